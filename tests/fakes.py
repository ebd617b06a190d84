"""Stand-ins for what cannot exist on a CPU-only machine: NVML and torch.cuda."""

from __future__ import annotations

from types import SimpleNamespace

GIB = 1024**3


class FakeNvml:
    """Enough of `pynvml` for the monitor and hardware detection; readings are fixed per GPU."""

    NVML_TEMPERATURE_GPU = 0
    NVML_CLOCK_SM = 1

    def __init__(self, gpus: list[dict]):
        self.gpus = gpus
        self.initialised = 0

    def nvmlInit(self):
        self.initialised += 1

    def nvmlShutdown(self):
        self.initialised -= 1

    def nvmlDeviceGetCount(self):
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index):
        return index

    def nvmlDeviceGetName(self, handle):
        return self.gpus[handle]["name"].encode()

    def nvmlDeviceGetMemoryInfo(self, handle):
        gpu = self.gpus[handle]
        return SimpleNamespace(
            total=gpu["memory_gb"] * GIB,
            used=gpu["used_gb"] * GIB,
            free=(gpu["memory_gb"] - gpu["used_gb"]) * GIB,
        )

    def nvmlDeviceGetCudaComputeCapability(self, handle):
        return self.gpus[handle]["capability"]

    def nvmlDeviceGetUtilizationRates(self, handle):
        return SimpleNamespace(gpu=self.gpus[handle]["utilization_pct"], memory=0)

    def nvmlDeviceGetTemperature(self, handle, sensor):
        return self.gpus[handle]["temperature_c"]

    def nvmlDeviceGetPowerUsage(self, handle):
        if "power_w" not in self.gpus[handle]:
            raise RuntimeError("Not Supported")
        return self.gpus[handle]["power_w"] * 1000

    def nvmlDeviceGetClockInfo(self, handle, clock):
        return 1980


class FakeCuda:
    """Enough of `torch.cuda` for hardware detection."""

    def __init__(self, gpus: list[dict]):
        self.gpus = gpus

    def device_count(self):
        return len(self.gpus)

    def get_device_properties(self, index):
        gpu = self.gpus[index]
        major, minor = gpu["capability"]
        return SimpleNamespace(
            name=gpu["name"], total_memory=gpu["memory_gb"] * GIB, major=major, minor=minor
        )

    def mem_get_info(self, index):
        gpu = self.gpus[index]
        return ((gpu["memory_gb"] - gpu["used_gb"]) * GIB, gpu["memory_gb"] * GIB)


H100 = {
    "name": "NVIDIA H100 80GB HBM3",
    "memory_gb": 80,
    "used_gb": 60,
    "capability": (9, 0),
    "utilization_pct": 97,
    "temperature_c": 71,
    "power_w": 650,
}
RTX_2060 = {
    "name": "NVIDIA GeForce RTX 2060",
    "memory_gb": 6,
    "used_gb": 5,
    "capability": (7, 5),
    "utilization_pct": 8,
    "temperature_c": 50,
}

"""Background hardware sampling: CPU, RAM and process RSS (psutil), GPUs (NVML).

A daemon thread takes one sample every `interval_s`, plus one at start and
one at stop so even a short run has data. GPU readings go through the NVML
module passed in (`pynvml`, or a fake in tests); without NVML the GPU list
is empty and `gpu_note` says why.
"""

from __future__ import annotations

import math
import threading
import time
from datetime import UTC, datetime
from typing import Any

import psutil

GB = 1024**3
SUMMARY_METRICS = ("cpu_pct", "ram_used_gb", "process_rss_gb")
GPU_METRICS = ("utilization_pct", "memory_used_gb", "temperature_c", "power_w", "sm_clock_mhz")


def import_nvml():
    """The `pynvml` module, or None when nvidia-ml-py is not installed."""
    try:
        import pynvml
    except ImportError:
        return None
    return pynvml


class HardwareMonitor:
    def __init__(self, interval_s: float, nvml=None):
        self.interval_s = interval_s
        self.nvml = nvml
        self.gpu_note: str | None = None if nvml else "nvidia-ml-py is not installed"
        self.samples: list[dict[str, Any]] = []
        self._process = psutil.Process()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="repotune-monitor", daemon=True)
        self._started = 0.0
        self._handles = []
        self.sampling_time_s = 0.0
        """Time spent taking samples (the monitor's own overhead)."""

    def start(self) -> HardwareMonitor:
        if self.nvml is not None:
            try:
                self.nvml.nvmlInit()
                count = self.nvml.nvmlDeviceGetCount()
                self._handles = [self.nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
                self.gpu_note = None if count else "NVML found no GPU"
            except Exception as err:  # NVMLError_LibraryNotFound, _DriverNotLoaded, ...: no GPU data
                self.nvml, self.gpu_note = None, f"no NVIDIA driver (NVML: {err})"
        self._process.cpu_percent(None)  # the first call only primes psutil's counters
        psutil.cpu_percent(None)
        self._started = time.perf_counter()
        self._sample()
        self._thread.start()
        return self

    def stop(self) -> None:
        if not self._stop.is_set():
            self._stop.set()
            self._thread.join()
            self._sample()
            if self.nvml is not None:
                self.nvml.nvmlShutdown()

    def __enter__(self) -> HardwareMonitor:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample()

    def _sample(self) -> None:
        began = time.perf_counter()
        memory = psutil.virtual_memory()
        sample = {
            "t_s": round(began - self._started, 3),
            "timestamp": datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "cpu_pct": psutil.cpu_percent(None),
            "ram_used_gb": round((memory.total - memory.available) / GB, 3),
            "process_rss_gb": round(self._process.memory_info().rss / GB, 3),
            "gpus": [self._gpu_sample(index, handle) for index, handle in enumerate(self._handles)],
        }
        self.samples.append(sample)
        self.sampling_time_s += time.perf_counter() - began

    def _gpu_sample(self, index: int, handle) -> dict[str, Any]:
        nvml = self.nvml

        def read(call, *args):
            try:
                return call(handle, *args)
            except Exception:  # a metric this GPU or driver does not report
                return None

        utilization = read(nvml.nvmlDeviceGetUtilizationRates)
        memory = read(nvml.nvmlDeviceGetMemoryInfo)
        power_mw = read(nvml.nvmlDeviceGetPowerUsage)
        return {
            "index": index,
            "utilization_pct": utilization.gpu if utilization else None,
            "memory_used_gb": round(memory.used / GB, 3) if memory else None,
            "memory_total_gb": round(memory.total / GB, 3) if memory else None,
            "temperature_c": read(nvml.nvmlDeviceGetTemperature, nvml.NVML_TEMPERATURE_GPU),
            "power_w": round(power_mw / 1000, 1) if power_mw is not None else None,
            "sm_clock_mhz": read(nvml.nvmlDeviceGetClockInfo, nvml.NVML_CLOCK_SM),
        }

    def report(self) -> dict[str, Any]:
        """The manifest's hardware section: interval, samples and their summary."""
        return {
            "collection_interval_seconds": self.interval_s,
            "sample_count": len(self.samples),
            "samples": self.samples,
            "summary": summarize(self.samples),
            "gpu_note": self.gpu_note,
            "monitor_overhead_s": round(self.sampling_time_s, 4),
        }


def summarize(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """mean / p95 / max per metric, per GPU too; null where nothing was measured."""
    summary: dict[str, Any] = {
        metric: summarize_values([s[metric] for s in samples]) for metric in SUMMARY_METRICS
    }
    gpu_indexes = sorted({gpu["index"] for s in samples for gpu in s["gpus"]})
    summary["gpus"] = [
        {
            "index": index,
            **{
                metric: summarize_values(
                    [gpu[metric] for s in samples for gpu in s["gpus"] if gpu["index"] == index]
                )
                for metric in GPU_METRICS
            },
        }
        for index in gpu_indexes
    ]
    return summary


def summarize_values(values: list[float | None]) -> dict[str, float | None]:
    """mean / p95 / max of a series; null when nothing was measured."""
    present = sorted(v for v in values if v is not None and math.isfinite(v))
    if not present:
        return {"mean": None, "p95": None, "max": None}
    rank = max(1, math.ceil(0.95 * len(present)))
    return {
        "mean": round(sum(present) / len(present), 3),
        "p95": round(present[rank - 1], 3),
        "max": round(present[-1], 3),
    }

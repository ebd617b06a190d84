"""What machine are we on? CPU cores and quotas, RAM and limits, GPUs, versions.

Detection never fails the run: whatever cannot be read is None, and
`Hardware.notes` says why. GPU readers take the `torch.cuda` module and the
`pynvml` module as arguments so tests can pass fakes (there is no GPU here).
"""

from __future__ import annotations

import json
import math
import os
import platform
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

import psutil

from pipeline.errors import ConfigError
from pipeline.types import GpuInfo, Hardware, Launch, Machine

GB = 1024**3


def usable_cores() -> int:
    """Cores this process may use: the affinity mask and the container's CPU quota applied."""
    return _cores_within(cgroup_cpu_quota(CGROUP_ROOT, _own_cgroup()))


def _cores_within(quota: float | None) -> int:
    cores = _affinity_cores() or psutil.cpu_count(logical=True) or 1
    return max(1, min(cores, math.floor(quota) if quota else sys.maxsize))


BUSY_CORES_NAMED = 0.25  # other processes using this much of the CPU are named, and slow training down


@dataclass(frozen=True)
class CpuLoad:
    busy_cores: float
    """Cores' worth of CPU other processes used over the window."""
    busy_processes: tuple[str, ...]


class LoadMeter:
    """How much CPU other processes use, on the cores this process may use, from when it is created to
    when it is read: the machine's busy time there minus this process's own (its children included)."""

    WINDOW_S = 0.1  # at least this long: CPU time is counted in 10 ms ticks

    def __init__(self):
        self._cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
        self._started = self._snapshot()

    def read(self) -> CpuLoad:
        wall, machine, own = self._started
        if (waited := time.perf_counter() - wall) < self.WINDOW_S:
            time.sleep(self.WINDOW_S - waited)
        now_wall, now_machine, now_own = self._snapshot()
        busy = max(0.0, (now_machine - machine - (now_own - own)) / (now_wall - wall))
        return CpuLoad(round(busy, 2), busiest_processes() if busy >= BUSY_CORES_NAMED else ())

    def _snapshot(self) -> tuple[float, float, float]:
        per_cpu = psutil.cpu_times(percpu=True)
        cores = [per_cpu[i] for i in self._cores if i < len(per_cpu)] if self._cores else per_cpu
        machine = sum(t.user + t.system + getattr(t, "nice", 0) + getattr(t, "irq", 0) + getattr(t, "softirq", 0)
                      + getattr(t, "steal", 0) for t in cores)  # fmt: skip
        own = psutil.Process().cpu_times()
        return time.perf_counter(), machine, own.user + own.system + own.children_user + own.children_system


def busiest_processes(window_s: float = 0.2, count: int = 3) -> tuple[str, ...]:
    """The processes other than this one (and its children) that used the most CPU over a short window."""
    ours = {os.getpid(), *(child.pid for child in psutil.Process().children(recursive=True))}
    before = cpu_seconds_of_others(ours)
    time.sleep(window_s)
    return busiest(before, cpu_seconds_of_others(ours), window_s, count)


def cpu_seconds_of_others(ours: set[int]) -> dict[int, tuple[str, float]]:
    """Each process not in `ours`: its name and the CPU seconds it has used so far."""
    found = {}
    for process in psutil.process_iter(["name", "cpu_times"]):
        cpu = process.info["cpu_times"]
        if process.pid not in ours and cpu is not None:
            found[process.pid] = (process.info["name"] or "?", cpu.user + cpu.system)
    return found


def busiest(
    before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]], seconds: float, count: int = 3
) -> tuple[str, ...]:
    """The `count` processes that used the most CPU between two `cpu_seconds_of_others` readings taken
    `seconds` apart, as `name (pid N): 1.0 core`."""
    used = sorted(
        ((spent - before[pid][1]) / seconds, name, pid)
        for pid, (name, spent) in after.items()
        if pid in before and spent > before[pid][1]
    )[::-1]
    return tuple(
        f"{name} (pid {pid}): {cores:.1f} core" for cores, name, pid in used[:count] if cores >= 0.05
    )


def free_cores(cores: int, busy: float) -> int:
    """The cores that other processes, busy on `busy` cores' worth of them, leave free: at least one."""
    return cores - min(cores - 1, round(busy))


def detect_hardware(load: LoadMeter | None = None) -> Hardware:
    notes: dict[str, str] = {}
    own = _own_cgroup()
    quota = cgroup_cpu_quota(CGROUP_ROOT, own)
    logical = psutil.cpu_count(logical=True)
    memory = psutil.virtual_memory()
    limit = cgroup_memory_limit(CGROUP_ROOT, own)
    physical = psutil.cpu_count(logical=False)
    if physical is None:
        notes["cpu_physical_cores"] = "psutil could not read the physical core count"
    if quota is None:
        notes["cpu_quota_cores"] = "no cgroup CPU quota on this process (unlimited, or not Linux)"
    if limit is None:
        notes["memory_limit_gb"] = "no cgroup memory limit on this process (unlimited, or not Linux)"
    hardware = Hardware(
        cpu_physical_cores=physical,
        cpu_logical_cores=logical,
        usable_cores=_cores_within(quota),
        cpu_quota_cores=quota,
        ram_total_gb=round(memory.total / GB, 2),
        ram_available_gb=round(memory.available / GB, 2),
        memory_limit_gb=round(limit / GB, 2) if limit else None,
        cpu_bf16=native_cpu_bf16(),
        platform=platform.platform(),
        python_version=platform.python_version(),
        notes=notes,
    )
    if load is not None:
        measured = load.read()
        hardware = replace(hardware, busy_cores=measured.busy_cores, busy_processes=measured.busy_processes)
    else:
        notes["busy_cores"] = "not measured: no window over which to count other processes' CPU time"
    return _with_accelerators(hardware)


BF16_CPU_FLAGS = ("amx_bf16", "avx512_bf16")  # native bfloat16 matmuls, best first


def cpu_bf16_flag(flags: set[str]) -> str | None:
    return next((flag for flag in BF16_CPU_FLAGS if flag in flags), None)


def native_cpu_bf16() -> str | None:
    """This CPU's flag for native bfloat16 matmuls (BF16_CPU_FLAGS), or None where it would emulate them."""
    return cpu_bf16_flag(_cpu_flags())


def _cpu_flags() -> set[str]:
    """The CPU's feature flags (Linux /proc/cpuinfo); empty elsewhere."""
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def _with_accelerators(hardware: Hardware) -> Hardware:
    notes = dict(hardware.notes)
    try:
        import torch
        import transformers
    except ImportError as err:
        for name in ("torch_version", "cuda_version", "transformers_version", "gpus"):
            notes[name] = f"torch is not importable ({err})"
        return replace(hardware, notes=notes)
    gpus: list[GpuInfo] = []
    cuda_usable = torch.cuda.is_available()
    if cuda_usable:
        gpus = gpus_from_torch(torch.cuda)
    else:
        gpus = _gpus_from_nvml_if_present(notes)
        if gpus:
            notes["cuda_usable"] = "NVML sees GPUs but this torch build cannot use them (CPU-only torch?)"
    if torch.version.cuda is None:
        notes["cuda_version"] = f"this torch build ({torch.__version__}) has no CUDA support"
    mps = bool(getattr(torch.backends, "mps", None) and torch.backends.mps.is_available())
    return replace(
        hardware,
        gpus=tuple(gpus),
        cuda_usable=cuda_usable,
        mps=mps,
        torch_version=torch.__version__,
        cuda_version=torch.version.cuda,
        transformers_version=transformers.__version__,
        notes=notes,
    )


def gpus_from_torch(cuda) -> list[GpuInfo]:
    """GPUs as torch sees them; `cuda` is `torch.cuda` (or a fake with the same calls)."""
    gpus = []
    for index in range(cuda.device_count()):
        props = cuda.get_device_properties(index)
        capability = (props.major, props.minor)
        try:
            free, _total = cuda.mem_get_info(index)
            free_gb = round(free / GB, 2)
        except RuntimeError:
            free_gb = None
        gpus.append(
            GpuInfo(
                index=index,
                name=props.name,
                memory_gb=round(props.total_memory / GB, 2),
                free_memory_gb=free_gb,
                compute_capability=capability,
            )
        )
    return gpus


def _gpus_from_nvml_if_present(notes: dict[str, str]) -> list[GpuInfo]:
    try:
        import pynvml
    except ImportError:
        notes["gpus"] = "nvidia-ml-py is not installed"
        return []
    try:
        return gpus_from_nvml(pynvml)
    except Exception as err:  # NVMLError subclasses vary by driver; none of them should stop a run
        notes["gpus"] = f"no NVIDIA GPU found ({err.__class__.__name__}: {err})"
        return []


def gpus_from_nvml(nvml) -> list[GpuInfo]:
    """GPUs as NVML sees them; `nvml` is the `pynvml` module (or a fake)."""
    nvml.nvmlInit()
    try:
        gpus = []
        for index in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            memory = nvml.nvmlDeviceGetMemoryInfo(handle)
            name = nvml.nvmlDeviceGetName(handle)
            capability = tuple(nvml.nvmlDeviceGetCudaComputeCapability(handle))
            gpus.append(
                GpuInfo(
                    index=index,
                    name=name.decode() if isinstance(name, bytes) else name,
                    memory_gb=round(memory.total / GB, 2),
                    free_memory_gb=round(memory.free / GB, 2),
                    compute_capability=capability,
                )
            )
        return gpus
    finally:
        nvml.nvmlShutdown()


def _affinity_cores() -> int | None:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # macOS and Windows have no affinity call
        return None


CGROUP_ROOT = Path("/sys/fs/cgroup")


def _own_cgroup() -> str:
    try:
        return Path("/proc/self/cgroup").read_text()
    except OSError:
        return ""


def cgroup_dirs(root: Path, own_cgroup: str, controller: str) -> list[Path]:
    """The cgroup directories that can limit this process for `controller` (cpu or memory): its own
    cgroup and every parent, in the v2 tree and in v1's per-controller tree (`cpu,cpuacct/...`)."""
    dirs: list[Path] = []
    for line in own_cgroup.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hierarchy, controllers, own = parts
        if hierarchy == "0" and not controllers:
            base = root  # v2: one tree for every controller
        elif controller in controllers.split(","):
            base = root / controllers
        else:
            continue
        directory = base / own.lstrip("/")
        while directory != base and base in directory.parents:
            dirs.append(directory)
            directory = directory.parent
        dirs.append(base)
    return dirs or [root, root / controller]


def cgroup_cpu_quota(root: Path, own_cgroup: str = "") -> float | None:
    """CPU quota in cores: the smallest `cpu.max` (v2) or `cpu.cfs_quota_us` (v1) on this process's
    cgroup path; None when unlimited."""
    quotas = [
        quota for directory in cgroup_dirs(root, own_cgroup, "cpu") if (quota := _cpu_quota_in(directory))
    ]
    return min(quotas, default=None)


def _cpu_quota_in(directory: Path) -> float | None:
    try:
        quota, period = (directory / "cpu.max").read_text().split()
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:
        quota_us = int((directory / "cpu.cfs_quota_us").read_text())
        period_us = int((directory / "cpu.cfs_period_us").read_text())
        return None if quota_us <= 0 else quota_us / period_us
    except (OSError, ValueError):
        return None


def cgroup_memory_limit(root: Path, own_cgroup: str = "") -> int | None:
    """Memory limit in bytes: the smallest `memory.max` (v2) or `memory.limit_in_bytes` (v1) on this
    process's cgroup path; None when unlimited."""
    limits = [
        limit
        for directory in cgroup_dirs(root, own_cgroup, "memory")
        if (limit := _memory_limit_in(directory))
    ]
    return min(limits, default=None)


def _memory_limit_in(directory: Path) -> int | None:
    for path in (directory / "memory.max", directory / "memory.limit_in_bytes"):
        try:
            text = path.read_text().strip()
        except OSError:
            continue
        if text == "max":
            return None
        try:
            value = int(text)
        except ValueError:
            continue
        # v1 reports "unlimited" as a huge page-aligned number.
        return None if value >= 2**60 else value
    return None


PROFILES_DIR = Path(__file__).resolve().parent.parent / "profiles"
_PROFILE_KEYS = {
    "name": str,
    "gpus": list,
    "cpu_cores": int,
    "logical_cores": int,
    "ram_gb": (int, float),
    "mps": bool,
    "cpu_flags": list,
}
_GPU_KEYS = {"name": str, "memory_gb": (int, float), "compute_capability": list, "count": int}


def load_hardware_profile(spec: str) -> Hardware:
    """A described machine to plan for: a JSON file, or the name of a shipped profile (`rtx2060`)."""
    path = Path(spec)
    if not path.exists() and (PROFILES_DIR / f"{spec}.json").exists():
        path = PROFILES_DIR / f"{spec}.json"
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        shipped = ", ".join(sorted(p.stem for p in PROFILES_DIR.glob("*.json")))
        raise ConfigError(f"--hardware-profile {spec}: no such file (shipped profiles: {shipped})") from None
    except (OSError, ValueError) as err:
        raise ConfigError(f"--hardware-profile {spec}: not a readable JSON file ({err})") from None
    problems = _profile_problems(data)
    if problems:
        raise ConfigError(f"{path.name}: " + "; ".join(problems))
    gpus: list[GpuInfo] = []
    for entry in data.get("gpus", []):
        capability = tuple(entry.get("compute_capability") or ()) or None
        for _ in range(entry.get("count", 1)):
            gpus.append(
                GpuInfo(
                    index=len(gpus),
                    name=entry["name"],
                    memory_gb=float(entry["memory_gb"]),
                    compute_capability=capability,
                )
            )
    cores = data.get("cpu_cores", 1)
    logical = data.get("logical_cores", cores)
    return Hardware(
        cpu_physical_cores=cores,
        cpu_logical_cores=logical,
        usable_cores=logical,
        cpu_quota_cores=None,
        ram_total_gb=float(data["ram_gb"]) if "ram_gb" in data else None,
        ram_available_gb=None,
        memory_limit_gb=None,
        gpus=tuple(gpus),
        cuda_usable=bool(gpus),  # the described machine is assumed to have a CUDA build of torch
        mps=data.get("mps", False),
        cpu_bf16=cpu_bf16_flag(set(data.get("cpu_flags", []))),
        source=f"profile {path.name}" + (f" ({data['name']})" if "name" in data else ""),
        notes={"source": "described by a hardware profile, not detected"},
    )


def _profile_problems(data) -> list[str]:
    if not isinstance(data, dict):
        return ['must be a JSON object such as {"gpus": [...], "cpu_cores": 8, "ram_gb": 32}']
    problems = _key_problems(data, _PROFILE_KEYS, "")
    for index, gpu in enumerate(data.get("gpus", []) if isinstance(data.get("gpus"), list) else []):
        if not isinstance(gpu, dict):
            problems.append(f"`gpus[{index}]` must be an object")
            continue
        problems += _key_problems(gpu, _GPU_KEYS, f"gpus[{index}].")
        for required in ("name", "memory_gb"):
            if required not in gpu:
                problems.append(f"`gpus[{index}].{required}` is required")
        capability = gpu.get("compute_capability")
        if capability is not None and not (
            len(capability) == 2 and all(isinstance(v, int) for v in capability)
        ):
            problems.append(f"`gpus[{index}].compute_capability` must be [major, minor], got {capability!r}")
    return problems


def _key_problems(data: dict, schema: dict, prefix: str) -> list[str]:
    problems = []
    for key, value in data.items():
        if key not in schema:
            problems.append(f"unknown key `{prefix}{key}` (known: {', '.join(schema)})")
        elif (isinstance(value, bool) and schema[key] is not bool) or not isinstance(value, schema[key]):
            problems.append(f"`{prefix}{key}` has the wrong type: {value!r}")
    return problems


def machine(hardware_profile: str | None, launch: Launch, load: LoadMeter | None = None) -> Machine:
    """What to plan for: this machine and this launch (`load`: how busy other processes kept its CPU
    since the run began), or the machine a hardware profile describes."""
    if hardware_profile:
        hardware = load_hardware_profile(hardware_profile)
        return Machine(hardware, launch_for_profile(hardware))
    return Machine(detect_hardware(load), launch)


def launch_for_profile(hardware: Hardware) -> Launch:
    """A described machine trains with one process per GPU (torchrun --nproc_per_node GPUS)."""
    gpus = len(hardware.gpus)
    if gpus > 1:
        return Launch(
            gpus, f"{hardware.source}: {gpus} GPUs, one process each (torchrun --nproc_per_node {gpus})"
        )
    return Launch(1, f"{hardware.source}: one process")

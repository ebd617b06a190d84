"""Background hardware sampling: CPU, RAM and process RSS (psutil), GPUs (NVML).

A daemon thread takes one sample every `interval_s`, plus one at start and
one at stop so even a short run has data. GPU readings go through the NVML
module passed in (`pynvml`, or a fake in tests); without NVML the GPU list
is empty and `gpu_note` says why. Each sample also says how much CPU other
processes took (`other_cores`: the busy cores this process may use, minus
this process and its children) and, when that slows training, which ones.
"""

from __future__ import annotations

import math
import os
import threading
import time
from typing import Any

import psutil

from pipeline.hardware import BUSY_CORES_NAMED, GB, busiest, cpu_seconds_of_others, free_cores
from pipeline.manifest import utc_now

SUMMARY_METRICS = (
    "cpu_pct",
    "other_cores",
    "ram_used_gb",
    "ram_total_gb",
    "process_cpu_pct",
    "process_rss_gb",
)
GPU_METRICS = (
    "utilization_pct",
    "memory_used_gb",
    "memory_total_gb",
    "temperature_c",
    "power_w",
    "sm_clock_mhz",
)


def import_nvml():
    """The `pynvml` module, or None when nvidia-ml-py is not installed."""
    try:
        import pynvml
    except ImportError:
        return None
    return pynvml


class HardwareMonitor:
    """Samples this machine every `interval_s`; `process` is the process whose CPU and RSS are
    followed (this one by default); `on_sample` sees each sample as it is taken."""

    def __init__(self, interval_s: float, nvml=None, process: psutil.Process | None = None, on_sample=None):
        self.interval_s = interval_s
        self.nvml = nvml
        self.gpu_note: str | None = None if nvml else "nvidia-ml-py is not installed"
        self.samples: list[dict[str, Any]] = []
        self.on_sample = on_sample
        self._process = process or psutil.Process()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="repotune-monitor", daemon=True)
        self._started = 0.0
        self._handles: list[Any] = []
        self._process_name: str | None = None
        self.sampling_time_s = 0.0
        """Time spent taking samples (the monitor's own overhead)."""
        self._cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
        self._children: dict[int, psutil.Process] = {}
        self._others: dict[int, tuple[str, float]] = {}  # other processes' CPU time at the last busy sample
        self._others_at = 0.0
        self.cpu_threads: list[dict[str, Any]] = []
        """The CPU threads training computed with, from each change on (step, threads, other_cores)."""

    def start(self) -> HardwareMonitor:
        if self.nvml is not None:
            try:
                self.nvml.nvmlInit()
                count = self.nvml.nvmlDeviceGetCount()
                self._handles = [self.nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
                self.gpu_note = None if count else "NVML found no GPU"
            except Exception as err:  # NVMLError_LibraryNotFound, _DriverNotLoaded, ...: no GPU data
                self.nvml, self.gpu_note = None, f"no NVIDIA driver (NVML: {err})"
        try:
            self._process_name = self._process.name()  # now: a followed process may be gone by the report
        except psutil.Error:
            self._process_name = None
        self._process.cpu_percent(None)  # the first call only primes psutil's counters
        psutil.cpu_percent(None)
        psutil.cpu_percent(None, percpu=True)
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
        try:
            with self._process.oneshot():
                process_cpu, process_rss = (
                    self._process.cpu_percent(None),
                    self._process.memory_info().rss / GB,
                )
        except psutil.Error:  # the followed process has exited
            process_cpu = process_rss = None
        other = self._other_cores(process_cpu)
        sample = {
            "t_s": round(began - self._started, 3),
            "timestamp": utc_now(),
            "cpu_pct": psutil.cpu_percent(None),
            "other_cores": other,
            "busiest": self._busiest() if other is not None and other >= BUSY_CORES_NAMED else [],
            "ram_used_gb": round((memory.total - memory.available) / GB, 3),
            "ram_total_gb": round(memory.total / GB, 3),
            "process_cpu_pct": process_cpu,
            "process_rss_gb": round(process_rss, 3) if process_rss is not None else None,
            "gpus": [self._gpu_sample(index, handle) for index, handle in enumerate(self._handles)],
        }
        self.samples.append(sample)
        self.sampling_time_s += time.perf_counter() - began
        if self.on_sample:
            self.on_sample(sample)

    def _other_cores(self, process_cpu: float | None) -> float | None:
        """Cores' worth of CPU that processes other than the followed one and its children used since the
        last sample, on the cores this process may use."""
        per_cpu = psutil.cpu_percent(None, percpu=True)
        busy = sum(per_cpu[i] for i in self._cpus if i < len(per_cpu)) if self._cpus else sum(per_cpu)
        if process_cpu is None or not self.samples:  # the first sample closes no interval
            return None
        ours = process_cpu
        try:
            for child in self._process.children(recursive=True):
                known = self._children.setdefault(child.pid, child)
                ours += known.cpu_percent(None)  # 0 at a child's first sample: it primes its counter
        except psutil.Error:
            pass
        return round(max(0.0, busy - ours) / 100, 2)

    def _busiest(self) -> list[str]:
        """The other processes that used the most CPU since the last busy sample (none at the first)."""
        now = time.perf_counter()
        seen = cpu_seconds_of_others({self._process.pid, *self._children})
        previous, since = self._others, self._others_at
        self._others, self._others_at = seen, now
        if not previous or now <= since:
            return []
        return list(busiest(previous, seen, now - since))

    def free_cores(self, cores: int) -> int | None:
        """The cores other processes leave free, when the last two samples agree on it (one sample is one
        interval of noise); None before two samples or while they disagree."""
        recent = [sample["other_cores"] for sample in self.samples[-2:]]
        if len(recent) < 2 or None in recent:
            return None
        free = {free_cores(cores, other) for other in recent}
        return free.pop() if len(free) == 1 else None

    def process_alive(self) -> bool:
        try:
            return self._process.is_running() and self._process.status() != psutil.STATUS_ZOMBIE
        except psutil.Error:
            return False

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
        """The manifest's hardware section: interval, samples, their summary and what they say."""
        summary = summarize(self.samples)
        return {
            "collection_interval_seconds": self.interval_s,
            "sample_count": len(self.samples),
            "samples": self.samples,
            "summary": summary,
            "assessment": assess(summary, self.gpu_note, busiest_over(self.samples)),
            "gpu_note": self.gpu_note,
            "monitor_overhead_s": round(self.sampling_time_s, 4),
            "followed_process": self._followed(),
            "cpu_threads": self.cpu_threads,
        }

    def _followed(self) -> dict[str, Any]:
        return {"pid": self._process.pid, "name": self._process_name, "exited": not self.process_alive()}


# Thresholds for the assessment, from what a busy training GPU looks like.
IDLE_GPU_PCT = 30  # mean utilisation under this: the GPU spends most of its time waiting
BUSY_GPU_PCT = 90  # mean utilisation over this: the GPU is the limit
FULL_MEMORY_SHARE = 0.7  # memory used over this share of the card: a model (and data) are loaded on it
COOL_GPU_C = 55  # a GPU under sustained load runs hotter than this
BUSY_CPU_PCT = 90
FULL_RAM_SHARE = 0.9


def assess(summary: dict[str, Any], gpu_note: str | None, busiest: list[str] | None = None) -> list[str]:
    """What the samples say, each with concrete advice (`busiest`: the other processes that took the
    most CPU)."""
    findings = []
    cpu = summary["cpu_pct"]["mean"]
    gpus = summary.get("gpus") or []
    if not gpus:
        findings.append(f"no GPU found ({gpu_note or 'NVML reported none'}): only CPU and RAM were sampled")
    for gpu in gpus:
        busy = gpu["utilization_pct"]["mean"]
        used, total = gpu["memory_used_gb"]["max"], gpu.get("memory_total_gb", {}).get("max")
        hottest = gpu["temperature_c"]["max"]
        label = f"GPU {gpu['index']}"
        if busy is None:
            findings.append(f"{label}: no utilisation readings from NVML")
            continue
        full = used is not None and total and used / total > FULL_MEMORY_SHARE
        if busy < IDLE_GPU_PCT and full:
            findings.append(
                f"{label}: utilisation mean {busy:.0f}% with memory {used / total:.0%} used: the GPU waits for data — "
                "raise dataloader workers (plan.num_workers), enable plan.pin_memory, pre-tokenize (see `prepare`)"
            )
        elif busy < IDLE_GPU_PCT:
            findings.append(
                f"{label}: utilisation mean {busy:.0f}%: the GPU is idle most of the time — is the job running on it?"
            )
        elif busy >= BUSY_GPU_PCT:
            findings.append(
                f"{label}: utilisation mean {busy:.0f}%: the GPU is the limit — more speed needs a faster GPU or more of them"
            )
        if hottest is not None and hottest < COOL_GPU_C and busy < BUSY_GPU_PCT:
            findings.append(
                f"{label}: temperature {hottest:.0f} °C at most: under real load it would run hotter; the GPU is idle most of the time"
            )
        if cpu is not None and cpu >= BUSY_CPU_PCT and busy < IDLE_GPU_PCT:
            findings.append(
                f"CPU mean {cpu:.0f}% while {label} waits: the input pipeline is CPU-bound — "
                "pre-tokenize with `prepare`, or move tokenization off this machine"
            )
    other = summary.get("other_cores", {}).get("mean")
    if other is not None and other >= BUSY_CORES_NAMED:
        named = f" (the busiest: {'; '.join(busiest)})" if busiest else ""
        findings.append(
            f"other processes took {other:.1f} cores on average while this ran{named}: it had that much less "
            "CPU; stop them, or expect the time a step takes to grow by about as much"
        )
    ram, ram_total = summary["ram_used_gb"]["max"], summary.get("ram_total_gb", {}).get("max")
    if ram is not None and ram_total and ram / ram_total > FULL_RAM_SHARE:
        findings.append(
            f"RAM nearly full ({ram:.1f} of {ram_total:.1f} GB): swapping will slow everything — lower plan.num_workers"
        )
    if not findings:
        findings.append(f"nothing unusual: CPU mean {cpu:.0f}%" if cpu is not None else "nothing measured")
    return findings


def busiest_over(samples: list[dict[str, Any]], count: int = 3) -> list[str]:
    """The other processes named most often among the samples' busiest, as the last sample named them."""
    named: dict[str, str] = {}
    times: dict[str, int] = {}
    for sample in samples:
        for entry in sample.get("busiest") or []:
            who = entry.split(":")[0]
            named[who], times[who] = entry, times.get(who, 0) + 1
    return [named[who] for who in sorted(times, key=lambda who: times[who], reverse=True)[:count]]


def summarize(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """mean / p95 / min / max per metric, per GPU too; null where nothing was measured."""
    summary: dict[str, Any] = {
        metric: summarize_values([s.get(metric) for s in samples]) for metric in SUMMARY_METRICS
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
    """mean / p95 / min / max of a series; null when nothing was measured."""
    present = sorted(v for v in values if v is not None and math.isfinite(v))
    if not present:
        return {"mean": None, "p95": None, "min": None, "max": None}
    rank = max(1, math.ceil(0.95 * len(present)))
    return {
        "mean": round(sum(present) / len(present), 3),
        "p95": round(present[rank - 1], 3),
        "min": round(present[0], 3),
        "max": round(present[-1], 3),
    }

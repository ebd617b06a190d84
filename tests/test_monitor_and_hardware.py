"""Hardware detection and monitoring: real psutil readings, GPUs through fakes at the seams."""

from __future__ import annotations

import time

from pipeline.hardware import (
    cgroup_cpu_quota,
    cgroup_memory_limit,
    detect_hardware,
    gpus_from_nvml,
    gpus_from_torch,
)
from pipeline.train.monitor import HardwareMonitor, summarize
from tests.fakes import H100, RTX_2060, FakeCuda, FakeNvml


def test_detects_this_machine_without_failing(host):
    hardware = detect_hardware()
    assert hardware.usable_cores >= 1
    assert hardware.ram_total_gb > 0
    assert hardware.torch_version
    manifest = hardware.to_manifest()
    assert manifest["gpu_count"] == len(hardware.gpus)


def test_gpus_from_torch_and_nvml_seams():
    (h100, rtx) = gpus_from_torch(FakeCuda([H100, RTX_2060]))
    assert (h100.name, h100.memory_gb, h100.free_memory_gb, h100.compute_capability, h100.bf16) == (
        "NVIDIA H100 80GB HBM3", 80.0, 20.0, (9, 0), True,
    )  # fmt: skip
    assert (rtx.memory_gb, rtx.bf16) == (6.0, False)
    nvml = FakeNvml([RTX_2060])
    (seen,) = gpus_from_nvml(nvml)
    assert (seen.name, seen.memory_gb, seen.compute_capability) == ("NVIDIA GeForce RTX 2060", 6.0, (7, 5))
    assert nvml.initialised == 0  # shut down again


def test_cgroup_v2_and_v1_limits(tmp_path):
    v2 = tmp_path / "v2"
    v2.mkdir()
    (v2 / "cpu.max").write_text("200000 100000\n")
    (v2 / "memory.max").write_text("8589934592\n")
    assert cgroup_cpu_quota(v2) == 2.0
    assert cgroup_memory_limit(v2) == 8 * 1024**3
    (v2 / "cpu.max").write_text("max 100000\n")
    (v2 / "memory.max").write_text("max\n")
    assert cgroup_cpu_quota(v2) is None and cgroup_memory_limit(v2) is None
    v1 = tmp_path / "v1"
    (v1 / "cpu").mkdir(parents=True)
    (v1 / "memory").mkdir()
    (v1 / "cpu" / "cpu.cfs_quota_us").write_text("150000\n")
    (v1 / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    (v1 / "memory" / "memory.limit_in_bytes").write_text(str(2**63 - 4096))
    assert cgroup_cpu_quota(v1) == 1.5
    assert cgroup_memory_limit(v1) is None  # v1's "unlimited"
    assert cgroup_cpu_quota(tmp_path / "missing") is None


def test_nested_cgroup_limits_apply_the_smallest(tmp_path):
    v2 = tmp_path / "v2"
    (v2 / "kubepods" / "pod1").mkdir(parents=True)
    (v2 / "kubepods" / "cpu.max").write_text("200000 100000\n")  # the parent allows 2 cores
    (v2 / "kubepods" / "pod1" / "cpu.max").write_text("400000 100000\n")  # the pod asks for 4
    (v2 / "kubepods" / "pod1" / "memory.max").write_text(str(3 * 1024**3))
    assert cgroup_cpu_quota(v2, "0::/kubepods/pod1\n") == 2.0
    assert cgroup_memory_limit(v2, "0::/kubepods/pod1\n") == 3 * 1024**3
    v1 = tmp_path / "v1"
    (v1 / "memory" / "job").mkdir(parents=True)
    (v1 / "memory" / "job" / "memory.limit_in_bytes").write_text(str(1024**3))
    (v1 / "cpu,cpuacct" / "job").mkdir(parents=True)
    (v1 / "cpu,cpuacct" / "job" / "cpu.cfs_quota_us").write_text("50000")
    (v1 / "cpu,cpuacct" / "job" / "cpu.cfs_period_us").write_text("100000")
    own = "4:memory:/job\n3:cpu,cpuacct:/job\n"
    assert cgroup_memory_limit(v1, own) == 1024**3
    assert cgroup_cpu_quota(v1, own) == 0.5


def test_monitor_samples_cpu_and_gpus_then_summarises():
    nvml = FakeNvml([H100, RTX_2060])
    with HardwareMonitor(interval_s=0.05, nvml=nvml) as monitor:
        time.sleep(0.3)
    report = monitor.report()
    assert report["collection_interval_seconds"] == 0.05
    assert report["sample_count"] >= 4
    assert report["gpu_note"] is None
    assert nvml.initialised == 0
    first = report["samples"][0]
    assert first["process_rss_gb"] > 0
    assert [gpu["utilization_pct"] for gpu in first["gpus"]] == [97, 8]
    assert first["gpus"][1]["power_w"] is None  # not reported by that GPU: null, not a crash
    summary = report["summary"]
    assert summary["gpus"][0]["utilization_pct"] == {"mean": 97.0, "p95": 97, "min": 97, "max": 97}
    assert summary["gpus"][1]["power_w"] == {"mean": None, "p95": None, "min": None, "max": None}
    assert summary["cpu_pct"]["max"] >= summary["cpu_pct"]["mean"] >= 0


def test_monitor_without_nvml_says_why():
    with HardwareMonitor(interval_s=10, nvml=None) as monitor:
        pass
    report = monitor.report()
    assert report["sample_count"] == 2  # at start and at stop
    assert report["summary"]["gpus"] == []
    assert report["gpu_note"] == "nvidia-ml-py is not installed"


def test_monitor_with_a_broken_driver_records_the_reason():
    class NoDriver(FakeNvml):
        def nvmlInit(self):
            raise RuntimeError("Driver Not Loaded")

    with HardwareMonitor(interval_s=10, nvml=NoDriver([])) as monitor:
        pass
    assert monitor.report()["gpu_note"] == "no NVIDIA driver (NVML: Driver Not Loaded)"


def test_summary_ignores_missing_values():
    samples = [
        {"cpu_pct": v, "ram_used_gb": 1.0, "process_rss_gb": None, "gpus": []} for v in (10, 20, 30, 40)
    ]
    summary = summarize(samples)
    assert summary["cpu_pct"] == {"mean": 25.0, "p95": 40, "min": 10, "max": 40}
    assert summary["process_rss_gb"] == {"mean": None, "p95": None, "min": None, "max": None}

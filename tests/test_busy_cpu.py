"""Other processes' load, measured for real: a process spinning on one core is measured and named, by the
run's start and by the monitor while training, and an idle machine measures idle. These are the tests
marked `quiet_machine`: `make test` runs this module alone after the parallel pass, so that no other test
is the load they measure; it imports nothing heavy, so that pass costs seconds. Every test that measures
the machine's load lives here (tests/test_structure.py holds it)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from pipeline.hardware import LoadMeter, detect_hardware
from pipeline.train.monitor import HardwareMonitor

pytestmark = pytest.mark.quiet_machine


@pytest.fixture
def busy_core():
    """A process spinning on one core, not a child of this one (nothing counts it as ours)."""
    started = subprocess.run(
        ["sh", "-c", f"{sys.executable} -c 'while True: pass' >/dev/null 2>&1 & echo $!"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    pid = int(started.stdout)
    time.sleep(0.2)  # its interpreter starting is not yet the load
    yield pid
    os.kill(pid, signal.SIGKILL)


def test_another_process_on_a_core_is_measured_and_named(busy_core):
    hardware = detect_hardware(LoadMeter())
    assert 0.6 <= hardware.busy_cores <= 1.3
    assert any(f"(pid {busy_core})" in named for named in hardware.busy_processes)
    assert hardware.to_manifest()["busy_processes"] == list(hardware.busy_processes)


def test_an_idle_machine_measures_idle():
    assert detect_hardware(LoadMeter()).busy_cores < 0.5


def test_the_monitor_sees_the_other_process_and_its_advice_names_it(busy_core):
    with HardwareMonitor(0.3) as monitor:
        time.sleep(1.5)
    report = monitor.report()
    assert report["samples"][0]["other_cores"] is None  # the first sample closes no interval
    assert [sample["other_cores"] >= 0.6 for sample in report["samples"][-2:]] == [True, True]
    assert any(f"(pid {busy_core})" in named for sample in report["samples"] for named in sample["busiest"])
    (finding,) = [line for line in report["assessment"] if line.startswith("other processes took")]
    assert f"(pid {busy_core})" in finding
    cores = len(os.sched_getaffinity(0))
    assert monitor.free_cores(cores) == max(1, cores - 1)

"""Training on a CPU that other processes use too: their load measured and named, threads planned for the
cores they leave free and followed while training, a remembered speed used only on an as-idle machine,
and advice that says what took the CPU. The other process is real: a spinner on one core."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from pipeline.config import load_config
from pipeline.hardware import LoadMeter, detect_hardware
from pipeline.plan.planner import make_plan
from pipeline.train.monitor import HardwareMonitor
from pipeline.train.performance import throughput_report
from pipeline.train.probe import _store_speed, remembered_speed
from pipeline.train.trainer import FollowFreeCores
from tests.test_planner import TINY, cpu_machine, same_length

pytestmark = pytest.mark.quiet_machine  # other processes' load is what they measure


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


def test_the_threads_are_the_cores_other_processes_leave_free():
    loaded = load_config(None, [])
    busy = dataclasses.replace(
        cpu_machine(2), busy_cores=1.02, busy_processes=("python (pid 4242): 1.0 core",)
    )
    plan = make_plan(same_length(20, 100), busy, TINY, loaded)
    assert (plan.cpu_threads, plan.follow_free_cores) == (1, True)
    assert plan.decisions["cpu_threads"].reason == (
        "2 usable cores, other processes busy on 1.0 of them when the run started (python (pid 4242): 1.0 core)"
    )
    idle = make_plan(same_length(20, 100), dataclasses.replace(cpu_machine(8), busy_cores=0.1), TINY, loaded)
    assert idle.cpu_threads == 8
    whole = dataclasses.replace(cpu_machine(2), busy_cores=3.0)  # busier than it has cores: keep one
    assert make_plan(same_length(20, 100), whole, TINY, loaded).cpu_threads == 1
    fixed = make_plan(same_length(20, 100), busy, TINY, load_config(None, ["plan.cpu_threads=2"]))
    assert (fixed.cpu_threads, fixed.follow_free_cores) == (2, False)


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


def test_training_follows_the_free_cores_and_records_each_change():
    class Samples(HardwareMonitor):
        def __init__(self, others):
            super().__init__(1.0)
            self.samples = [{"other_cores": other} for other in others]

    before = torch.get_num_threads()
    monitor = Samples([None, 0.0, 1.1])  # the last two disagree: nothing changes yet
    follow = FollowFreeCores(monitor)
    follow.cores = 2
    try:
        torch.set_num_threads(2)
        follow.on_step_begin(None, type("State", (), {"global_step": 3})(), None)
        assert torch.get_num_threads() == 2 and monitor.cpu_threads == []
        monitor.samples.append({"other_cores": 0.9})  # two samples agree: one core is taken
        follow.on_step_begin(None, type("State", (), {"global_step": 4})(), None)
        assert torch.get_num_threads() == 1
        assert monitor.cpu_threads == [{"step": 4, "threads": 1, "other_cores": 0.9}]
    finally:
        torch.set_num_threads(before)


def test_a_remembered_speed_holds_only_while_the_load_is_the_same(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    _store_speed("key", 560.0, 0.0)
    speed, _ = remembered_speed("key", 0.3)
    assert speed.tokens_per_s == 560.0
    speed, why = remembered_speed("key", 1.0)
    assert speed is None and "(560.0 tokens/s) had 0.0 cores taken by other processes, now 1.0" in why


def test_advice_on_a_shared_cpu_says_what_took_it():
    from pipeline.train.trainer import TrainingHistory

    history = TrainingHistory(1000, 10, False, lambda: None)
    history.train_runtime_s, history.step_time_s, history.data_wait_s = 10.0, [1.0] * 10, [0.0] * 10
    plan = make_plan(same_length(20, 100), cpu_machine(2), TINY, load_config(None, []))
    busiest = ["python (pid 4242): 1.0 core"]
    samples = [{"other_cores": 1.0, "busiest": busiest}] * 3
    monitor = {"summary": {"other_cores": {"mean": 1.0}, "gpus": []}, "samples": samples}
    report = throughput_report(history, plan, monitor, 2, 1.0, 135_000_000)
    assert report["bottleneck"] == "cpu-shared"
    assert report["suggestion"].startswith(
        "other processes took 1.0 of the 2 usable cores while this trained (the busiest: python (pid 4242): "
        "1.0 core): it trained on the 1.0 left; with them stopped it could train about 2.0× faster"
    )

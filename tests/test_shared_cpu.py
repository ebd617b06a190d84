"""Training on a CPU that other processes use too: threads planned for the cores they leave free and
followed while training, a remembered speed used only on an as-idle machine and while the cores keep
their pace, and advice that says what took the CPU. The load is given here; tests/test_busy_cpu.py
measures a real one."""

from __future__ import annotations

import dataclasses
import math

import orjson
import torch

from pipeline.config import load_config
from pipeline.plan.planner import make_plan
from pipeline.train.monitor import HardwareMonitor
from pipeline.train.performance import throughput_report
from pipeline.train.probe import _store_speed, cores_pace, remembered_speed
from pipeline.types import Speed
from tests.conftest import FAST_TRAINING, read_json
from tests.test_planner import TINY, cpu_machine, same_length
from tests.test_training_engine import history_repo


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


def test_training_follows_the_free_cores_and_records_each_change():
    # heavy: transformers' Trainer and peft, which a worker otherwise imports as a run loads them
    from pipeline.train.trainer import FollowFreeCores

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
    _store_speed("key", 560.0, 0.0, None)
    speed, _ = remembered_speed("key", 0.3, None)
    assert speed.tokens_per_s == 560.0
    speed, why = remembered_speed("key", 1.0, None)
    assert speed is None and "(560.0 tokens/s) had 0.0 cores taken by other processes, now 1.0" in why


def test_a_remembered_speed_holds_while_the_cores_keep_their_pace(tmp_path, monkeypatch):
    """The same idle cores trained 103 tokens/s one afternoon and 142 three hours later: the speed an
    earlier run measured holds as it is while the cores multiply matrices about as fast as then (two
    seconds of it vary by 30%, and training does not follow that), and is measured again beyond."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    _store_speed("key", 100.0, 0.0, 110.0)
    for pace in (85.0, 110.0, 143.0):
        speed, _ = remembered_speed("key", 0.0, pace)
        assert speed.tokens_per_s == 100.0 and speed.cores_gflops == pace
    assert speed.how.endswith(
        ", as it is: its cores' pace now (143.0 GFLOP/s, 110.0 then) within what two seconds of it vary by"
    )
    for pace in (84.0, 144.0):
        speed, why = remembered_speed("key", 0.0, pace)
        assert speed is None and "the cores ran 110.0 GFLOP/s for the speed remembered from" in why
        assert why.endswith(f"(100.0 tokens/s), now {pace}")
    _store_speed("key", 100.0, 0.0, None)  # remembered before the pace was: used as it is, and paced on
    speed, _ = remembered_speed("key", 0.0, 200.0)
    assert speed.tokens_per_s == 100.0 and speed.cores_gflops == 200.0
    assert cores_pace(1) > 0


def test_a_run_remembers_its_speed_with_its_cores_pace_and_the_next_run_measures_again_where_it_moved(
    cli, tmp_path, monkeypatch, cpu_only
):
    """The pace of the cores is a CPU's (a GPU's speed does not follow it), so the host is CPU-only; the
    threads are set and any load of other processes counts as the same here (a remembered speed is kept
    per thread count and holds only at the load it was measured at, tested above), so the suite's other
    workers do not decide it."""
    from pipeline.train import probe

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(probe, "SAME_LOAD_CORES", math.inf)
    measured: list[int] = []
    passes = Speed(1e6, "a test's passes")
    monkeypatch.setattr(probe, "training_speed", lambda *args: measured.append(1) or passes)
    repo = history_repo(tmp_path / "repo", commits=24)

    def run_at(pace: float) -> dict:
        monkeypatch.setattr(probe, "cores_pace", lambda threads: pace)
        out = tmp_path / f"at-{pace:g}"
        # 20 steps: enough to remember a speed.
        options = ("--budget", "10m", "--set", "train.epochs=1", "--set", "plan.cpu_threads=1")
        result = cli("--repo", repo.path, "--output-dir", out, *FAST_TRAINING, *options)
        assert result.code == 0, result.err
        return read_json(out / "MANIFEST.json")["training_parameters"]

    first = run_at(100.0)
    (entry,) = orjson.loads((tmp_path / "cache/repotune/speeds.json").read_bytes()).values()
    assert entry["cores_gflops"] == 100.0 and measured == [1] and first["measured_tokens_per_s"] == 1e6
    second = run_at(125.0)
    assert measured == [1] and second["measured_tokens_per_s"] == entry["tokens_per_s"]
    assert second["decisions"]["measured_tokens_per_s"]["reason"].endswith(
        ", as it is: its cores' pace now (125.0 GFLOP/s, 100.0 then) within what two seconds of it vary by"
    )
    (entry,) = orjson.loads((tmp_path / "cache/repotune/speeds.json").read_bytes()).values()
    third = run_at(200.0)
    assert measured == [1, 1] and third["measured_tokens_per_s"] == 1e6
    assert third["decisions"]["measured_tokens_per_s"]["reason"].endswith(
        f"the cores ran 125.0 GFLOP/s for the speed remembered from {entry['measured_at']} "
        f"({entry['tokens_per_s']} tokens/s), now 200.0"
    )


def test_a_run_that_trained_faster_than_planned_says_why_it_left_budget_unused():
    from types import SimpleNamespace

    from pipeline.train.trainer import budget_unused

    plan = SimpleNamespace(train_seconds=480.0, measured_tokens_per_s=123.0)  # 480 s train at 123 tokens/s
    # flask's default run: 468 s planned. The steps' speed is the plan's kind: validations left out.
    faster = {"tokens_per_s": 170.0, "step_tokens_per_s": 177.0, "processed_tokens": 57_532}
    assert budget_unused(plan, 326.0, faster) == (
        "trained in 326 s of the 480 s the time budget gives training: this machine trained 177 tokens/s "
        "where the plan rested on 123; the next run here plans with the speed it trained at"
    )
    assert budget_unused(plan, 326.0, {**faster, "step_tokens_per_s": 140.0}) is None  # within the noise
    assert budget_unused(plan, 100.0, {**faster, "processed_tokens": 17_700}) is None  # it all fitted
    assert budget_unused(SimpleNamespace(train_seconds=None, measured_tokens_per_s=None), 9.0, faster) is None


def test_the_speed_a_run_leaves_the_next_is_its_steps_without_its_validations():
    """The probe times passes and the plan fits validations beside them: a speed that counted a run's
    validations would plan the next run short (one that validated every 12 steps: 546 tokens/s, where
    its steps ran 763)."""
    from pipeline.train.trainer import TrainingHistory

    history = TrainingHistory(1000, 10, False, lambda: None)
    history.train_runtime_s, history.step_time_s, history.data_wait_s = 10.0, [1.0] * 10, [0.0] * 10
    history.blocks, history.validation_s = 8, 2.0
    plan = make_plan(same_length(20, 100), cpu_machine(2), TINY, load_config(None, []))
    report = throughput_report(history, plan, {}, 2, 1.0, 135_000_000)
    processed = 8 * plan.sequence_length
    assert report["processed_tokens"] == processed and report["validation_s"] == 2.0
    assert report["tokens_per_s"] == round(processed / 10.0, 1)
    assert report["step_tokens_per_s"] == round(processed / 8.0, 1)


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

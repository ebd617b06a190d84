"""What ML engineers expect around a run: their experiment tracker (TensorBoard, offline), a clear line
when a tracker cannot be used, progress with tokens/s, elapsed time and time left, and plain progress
lines in a log."""

from __future__ import annotations

import re

import pytest

from tests.conftest import FAST_TRAINING, GitRepo, add_features, read_json


def test_tensorboard_gets_the_curves_the_plan_and_the_manifest(cli, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    repo = add_features(GitRepo(tmp_path / "repo"))
    out = tmp_path / "out"
    result = cli(
        "--repo", repo.path, "--output-dir", out, *FAST_TRAINING,
        "--set", "train.epochs=2", "--set", "train.eval_steps=4", "--set", "train.report_to=[tensorboard]",
    )  # fmt: skip
    assert result.code == 0, result.err
    manifest = read_json(out / "MANIFEST.json")
    decision = manifest["training_parameters"]["decisions"]["report_to"]
    assert decision["value"] == ["tensorboard"] and "OUTPUT_DIR/tensorboard" in decision["reason"]
    events = EventAccumulator(str(out / "tensorboard"), size_guidance={"tensors": 0})
    events.Reload()
    logged = [event.step for event in events.Scalars("train/loss")]
    assert logged == [entry["step"] for entry in manifest["training_report"]["training"]["loss_history"]]
    evaluated = [e["step"] for e in manifest["training_report"]["evaluation"]["history"]]
    assert evaluated and [e.step for e in events.Scalars("eval/loss")] == evaluated
    texts = events.Tags()["tensors"]
    assert "repotune/plan/text_summary" in texts and "repotune/manifest/text_summary" in texts
    plan = events.Tensors("repotune/plan/text_summary")[0].tensor_proto.string_val[0].decode()
    assert "| report_to | ['tensorboard'] | cli |" in plan


def test_a_tracker_that_cannot_be_used_is_one_line(cli, sample_repo, tmp_path, monkeypatch):
    from transformers.integrations import integration_utils

    unknown = cli(
        "--repo", sample_repo.path, "--output-dir", tmp_path / "a", "--set", "train.report_to=tensorbored"
    )
    assert unknown.code == 2
    assert unknown.err.strip().startswith(
        "repotune: error: training_config.yaml: `train.report_to`: 'tensorbored' is not a tracker this transformers supports "
        "(one of: "
    )
    monkeypatch.setattr(integration_utils, "get_available_reporting_integrations", lambda: [])
    missing = cli(
        "--repo", sample_repo.path, "--output-dir", tmp_path / "b", "--set", "train.report_to=[mlflow]"
    )
    assert (missing.code, missing.err.strip()) == (
        2,
        "repotune: error: training_config.yaml: `train.report_to`: mlflow needs its package: pip install mlflow",
    )  # before any scraping: nothing was written


STEP_LINE = re.compile(
    r"^  step (\d+)/(\d+)  loss \d+\.\d{4}  lr \S+  [\d,]+ tokens/s  elapsed \S+  left \S+( \(the time budget\))?$"
)


def test_every_step_line_says_speed_elapsed_and_time_left(cli, sample_repo, tmp_path):
    result = cli(
        "--repo",
        sample_repo.path,
        "--output-dir",
        tmp_path / "out",
        *FAST_TRAINING,
        "--set",
        "train.epochs=2",
    )
    assert result.code == 0, result.err
    lines = [line for line in result.err.splitlines() if line.startswith("  step ")]
    assert lines and all(STEP_LINE.match(line) for line in lines), lines
    assert lines[-1].endswith("left 0s")


def test_progress_is_a_plain_line_now_and_then_away_from_a_terminal(monkeypatch, capsys):
    from pipeline import progress

    now = iter(range(0, 1000, 4))  # each reading of the clock is 4 s later
    monkeypatch.setattr(progress.time, "perf_counter", lambda: next(now))
    with progress.Progress("tokenizing train", 1000, "sequence") as bar:
        for _ in range(10):
            bar.update(100)
    lines = capsys.readouterr().err.splitlines()
    assert lines == [
        "tokenizing train: 300/1,000 sequences (30%) in 12s, about 28s left",
        "tokenizing train: 600/1,000 sequences (60%) in 24s, about 16s left",
        "tokenizing train: 900/1,000 sequences (90%) in 36s, about 4s left",
        "tokenizing train: 1,000/1,000 sequences (100%) in 44s",
    ]


@pytest.mark.parametrize(("seconds", "shown"), [(37, "37s"), (245, "4m05s"), (3720, "1h02m")])
def test_clock(seconds, shown):
    from pipeline.progress import clock

    assert clock(seconds) == shown


def test_a_cpu_run_says_how_much_faster_a_gpu_would_be():
    from pipeline.performance import gpu_speedup

    # smollm2-135m at 350 tokens/s on 2 cores: 0.19 TFLOP/s against an RTX 2060's 7.7.
    assert gpu_speedup(350.0, 134_515_008).startswith(
        "an RTX 2060 would train about 41× faster (estimate: 7.7 TFLOP/s, 30% of its fp16 peak, against the "
        "188 GFLOP/s reached here"
    )

"""What ML engineers expect around a run: their experiment trackers (TensorBoard, MLflow and W&B, offline,
all three at once in one run), a clear line when a tracker cannot be used, progress with tokens/s,
elapsed time and time left, and plain progress lines in a log."""

from __future__ import annotations

import json
import re
import struct
from pathlib import Path

import pytest

import run_pipeline
from tests.conftest import FAST_TRAINING, GitRepo, add_features, read_json

TRACKERS = ["tensorboard", "mlflow", "wandb"]


def mlflow_store(root: Path) -> dict[str, str]:
    """A local file store under `root` (MLflow 3 wants a database or a server by default; this is its own
    opt-in): for the run that logs to it and the client that reads it back."""
    return {"MLFLOW_TRACKING_URI": (root / "mlruns").as_uri(), "MLFLOW_ALLOW_FILE_STORE": "true"}


@pytest.fixture(scope="module")
def tracked(tmp_path_factory) -> tuple[dict, Path]:
    """One run reporting to the three trackers at once (each offline, into this fixture's folder), as a
    user who keeps more than one would: its manifest and that folder (the run's output is `out/` in it)."""
    root = tmp_path_factory.mktemp("tracked")
    repo = add_features(GitRepo(root / "repo"))
    out = root / "out"
    with pytest.MonkeyPatch.context() as patch:
        wandb = {"WANDB_MODE": "offline", "WANDB_DIR": str(root), "WANDB_SILENT": "true"}
        for name, value in {**mlflow_store(root), "MLFLOW_EXPERIMENT_NAME": "repotune", **wandb}.items():
            patch.setenv(name, value)
        argv = [
            "--repo", str(repo.path), "--output-dir", str(out), *FAST_TRAINING,
            "--set", "train.epochs=2", "--set", "train.eval_steps=4",
            "--set", f"train.report_to=[{', '.join(TRACKERS)}]",
        ]  # fmt: skip
        assert run_pipeline.main(argv) == 0
    return read_json(out / "MANIFEST.json"), root


def test_tensorboard_gets_the_curves_the_plan_and_the_manifest(tracked):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    manifest, root = tracked
    decision = manifest["training_parameters"]["decisions"]["report_to"]
    assert decision["value"] == TRACKERS and "OUTPUT_DIR/tensorboard" in decision["reason"]
    events = EventAccumulator(str(root / "out" / "tensorboard"), size_guidance={"tensors": 0})
    events.Reload()
    logged = [event.step for event in events.Scalars("train/loss")]
    assert logged == [entry["step"] for entry in manifest["training_report"]["training"]["loss_history"]]
    evaluated = [e["step"] for e in manifest["training_report"]["evaluation"]["history"]]
    assert evaluated and [e.step for e in events.Scalars("eval/loss")] == evaluated
    texts = events.Tags()["tensors"]
    assert "repotune/plan/text_summary" in texts and "repotune/manifest/text_summary" in texts
    plan = events.Tensors("repotune/plan/text_summary")[0].tensor_proto.string_val[0].decode()
    assert f"| report_to | {TRACKERS} | cli |" in plan


def test_mlflow_gets_the_params_the_loss_curve_the_plan_and_the_manifest(tracked, monkeypatch):
    from mlflow.tracking import MlflowClient

    manifest, root = tracked
    for name, value in mlflow_store(root).items():
        monkeypatch.setenv(name, value)
    client = MlflowClient()
    (run,) = client.search_runs([client.get_experiment_by_name("repotune").experiment_id])
    plan = manifest["training_parameters"]
    assert float(run.data.params["learning_rate"]) == plan["learning_rate"]
    assert int(run.data.params["per_device_train_batch_size"]) == plan["batch_size"]
    logged = client.get_metric_history(run.info.run_id, "loss")
    history = manifest["training_report"]["training"]["loss_history"]
    assert [(m.step, round(m.value, 4)) for m in logged] == [
        (e["step"], round(e["loss"], 4)) for e in history
    ]
    assert {a.path for a in client.list_artifacts(run.info.run_id, "repotune")} == {
        "repotune/plan.json",
        "repotune/MANIFEST.json",
    }
    attached = json.loads(Path(client.download_artifacts(run.info.run_id, "repotune/plan.json")).read_text())
    assert attached["report_to"] == manifest["training_parameters"]["decisions"]["report_to"]
    assert attached["report_to"]["value"] == TRACKERS


def wandb_records(run_file: Path):
    """The records of an offline W&B run file: its header, then LevelDB-log chunks (7-byte headers:
    crc32, length, type) in 32 KiB blocks, each record a protobuf `Record`. wandb itself reads these only
    when it syncs them to a server."""
    from wandb.proto import wandb_internal_pb2

    data, position, pending, records = run_file.read_bytes(), 7, b"", []
    while position + 7 <= len(data):
        if 32768 - position % 32768 < 7:  # a block's tail too short for a header is padding
            position += 32768 - position % 32768
            continue
        _, length, kind = struct.unpack("<IHB", data[position : position + 7])
        chunk, position = data[position + 7 : position + 7 + length], position + 7 + length
        if kind in (1, 4):  # a whole record, or the last piece of one
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending + chunk)
            records.append(record)
            pending = b""
        elif kind in (2, 3):
            pending += chunk
    return records


def test_wandb_offline_gets_the_loss_curve_the_plan_and_the_manifest(tracked):
    manifest, root = tracked
    (run,) = (root / "wandb").glob("offline-run-*")
    assert (run / "files" / "MANIFEST.json").exists()
    records = wandb_records(next(run.glob("run-*.wandb")))
    losses = [
        {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}
        for record in records
        if record.WhichOneof("record_type") == "history"
    ]
    logged = [
        (row["train/global_step"], round(row["train/loss"], 4)) for row in losses if "train/loss" in row
    ]
    history = manifest["training_report"]["training"]["loss_history"]
    assert logged == [(entry["step"], round(entry["loss"], 4)) for entry in history]
    config = {
        item.key or "/".join(item.nested_key)
        for record in records
        if record.WhichOneof("record_type") == "config"
        for item in record.config.update
    }
    assert "repotune" in config and "learning_rate" in config


def test_a_tracker_that_fails_while_training_is_one_line(cli, sample_repo, tmp_path, monkeypatch):
    import mlflow
    from mlflow.exceptions import MlflowException

    def unreachable(*args, **kwargs):  # what an unreachable tracking server or an unsupported URI gives
        raise MlflowException("API request to http://mlflow.internal:5000 failed: connection refused")

    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://mlflow.internal:5000")
    monkeypatch.setattr(mlflow, "start_run", unreachable)
    out = tmp_path / "out"
    result = cli("--repo", sample_repo.path, "--output-dir", out, "--set", "train.report_to=[mlflow]")
    assert result.code == 1
    assert result.err.strip().splitlines()[-1] == (
        "repotune: error: `train.report_to`: mlflow failed when training began or logged: MlflowException: "
        "API request to http://mlflow.internal:5000 failed: connection refused (fix the tracker's own settings, "
        "e.g. its environment variables, or leave it out of train.report_to)"
    )
    manifest = read_json(out / "MANIFEST.json")
    assert manifest["status"] == "failed" and "mlflow failed" in manifest["error"]


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


def test_progress_keeps_coming_while_nothing_more_is_counted(monkeypatch, capsys):
    """Answers are written after their prompts were read and counted: the line still comes, and once
    every prompt is counted it says the step is finishing, not a time left that has already run out."""
    from pipeline import progress

    now = iter(range(0, 1000, 6))  # each reading of the clock is 6 s later
    monkeypatch.setattr(progress.time, "perf_counter", lambda: next(now))
    with progress.Progress("the base model answering", 4, "question") as bar:
        for count in (2, 0, 2, 0, 0):
            bar.update(count)
    assert capsys.readouterr().err.splitlines() == [
        "the base model answering: 2/4 questions (50%) in 12s, about 12s left",
        "the base model answering: 4/4 questions (100%) in 24s, finishing",
        "the base model answering: 4/4 questions (100%) in 36s",
    ]


def test_prompts_read_shortest_first_reckon_the_time_left_from_their_tokens(monkeypatch, capsys):
    """Three of four questions read are 40% of their tokens: the time left is what the tokens say (the
    questions would say 3 s), and the line says the share is of their tokens."""
    from pipeline import progress

    now = iter(range(0, 1000, 5))  # each reading of the clock is 5 s later
    monkeypatch.setattr(progress.time, "perf_counter", lambda: next(now))
    with progress.Progress("the base model answering", 4, "question", tokens=1000) as bar:
        for count, tokens in ((2, 100), (1, 300), (0, 0), (1, 600)):
            bar.update(count, tokens)
    assert capsys.readouterr().err.splitlines() == [
        "the base model answering: 3/4 questions (40% of their tokens) in 10s, about 15s left",
        "the base model answering: 4/4 questions (100% of their tokens) in 25s",
    ]


@pytest.mark.parametrize(("seconds", "shown"), [(37, "37s"), (245, "4m05s"), (3720, "1h02m")])
def test_clock(seconds, shown):
    from pipeline.progress import clock

    assert clock(seconds) == shown


def test_a_cpu_run_says_how_much_faster_a_gpu_would_be():
    from pipeline.train.performance import gpu_speedup

    # smollm2-135m at 350 tokens/s on 2 cores: 0.19 TFLOP/s against an RTX 2060's 7.7.
    assert gpu_speedup(350.0, 134_515_008).startswith(
        "an RTX 2060 would train about 41× faster (estimate: 7.7 TFLOP/s, 30% of its fp16 peak, against the "
        "188 GFLOP/s reached here"
    )


@pytest.mark.parametrize(("runtime_s", "compile_advised"), [(31.0, False), (3600.0, True)])
def test_a_half_idle_gpu_is_told_to_compile_only_where_a_long_run_repays_it(runtime_s, compile_advised):
    import dataclasses

    from pipeline.config import load_config
    from pipeline.plan.planner import make_plan
    from pipeline.train.performance import throughput_report
    from pipeline.train.trainer import TrainingHistory
    from tests.test_planner import TINY, gpu_machine, same_length

    history = TrainingHistory(1000, 10, False, lambda: None)
    history.train_runtime_s, history.step_time_s, history.data_wait_s = runtime_s, [0.3] * 10, [0.0] * 10
    plan = make_plan(same_length(20, 100), gpu_machine(80.0), TINY, load_config(None, []))
    monitor = {"summary": {"gpus": [{"utilization_pct": {"mean": 52.0}}]}}
    suggestion = throughput_report(history, plan, monitor, 16, 1.0, 494_000_000)["suggestion"]
    assert suggestion.startswith(
        f"GPU utilisation averages 52% with little data wait: raise plan.batch_size above {plan.batch_size} "
        "(or keep plan.batch_probe on)"
    )
    assert ("train.torch_compile=true with plan.drop_last=true" in suggestion) is compile_advised
    compiled = dataclasses.replace(plan, torch_compile=True)
    assert (
        "torch_compile"
        not in throughput_report(history, compiled, monitor, 16, 1.0, 494_000_000)["suggestion"]
    )

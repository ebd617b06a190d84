"""The training engine: token cache, evaluation, interruption and faults, using the result."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest
import torch

from pipeline.train.model import STAMP_FILE
from tests.conftest import FAST_TRAINING, PRETRAINED, WITH_FILES, GitRepo, module_source, read_json

ROOT = Path(__file__).resolve().parent.parent


def history_repo(path: Path, commits: int = 30) -> GitRepo:
    """Enough commits for a held-out split (20 or more kept commits hold out at least one)."""
    repo = GitRepo(path)
    for index in range(1, commits + 1):
        repo.commit(
            f"Add compute_{index} and describe_{index}", {f"pkg/feature_{index}.py": module_source(index)}
        )
    return repo


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory):
    import run_pipeline

    base = tmp_path_factory.mktemp("engine")
    repo = history_repo(base / "repo")
    out = base / "out"
    # A step a commit, not two: generate's answer below is text (at half the steps it wrote blank lines).
    argv = ["--repo", str(repo.path), "--output-dir", str(out), *FAST_TRAINING, *WITH_FILES]
    assert run_pipeline.main([*argv, "--set", "plan.batch_size=1"]) == 0
    return repo, out, read_json(out / "MANIFEST.json")


def test_held_out_loss_falls_and_samples_are_recorded(trained_run):
    _, _, manifest = trained_run
    evaluation = manifest["training_report"]["evaluation"]
    assert evaluation["note"] is None
    before, after = evaluation["before"], evaluation["after"]
    assert after["loss"] < before["loss"] - 0.5
    assert evaluation["relative_change"] == pytest.approx(
        (after["loss"] - before["loss"]) / before["loss"], abs=1e-5
    )
    assert after["perplexity"] < before["perplexity"]
    assert before["blocks"] == after["blocks"] >= 1
    history, total = evaluation["history"], manifest["training_parameters"]["total_steps"]
    kept = manifest["training_report"]["training"]["kept"]
    # The last step trained: the planned total, unless validation stopped training early (on a GPU, whose
    # plan validates more often, it did: step 56 of 78 on an H100).
    last = kept["stopped_early"]["step"] if kept["stopped_early"] else total
    # Validation loss during training (the validation commits, never the held-out ones), the last step too:
    assert history and all(1 <= entry["step"] <= last for entry in history) and history[-1]["step"] == last
    assert manifest["training_report"]["training"]["global_step"] == last == kept["last_step"]
    best = min(history, key=lambda entry: entry["loss"])
    assert (kept["step"], kept["validation_loss"]) == (best["step"], best["loss"])
    assert kept["kept"] == ("last" if best["step"] == last else "best")
    # Their time is counted apart: the speed the next run plans with is the steps' alone.
    throughput = manifest["training_report"]["throughput"]
    assert 0 < throughput["validation_s"] < manifest["timings"]["train_s"]
    assert throughput["step_tokens_per_s"] > throughput["tokens_per_s"]
    samples = evaluation["samples"]
    # Three held-out commits (10% of 30), each asked its message from its diff and lines it added, the
    # file before each given alone and after other files' chunks.
    tasks = [sample["task"] for sample in samples["after"]]
    assert tasks[:3] == ["message"] * 3 and set(tasks[3:]) == {"code", "code_context"}
    message, code = samples["after"][0], samples["after"][3]
    assert message["reference"] == "Add compute_30 and describe_30"
    assert message["prompt"].startswith("diff --git a/pkg/feature_30.py")
    assert code["commit"] == message["commit"] and code["reference"] in module_source(30)
    assert code["prompt"].startswith("pkg/feature_30.py\n") and "@@" not in code["prompt"]
    scored = evaluation["tasks"]["after"]
    assert scored["message"]["samples"] == 3
    assert scored["code"]["samples"] == scored["code_context"]["samples"] and scored["code"]["commits"] == 3


def test_packing_throughput_and_bottleneck_are_reported(trained_run):
    _, _, manifest = trained_run
    dataset = manifest["dataset"]
    assert 0.5 < dataset["packing_efficiency"] <= 1
    assert "position_ids restart per sequence" in dataset["packing_method"]
    assert dataset["cache"]["hit"] is False and len(dataset["cache"]["key"]) == 20
    throughput = manifest["training_report"]["throughput"]
    assert throughput["tokens_per_s"] > 0 and throughput["samples_per_s"] > 0
    # cpu-shared when something else on this machine took a share of the CPU meanwhile (CI runners do)
    assert throughput["bottleneck"] in ("data-bound", "compute-bound", "cpu-shared")
    assert throughput["suggestion"]
    assert 0 <= throughput["data_wait_share_pct"] <= 100
    # The monitor's own cost is reported; how small it is is measured, not asserted here: this run samples
    # every 0.5 s beside the suite's other workers (5.3% once, 3 workers on 2 cores), a real run every 5 s
    # (0.08% of the default 10 minutes on psf/requests).
    assert 0 < throughput["monitor_overhead_pct"] < 100
    assert throughput["step_time_s"]["mean"] > 0


def test_generate_and_merge_use_the_saved_adapter(cli, trained_run, tmp_path):
    _, out, _ = trained_run
    result = cli(
        "generate",
        "--adapter",
        out,
        "--prompt",
        "Add compute_31 and describe_31\n\n",
        "--max-new-tokens",
        "12",
    )
    assert result.code == 0, result.err
    assert result.out.strip()
    merged = tmp_path / "merged"
    assert cli("generate", "--adapter", out / "adapter", "--merge", merged).code == 0
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(merged)
    assert not any("lora" in name for name, _ in model.named_parameters())


def test_generate_with_an_empty_prompt_is_one_line(cli, trained_run):
    _, out, _ = trained_run
    result = cli("generate", "--adapter", out, "--prompt", " \n")
    assert result.code == 2
    assert (
        result.err.strip()
        .splitlines()[-1]
        .endswith("--prompt is empty: give the model text to continue (or - to read it from stdin)")
    )
    # A commit message for nothing staged: the past would have answered with whatever it ranks first.
    message = cli("generate", "--adapter", out, "--task", "message", "--prompt", "")
    assert message.code == 2 and message.err.count("\n") == 1
    assert message.err.startswith("repotune: error: --prompt is empty: give the diff to write a message for")


def test_generate_without_an_adapter_is_one_line(cli, tmp_path):
    result = cli("generate", "--adapter", tmp_path, "--prompt", "x")
    assert result.code == 2
    assert "no adapter_config.json there" in result.err.strip().splitlines()[-1]


def test_second_run_hits_the_token_cache_and_a_change_misses_it(cli, tmp_path):
    repo = history_repo(tmp_path / "repo", commits=8)
    out = tmp_path / "out"
    assert cli("plan", "--repo", repo.path, "--output-dir", out).code == 0
    first = read_json(out / "MANIFEST.json")["dataset"]["cache"]
    assert cli("plan", "--repo", repo.path, "--output-dir", out).code == 0
    second = read_json(out / "MANIFEST.json")["dataset"]["cache"]
    assert (first["hit"], second["hit"], second["key"]) == (False, True, first["key"])
    assert cli("plan", "--repo", repo.path, "--output-dir", out, "--set", "scrape.format=diff").code == 0
    third = read_json(out / "MANIFEST.json")["dataset"]["cache"]
    assert third["hit"] is False and third["key"] != first["key"]


@pytest.fixture(scope="module")
def small_pretrained(tmp_path_factory) -> Path:
    """A model directory as a user's own would be: the built-in model's tokenizer, so that a run tokenizes
    as a pretrained model's does, in front of tiny's random weights, so that its training takes a second."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from pipeline.base_models import TINY, load_pretrained, model_config

    tokenizer = load_pretrained(AutoTokenizer, PRETRAINED)
    directory = tmp_path_factory.mktemp("small-pretrained") / "model"
    AutoModelForCausalLM.from_config(model_config(TINY, tokenizer)).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def test_a_budget_tokenizes_the_newest_history_it_can_train_and_the_rest_only_when_it_trains_more(
    cli, tmp_path, monkeypatch, small_pretrained
):
    """A first run on a long history tokenized all of it (pytest's 23,478 sequences: 1 to 2 minutes on 2
    cores) to train the newest 146; it now tokenizes ahead of the budget, and all when the speed measured
    reaches past that. The speed is the seam: how fast this machine trains decides which path a run takes."""
    from pipeline.plan import planner
    from pipeline.train import probe
    from pipeline.types import Speed

    repo = history_repo(tmp_path / "repo", commits=16)
    monkeypatch.setattr(planner, "AHEAD_TOKENS_PER_S", 5)  # 240 tokens for a 1-minute budget: a few sequences
    monkeypatch.setattr(probe, "remembered_speed", lambda *args: (None, ""))
    monkeypatch.setattr("pipeline.recipes.run.remember_speed", lambda *args: None)  # where the run calls it
    options = (
        "--repo", repo.path, "--model", small_pretrained, "--budget", "1m", "--set", "train.epochs=1",
        "--set", "train.max_sequence_length=64", "--set", "eval.samples=0", "--set", "eval.max_blocks=1",
        "--set", "eval.message_tokens=4", "--set", "scrape.format=message", "--set", "scrape.eval_commits=1",
        "--set", "scrape.valid_commits=0", "--set", "scrape.files=false", "--set", "eval.code_cases=0",
    )  # fmt: skip

    def run_at(tokens_per_s: float, out: Path):
        monkeypatch.setattr(
            probe, "training_speed", lambda *args: Speed(tokens_per_s, "a test's measurement")
        )
        result = cli(*options, "--output-dir", out)
        assert result.code == 0, result.err
        return result, read_json(out / "MANIFEST.json")

    slow, manifest = run_at(1.0, tmp_path / "slow")  # one block fits: the newest sequence
    dataset, total = manifest["dataset"], manifest["scrape"]["split"]["train_sequences"]
    tokenized = int(Path(dataset["cache"]["dir"]).name.rsplit("-newest", 1)[1])
    assert 1 <= tokenized < total and dataset["train_sequences"] == total
    assert dataset["cache"]["dir"].endswith(f"tokens-{dataset['cache']['key']}-newest{tokenized}")
    assert dataset["estimate"].startswith(f"the newest {tokenized} of {total} training sequences tokenized")
    assert f"token statistics: the newest {tokenized} of {total}" in slow.err
    assert manifest["training_parameters"]["train_sequences"] == 1
    assert dataset["left_out"]["sequences"] == total - 1 and "tokenize_rest_s" not in manifest["timings"]
    # Training is planned for what the minute leaves once the run spent what came before it: less than 80%.
    params = manifest["training_parameters"]
    assert params["train_seconds"] < 0.8 * 60
    assert "the 60 s budget leaves after" in params["decisions"]["train_seconds"]["reason"]

    monkeypatch.setattr(planner, "AHEAD_TOKENS_PER_S", 1)  # a shorter budget: the longer one's entry holds it
    shorter = run_at(1.0, tmp_path / "slow")[1]["dataset"]["cache"]  # again, as a user would
    assert shorter["hit"] and shorter["dir"] == dataset["cache"]["dir"]
    monkeypatch.setattr(planner, "AHEAD_TOKENS_PER_S", 5)

    fast, manifest = run_at(1e6, tmp_path / "fast")  # everything fits: the rest is tokenized, then trained
    dataset = manifest["dataset"]
    assert f"the budget trains more than the newest {tokenized} sequences: tokenizing the rest" in fast.err
    assert manifest["timings"]["tokenize_rest_s"] > 0 and dataset["estimate"] is None
    assert dataset["cache"]["dir"].endswith(f"tokens-{dataset['cache']['key']}")
    assert manifest["training_parameters"]["train_sequences"] == dataset["train_sequences"] == total
    assert dataset["left_out"] is None


def test_nan_loss_stops_the_run_with_its_step(cli, tmp_path):
    repo = history_repo(tmp_path / "repo", commits=6)
    out = tmp_path / "out"
    result = cli(
        "--repo", repo.path, "--output-dir", out, *FAST_TRAINING, "--set", "train.learning_rate=1e30"
    )
    assert result.code == 1
    line = result.err.strip().splitlines()[-1]
    assert (
        line.startswith("repotune: error: the loss became nan at step ")
        and "lower train.learning_rate" in line
    )
    manifest = read_json(out / "MANIFEST.json")
    assert manifest["status"] == "failed"
    assert manifest["training_report"]["training"]["diverged"]["step"] >= 1


def test_cuda_out_of_memory_halves_the_micro_batch_and_keeps_the_effective_batch(cli, tmp_path, monkeypatch):
    """No GPU here: the seam is the training step, which runs out of memory above micro-batch 1."""
    from pipeline.train.trainer import RepotuneTrainer

    real_step = RepotuneTrainer.training_step

    def step(self, model, inputs, *args, **kwargs):
        if len(inputs["input_ids"]) > 1:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real_step(self, model, inputs, *args, **kwargs)

    monkeypatch.setattr(RepotuneTrainer, "training_step", step)
    repo = history_repo(tmp_path / "repo", commits=6)
    out = tmp_path / "out"
    options = [
        "--set",
        "plan.batch_size=4",
        "--set",
        "plan.gradient_accumulation_steps=1",
        "--set",
        "train.max_sequence_length=128",
    ]
    result = cli("--repo", repo.path, "--output-dir", out, *options)
    assert result.code == 0, result.err
    params = read_json(out / "MANIFEST.json")["training_parameters"]
    assert [retry["batch_size"] for retry in params["oom_retries"]] == [4, 2]
    assert (params["batch_size"], params["gradient_accumulation_steps"], params["effective_batch_size"]) == (
        1,
        4,
        4,
    )
    assert (
        params["decisions"]["batch_size"]["reason"]
        == "capped at 1: CUDA ran out of memory at larger micro-batches (planned 4)"
    )
    assert (
        read_json(out / "MANIFEST.json")["training_report"]["training"]["global_step"]
        == params["total_steps"]
    )
    # Planned again with what the first plan was fitted to: the time the budget left training.
    assert "the 600 s budget leaves after" in params["decisions"]["train_seconds"]["reason"]


def test_out_of_memory_at_micro_batch_1_gives_up_clearly(cli, tmp_path, monkeypatch):
    from pipeline.train.trainer import RepotuneTrainer

    def step(self, model, inputs, *args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory")

    monkeypatch.setattr(RepotuneTrainer, "training_step", step)
    repo = history_repo(tmp_path / "repo", commits=4)
    result = cli("--repo", repo.path, "--output-dir", tmp_path / "out", *FAST_TRAINING)
    assert result.code == 1
    assert "out of memory even at micro-batch 1" in result.err.strip().splitlines()[-1]


# Interruption: the real CLI in a subprocess, killed or signalled mid-training.
SLOW_TRAINING = [
    *FAST_TRAINING,
    "--set", "train.epochs=3",
    "--set", "train.save_steps=5",
    "--set", "train.save_total_limit=3",
]  # fmt: skip


def start_run(repo: GitRepo, out: Path, *args: str, **popen: Any) -> subprocess.Popen:
    return subprocess.Popen(
        [
            sys.executable,
            ROOT / "run_pipeline.py",
            "--repo",
            repo.path,
            "--output-dir",
            out,
            *SLOW_TRAINING,
            *args,
        ],
        cwd=ROOT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        **{"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, **popen},
    )


def wait_for_checkpoint(
    out: Path, process: subprocess.Popen, timeout_s: float = 120, said: Callable[[], bytes] | None = None
) -> None:
    """Until the run's first checkpoint is complete; `said`: what the run wrote so far, where it does not
    write to its stderr pipe."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if any((path / STAMP_FILE).exists() for path in (out / "checkpoints").glob("checkpoint-*")):
            return
        assert process.poll() is None, (said() if said else process.stderr.read()).decode()
        time.sleep(0.05)
    raise AssertionError("no checkpoint appeared")


def test_kill_9_then_resume_completes_the_same_run(cli, tmp_path):
    repo = history_repo(tmp_path / "repo", commits=8)
    out = tmp_path / "out"
    process = start_run(repo, out)
    wait_for_checkpoint(out, process)
    process.send_signal(signal.SIGKILL)
    process.wait()
    killed = read_json(out / "MANIFEST.json")  # still parses: every write was atomic
    assert killed["status"] == "running"
    total = killed["training_parameters"]["total_steps"]
    saved = max(int(path.name.split("-")[1]) for path in (out / "checkpoints").glob("checkpoint-*"))
    assert saved < total
    # The resume in this process: what had to be a process of its own is the run killed.
    resumed = cli("--repo", repo.path, "--output-dir", out, *SLOW_TRAINING, "--resume")
    assert resumed.code == 0, resumed.err
    assert f"resuming from {out / 'checkpoints'}" in resumed.err
    assert f"was still `running` but its process ({killed['run']['pid']}) is gone" in resumed.err
    manifest = read_json(out / "MANIFEST.json")
    assert manifest["run"]["replaced"] == {
        "id": killed["run"]["id"], "pid": killed["run"]["pid"], "started_at": killed["run"]["started_at"]
    }  # fmt: skip
    assert manifest["status"] == "completed"
    assert manifest["training_report"]["training"]["global_step"] == total
    assert manifest["run"]["resumed_from"].startswith("checkpoint-")
    steps = [entry["step"] for entry in manifest["training_report"]["learning_rate"]["history"]]
    assert steps[0] == 1 and steps[-1] == total  # the history before the kill is kept


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_saves_a_checkpoint_and_marks_the_run_interrupted(cli, tmp_path, monkeypatch, signum, code):
    """The signal reaches the run's own process (this one) once its first checkpoint is complete, as Ctrl-C
    or `kill PID` from another terminal would; a run killed with -9 is the test above's real process."""
    from pipeline.train.trainer import CheckpointStamp

    stamped = CheckpointStamp.on_save

    def then_signalled(self, *args, **kwargs):
        stamped(self, *args, **kwargs)
        monkeypatch.setattr(CheckpointStamp, "on_save", stamped)  # once
        os.kill(os.getpid(), signum)

    monkeypatch.setattr(CheckpointStamp, "on_save", then_signalled)
    repo = history_repo(tmp_path / "repo", commits=8)
    out = tmp_path / "out"
    result = cli("--repo", repo.path, "--output-dir", out, *SLOW_TRAINING)
    assert result.code == code, result.err
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # the run's handlers are gone
    last = result.err.strip().splitlines()[-1]
    assert last.startswith(f"repotune: error: interrupted by {signal.Signals(signum).name} at step ")
    assert "--resume" in last
    manifest = read_json(out / "MANIFEST.json")
    assert manifest["status"] == "interrupted"
    step = int(last.split(" at step ")[1].split(";")[0])
    assert (out / "checkpoints" / f"checkpoint-{step}" / "trainer_state.json").exists()
    # The record agrees with the message, and its figures are what really ran.
    assert (
        manifest["run"]["current_step"]
        == step
        == manifest["training_report"]["training"]["loss_history"][-1]["step"]
    )
    assert manifest["run"]["stage"] == "train"
    throughput = manifest["training_report"]["throughput"]
    assert throughput["tokens_per_s"] > 0 and throughput["processed_tokens"] > 0
    total = manifest["training_parameters"]["total_steps"]
    for epoch in manifest["training_report"]["training"]["epoch_summaries"]:
        assert epoch["tokens"] <= manifest["dataset"]["real_tokens"]
    assert step < total


def test_a_sigterm_to_every_process_of_the_run_saves_a_checkpoint_with_data_loader_workers(tmp_path):
    """`timeout`, `kill -- -PGID`, systemd and Slurm signal the run's data-loader workers with it: they leave
    the signal to the run, which stops as it does signalled alone (torch's workers died of it, and the
    run ended in an internal error without a checkpoint), then ends them."""
    repo = history_repo(tmp_path / "repo", commits=8)
    out = tmp_path / "out"
    process = start_run(repo, out, "--set", "plan.num_workers=1", start_new_session=True)
    wait_for_checkpoint(out, process)
    workers = psutil.Process(process.pid).children()
    assert workers  # the loader's
    os.killpg(process.pid, signal.SIGTERM)
    _, err = process.communicate(timeout=120)
    assert process.returncode == 143, err.decode()
    assert (
        err.decode().strip().splitlines()[-1].startswith("repotune: error: interrupted by SIGTERM at step ")
    )
    assert read_json(out / "MANIFEST.json")["status"] == "interrupted"
    assert not any(worker.is_running() and worker.status() != psutil.STATUS_ZOMBIE for worker in workers)


def test_a_closed_terminal_stops_the_run_as_sigterm_does_and_the_manifest_says_so(tmp_path):
    """A terminal closed under a run (an SSH session dropped) sends SIGHUP to every process of the run, and
    takes no more writes (EIO): the run stops as at SIGTERM, saying it to nobody, and its manifest and
    checkpoint say so (SIGHUP ended it at once, the manifest still `running`)."""
    repo = history_repo(tmp_path / "repo", commits=8)
    out = tmp_path / "out"
    terminal, seat = os.openpty()
    process = start_run(
        repo, out, "--set", "plan.num_workers=1", start_new_session=True, stdout=seat, stderr=seat
    )
    os.close(seat)
    os.set_blocking(terminal, False)
    shown = bytearray()

    def said() -> bytes:
        """What the terminal showed so far (a pty that nobody reads fills, and blocks its writer)."""
        with contextlib.suppress(BlockingIOError):
            while chunk := os.read(terminal, 1 << 16):
                shown.extend(chunk)
        return bytes(shown)

    wait_for_checkpoint(out, process, said=said)
    said()
    assert b"training" in shown
    workers = psutil.Process(process.pid).children()
    assert workers  # the loader's
    os.close(terminal)  # the terminal is gone: the run's writes to it fail from now on
    os.killpg(process.pid, signal.SIGHUP)
    assert process.wait(timeout=120) == 129
    manifest = read_json(out / "MANIFEST.json")
    assert manifest["status"] == "interrupted"
    assert manifest["error"].startswith("interrupted by SIGHUP at step ") and "--resume" in manifest["error"]
    step = manifest["run"]["current_step"]
    assert (out / "checkpoints" / f"checkpoint-{step}" / STAMP_FILE).exists()
    assert not any(worker.is_running() and worker.status() != psutil.STATUS_ZOMBIE for worker in workers)


def test_a_run_started_with_nohup_leaves_sighup_ignored():
    from pipeline.signals import stop_signals

    assert signal.SIGHUP in stop_signals()
    previous = signal.signal(signal.SIGHUP, signal.SIG_IGN)  # as `nohup` starts it
    try:
        assert stop_signals() == (signal.SIGINT, signal.SIGTERM)
    finally:
        signal.signal(signal.SIGHUP, previous)


def test_a_run_that_exits_holding_workers_that_ignore_sigterm_ends_them_quietly():
    """Python's multiprocessing stops a process's daemonic workers at its exit with a SIGTERM, which the
    loader's workers now ignore: a loader whose iterator outlives training would keep the run waiting."""
    holding = (
        "import torch.utils.data as data\n"
        "from pipeline.train.workers import leaving_signals_to_the_run\n"
        "loader = data.DataLoader(list(range(8)), num_workers=1, persistent_workers=True,\n"
        "    worker_init_fn=leaving_signals_to_the_run(None))\n"
        "HELD = iter(loader)\n"
        "next(HELD)\n"
    )
    ended = subprocess.run(
        [sys.executable, "-c", holding], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert (ended.returncode, ended.stderr) == (0, "")


def test_resume_refuses_a_checkpoint_from_other_data(cli, tmp_path):
    repo = history_repo(tmp_path / "repo", commits=6)
    out = tmp_path / "out"
    assert cli("--repo", repo.path, "--output-dir", out, *FAST_TRAINING).code == 0
    repo.commit("Add compute_99", {"pkg/feature_99.py": module_source(99)})
    result = cli("--repo", repo.path, "--output-dir", out, *FAST_TRAINING, "--resume")
    assert result.code == 2
    assert "--resume: the training data changed since checkpoint-" in result.err.strip().splitlines()[-1]


def test_resume_without_a_checkpoint_is_one_line(cli, tmp_path):
    repo = history_repo(tmp_path / "repo", commits=4)
    result = cli("--repo", repo.path, "--output-dir", tmp_path / "out", *FAST_TRAINING, "--resume")
    assert result.code == 2
    assert "--resume: no checkpoint in" in result.err.strip().splitlines()[-1]


def test_resume_passes_over_a_checkpoint_killed_while_saving(tmp_path):
    from pipeline.train.trainer import STAMP_FILE, resumable_checkpoint

    stamp = {"dataset_fingerprint": "d", "effective_batch_size": 4, "total_steps": 20}
    complete, cut_off = tmp_path / "checkpoint-5", tmp_path / "checkpoint-10"
    for checkpoint in (complete, cut_off):
        checkpoint.mkdir()
        (checkpoint / "trainer_state.json").write_text('{"log_history": []}')
    # Only the older one got repotune's stamp: the Trainer's own files came first, then the kill.
    (complete / STAMP_FILE).write_text(
        '{"dataset_fingerprint": "d", "effective_batch_size": 4, "total_steps": 20}'
    )
    assert resumable_checkpoint(tmp_path, stamp) == complete

"""Every record tells the truth: a signal in any stage ends the run as `interrupted` with the stage and
what the next run can reuse, and a manifest left `running` by a process that is gone is said to be so."""

from __future__ import annotations

import os
import signal
import subprocess

import orjson
import pytest

from tests.conftest import FAST_TRAINING, read_json


def test_a_signal_before_training_names_the_stage_and_what_is_kept(cli, sample_repo, tmp_path, monkeypatch):
    from pipeline.recipes import run

    def terminated(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)  # as `kill PID` from another terminal

    monkeypatch.setattr(run, "machine", terminated)
    out = tmp_path / "out"
    result = cli("--repo", sample_repo.path, "--output-dir", out, *FAST_TRAINING)
    assert result.code == 143
    assert result.err.strip().splitlines()[-1] == (
        "repotune: error: interrupted by SIGTERM during detect; kept: the scrape (reused by the next run on the "
        "same HEADs and config)"
    )  # (the machine is detected before tokenizing: how much to tokenize depends on it)
    manifest = read_json(out / "MANIFEST.json")
    assert (manifest["status"], manifest["run"]["stage"]) == ("interrupted", "detect")
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # the handler is the run's only
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_signal_after_training_offers_its_checkpoint_and_resume_scores_it(
    cli, sample_repo, tmp_path, monkeypatch
):
    from pipeline.evaluate import scoreboard

    score_past = scoreboard.score_past

    def terminated(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(scoreboard, "score_past", terminated)
    out = tmp_path / "out"
    result = cli("--repo", sample_repo.path, "--output-dir", out, *FAST_TRAINING)
    assert result.code == 143
    newest = max((out / "checkpoints").glob("checkpoint-*"), key=lambda path: int(path.name.split("-")[1]))
    assert (
        result.err.strip()
        .splitlines()[-1]
        .endswith(
            f"during evaluate_past; kept: the scrape (reused by the next run on the same HEADs and config), the token "
            f"cache, the converted model, the trained model's last checkpoint ({newest.name}: run the same command "
            "with --resume to start from it instead of training again)"
        )
    )
    monkeypatch.setattr(scoreboard, "score_past", score_past)
    resumed = cli("--repo", sample_repo.path, "--output-dir", out, *FAST_TRAINING, "--resume")
    assert resumed.code == 0, resumed.err
    manifest = read_json(out / "MANIFEST.json")
    assert manifest["status"] == "completed"
    assert manifest["run"]["resumed_from"].endswith(newest.name)


def test_a_running_manifest_whose_process_is_gone_is_said_to_be(cli, sample_repo, tmp_path):
    out = tmp_path / "out"
    assert cli("scrape", "--repo", sample_repo.path, "--output-dir", out).code == 0
    gone = subprocess.Popen(["true"])
    gone.wait()  # a pid that no longer runs
    manifest = orjson.loads((out / "MANIFEST.json").read_bytes())
    manifest["status"] = manifest["run"]["status"] = "running"
    manifest["run"]["pid"] = gone.pid
    (out / "MANIFEST.json").write_bytes(orjson.dumps(manifest))
    again = cli("scrape", "--repo", sample_repo.path, "--output-dir", out)
    assert again.code == 0
    assert f"was still `running` but its process ({gone.pid}) is gone" in again.err
    assert read_json(out / "MANIFEST.json")["run"]["replaced"]["pid"] == gone.pid


def test_generate_offers_the_checkpoint_of_a_run_that_did_not_finish(cli, sample_repo, tmp_path):
    import shutil
    import time

    out = tmp_path / "out"
    trained = cli(
        "--repo", sample_repo.path, "--output-dir", out, *FAST_TRAINING, "--set", "train.save_steps=4"
    )
    assert trained.code == 0, trained.err
    shutil.rmtree(out / "adapter")  # as a run stopped before saving it leaves the directory
    started = time.perf_counter()
    offered = cli("generate", "--adapter", out, "--prompt", "def ")
    assert offered.code == 2 and time.perf_counter() - started < 5  # said before any model loads
    newest = max((out / "checkpoints").glob("checkpoint-*"), key=lambda path: int(path.name.split("-")[1]))
    assert offered.err.strip() == (
        f"repotune: error: --adapter {out}: no adapter/ (the run did not finish), but its newest checkpoint "
        f"has one: --adapter {newest}"
    )
    used = cli("generate", "--adapter", newest, "--prompt", "def ", "--max-new-tokens", "4")
    assert used.code == 0, used.err
    assert (newest / "repotune.json").exists() and (newest / "tokenizer.json").exists()


CHECK_HELP = """
import contextlib, io, json, runpy, sys
printed = []
for argv in json.loads(sys.argv[1]):
    sys.argv = argv
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            runpy.run_path(argv[0], run_name="__main__")
    except SystemExit as stop:
        assert stop.code in (0, None), (argv, stop.code)
    heavy = sorted(name for name in ("torch", "transformers", "datasets", "peft") if name in sys.modules)
    assert not heavy, f"{' '.join(argv)} imported {heavy}"
    printed.append(out.getvalue())
print(json.dumps(printed))
"""


def test_every_help_answers_without_importing_torch():
    """Every help, one after another in one fresh process (a process each cost 8 s of the suite's CPU): what
    one imports stays imported, so the first help that imports torch is the one named."""
    import json
    import sys
    from pathlib import Path

    import run_pipeline

    root = Path(__file__).resolve().parent.parent
    commands = [["run_pipeline.py", "--help"]] + [
        ["run_pipeline.py", name, "--help"] for name in run_pipeline.COMMANDS
    ]
    benchmarks = [
        [str(path.relative_to(root)), "--help"] for path in sorted((root / "benchmarks").glob("bench_*.py"))
    ]
    assert len(benchmarks) >= 4
    done = subprocess.run(
        [sys.executable, "-c", CHECK_HELP, json.dumps(commands + benchmarks)],
        cwd=root, capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    for argv, printed in zip(commands + benchmarks, json.loads(done.stdout), strict=True):
        assert "usage:" in printed, argv
        if argv[0] == "run_pipeline.py":  # the program is called by the name the user types
            assert printed.startswith(f"usage: repotune {argv[1] if len(argv) > 2 else ''}".rstrip())
        if argv[1] == "update":  # an update reads the commits since its parent: no range to choose
            assert not any(option in printed for option in ("--rev", "--max-commits", "--since", "--until"))


def test_the_version_is_the_installed_one_and_its_commit(capsys):
    from importlib import metadata

    import run_pipeline

    with pytest.raises(SystemExit) as ended:
        run_pipeline.main(["--version"])
    assert ended.value.code == 0
    printed = capsys.readouterr().out
    assert printed.startswith(f"repotune {metadata.version('repotune')} (commit ")


def test_a_short_monitor_fits_its_interval_to_the_duration(cli, tmp_path, host):
    import time

    from pipeline.use.watch import fitted_interval

    assert (
        fitted_interval(5.0, 3.0) == 0.3
        and fitted_interval(5.0, 600.0) == 5.0
        and fitted_interval(5.0, None) == 5.0
    )
    started = time.perf_counter()
    result = cli("monitor", "--duration", "1", "--output", tmp_path / "monitor.json")
    assert result.code == 0, result.err
    assert time.perf_counter() - started < 5
    samples = read_json(tmp_path / "monitor.json")["training_report"]["hardware"]["samples"]
    assert len(samples) >= 5  # not 1 sample every 5 s


def test_the_redaction_summary_says_where_the_secrets_were(cli, tmp_path):
    from tests.conftest import GitRepo, add_features

    repo = add_features(GitRepo(tmp_path / "repo"), range(1, 4))
    key = "AKIA" + "QWERTYUIOPASDFGH"  # an AWS access key id's shape
    repo.commit("Add fixtures", {"tests/fixtures/keys.py": f'AWS = "{key}"\nOTHER = "{key[:-1]}Z"\n'})
    repo.commit(f"Rotate {key}", {"pkg/settings.py": "REGION = 'eu-west-1'\n"})
    out = tmp_path / "out"
    result = cli("scrape", "--repo", repo.path, "--output-dir", out, "--set", "scrape.format=diff")
    assert result.code == 0, result.err
    assert "redacted 3 secrets (in tests/fixtures/keys.py 2, (commit message) 1)" in result.err
    manifest = read_json(out / "MANIFEST.json")
    assert manifest["scrape"]["redacted_paths"] == {"tests/fixtures/keys.py": 2, "(commit message)": 1}
    assert key not in (out / "sequences.jsonl").read_text() and key not in (out / "MANIFEST.json").read_text()


def test_stage_timings_leave_imports_out_and_a_cache_hit_shows_its_saving(cli, sample_repo, tmp_path, host):
    out = tmp_path / "out"
    built = cli("prepare", "--repo", sample_repo.path, "--output-dir", out)
    assert built.code == 0, built.err
    assert "loaded torch, transformers, datasets in " in built.err
    first = read_json(out / "MANIFEST.json")
    assert "imports_s" in first["timings"] and first["dataset"]["cache"]["build_seconds"] > 0
    hit = cli("prepare", "--repo", sample_repo.path, "--output-dir", out)
    assert hit.code == 0, hit.err
    line = next(line for line in hit.err.splitlines() if line.startswith("token cache hit: "))
    assert (
        f"building it took {first['dataset']['cache']['build_seconds']:.1f} s, so " in line
        and line.endswith(" s saved)")
    )
    second = read_json(out / "MANIFEST.json")
    assert (
        second["dataset"]["cache"]["hit"]
        and second["dataset"]["cache"]["build_seconds"] == first["dataset"]["cache"]["build_seconds"]
    )


def test_plan_estimates_a_large_history_from_a_sample_and_uses_the_cache_when_there(
    cli, tmp_path, monkeypatch
):
    from pipeline.recipes import stages
    from tests.conftest import GitRepo, add_features

    repo = add_features(GitRepo(tmp_path / "repo"), range(1, 31))
    out = tmp_path / "out"
    options = ("--repo", repo.path, "--output-dir", out, "--set", "scrape.format=diff", "--budget", "none")
    monkeypatch.setattr(stages, "PLAN_SAMPLE", 6)
    sampled = cli("plan", *options)
    assert sampled.code == 0, sampled.err
    estimated = read_json(out / "MANIFEST.json")
    assert estimated["dataset"]["estimate"].startswith(
        "estimated from 6 of 24 training sequences (one in every 4)"
    )  # 30 commits: 3 held out, 3 validating, 24 training
    assert "token statistics estimated from 6 of 24" in sampled.err
    assert [path.name.split("-every")[1] for path in (out / "cache").glob("tokens-*")] == [
        "4"
    ]  # no full tokenization
    assert cli("prepare", *options).code == 0
    exact = cli("plan", *options)
    assert exact.code == 0 and "token cache hit" in exact.err
    measured = read_json(out / "MANIFEST.json")
    assert measured["dataset"]["estimate"] is None
    train = "train_sequences", "sequence_length"
    assert [estimated["training_parameters"][name] for name in train] == [
        measured["training_parameters"][name] for name in train
    ]
    blocks = estimated["training_parameters"]["train_blocks"], measured["training_parameters"]["train_blocks"]
    assert abs(blocks[0] - blocks[1]) <= max(2, blocks[1] // 5), blocks

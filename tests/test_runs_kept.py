"""Runs kept: a run again in the same output directory keeps the last one's record under runs/, `runs`
lists them, `diff` with no runs named compares the newest two that read a history, `report` reads any of them."""

from __future__ import annotations

import shutil

import orjson
import pytest

from pipeline.record.history import keep_previous, kept_runs
from tests.conftest import FAST_TRAINING, WITH_FILES, GitRepo, add_features, cpu_only_host, read_json


@pytest.fixture(scope="module")
def kept(tmp_path_factory):
    """One repository trained twice into one output directory (micro-batch 1, then 2 keeping its
    adapter), and what the second run printed on stderr."""
    import run_pipeline

    base = tmp_path_factory.mktemp("kept")
    repo = add_features(GitRepo(base / "repo"))
    out = base / "out"
    for batch, more in (("1", ()), ("2", ("--set", "output.keep_adapter=true"))):
        argv = [
            "--repo",
            str(repo.path),
            "--output-dir",
            str(out),
            *FAST_TRAINING,
            *WITH_FILES,  # its next lines scored too: `runs` shows them
            "--set",
            f"plan.batch_size={batch}",
        ]
        with cpu_only_host():
            assert run_pipeline.main([*argv, *more]) == 0
    return out


def test_a_second_run_keeps_the_first_runs_record_and_its_own(kept):
    first, second = kept_runs(kept)
    assert read_json(second / "MANIFEST.json") == read_json(kept / "MANIFEST.json")
    assert read_json(first / "MANIFEST.json")["training_parameters"]["batch_size"] == 1
    assert read_json(second / "MANIFEST.json")["training_parameters"]["batch_size"] == 2
    for folder in (first, second):  # each with the answers its own scoreboard gave
        run = read_json(folder / "MANIFEST.json")["run"]
        assert folder.name.endswith(run["id"]) and folder.name.startswith(run["started_at"][:4])
        assert (folder / "evaluation.jsonl").read_bytes()
    assert (second / "evaluation.jsonl").read_bytes() == (kept / "evaluation.jsonl").read_bytes()
    # The adapter is kept only where asked (the second run), the same files as the one it replaces.
    assert not (first / "adapter").exists()
    assert sorted(p.name for p in (second / "adapter").iterdir()) == sorted(
        p.name for p in (kept / "adapter").iterdir()
    )


def test_runs_lists_them_oldest_first_with_their_key_scores(cli, kept):
    listed = cli("runs", kept)
    assert listed.code == 0
    header, first, second, _, summary = listed.out.strip().splitlines()
    for column in ("run", "started", "command", "repository", "commit", "model", "budget", "steps", "status"):
        assert column in header
    assert "message chrF / ES" in header
    names = [path.name for path in kept_runs(kept)]
    assert first.startswith(names[0]) and second.startswith(names[1])
    assert "completed" in first and "tiny" in first and " run " in first
    # The scores of what the run suggests: its messages, and its next lines as the system it chose writes them.
    for row, folder in zip((first, second), kept_runs(kept), strict=True):
        evaluation = read_json(folder / "MANIFEST.json")["training_report"]["evaluation"]
        message = evaluation["tasks"]["suggested"]["message"]
        assert evaluation["code_system"]["name"] == "model-context"  # the default: no validation here
        code = evaluation["tasks"]["after"]["code_context"]
        assert f"{message['chrf']:.1f} / {message['edit_similarity']:.1f}" in row
        assert f"{code['exact_match_pct']:.1f} / {code['edit_similarity']:.1f}" in row
    assert summary.startswith(f"2 runs kept in {kept / 'runs'}")
    assert cli("runs", "--output-dir", kept).out == listed.out  # named as a run names it
    # Only what differs between them (their steps), never the repository or the model; the run always.
    changed = cli("runs", kept, "--only-changed")
    header = changed.out.splitlines()[0]
    assert header.split()[0] == "run" and "steps" in header
    assert "repository" not in header and "model" not in header and "command" not in header


def test_diff_without_runs_named_compares_the_newest_two(cli, kept, monkeypatch):
    first, second = kept_runs(kept)
    named = cli("diff", first, second, "--json")
    alone = cli("diff", kept, "--json")
    assert alone.code == named.code == 1
    assert orjson.loads(alone.out) == orjson.loads(named.out)
    assert alone.err.startswith(f"comparing {first} with {second}")
    assert cli("diff", "--output-dir", kept, "--json").out == alone.out  # named as a run names it
    # Neither named: the configured output directory's (repotune-output/ in the working directory).
    monkeypatch.chdir(kept.parent)
    shutil.copytree(kept / "runs", kept.parent / "repotune-output" / "runs")
    default = cli("diff", "--json")
    assert default.code == 1 and orjson.loads(default.out) == orjson.loads(named.out)
    # A run that stopped before reading the history (a model name that is not one) is kept and listed,
    # and left out of what `diff` compares: beside it every figure would read as new.
    stopped = cli("--repo", kept.parent / "repo", "--model", "./no-model")
    assert stopped.code == 2 and len(kept_runs(kept.parent / "repotune-output")) == 3
    *_, listed, _, _ = cli("runs").out.strip().splitlines()  # it names the repository it was asked to read
    assert listed.split()[3:6] == ["run", "repo", "-"] and listed.endswith(" failed")
    after_it = cli("diff", "--json")
    assert after_it.code == 1 and orjson.loads(after_it.out) == orjson.loads(named.out)


def test_report_compares_kept_runs(cli, kept, tmp_path):
    page = tmp_path / "compare.html"
    made = cli("report", *kept_runs(kept), "-o", page)
    assert made.code == 0 and page.read_text().count("<svg") + page.read_text().count("<img") >= 1


def test_a_run_nothing_kept_is_kept_by_the_next_before_it_replaces_it(kept, tmp_path):
    """A run killed with kill -9, or one an earlier version made, never kept its record: the next run in
    the directory keeps it first (its answers only where that run wrote them)."""
    legacy = tmp_path / "legacy"
    legacy.mkdir()
    newest = kept_runs(kept)[-1]
    shutil.copy2(newest / "MANIFEST.json", legacy / "MANIFEST.json")
    keep_previous(legacy, read_json(legacy / "MANIFEST.json"))
    (folder,) = kept_runs(legacy)
    assert folder.name == newest.name and not (folder / "evaluation.jsonl").exists()  # older than the run
    keep_previous(legacy, read_json(legacy / "MANIFEST.json"))  # kept once
    assert kept_runs(legacy) == [folder]


def test_bad_input_is_one_line(cli, kept, tmp_path):
    missing = cli("runs", tmp_path / "nowhere")
    assert missing.code == 2 and missing.err.count("\n") == 1 and "no such directory" in missing.err
    empty = cli("runs", tmp_path)
    assert empty.code == 0 and "keeps no runs yet" in empty.out
    one = tmp_path / "one"
    shutil.copytree(kept_runs(kept)[0], one / "runs" / kept_runs(kept)[0].name)
    alone = cli("diff", one)
    assert alone.code == 2 and alone.err.count("\n") == 1
    assert "holds 1 kept run that read a history: run again there to compare two" in alone.err


def test_a_run_that_ended_before_its_plan_is_listed_with_the_model_and_budget_it_was_given(cli, tmp_path):
    """A model name that is not one stops the run before anything is planned: `runs` still says which
    model and budget it was given, not `-` and `none`."""
    repo = add_features(GitRepo(tmp_path / "repo"), range(1, 4))
    out = tmp_path / "out"
    failed = cli("--repo", repo.path, "--output-dir", out, "--model", tmp_path / "no-model", "--budget", "3m")
    assert failed.code == 2 and "no-model: no such directory" in failed.err
    _, row, *_ = cli("runs", out).out.splitlines()
    assert f"{tmp_path / 'no-model'}  3m " in row and row.rstrip().endswith("failed")

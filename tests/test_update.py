"""`update --from OUTPUT_DIR`: a run's adapter continued on the commits made since it, with its lineage,
the parent's held-out commits scored before and after (forgetting), and a clear line for every case it
cannot continue."""

from __future__ import annotations

import shutil

import orjson
import pytest

from pipeline.manifest import sha256_file
from pipeline.record.history import kept_runs
from tests.conftest import FAST_TRAINING, GitRepo, add_features, module_source, read_json

TRAINING = (*FAST_TRAINING, "--set", "train.epochs=2")


@pytest.fixture(scope="module")
def parent(tmp_path_factory):
    """A repository of 22 commits and a completed run on it (module-wide: tests copy what they change)."""
    import run_pipeline

    base = tmp_path_factory.mktemp("update")
    repo = add_features(GitRepo(base / "repo"))
    out = base / "parent"
    assert run_pipeline.main(["--repo", str(repo.path), "--output-dir", str(out), *TRAINING]) == 0
    return repo, out


def copied(parent, tmp_path):
    """The parent run and its repository, copied so a test can change them."""
    repo, out = parent
    shutil.copytree(repo.path, tmp_path / "repo")
    shutil.copytree(out, tmp_path / "parent")
    return GitRepo(tmp_path / "repo"), tmp_path / "parent"


def test_an_update_trains_the_parent_adapter_on_the_new_commits_only(cli, parent, tmp_path):
    repo, out = copied(parent, tmp_path)
    old_head = repo.head()
    add_features(repo, range(23, 29))
    new_head = repo.head()
    child = tmp_path / "child"
    assert cli("hook", "install", "--repo", repo.path, "--adapter", out).code == 0
    result = cli("update", "--from", out, "--repo", repo.path, "--output-dir", child, "--model", "tiny")
    assert result.code == 0, result.err
    assert (  # the hook is the user's to move, and the update says how
        f"the commit hook in {repo.path} still suggests with {out}: "
        f"`hook install --repo {repo.path} --adapter {child}` moves it to this update"
    ) in result.err
    manifest = read_json(child / "MANIFEST.json")
    lineage = manifest["lineage"]
    assert lineage["parent_manifest"] == str((out / "MANIFEST.json").resolve())
    assert lineage["parent_sha256"] == sha256_file(out / "MANIFEST.json")
    assert (lineage["old_head"], lineage["new_head"]) == (old_head, new_head)
    assert lineage["commits_added"] == repo.git("rev-list", f"{old_head}..{new_head}").split()
    assert len(lineage["commits_added"]) == 6
    assert manifest["scrape"]["commits_seen"] == 6  # the new commits, not the history again
    assert manifest["scrape"]["split"]["eval_commits"] == 1  # the newest, held out though fewer than 20
    decisions = manifest["training_parameters"]["decisions"]
    parent_rate = read_json(out / "MANIFEST.json")["training_parameters"]["learning_rate"]
    assert decisions["learning_rate"]["value"] == pytest.approx(parent_rate / 2)
    assert "continued training" in decisions["learning_rate"]["reason"]
    assert (
        decisions["warmup_steps"]["value"] == 1
        and "continued training" in decisions["warmup_steps"]["reason"]
    )
    # It continued the parent's adapter: before training, the new held-out commits score as the parent would.
    assert manifest["training_report"]["evaluation"]["before"]["loss"] < 7.0  # a fresh tiny model reads ~7.1
    forgetting = lineage["forgetting"]
    assert forgetting["before"]["loss"] and forgetting["after"]["loss"]
    assert forgetting["relative_change"] == pytest.approx(
        (forgetting["after"]["loss"] - forgetting["before"]["loss"]) / forgetting["before"]["loss"], abs=1e-5
    )
    assert "held-out commits: loss" in result.err
    assert (child / "adapter" / "adapter_model.safetensors").exists()
    assert manifest["run"]["command"] == "update" and manifest["status"] == "completed"
    # Retrieval answers from the whole history, not from the 6 new commits alone: the parent's past and them.
    answered_from = [orjson.loads((run / "adapter" / "retrieval" / "commits.json").read_bytes())["shas"]
                     for run in (out, child)]  # fmt: skip
    assert answered_from[1] == lineage["commits_added"] + answered_from[0]
    assert manifest["retrieval"]["index"]["commits"] == len(answered_from[1]) - 1  # all but the held-out one
    assert manifest["retrieval"]["whole_history"]["commits"] == len(answered_from[1])
    assert "scraped the history up to" in result.err and manifest["timings"]["scrape_past_s"] > 0
    assert not (child / "past").exists()  # read, then removed: the adapter's index keeps what use needs

    from pipeline.use.report import render_report

    page = render_report(manifest)
    assert "<h2>Lineage (an update)</h2>" in page and f"{old_head[:12]} → {new_head[:12]}" in page
    shown = cli("diff", out / "MANIFEST.json", child / "MANIFEST.json").out
    assert "== lineage (params) ==" in shown and "== lineage (metrics) ==" in shown
    assert "forgetting.after.loss" in shown and "evaluation.after.loss" in shown

    again = cli("update", "--from", child, "--repo", repo.path, "--output-dir", tmp_path / "again")
    assert again.code == 0, again.err
    assert "up to date: HEAD" in again.err and "nothing to train" in again.err
    noop = read_json(tmp_path / "again" / "MANIFEST.json")
    assert noop["status"] == "up_to_date" and noop["lineage"]["commits_added"] == []
    assert not (tmp_path / "again" / "adapter").exists()


def update_error(cli, *argv, before_any_work=True):
    """The error line of an update that cannot continue (checked before any work: the only line)."""
    result = cli("update", *map(str, argv))
    assert result.code == 2, result.err
    lines = result.err.strip().splitlines()
    assert len(lines) == 1 or not before_any_work, lines
    assert lines[-1].startswith("repotune: error: ")
    return lines[-1]


def test_a_rewritten_history_says_so_and_offers_a_full_run(cli, parent, tmp_path):
    repo, out = copied(parent, tmp_path)
    repo.git("reset", "--quiet", "--hard", "HEAD~2")
    repo.commit("Rewrite the end", {"pkg/rewritten.py": module_source(99)})
    line = update_error(cli, "--from", out, "--repo", repo.path, "--output-dir", tmp_path / "child")
    assert "history rewritten" in line and "is not in the history of HEAD" in line
    assert line.endswith(f"train afresh: repotune --repo {repo.path} --output-dir NEW_DIR")


def test_another_base_model_is_refused(cli, parent, tmp_path):
    _, out = copied(parent, tmp_path)
    line = update_error(cli, "--from", out, "--model", "smollm2-135m", "--output-dir", tmp_path / "child")
    assert line == (
        f"repotune: error: --model smollm2-135m: {out} trained an adapter for tiny, and an adapter only "
        "continues on its own base model; train afresh with --model smollm2-135m"
    )


def test_another_tokenizer_is_refused(cli, parent, tmp_path, monkeypatch):
    repo, out = copied(parent, tmp_path)
    repo.commit("Add more", {"pkg/more.py": module_source(50)})
    (out / "adapter" / "tokenizer.json").write_bytes(
        orjson.dumps({**orjson.loads((out / "adapter" / "tokenizer.json").read_bytes()), "added_tokens": [
            {"id": 99_999, "content": "<other>", "single_word": False, "lstrip": False, "rstrip": False,
             "normalized": False, "special": True}]})
    )  # fmt: skip
    line = update_error(
        cli, "--from", out, "--repo", repo.path, "--output-dir", tmp_path / "child", before_any_work=False
    )  # after tokenizing: the tokenizer is the model's
    assert "is not the one that run trained with" in line


def test_a_parent_that_did_not_complete_is_refused(cli, parent, tmp_path):
    repo, out = copied(parent, tmp_path)
    manifest = orjson.loads((out / "MANIFEST.json").read_bytes())
    manifest["status"] = "interrupted"
    (out / "MANIFEST.json").write_bytes(orjson.dumps(manifest))
    line = update_error(cli, "--from", out, "--repo", repo.path)
    assert line == (
        f"repotune: error: --from {out}: that run did not complete (status interrupted); finish it first "
        "(its own command with --resume) or train afresh with repotune --repo PATH"
    )


def test_a_run_that_stopped_before_reading_the_history_leaves_its_parent_to_continue(cli, parent, tmp_path):
    """A model name that is not one, run into the parent's directory, writes a failed manifest there and
    touches nothing else: the adapter is still the completed run's, which an update continues (from the
    record it kept under runs/), and `diff` compares past it."""
    repo, out = copied(parent, tmp_path)
    assert cli("--repo", repo.path, "--output-dir", out, "--model", "./no-model").code == 2
    assert read_json(out / "MANIFEST.json")["status"] == "failed"
    result = cli("update", "--from", out, "--repo", repo.path, "--output-dir", tmp_path / "child")
    assert result.code == 0 and "up to date" in result.err, result.err
    run = read_json(parent[1] / "MANIFEST.json")["run"]["id"]
    (kept,) = [folder / "MANIFEST.json" for folder in kept_runs(out) if folder.name.endswith(run)]
    lineage = read_json(tmp_path / "child" / "MANIFEST.json")["lineage"]
    assert (lineage["parent_manifest"], lineage["parent_sha256"]) == (str(kept.resolve()), sha256_file(kept))


def test_a_missing_adapter_is_refused(cli, parent, tmp_path):
    repo, out = copied(parent, tmp_path)
    shutil.rmtree(out / "adapter")
    line = update_error(cli, "--from", out, "--repo", repo.path)
    assert line.startswith(f"repotune: error: --from {out}: no adapter in {out / 'adapter'}")


def test_a_missing_parent_and_a_range_are_one_line(cli, parent, tmp_path):
    repo, out = copied(parent, tmp_path)
    line = update_error(cli, "--from", tmp_path / "nowhere", "--repo", repo.path)
    assert (
        line
        == f"repotune: error: cannot read {tmp_path / 'nowhere' / 'MANIFEST.json'}: No such file or directory"
    )
    repo.commit("Add more", {"pkg/more.py": module_source(50)})
    line = update_error(cli, "--from", out, "--repo", repo.path, "--set", "scrape.rev=HEAD~1")
    assert line.startswith("repotune: error: update reads the commits made since its parent, so scrape.rev")


def test_forgetting_is_said_in_a_line_and_not_invented_without_a_parent_held_out_set(tmp_path):
    from pipeline.record.lineage import describe_forgetting, forgetting
    from pipeline.types import Scores

    was, now = Scores({"loss": 2.0}, None, []), Scores({"loss": 2.1}, None, [])
    assert forgetting(was, now)["relative_change"] == pytest.approx(0.05)
    assert describe_forgetting(tmp_path, was, now).endswith(
        "loss 2.0000 → 2.1000 (+5.0%: what it knew is forgotten)"
    )
    unscored = Scores(None, None, [])
    assert forgetting(unscored, unscored) == {"before": None, "after": None, "relative_change": None}
    assert "not scored" in describe_forgetting(tmp_path, unscored, unscored)

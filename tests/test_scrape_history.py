"""Scraping whole histories: skip reasons, the held-out split, shards, ranges, several repositories."""

from __future__ import annotations

import subprocess

import pytest

from pipeline.config import ScrapeConfig
from scrapers.git import describe_repository, open_repository
from scrapers.parse import log_format, parse_log
from scrapers.scrape import SPLITS, holdout_counts, scrape
from tests.conftest import GitRepo, module_source, read_json, sequences


@pytest.fixture
def messy_repo(tmp_path) -> GitRepo:
    """One commit for each thing a real history throws at the scraper."""
    repo = GitRepo(tmp_path / "messy")
    repo.commit("Add core module", {"core.py": module_source(1)})
    repo.commit("Add helpers", {"helpers.py": module_source(2)})
    repo.commit(
        "Bump requests from 2.31 to 2.32",
        {"requirements.txt": "requests==2.32\n"},
        author="dependabot[bot] <bot@github.com>",
    )
    repo.commit("wip", {"core.py": module_source(3)})
    repo.commit("Pin dependencies", {"poetry.lock": "lock\n" * 50, "pyproject.toml": "[project]\nname='x'\n"})
    repo.commit("Vendor left-pad", {"vendor/left_pad.py": module_source(4)})
    repo.commit(
        "Add generated table", {"table.py": "".join(f"ROW_{i} = {i}\n" for i in range(20000))}
    )  # > max_file_bytes
    repo.commit("Add minified bundle", {"static/app.min.js": "var a=1;" * 100})
    repo.commit("Reformat everything", {f"pkg/m{i}.py": f"X = {i}\n" for i in range(60)})  # too many files
    repo.commit("Add logo", {"logo.png": b"\x89PNG\r\n\x1a\n\x00\x00data"})
    repo.git("checkout", "--quiet", "-b", "feature", "HEAD~3")
    repo.commit("Add parser", {"parser.py": module_source(5)})
    repo.git("checkout", "--quiet", "main")
    repo.commit(
        "Add parser", {"parser.py": module_source(5)}
    )  # the same change on both branches: a duplicate
    repo.git("merge", "--quiet", "--no-ff", "-m", "Merge branch 'feature'", "feature")
    return repo


def test_every_skip_reason_is_counted(cli, messy_repo, tmp_path):
    config = ["--set", "scrape.max_file_bytes=100000", "--set", "scrape.format=diff"]
    result = cli("scrape", "--repo", messy_repo.path, "--output-dir", tmp_path / "out", *config)
    assert result.code == 0, result.err
    scrape_section = read_json(tmp_path / "out" / "MANIFEST.json")["scrape"]
    assert scrape_section["commits_seen"] == 13
    assert scrape_section["skipped"] == {
        "bot_author": 1,
        "duplicate": 1,
        "merge": 1,
        "no_text_changes": 4,  # vendored code, generated table, minified bundle, logo: nothing left
        "too_many_files": 1,
        "trivial_message": 1,
    }
    assert scrape_section["files_skipped"] == {"binary_file": 1, "excluded_path": 3, "file_too_large": 1}
    kept = [record["text"].splitlines()[0] for record in sequences(tmp_path / "out" / "sequences.jsonl")]
    assert kept == ["Add parser", "Pin dependencies", "Add helpers", "Add core module"]
    assert "poetry.lock" not in sequences(tmp_path / "out" / "sequences.jsonl")[1]["text"]
    assert scrape_section["commits_kept"] == 4
    assert scrape_section["files_kept"] == 4


def test_newest_commits_are_held_out_and_never_trained_on(tmp_path):
    repo = GitRepo(tmp_path / "long")
    shas = [repo.commit(f"Add compute_{i}", {f"m{i}.py": module_source(i)}) for i in range(1, 41)]
    out = tmp_path / "out"
    out.mkdir()
    config = ScrapeConfig(eval_commits=5, valid_commits=3, format=["diff", "message"])
    result = scrape([repo.path], config, out)
    records = sequences(out / "sequences.jsonl")
    by_split = {split: {r["commit"] for r in records if r["split"] == split} for split in SPLITS}
    assert by_split["eval"] == set(shas[-4:])  # the newest, at most 10% of the history
    assert by_split["valid"] == set(shas[-7:-4])  # just older: every choice is made there
    assert not by_split["eval"] & by_split["train"] and not by_split["valid"] & by_split["train"]
    assert result.sequences == {"train": 66, "valid": 6, "eval": 8}  # two formats per commit, in one split
    assert [r["format"] for r in records[:2]] == ["diff", "message"]


@pytest.mark.parametrize(
    ("kept", "share", "held", "validated"),
    [(9, 0.1, 0, 0), (19, 0.1, 1, 1), (20, 0.1, 2, 2), (20, 0.04, 1, 0), (100, 0.1, 10, 10), (1000, 0.1, 100, 100), (5000, 0.1, 100, 100),
     (500, 0.0, 0, 0), (500, 0.5, 100, 100)],
)  # fmt: skip
def test_holdout_counts(kept, share, held, validated):
    config = ScrapeConfig(holdout_max_share=share)
    assert holdout_counts(kept, config) == (held, validated)


def test_shards_give_the_same_file_as_one_process(messy_repo, tmp_path):
    outputs = []
    for workers in (1, 3):
        out = tmp_path / f"w{workers}"
        out.mkdir()
        scrape([messy_repo.path], ScrapeConfig(workers=workers, format=["diff", "rich"]), out)
        outputs.append((out / "sequences.jsonl").read_bytes())
    assert outputs[0] == outputs[1]


def test_rev_since_until_and_max_commits(cli, tmp_path):
    repo = GitRepo(tmp_path / "ranged")
    shas = [repo.commit(f"Add compute_{i}", {f"m{i}.py": module_source(i)}) for i in range(1, 11)]
    repo.git("tag", "v1.0", shas[3])

    def kept(*options):
        out = tmp_path / "out"
        assert (
            cli(
                "scrape", "--repo", repo.path, "--output-dir", out, *options, "--set", "scrape.format=diff"
            ).code
            == 0
        )
        return [record["commit"] for record in sequences(out / "sequences.jsonl")]

    assert kept("--rev", "v1.0..main") == shas[:3:-1]
    assert kept("--max-commits", "2") == shas[:-3:-1]
    # The fixture dates commit n on 2024-01-n at noon.
    assert kept("--since", "2024-01-08T00:00:00Z") == shas[:6:-1]
    assert kept("--until", "2024-01-02T23:00:00Z", "--rev", "main") == shas[1::-1]


def test_a_bad_range_is_one_clear_line(cli, sample_repo, tmp_path):
    result = cli(
        "scrape", "--repo", sample_repo.path, "--output-dir", tmp_path / "out", "--rev", "no-such-tag..main"
    )
    assert result.code == 2
    assert result.err.strip().splitlines()[-1].startswith("repotune: error: ")
    assert "no-such-tag" in result.err


def test_several_repositories_are_tagged_and_counted(cli, sample_repo, tmp_path):
    other = GitRepo(tmp_path / "other" / "sample")  # the same name: tags must stay distinct
    other.commit("Add tool", {"tool.py": module_source(7)})
    out = tmp_path / "out"
    assert cli("scrape", "--repo", sample_repo.path, "--repo", other.path, "--output-dir", out).code == 0
    tags = {record["repo"] for record in sequences(out / "sequences.jsonl")}
    assert tags == {"sample", "sample-2"}
    manifest = read_json(out / "MANIFEST.json")
    per_repo = {entry["name"]: entry["commits_kept"] for entry in manifest["scrape"]["per_repository"]}
    assert per_repo == {"sample": 11, "sample-2": 1}
    assert [entry["path"] for entry in manifest["repositories"]] == [str(sample_repo.path), str(other.path)]


def test_shallow_clone_skips_its_boundary_commit(sample_repo, tmp_path):
    shallow = tmp_path / "shallow"
    sample_repo.git("clone", "--quiet", "--depth", "3", f"file://{sample_repo.path}", str(shallow))
    info = describe_repository(open_repository(shallow))
    assert info.shallow is True
    out = tmp_path / "out"
    out.mkdir()
    result = scrape([shallow], ScrapeConfig(), out)
    assert result.stats.commits_seen == 3
    # The boundary's diff would be "the whole tree, added": skipped, and the other two kept.
    assert result.stats.skipped == {"shallow_boundary": 1, "no_text_changes": 1}


def test_partial_clone_skips_the_commits_whose_contents_it_lacks(cli, tmp_path):
    """`git clone --filter=blob:limit=…` leaves large files' older versions on the server: git log -p
    would stop at the first ("unable to read"), and the scrape may not fetch them."""
    source = GitRepo(tmp_path / "source")
    source.commit("Add module", {"a.py": module_source(1)})
    source.commit("Add the data", {"data.json": '{"rows": 1}\n' + "x" * 3000})
    source.commit("Grow the module", {"a.py": module_source(1) + module_source(2)})
    source.commit("Add a row", {"data.json": '{"rows": 2}\n' + "x" * 3000})
    source.commit("Rename the data", {"data.json": None, "rows.json": '{"rows": 2}\n' + "x" * 3000})
    source.commit("Shrink the module", {"a.py": module_source(2)})
    source.git("config", "uploadpack.allowFilter", "true")
    clone = tmp_path / "clone"  # the checkout fetches what HEAD holds; the older data stays missing
    source.git("clone", "--quiet", "--filter=blob:limit=1k", f"file://{source.path}", str(clone))
    out = tmp_path / "out"
    result = cli("scrape", "--repo", clone, "--output-dir", out, "--set", "scrape.format=diff")
    assert result.code == 0, result.err
    scraped = read_json(out / "MANIFEST.json")["scrape"]
    assert scraped["commits_seen"] == 6
    assert scraped["skipped"] == {"partial_clone": 2}  # "Add the data" and "Add a row"
    assert "partial clone (`git clone --filter`)" in result.err
    messages = {record["text"].splitlines()[0] for record in sequences(out / "sequences.jsonl")}
    assert messages == {"Add module", "Grow the module", "Rename the data", "Shrink the module"}
    # Filled in later (the same HEAD), the clone is scraped again, where a run would otherwise reuse the
    # scrape its output directory holds.
    prepared = tmp_path / "prepared"
    assert cli("prepare", "--repo", clone, "--output-dir", prepared).code == 0
    source.git("-C", str(clone), "config", "--unset", "remote.origin.partialclonefilter")
    source.git("-C", str(clone), "fetch", "--quiet", "--refetch", "origin")
    again = cli("prepare", "--repo", clone, "--output-dir", prepared)
    assert again.code == 0 and "reusing the scrape" not in again.err
    assert read_json(prepared / "MANIFEST.json")["scrape"]["skipped"] == {}
    # Without any contents (blob:none, nothing checked out) every commit is skipped: none is logged.
    empty = tmp_path / "empty"
    source.git("clone", "--quiet", "--filter=blob:none", "--no-checkout", f"file://{source.path}", str(empty))
    (tmp_path / "out-empty").mkdir()
    nothing = scrape([empty], ScrapeConfig(), tmp_path / "out-empty")
    assert (nothing.stats.commits_kept, nothing.stats.skipped) == (0, {"partial_clone": 6})
    # A full clone holds every content: nothing is skipped for it, and nothing is said.
    full = cli(
        "scrape", "--repo", source.path, "--output-dir", tmp_path / "full", "--set", "scrape.format=diff"
    )
    assert read_json(tmp_path / "full" / "MANIFEST.json")["scrape"]["skipped"] == {}
    assert "partial clone" not in full.err


def test_detached_head(sample_repo, tmp_path):
    sample_repo.git("checkout", "--quiet", "--detach", "HEAD~2")
    info = describe_repository(open_repository(sample_repo.path))
    assert info.branch is None
    assert info.head == sample_repo.git("rev-parse", "HEAD")


def test_copies_are_parsed(tmp_path):
    repo = GitRepo(tmp_path / "copies")
    repo.commit("Add module", {"a.py": module_source(1) * 3})
    repo.commit("Copy module", {"b.py": module_source(1) * 3, "a.py": module_source(1) * 3 + "# changed\n"})
    raw = subprocess.run(
        ["git", "log", "-p", "-C", "-C", f"--format={log_format('N')}", "-1"],
        cwd=repo.path,
        capture_output=True,
        check=True,
    ).stdout
    (commit,) = parse_log(iter([raw]), "N", 1 << 20)
    copied = next(change for change in commit.files if change.status == "C")
    assert (copied.old_path, copied.path) == ("a.py", "b.py")


def test_progress_bar_stays_quiet_when_not_a_terminal(cli, sample_repo, tmp_path):
    result = cli("scrape", "--repo", sample_repo.path, "--output-dir", tmp_path / "out")
    assert "commit/s" not in result.err and "it/s" not in result.err

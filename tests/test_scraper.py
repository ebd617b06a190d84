"""Scraping real (tiny) repositories: one git process, exact commits, files and sequences."""

from __future__ import annotations

import orjson
import pytest

from pipeline.config import ScrapeConfig
from scrapers.git import (
    LogOptions,
    describe_repository,
    open_repository,
    rev_list,
    stream_commits,
    strip_credentials,
)
from scrapers.parse import _unquote, parse_log
from scrapers.scrape import scrape
from tests.conftest import GitRepo, module_source, trained_diff


def commits_of(repo: GitRepo | str, max_file_diff_bytes: int = 1 << 20, context_lines: int = 3):
    git_repo = open_repository(repo.path if isinstance(repo, GitRepo) else repo)
    options = LogOptions(
        context_lines, merge_diffs=True, big_file_bytes=1 << 20, max_file_diff_bytes=max_file_diff_bytes
    )
    with stream_commits(git_repo, rev_list(git_repo, "HEAD", None, None, None), options) as commits:
        return list(commits)


def test_commits_come_out_newest_first_with_exact_metadata(sample_repo):
    commits = commits_of(sample_repo)
    assert len(commits) == 12
    newest = commits[0]
    assert newest.sha == sample_repo.git("rev-parse", "HEAD")
    assert newest.message == "Scale compute_1 by two\n\nThe callers expect doubled totals."
    assert newest.date == "2024-01-12T12:00:00+00:00"
    assert (newest.author_name, newest.author_email) == ("Ada Lovelace", "ada@example.com")
    assert [(f.path, f.status, f.added, f.deleted) for f in newest.files] == [("pkg/feature_1.py", "M", 1, 1)]
    assert "-        total += value * 1\n+        total += value * 2\n" in newest.files[0].hunks
    root = commits[-1]
    assert root.parents == ()
    assert sorted((f.path, f.status) for f in root.files) == [("README.md", "A"), ("pkg/__init__.py", "A")]


def test_binary_files_are_marked(sample_repo):
    logo = next(c for c in commits_of(sample_repo) if c.message == "Add logo")
    assert [(f.path, f.binary, f.hunks) for f in logo.files] == [("logo.png", True, "")]


def lfs_pointer(oid: str, size: int) -> str:
    return f"version https://git-lfs.github.com/spec/v1\noid sha256:{oid * 64}\nsize {size}\n"


def test_git_lfs_pointers_are_left_out_as_the_binaries_they_stand_for(tmp_path):
    """What git stores for a file in Git LFS is a pointer (a random object id and a size): a diff of one
    teaches nothing, however it changes; text that only mentions the spec stays."""
    repo = GitRepo(tmp_path / "lfs")
    repo.commit("Add the model", {"train.py": module_source(1), "model.bin": lfs_pointer("a", 100)})
    repo.commit("Retrain the model", {"model.bin": lfs_pointer("b", 200)})
    repo.commit("Say where weights live", {"README.md": "See https://git-lfs.github.com/spec/v1\n"})
    out = tmp_path / "out"
    out.mkdir()
    result = scrape([repo.path], ScrapeConfig(format="diff"), out)
    assert result.stats.files_skipped == {"lfs_pointer": 2}
    assert result.stats.skipped == {"no_text_changes": 1}  # the retraining changed nothing but a pointer
    texts = [orjson.loads(line)["text"] for line in (out / "sequences.jsonl").read_bytes().splitlines()]
    assert len(texts) == 2 and not any("oid sha256" in text for text in texts)


def test_a_staged_change_is_read_as_training_read_commits(tmp_path, monkeypatch):
    """What the commit hook and `generate --task message` are given (git's diff of the staged change,
    under the user's own diff settings) becomes what training saw of the same change once committed: a
    lockfile sorted first, a binary, an LFS pointer and a vendored file are not in it, and no `index` line."""
    from pipeline.use.hook import staged_diff
    from scrapers.filters import as_trained, file_filters

    repo = GitRepo(tmp_path / "work")
    repo.commit("Add the core", {"pkg/core.py": module_source(1)})
    repo.git("config", "diff.noprefix", "true")  # the user's settings: the hook reads past them
    repo.git("config", "diff.context", "5")
    files = {
        "Cargo.lock": "".join(f'[[package]]\nname = "crate{i}"\n' for i in range(40)),
        "logo.png": b"\x89PNG\r\n\x1a\n\x00\x00data",
        "model.bin": lfs_pointer("c", 300),
        "vendor/left_pad.py": module_source(4),
        "pkg/core.py": module_source(1) + module_source(2),
        "pkg/caf\u00e9.py": module_source(3),
    }
    for name, content in files.items():
        (repo.path / name).parent.mkdir(parents=True, exist_ok=True)
        (repo.path / name).write_bytes(content if isinstance(content, bytes) else content.encode())
    repo.git("add", "-A")
    monkeypatch.chdir(repo.path)
    staged = staged_diff()
    coloured = repo.git(
        "-c", "color.diff.new=bold green reverse", "-c", "diff.noprefix=false", "diff", "--cached", "-U3",
        "--color=always",
    )  # fmt: skip
    read = as_trained(staged, file_filters(ScrapeConfig()))
    assert read == trained_diff(repo, "Grow the core", tmp_path / "out")
    assert [line.split(" b/")[1] for line in read.splitlines() if line.startswith("diff --git")] == [
        "pkg/caf\u00e9.py",
        "pkg/core.py",
    ]
    assert "Cargo.lock" in staged and "Cargo.lock" not in read
    # A change training would have left out whole is still read (a suggestion from it beats none), and
    # text that is not git's diff is left as it is.
    lockfile_only = as_trained(staged.split("diff --git a/logo.png")[0], file_filters(ScrapeConfig()))
    assert (
        lockfile_only.startswith("diff --git a/Cargo.lock b/Cargo.lock\n") and "index " not in lockfile_only
    )
    assert as_trained("fix the parser\n", file_filters(ScrapeConfig())) == "fix the parser\n"
    # `git diff --cached --color | generate …`, or a user's color.ui=always: read as the plain text.
    assert "\x1b[" in coloured and as_trained(coloured, file_filters(ScrapeConfig())) == read


def test_a_piped_diff_is_read_whatever_prefixes_the_users_git_prints(tmp_path):
    """`git diff --cached | generate …` under the user's own settings: `diff.mnemonicPrefix` (c/ and i/,
    as "How core Git developers configure Git" recommends), `diff.noprefix` with a folder named `b`,
    other prefixes: the same paths as git's a/ and b/, a rename's included."""
    from scrapers.filters import as_trained, file_filters

    repo = GitRepo(tmp_path / "work")
    repo.commit("Add the core", {"pkg/core.py": module_source(1), "b/util.py": module_source(2)})
    repo.git("mv", "pkg/core.py", "pkg/engine.py")
    for name, text in (
        ("pkg/engine.py", module_source(1) + module_source(3)),
        ("b/util.py", module_source(2) + module_source(4)),
        ("c/new.py", module_source(5)),
    ):
        (repo.path / name).parent.mkdir(exist_ok=True)
        (repo.path / name).write_text(text)
    repo.git("add", "-A")
    plain = as_trained(repo.git("diff", "--cached"), file_filters(ScrapeConfig()))
    assert [line for line in plain.splitlines() if line.startswith("diff --git")] == [
        "diff --git a/b/util.py b/b/util.py",
        "diff --git a/c/new.py b/c/new.py",
        "diff --git a/pkg/core.py b/pkg/engine.py",
    ]
    for settings in (
        ["-c", "diff.mnemonicPrefix=true"],
        ["-c", "diff.noprefix=true"],
        ["-c", "diff.noprefix=true", "-c", "diff.mnemonicPrefix=true"],
    ):
        assert as_trained(repo.git(*settings, "diff", "--cached"), file_filters(ScrapeConfig())) == plain
    prefixed = repo.git("diff", "--cached", "--src-prefix=before/", "--dst-prefix=after/")
    assert "+++ after/b/util.py" in prefixed
    assert as_trained(prefixed, file_filters(ScrapeConfig())) == plain


def test_scrape_writes_one_sequence_per_kept_commit(sample_repo, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    result = scrape([sample_repo.path], ScrapeConfig(format="diff"), out)
    lines = [orjson.loads(line) for line in (out / "sequences.jsonl").read_bytes().splitlines()]
    assert len(lines) == 11
    assert result.stats.skipped == {"no_text_changes": 1}
    assert result.stats.files_skipped == {"binary_file": 1}
    first = lines[0]
    assert set(first) == {"text", "commit", "date", "format", "repo", "split"}
    assert (first["format"], first["repo"], first["split"]) == ("diff", "sample", "eval")  # the newest
    assert [line["split"] for line in lines[1:3]] == [
        "valid",
        "train",
    ]  # 11 kept: one held out, one validates
    assert first["text"].startswith(
        "Scale compute_1 by two\n\nThe callers expect doubled totals.\n\ndiff --git a/pkg/feature_1.py b/pkg/feature_1.py\n"
    )
    assert "\nindex " not in first["text"]  # blob hashes teach nothing
    info = result.repositories[0].info
    assert (info.commit_count, info.branch) == (12, "main")
    written = sorted(path.name for path in out.iterdir())
    assert written == ["completions.jsonl", "files.jsonl", "sequences.jsonl"]  # no part file left


def test_renames_unicode_and_spaces_in_paths(tmp_path):
    repo = GitRepo(tmp_path / "paths")
    repo.commit("Add module", {"old name.py": module_source(1)})
    repo.commit("Add unicode", {'données/é t"q.txt': "hello\n"})
    repo.git("mv", "old name.py", "new name.py")
    sha = repo.commit("Rename module", {})
    commits = {c.sha: c for c in commits_of(repo)}
    renamed = commits[sha].files[0]
    assert (renamed.status, renamed.old_path, renamed.path) == ("R", "old name.py", "new name.py")
    unicode = next(c for c in commits.values() if c.message == "Add unicode").files[0]
    assert unicode.path == 'données/é t"q.txt'


def test_non_utf8_message_with_encoding_header_is_decoded(tmp_path):
    repo = GitRepo(tmp_path / "latin")
    repo.git("config", "i18n.commitEncoding", "ISO-8859-1")
    repo.commit("Ajoute le r\xe9sum\xe9".encode("latin-1"), {"a.txt": "caf\xe9\n".encode("latin-1")})
    (commit,) = commits_of(repo)
    assert commit.message == "Ajoute le résumé"
    assert commit.files[0].hunks == "@@ -0,0 +1 @@\n+café\n"


def test_undecodable_bytes_without_header_are_never_fatal(tmp_path):
    repo = GitRepo(tmp_path / "bytes")
    repo.commit("Ajoute le r\xe9sum\xe9".encode("latin-1"), {"a.txt": b"ok \xff\n"})
    (commit,) = commits_of(repo)
    # git re-encodes a header-less message that is not UTF-8 as Latin-1; diff bytes are ours to replace.
    assert commit.message == "Ajoute le résumé"
    assert commit.files[0].hunks == "@@ -0,0 +1 @@\n+ok \ufffd\n"


def test_oversize_file_keeps_only_its_head(tmp_path):
    repo = GitRepo(tmp_path / "huge")
    repo.commit("Add generated table", {"table.py": "".join(f"ROW_{i} = {i}\n" for i in range(5000))})
    (commit,) = commits_of(repo, max_file_diff_bytes=1000)
    change = commit.files[0]
    assert change.oversize and change.hunks.endswith("\n") and 0 < change.added < 100
    assert len(change.hunks) < 1100 and change.patch_bytes > 50_000


def test_leaving_the_stream_early_stops_git(sample_repo):
    git_repo = open_repository(sample_repo.path)
    options = LogOptions(3, merge_diffs=False, big_file_bytes=1 << 20, max_file_diff_bytes=1 << 20)
    with stream_commits(git_repo, rev_list(git_repo, "HEAD", None, None, None), options) as commits:
        first = next(commits)
    assert first.message.startswith("Scale compute_1")


def test_bare_repository(tmp_path, sample_repo):
    bare = tmp_path / "bare.git"
    sample_repo.git("clone", "--quiet", "--bare", str(sample_repo.path), str(bare))
    info = describe_repository(open_repository(bare))
    assert info.bare is True
    assert info.path == str(bare.resolve())
    result = scrape([bare], ScrapeConfig(), tmp_path)
    assert result.stats.commits_kept == 11


@pytest.mark.parametrize(
    ("url", "clean"),
    [
        ("https://user:s3cret@github.com/org/repo.git", "https://github.com/org/repo.git"),
        ("https://ghp_abc123@github.com/org/repo", "https://github.com/org/repo"),
        ("git@github.com:org/repo.git", "github.com:org/repo.git"),
        ("https://github.com/org/repo", "https://github.com/org/repo"),
        ("/srv/git/repo.git", "/srv/git/repo.git"),
    ],
)
def test_credentials_are_stripped_from_remote_urls(url, clean):
    assert strip_credentials(url) == clean


def test_remote_url_is_recorded_without_credentials(sample_repo):
    sample_repo.git("remote", "add", "origin", "https://bob:hunter2@example.com/team/sample.git")
    info = describe_repository(open_repository(sample_repo.path))
    assert info.remote_url == "https://example.com/team/sample.git"


def test_parser_gives_the_same_commits_whatever_the_chunk_size(sample_repo):
    git_repo = open_repository(sample_repo.path)
    options = LogOptions(3, merge_diffs=False, big_file_bytes=1 << 20, max_file_diff_bytes=1 << 20)
    with stream_commits(git_repo, rev_list(git_repo, "HEAD", None, None, None), options) as commits:
        expected = list(commits)
    import subprocess

    from scrapers.parse import log_format

    raw = subprocess.run(
        ["git", "log", "-p", "--full-index", f"--format={log_format('N0NCE')}"],
        cwd=sample_repo.path,
        capture_output=True,
        check=True,
    ).stdout
    for size in (1, 7, 100, len(raw)):
        chunks = (raw[i : i + size] for i in range(0, len(raw), size))
        assert list(parse_log(chunks, "N0NCE", 1 << 20)) == expected


def test_parser_ignores_a_nonce_that_is_not_this_run_s():
    nonce = "abc"
    stream = [
        b"\x1eabc\n", b"1111\n", b"\n", b"A\n", b"a@x\n", b"2024-01-01T00:00:00+00:00\n", b"\n",
        b"Message mentioning \x1exyz\n", b"\x1eabc-end\n", b"\n",
        b"diff --git a/f b/f\n", b"--- a/f\n", b"+++ b/f\n", b"@@ -1 +1 @@\n", b"-\x1eabc-end\n", b"+x\x00y\n",
    ]  # fmt: skip
    (commit,) = list(parse_log(iter(stream), nonce, 1 << 20))
    assert commit.message == "Message mentioning \x1exyz"
    assert commit.files[0].hunks == "@@ -1 +1 @@\n-\x1eabc-end\n+x\x00y\n"


def test_unquote_handles_git_c_style_paths():
    assert _unquote(b'"a\\tb\\"c\\\\d"') == b'a\tb"c\\d'
    assert _unquote(b'"\\303\\251t\\303\\251"').decode() == "été"
    assert _unquote(b"plain/path") == b"plain/path"

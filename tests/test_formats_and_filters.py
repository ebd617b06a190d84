"""Filters, globs, message cleaning, context trimming and the three sequence formats, exactly."""

from __future__ import annotations

import subprocess

import pytest

from pipeline.config import ScrapeConfig
from scrapers.commit import Commit, FileChange
from scrapers.filters import Filters, file_filters, git_pathspecs, glob_pattern
from scrapers.formats import FORMATS, KeptCommit, clean_message, render_file, trim_context
from tests.conftest import GitRepo


def change(path="src/app.py", **fields) -> FileChange:
    base = {
        "old_path": None,
        "status": "M",
        "hunks": "@@ -1 +1 @@\n-a\n+b\n",
        "patch_bytes": 100,
    }
    return FileChange(path=path, **{**base, **fields})


def commit(
    message="Fix the parser", parents=("p1",), author=("Ada", "ada@example.com"), files=(), sha="c1"
) -> Commit:
    return Commit(
        sha, tuple(parents), author[0], author[1], "2024-01-02T03:04:05+00:00", message, tuple(files)
    )


@pytest.mark.parametrize(
    ("path", "excluded"),
    [
        ("Cargo.lock", True),
        ("sub/dir/poetry.lock", True),
        ("package-lock.json", True),
        ("web/package-lock.json", True),
        ("vendor/github.com/x/y.go", True),
        ("src/vendor/lib.c", True),
        ("app/node_modules/left-pad/index.js", True),
        ("static/app.min.js", True),
        ("static/app.js", False),
        ("src/vendored.py", False),  # a directory glob never matches a file name
        ("doc/build/index.rst", False),  # no blanket build/ rule: it deletes real documentation
        ("proto/api_pb2.py", True),
    ],
)
def test_default_exclude_globs(path, excluded):
    assert bool(glob_pattern(ScrapeConfig().exclude_globs).match(path)) is excluded


def test_glob_forms():
    pattern = glob_pattern(["docs/build/*", "**/generated/*.py", "*.snap"])
    assert pattern.match("docs/build/index.html")
    assert not pattern.match("docs/build/sub/index.html")  # `*` stays in one directory
    assert pattern.match("a/b/generated/x.py")
    assert pattern.match("tests/__snapshots__/ui.snap")
    assert not pattern.match("sub/docs/build/index.html")  # a slash inside anchors at the root
    assert glob_pattern([]) is None


PATHS = [
    "a.lock", "sub/dir/Cargo.lock", "lock", "vendor/x.go", "src/vendor/y.go", "vendored/z.go", "lib/app.min.js",
    "lib/app.js", "pkg/api.pb.go", "x_pb2.py", "src/main.py", "src/deep/er/util.py", "docs/build/index.html",
    "docs/build/sub/page.html", "docs/guide.md", "node_modules/left-pad/index.js", "go.sum", "cmd/go.sum",
]  # fmt: skip


@pytest.mark.parametrize(
    "filters",
    [
        file_filters(),
        {"exclude_globs": ["docs/build/*", "*.md", "vendor/"], "include_globs": ["src/**", "*.go", "docs/"]},
    ],
)
def test_git_pathspecs_pick_the_files_the_globs_keep(tmp_path, filters):
    repo = GitRepo(tmp_path / "repo")
    repo.commit("Add files", dict.fromkeys(PATHS, "x\n"))
    excluded, included = glob_pattern(filters["exclude_globs"]), glob_pattern(filters["include_globs"])
    kept = {
        path
        for path in PATHS
        if not (excluded and excluded.match(path)) and (not included or included.match(path))
    }
    for where in (repo.path, repo.path / "src" / "deep"):  # the same from a subfolder: the pipe runs anywhere
        listed = subprocess.run(
            ["git", "ls-files", "--full-name", "--", *git_pathspecs(filters)],
            cwd=where,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
        assert set(listed) == kept and 0 < len(kept) < len(PATHS)


def test_commit_filters_name_their_reason():
    filters = Filters(ScrapeConfig(), shallow_boundaries=frozenset({"boundary"}))
    assert filters.commit_reason(commit(parents=("a", "b")), "Merge feature") == "merge"
    assert filters.commit_reason(commit(sha="boundary", parents=()), "Initial import") == "shallow_boundary"
    bot = commit(author=("dependabot[bot]", "49699333+dependabot[bot]@users.noreply.github.com"))
    assert filters.commit_reason(bot, "Bump requests from 2.31 to 2.32") == "bot_author"
    assert filters.commit_reason(commit(author=("Renovate Bot", "bot@renovateapp.com")), "x") == "bot_author"
    assert filters.commit_reason(commit(), "") == "empty_message"
    for trivial in (
        "Merge branch 'main' into dev",
        'Revert "Add x"',
        "wip",
        "Update README.md",
        "v1.2.3",
        "Bump version to 2.0",
        "fixup! Add parser",
        ".",
    ):
        assert filters.commit_reason(commit(), trivial) == "trivial_message", trivial
    for real in (
        "merge app and request context",
        "Fix typo in the parser's error message",
        "Update parser for Python 3.12",
    ):
        assert filters.commit_reason(commit(), real) is None, real
    with_merges = Filters(ScrapeConfig(include_merges=True))
    assert with_merges.commit_reason(commit(parents=("a", "b")), "Merge branch 'dev'") is None


def test_file_filters_name_their_reason():
    filters = Filters(ScrapeConfig(include_globs=["*.py", "docs/"], max_file_diff_bytes=1000))
    assert filters.file_reason(change(binary=True)) == "binary_file"
    assert filters.file_reason(change("vendored-lib", submodule=True)) == "submodule"
    assert filters.file_reason(change("uv.lock")) == "excluded_path"
    assert filters.file_reason(change("Makefile")) == "not_included"
    assert filters.file_reason(change("docs/index.rst")) is None
    assert filters.file_reason(change(patch_bytes=1001)) == "file_diff_too_large"
    assert filters.file_reason(change(oversize=True)) == "file_diff_too_large"
    assert filters.file_reason(change()) is None
    pointer = "version https://git-lfs.github.com/spec/v1\noid sha256:{}\nsize {}\n"
    added = "@@ -0,0 +1,3 @@\n" + "".join(
        "+" + line + "\n" for line in pointer.format("a" * 64, 9).splitlines()
    )
    assert filters.file_reason(change("data/model.bin", hunks=added)) == "lfs_pointer"
    changed = f"@@ -1,3 +1,3 @@\n version https://git-lfs.github.com/spec/v1\n-oid sha256:{'a' * 64}\n+oid sha256:{'b' * 64}\n-size 9\n+size 12\n"
    assert filters.file_reason(change("data/model.bin", hunks=changed)) == "lfs_pointer"
    # A pointer replaced by the file's content (`git lfs migrate export`) is a change to learn from.
    exported = f"@@ -1,3 +1 @@\n-version https://git-lfs.github.com/spec/v1\n-oid sha256:{'a' * 64}\n-size 9\n+id,name\n"
    assert filters.file_reason(change("docs/rows.csv", hunks=exported)) is None


def test_commit_size_filters():
    filters = Filters(ScrapeConfig(max_commit_files=2, max_commit_diff_bytes=250))
    assert filters.size_reason([]) == "no_text_changes"
    assert filters.size_reason([change(), change(), change()]) == "too_many_files"
    assert filters.size_reason([change(patch_bytes=200), change(patch_bytes=100)]) == "commit_too_large"
    assert filters.size_reason([change(), change()]) is None


def test_clean_message_strips_trailers_only():
    message = "Fix race in cache\n\nThe lock was released early.\n\nSigned-off-by: Ada <ada@example.com>\nChange-Id: I8f2c\nCo-authored-by: Bob <bob@example.com>\n"
    assert clean_message(message) == "Fix race in cache\n\nThe lock was released early."
    assert clean_message("Mention Signed-off-by: in docs\n\nBody") == "Mention Signed-off-by: in docs\n\nBody"


HUNK = (
    "@@ -1,12 +1,12 @@ def main():\n"
    + "".join(f" line {i}\n" for i in range(1, 5))
    + "-old 5\n+new 5\n"
    + "".join(f" line {i}\n" for i in range(6, 12))
    + "-old 12\n+new 12\n"
)


def test_trim_context_recuts_hunks_with_exact_headers():
    assert trim_context(HUNK, 1) == (
        "@@ -4,3 +4,3 @@ def main():\n line 4\n-old 5\n+new 5\n line 6\n"
        "@@ -11,2 +11,2 @@ def main():\n line 11\n-old 12\n+new 12\n"
    )
    assert trim_context(HUNK, 2) == (
        "@@ -3,5 +3,5 @@ def main():\n line 3\n line 4\n-old 5\n+new 5\n line 6\n line 7\n"
        "@@ -10,3 +10,3 @@ def main():\n line 10\n line 11\n-old 12\n+new 12\n"
    )
    # Like git, hunks whose unchanged gap is at most twice the context (6 lines here) stay one hunk.
    assert trim_context(HUNK, 3) == "@@ -2,11 +2,11 @@ def main():\n" + HUNK.split("\n", 2)[2]
    assert trim_context(HUNK, 10) == HUNK  # nothing to cut: one hunk, as git wrote it
    paged = HUNK.replace(" line 8\n", " line 8\x0c-not a removal\n")  # a form feed inside a line
    assert trim_context(paged, 2) == trim_context(HUNK, 2) and trim_context(paged, 10) == paged
    assert trim_context("@@ -0,0 +1,2 @@\n+a\n+b\n", 3) == "@@ -0,0 +1,2 @@\n+a\n+b\n"
    no_newline = (
        "@@ -1,2 +1,2 @@\n keep\n-x\n\\ No newline at end of file\n+y\n\\ No newline at end of file\n"
    )
    assert (
        trim_context(no_newline, 0)
        == "@@ -2 +2 @@\n-x\n\\ No newline at end of file\n+y\n\\ No newline at end of file\n"
    )


def test_render_file_for_each_status():
    assert render_file(change("a.py", status="A", mode="100644", hunks="@@ -0,0 +1 @@\n+x\n")) == (
        "diff --git a/a.py b/a.py\nnew file mode 100644\n--- /dev/null\n+++ b/a.py\n@@ -0,0 +1 @@\n+x\n"
    )
    assert render_file(change("b.py", status="D", mode="100644", hunks="@@ -1 +0,0 @@\n-x\n")) == (
        "diff --git a/b.py b/b.py\ndeleted file mode 100644\n--- a/b.py\n+++ /dev/null\n@@ -1 +0,0 @@\n-x\n"
    )
    assert render_file(change("new.py", old_path="old.py", status="R", hunks="")) == (
        "diff --git a/old.py b/new.py\nrename from old.py\nrename to new.py\n"
    )


def test_the_three_formats():
    kept = KeptCommit(
        "c1",
        "2024-01-02T03:04:05+00:00",
        "Fix the parser",
        [change(hunks=HUNK)],
        git_context=10,
    )
    diff = FORMATS["diff"](kept)
    assert diff.startswith(
        "Fix the parser\n\ndiff --git a/src/app.py b/src/app.py\n--- a/src/app.py\n+++ b/src/app.py\n@@ -2,11 +2,11 @@"
    )
    message = FORMATS["message"](kept)
    assert message.startswith("diff --git a/src/app.py b/src/app.py\n")
    assert message.endswith("\nCommit message:\nFix the parser\n")
    rich = FORMATS["rich"](kept)
    assert rich.startswith(
        "Date: 2024-01-02T03:04:05+00:00\nFiles changed: 1 (+2 -2)\n  M src/app.py (+2 -2)\n\nFix the parser\n\n"
    )
    assert HUNK in rich  # the wider context, untrimmed

"""Decide what the model learns from: every filter names why it drops a commit or a file.

Reasons are the keys of the manifest's `.scrape.skipped` (commits) and
`.scrape.files_skipped` (files of otherwise kept commits).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any

from scrapers.commit import Commit, FileChange
from scrapers.config import ScrapeConfig
from scrapers.formats import DEFAULT_CONTEXT, render_file
from scrapers.notebooks import Contents, as_source, blobs_of, contents_here
from scrapers.parse import parse_diff

FILE_FILTERS = ("exclude_globs", "include_globs", "max_file_diff_bytes")
"""The scrape settings that decide which files of a commit training saw. Saved beside an adapter
(`file_filters`), so that a diff from outside the history is read as training read commits (`as_trained`)."""


KEEPS = {
    "merge": "--set scrape.include_merges=true",
    "bot_author": "--set scrape.bot_authors=[]",
    "trivial_message": "--set scrape.trivial_messages=[]",
    "message_too_large": "a larger scrape.max_message_bytes",
    "too_many_files": "a larger scrape.max_commit_files",
    "commit_too_large": "a larger scrape.max_commit_diff_bytes",
    # A clone made with --depth 1 holds one commit, without its parent to diff against.
    "shallow_boundary": "`git fetch --unshallow` in the clone",
}
"""For a commit's skip reason that a setting or a git command decides, what keeps such commits (a history
all bots or all merges, or a clone of one commit, must say how to learn from it anyway)."""


def what_keeps(skipped: dict[str, int]) -> str | None:
    """How to keep the most commits a setting skipped, as a clause for a message; None if no setting did."""
    counts = [(count, reason) for reason, count in skipped.items() if reason in KEEPS]
    if not counts:
        return None
    count, reason = max(counts)
    return f"{KEEPS[reason]} keeps the {count} skipped as {reason}"


def glob_pattern(globs: Iterable[str]) -> re.Pattern[str] | None:
    """One regex for a list of path globs, or None for an empty list.

    `*.lock` (no slash) matches the file name in any directory; `vendor/` (a
    trailing slash) matches a directory of that name anywhere; `docs/build/*`
    (a slash inside) matches the path from the repository root. `*` stays
    within one path component and `**` crosses them.
    """
    parts = []
    for glob in globs:
        if glob.endswith("/"):
            parts.append(r"(?:^|.*/)" + _translate(glob.rstrip("/")) + r"/.*")
        elif "/" in glob:
            parts.append(_translate(glob.lstrip("/")))
        else:
            parts.append(r"(?:^|.*/)" + _translate(glob))
    return re.compile("(?:" + "|".join(parts) + r")\Z") if parts else None


def _translate(glob: str) -> str:
    out, i = [], 0
    while i < len(glob):
        if glob.startswith("**", i):
            out.append(".*")
            i += 2
        elif glob[i] == "*":
            out.append("[^/]*")
            i += 1
        elif glob[i] == "?":
            out.append("[^/]")
            i += 1
        else:
            out.append(re.escape(glob[i]))
            i += 1
    return "".join(out)


# The SGR sequences git colours a diff with (`color.diff.*`, `diff.colorMoved`); piped into `generate`, they
# would hide every `diff --git` line from the parser.
_COLOUR = re.compile(r"\x1b\[[0-9;]*m")
# A Git LFS pointer stands in for a binary file stored elsewhere: its diff is a random object id and a size.
# Its lines, by the spec (github.com/git-lfs/git-lfs/blob/main/docs/spec.md): the version, ext-… lines,
# the oid, the size.
_LFS_LINE = re.compile(
    r"[ +-](?:version https://git-lfs\.github\.com/spec/v1|ext-\S+ \S+|oid sha256:[0-9a-f]{64}|size \d+)"
)


def is_lfs_pointer(hunks: str) -> bool:
    """Whether a file's diff hunks change only a Git LFS pointer (every line of it one of a pointer's)."""
    if "git-lfs.github.com/spec/" not in hunks:
        return False
    lines = [line for line in hunks.splitlines() if not line.startswith(("@@", "\\"))]
    return bool(lines) and all(_LFS_LINE.fullmatch(line) for line in lines)


class Filters:
    """The scrape config's filters, compiled once and applied per commit and per file."""

    def __init__(self, config: ScrapeConfig, shallow_boundaries: frozenset[str] = frozenset()):
        self.config = config
        self.shallow_boundaries = shallow_boundaries
        self.bots = [name.lower() for name in config.bot_authors]
        self.trivial = (
            re.compile("|".join(f"(?:{p})" for p in config.trivial_messages), re.IGNORECASE)
            if config.trivial_messages
            else None
        )
        self.excluded = glob_pattern(config.exclude_globs)
        self.included = glob_pattern(config.include_globs)

    def commit_reason(self, commit: Commit, message: str) -> str | None:
        """Why this commit is dropped before its files are looked at; `message` is the cleaned message."""
        if commit.is_merge and not self.config.include_merges:
            return "merge"
        if commit.sha in self.shallow_boundaries:
            # A shallow clone cuts history here: git shows this commit's whole tree as "added".
            return "shallow_boundary"
        author = f"{commit.author_name} <{commit.author_email}>".lower()
        if any(bot in author for bot in self.bots):
            return "bot_author"
        if not message:
            return "empty_message"
        if len(message.encode("utf-8", "replace")) > self.config.max_message_bytes:
            return "message_too_large"  # generated text (a changelog, a log dump), not a message to learn
        # A merge kept by include_merges has git's generated subject; the user asked for it anyway.
        if self.trivial and not commit.is_merge and self.trivial.fullmatch(message.splitlines()[0].strip()):
            return "trivial_message"
        return None

    def file_reason(self, change: FileChange) -> str | None:
        """Why this file's diff is dropped from a kept commit, or None to keep it."""
        if change.submodule:
            return "submodule"
        if change.binary:
            return "binary_file"  # or file_too_large: see the scrape's blob-size check
        if is_lfs_pointer(change.hunks):
            return "lfs_pointer"
        if self.excluded and self.excluded.match(change.path):
            return "excluded_path"
        if self.included and not self.included.match(change.path):
            return "not_included"
        if change.oversize or change.patch_bytes > self.config.max_file_diff_bytes:
            return "file_diff_too_large"
        return None

    def size_reason(self, files: Sequence[FileChange]) -> str | None:
        """Why the commit is dropped after its files were filtered, or None to keep it."""
        if not files:
            return "no_text_changes"
        if len(files) > self.config.max_commit_files:
            return "too_many_files"
        if sum(change.patch_bytes for change in files) > self.config.max_commit_diff_bytes:
            return "commit_too_large"
        return None


def file_filters(config: ScrapeConfig | None = None) -> dict[str, Any]:
    """What `as_trained` needs of a scrape's config (None: the shipped one), as JSON."""
    return {name: getattr(config or ScrapeConfig(), name) for name in FILE_FILTERS}


def git_pathspecs(filters: dict[str, Any]) -> list[str]:
    """The scrape's path filters (`include_globs`, `exclude_globs`) as git pathspecs, for a diff piped
    where `as_trained` cannot read it first (Ollama, llama.cpp): `git diff --cached -- SPECS` leaves out
    the lockfiles and vendored code training never saw (binary files and oversized diffs, which no name
    tells, stay). The globs mean what `glob_pattern` makes of them: git's glob magic is the same
    wildmatch (`*` within a component), with `**/` for "in any directory"."""

    def spec(glob: str) -> str:
        if glob.endswith("/"):
            return f"**/{glob.rstrip('/')}/**"
        return glob.lstrip("/") if "/" in glob else f"**/{glob}"

    # `top`: from the repository's root wherever in the work tree the pipe runs (`.` and plain globs are
    # read from the folder it runs in, which from a subfolder had sent that folder's changes alone).
    included = [f":(top,glob){spec(glob)}" for glob in filters.get("include_globs") or ()] or [":/"]
    return included + [f":(top,exclude,glob){spec(glob)}" for glob in filters.get("exclude_globs") or ()]


def as_trained(diff: str, filters: dict[str, Any], contents: Contents = contents_here) -> str:
    """A diff from outside the history (the staged change the commit hook reads, a diff given to
    `generate --task message`) as training saw commits: only the files the scrape keeps (no lockfile,
    binary, LFS pointer, vendored or oversized diff: the retrieval never indexed them, and a lockfile
    sorted first would fill the model's prompt), each rendered as the formats render it (no `index`
    line, git's 3 lines of context, UTF-8 paths), a notebook as its cells' source where `contents`
    reads both versions (the repository run in). A diff printed in colour (`git diff --color`,
    `color.ui=always`) is read as the text it colours. `diff` as given where it is not git's; where
    training would have kept none of its files, all of them, rendered so (a suggestion from a lockfile's
    change beats none)."""
    config = ScrapeConfig(**filters)
    filtering = Filters(config)
    diff = _COLOUR.sub("", diff)
    changes = parse_diff(diff.encode(), config.max_file_diff_bytes)
    read = contents(blobs_of(changes))
    sources = [as_source(change, read, DEFAULT_CONTEXT) for change in changes]
    kept = [change for change in sources if filtering.file_reason(change) is None] or sources
    return "".join(render_file(change, DEFAULT_CONTEXT) for change in kept) if kept else diff

"""What to read from a repository and how: the scrape's settings, typed, each with its meaning.

The field rules (`POSITIVE`, `FRACTION`, ...) are metadata that `pipeline.config` checks when it
builds a config from YAML, for these fields and its own.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

Auto = Literal["auto"]


def rule(predicate, requirement: str) -> dict:
    """Field metadata: a range rule and how to say it ("must be > 0")."""
    return {"check": (predicate, requirement)}


def _positive(value) -> bool:
    return value == "auto" or value > 0


def _non_negative(value) -> bool:
    return value == "auto" or value >= 0


POSITIVE = rule(_positive, "must be > 0")
NON_NEGATIVE = rule(_non_negative, "must be >= 0")
POSITIVE_OR_NULL = rule(lambda v: v is None or v > 0, "must be > 0 or null")
FRACTION = rule(lambda v: 0 <= v < 1, "must be in [0, 1)")
FRACTION_OR_AUTO = rule(lambda v: v == "auto" or 0 <= v < 1, "must be in [0, 1) or auto")
SHARE_OR_AUTO = rule(lambda v: v == "auto" or 0 <= v <= 1, "must be in [0, 1] or auto")


SEQUENCE_FORMATS = ("diff", "message", "rich")
DEFAULT_BOT_AUTHORS = [
    "[bot]",
    "dependabot",
    "renovate",
    "github-actions",
    "pre-commit-ci",
    "greenkeeper",
    "snyk-bot",
    "imgbot",
    "allcontributors",
    "mergify",
]
DEFAULT_TRIVIAL_MESSAGES = [
    r"merge (branch|pull request|remote-tracking branch|tag|commit|changes from)\b.*",
    r"merged in .*",
    r"revert\b.*",
    r"(fixup|squash|amend)! .*",
    r"(bump|bumped|bumping) (the )?(version|to v?\d).*",
    r"(release|version|v)? ?v?\d+(\.\d+)+\S*",
    r"update(d)? (the )?readme(\.md)?",
    r"(wip|fix|fixes|fixed|update|updates|updated|typo|minor|cleanup|misc|changes|tmp|temp|test|\.|-)",
]
DEFAULT_EXCLUDE_GLOBS = [
    "*.lock",
    "package-lock.json",
    "npm-shrinkwrap.json",
    "pnpm-lock.yaml",
    "go.sum",
    "vendor/",
    "node_modules/",
    "third_party/",
    "bower_components/",
    "*.min.js",
    "*.min.css",
    "*.map",
    "*.pb.go",
    "*_pb2.py",
    "*_pb2_grpc.py",
    "*.pyc",
]


@dataclass(frozen=True)
class ScrapeConfig:
    format: str | list[str] = field(default_factory=lambda: ["diff", "message"])
    """Sequence formats, one or several: diff (message then change), message (change then message), rich;
    the default teaches both tasks: writing a change for an intent, and a commit message for a change."""
    rev: str = "HEAD"
    """Revision or range to read, e.g. `v1.0..main`."""
    since: str | None = None
    """Only commits after this date (anything `git log --since` accepts)."""
    until: str | None = None
    """Only commits before this date."""
    max_commits: int | None = field(default=None, metadata=POSITIVE_OR_NULL)
    """Read at most this many commits, newest first; null reads the whole history."""
    include_merges: bool = False
    """Keep merge commits (their diff against the first parent)."""
    bot_authors: list[str] = field(default_factory=lambda: list(DEFAULT_BOT_AUTHORS))
    """Commits whose author name or email contains one of these (case-insensitive) are skipped."""
    trivial_messages: list[str] = field(default_factory=lambda: list(DEFAULT_TRIVIAL_MESSAGES))
    """Regexes (case-insensitive, whole subject line) for messages that teach nothing."""
    exclude_globs: list[str] = field(default_factory=lambda: list(DEFAULT_EXCLUDE_GLOBS))
    """Files left out: `name.ext` globs match the file name anywhere, `dir/` any directory, `a/b*` the path."""
    include_globs: list[str] = field(default_factory=list)
    """When not empty, only files matching one of these are kept (same glob rules)."""
    max_file_bytes: int = field(default=1_048_576, metadata=POSITIVE)
    """Files larger than this (bytes) are not even diffed: git treats them as binary."""
    max_file_diff_bytes: int = field(default=65536, metadata=POSITIVE)
    """A file whose diff is larger than this (bytes) is left out; such files are almost always generated."""
    max_commit_diff_bytes: int = field(default=131072, metadata=POSITIVE)
    """A commit whose kept diff is larger than this (bytes) is skipped."""
    max_message_bytes: int = field(default=8192, metadata=POSITIVE)
    """A commit whose cleaned message is longer than this (bytes) is skipped: generated text, not a message."""
    max_commit_files: int = field(default=50, metadata=POSITIVE)
    """A commit touching more kept files than this is skipped (mass renames, reformatting)."""
    rich_context_lines: int = field(default=10, metadata=NON_NEGATIVE)
    """Context lines around each change in the `rich` format (the others use git's 3)."""
    eval_commits: int = field(default=100, metadata=NON_NEGATIVE)
    """The newest kept commits, held out to score the run (never trained on, never retrieved from): 100
    gives intervals narrow enough to decide; a small history holds out fewer (`holdout_max_share`)."""
    valid_commits: int = field(default=100, metadata=NON_NEGATIVE)
    """The kept commits just older than the held-out ones, held out for every choice a run makes (the
    checkpoint it keeps, when it stops, the suggestion system): never trained on."""
    holdout_max_share: float = field(default=0.1, metadata=FRACTION)
    """Most of the kept commits each of the two held-out splits may take, so a small history still trains
    on most of itself (the held-out split keeps at least one commit from 20 up)."""
    files: bool = True
    """Read the repository's files as they stood at the split point (the parent of the oldest held-out
    commit, never newer), through the same filters and redaction: what completing its code learns from."""
    workers: int | Auto = field(default="auto", metadata=POSITIVE)
    """Parallel git log processes, each over its share of the commits; auto follows the cores and history size."""

    @property
    def formats(self) -> list[str]:
        return [self.format] if isinstance(self.format, str) else list(self.format)

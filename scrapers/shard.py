"""One shard of a scrape: ONE `git log -p` over a list of commits, filtered, redacted, formatted.

Runs in a worker process (or in-process for small histories). It writes its
sequences to a part file and returns, per kept commit, what the merge step
needs: the sha, the date and a content key for deduplication.
"""

from __future__ import annotations

import hashlib
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from scrapers.commit import Commit, FileChange
from scrapers.config import ScrapeConfig
from scrapers.filters import Filters
from scrapers.formats import DEFAULT_CONTEXT, FORMATS, KeptCommit, clean_message, format_diff
from scrapers.git import LogOptions, blob_contents, blob_sizes, repository_at, stream_commits
from scrapers.notebooks import MAX_BYTES as NOTEBOOK_BYTES
from scrapers.notebooks import as_source, blobs_of
from scrapers.secrets import redact_all, redaction_origins

SOURCE_MAY_KEEP = (None, "binary_file", "file_diff_too_large")
"""Why a notebook's change may be dropped as git diffed it, where its cells' source would be kept."""
REDACT_BATCH = 128  # commits redacted together: enough to share the hint scans, little to hold
PROGRESS_EVERY = 64  # commits between progress-counter updates (a shared counter costs a lock)


def describe_counts(counts: dict[str, int]) -> str:
    """`merge 3, no_text_changes 1` (or `none`), for messages."""
    return ", ".join(f"{reason} {count}" for reason, count in sorted(counts.items())) or "none"


@dataclass
class ScrapeStats:
    commits_seen: int = 0
    commits_kept: int = 0
    files_seen: int = 0
    files_kept: int = 0
    bytes_seen: int = 0
    """Diff bytes git printed for every file of every commit seen."""
    bytes_kept: int = 0
    """Diff bytes of the files that went into sequences."""
    skipped: Counter = field(default_factory=Counter)
    """Commits dropped, by reason."""
    files_skipped: Counter = field(default_factory=Counter)
    """Files dropped from kept commits, by reason."""
    redactions: Counter = field(default_factory=Counter)
    """Secrets replaced, by rule."""
    redacted_commits: list[str] = field(default_factory=list)
    redacted_paths: Counter = field(default_factory=Counter)
    """Secrets replaced, by the file (or commit message) they were in: a fixture or a leak?"""
    notebooks_read: int = 0
    """Notebook changes read as their cells' source instead of git's JSON diff (`scrapers.notebooks`)."""

    def add(self, other: ScrapeStats) -> None:
        for name in (
            "commits_seen", "commits_kept", "files_seen", "files_kept", "bytes_seen", "bytes_kept", "notebooks_read"
        ):  # fmt: skip
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.skipped.update(other.skipped)
        self.files_skipped.update(other.files_skipped)
        self.redactions.update(other.redactions)
        self.redacted_commits.extend(other.redacted_commits)
        self.redacted_paths.update(other.redacted_paths)

    def skipped_summary(self) -> str:
        return describe_counts(self.skipped)

    def to_manifest(self) -> dict[str, Any]:
        return {
            "commits_seen": self.commits_seen,
            "commits_kept": self.commits_kept,
            "files_seen": self.files_seen,
            "files_kept": self.files_kept,
            "bytes_seen": self.bytes_seen,
            "bytes_kept": self.bytes_kept,
            "notebooks_read": self.notebooks_read,
            "skipped": dict(sorted(self.skipped.items())),
            "files_skipped": dict(sorted(self.files_skipped.items())),
            "redactions": dict(sorted(self.redactions.items())),
            "redacted_commits": sorted(self.redacted_commits),
            "redacted_paths": dict(self.redacted_paths.most_common()),
        }


@dataclass(frozen=True)
class ShardTask:
    git_dir: Path
    work_tree: Path | None
    shas: list[str]
    config: ScrapeConfig
    shallow_boundaries: frozenset[str]
    lacking_content: frozenset[str]
    """Commits whose diff needs file contents a partial clone does not hold: git cannot diff them."""
    part_path: Path
    repo_name: str


@dataclass(frozen=True)
class KeptRecord:
    sha: str
    key: bytes
    """Content hash of the commit's diff-format text: equal keys are exact duplicates."""
    files: int
    bytes: int


@dataclass
class ShardResult:
    stats: ScrapeStats
    kept: list[KeptRecord]
    seconds: float
    """Time this shard's worker took."""


def log_options(config: ScrapeConfig) -> LogOptions:
    return LogOptions(
        context_lines=max(DEFAULT_CONTEXT, config.rich_context_lines)
        if "rich" in config.formats
        else DEFAULT_CONTEXT,
        merge_diffs=config.include_merges,
        big_file_bytes=config.max_file_bytes,
        max_file_diff_bytes=config.max_file_diff_bytes,
    )


def scrape_shard(task: ShardTask, progress=None) -> ShardResult:
    """Scrape `task.shas`; `progress` is a shared counter (multiprocessing.Value) or None."""
    started = time.perf_counter()
    config = task.config
    repo = repository_at(task.git_dir, task.work_tree)
    filters = Filters(config, task.shallow_boundaries)
    options = log_options(config)
    stats = ScrapeStats()
    kept: list[KeptRecord] = []
    binary_blobs: list[str | None] = []
    pending: list[tuple[KeptCommit, int]] = []  # kept commits and their diff bytes, to redact together
    shas = [sha for sha in task.shas if sha not in task.lacking_content]
    if len(shas) < len(task.shas):
        stats.commits_seen = stats.skipped["partial_clone"] = len(task.shas) - len(shas)
    with task.part_path.open("wb") as out, stream_commits(repo, shas, options) as commits:
        for count, commit in enumerate(commits, 1):
            if progress is not None and count % PROGRESS_EVERY == 0:
                with progress.get_lock():
                    progress.value += PROGRESS_EVERY
            stats.commits_seen += 1
            stats.files_seen += len(commit.files)
            stats.bytes_seen += sum(change.patch_bytes for change in commit.files)
            message = clean_message(commit.message)
            reason = filters.commit_reason(commit, message)
            files = []
            if reason is None:
                files = _kept_files(repo, commit, filters, options.context_lines, stats, binary_blobs)
                reason = filters.size_reason(files)
            if reason:
                stats.skipped[reason] += 1
                continue
            kept_bytes = sum(change.patch_bytes for change in files)
            stats.commits_kept += 1
            stats.files_kept += len(files)
            stats.bytes_kept += kept_bytes
            pending.append(
                (KeptCommit(commit.sha, commit.date, message, files, options.context_lines), kept_bytes)
            )
            if len(pending) == REDACT_BATCH:
                _write_batch(pending, task, stats, kept, out)
        _write_batch(pending, task, stats, kept, out)
    if progress is not None:
        with progress.get_lock():
            progress.value += stats.commits_seen % PROGRESS_EVERY
    _count_binary_files(repo, binary_blobs, config.max_file_bytes, stats)
    repo.git.clear_cache()  # ends the persistent `git cat-file` processes that read notebooks
    return ShardResult(stats, kept, time.perf_counter() - started)


def _kept_files(
    repo, commit: Commit, filters: Filters, context: int, stats: ScrapeStats, binary_blobs: list[str | None]
) -> list[FileChange]:
    """The files of a kept commit that training reads, a notebook's as its cells' source (`notebooks`);
    the others counted by why they were dropped (binary ones in `binary_blobs`, until sizes are known)."""
    reasons = [filters.file_reason(change) for change in commit.files]
    # Only a notebook kept but for git's diff of it is read: one excluded by the globs never is.
    readable = [
        change for change, reason in zip(commit.files, reasons, strict=True) if reason in SOURCE_MAY_KEEP
    ]
    contents = blob_contents(repo, blobs_of(readable), NOTEBOOK_BYTES)
    files = []
    for change, reason in zip(commit.files, reasons, strict=True):
        if reason in SOURCE_MAY_KEEP:
            source = as_source(change, contents, context)
            if source is not change:
                stats.notebooks_read += 1
                change, reason = source, filters.file_reason(source)
        if reason == "binary_file":
            binary_blobs.append(change.blob)
        elif reason:
            stats.files_skipped[reason] += 1
        else:
            files.append(change)
    return files


def _write_batch(
    pending: list[tuple[KeptCommit, int]], task: ShardTask, stats: ScrapeStats, kept: list[KeptRecord], out
) -> None:
    """Render, redact and write the pending commits, add them to `kept`, and empty `pending`.
    Redacting a batch at once lets the hint scans run over all its texts together.

    A commit's secrets are counted once per rule: the most any one of its formats held (rich's
    wider context can show more). Its deduplication key hashes its redacted diff-format text.
    """
    formats = task.config.formats
    # The key's text is the redacted diff format: one of the formats, or rendered after them.
    identity = formats.index("diff") if "diff" in formats else len(formats)
    rendered = [
        [FORMATS[name](commit) for name in formats] + ([] if "diff" in formats else [format_diff(commit)])
        for commit, _ in pending
    ]
    redacted = iter(redact_all([text for texts in rendered for text in texts]))
    for (commit, kept_bytes), texts in zip(pending, rendered, strict=True):
        results = [next(redacted) for _ in texts]
        found: Counter = Counter()
        for _, counts in results[: len(formats)]:
            found |= counts
        if found:
            stats.redactions.update(found)
            stats.redacted_commits.append(commit.sha)
            stats.redacted_paths.update(redaction_origins(results[identity][0]))
        for name, (text, _) in zip(formats, results, strict=False):  # the formats, not the key's extra text
            # `split` comes last, as "train": the merge step rewrites the held-out ones' bytes in place.
            record = {
                "text": text,
                "format": name,
                "commit": commit.sha,
                "date": commit.date,
                "repo": task.repo_name,
            }
            record["split"] = "train"
            out.write(orjson.dumps(record) + b"\n")
        key = hashlib.blake2b(results[identity][0].encode(), digest_size=16).digest()
        kept.append(KeptRecord(commit.sha, key, len(commit.files), kept_bytes))
    pending.clear()


def _count_binary_files(repo, blobs: Sequence[str | None], max_file_bytes: int, stats: ScrapeStats) -> None:
    """git calls files above core.bigFileThreshold binary too; their size tells them apart."""
    sizes = blob_sizes(repo, sorted({blob for blob in blobs if blob}))
    for blob in blobs:
        too_large = sizes.get(blob or "", 0) > max_file_bytes
        stats.files_skipped["file_too_large" if too_large else "binary_file"] += 1

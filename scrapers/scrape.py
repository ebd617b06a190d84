"""git history → `sequences.jsonl`: stream, filter, format, write; count everything."""

from __future__ import annotations

import os
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from pipeline.config import ScrapeConfig
from scrapers.filters import commit_skip_reason, file_skip_reason
from scrapers.formats import FORMATS
from scrapers.git import RepositoryInfo, describe_repository, open_repository, stream_commits

SEQUENCES_FILE = "sequences.jsonl"


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
    sequences: int = 0
    duration_s: float = 0.0

    def skipped_summary(self) -> str:
        """`merge 3, no_text_changes 1` (or `none`), for messages."""
        return ", ".join(f"{reason} {count}" for reason, count in sorted(self.skipped.items())) or "none"

    def to_manifest(self) -> dict[str, Any]:
        return {
            "commits_seen": self.commits_seen,
            "commits_kept": self.commits_kept,
            "files_seen": self.files_seen,
            "files_kept": self.files_kept,
            "bytes_seen": self.bytes_seen,
            "bytes_kept": self.bytes_kept,
            "skipped": dict(sorted(self.skipped.items())),
            "files_skipped": dict(sorted(self.files_skipped.items())),
            "sequences": self.sequences,
            "duration_s": round(self.duration_s, 3),
            "commits_per_s": round(self.commits_seen / self.duration_s, 1) if self.duration_s > 0 else None,
        }


@dataclass(frozen=True)
class ScrapeResult:
    sequences_path: Path
    repository: RepositoryInfo
    stats: ScrapeStats


def scrape(repo_path: str | Path, config: ScrapeConfig, output_dir: Path) -> ScrapeResult:
    """Scrape `repo_path` into `output_dir/sequences.jsonl` (written atomically)."""
    started = time.perf_counter()
    repo = open_repository(repo_path)
    info = describe_repository(repo)
    log_args = ["HEAD"] + ([f"--max-count={config.max_commits}"] if config.max_commits else [])
    stats = ScrapeStats()
    path = output_dir / SEQUENCES_FILE
    partial = path.with_name(path.name + ".partial")
    repo_name = Path(info.path).name.removesuffix(".git")
    with partial.open("wb") as out, stream_commits(repo, log_args, config.max_file_diff_bytes) as commits:
        for commit in commits:
            stats.commits_seen += 1
            stats.files_seen += len(commit.files)
            stats.bytes_seen += sum(change.patch_bytes for change in commit.files)
            reason = commit_skip_reason(commit, config)
            kept_files = []
            if reason is None:
                for change in commit.files:
                    file_reason = file_skip_reason(change, config)
                    if file_reason:
                        stats.files_skipped[file_reason] += 1
                    else:
                        kept_files.append(change)
                if not kept_files:
                    reason = "no_text_changes"
            if reason:
                stats.skipped[reason] += 1
                continue
            stats.commits_kept += 1
            stats.files_kept += len(kept_files)
            stats.bytes_kept += sum(change.patch_bytes for change in kept_files)
            for name, format_commit in FORMATS.items():
                record = {
                    "text": format_commit(commit, kept_files),
                    "commit": commit.sha,
                    "date": commit.date,
                    "format": name,
                    "repo": repo_name,
                }
                out.write(orjson.dumps(record) + b"\n")
                stats.sequences += 1
    os.replace(partial, path)
    stats.duration_s = time.perf_counter() - started
    return ScrapeResult(sequences_path=path, repository=info, stats=stats)

"""Decide what the model learns from: each filter names why it drops a commit or a file."""

from __future__ import annotations

from pipeline.config import ScrapeConfig
from scrapers.commit import Commit, FileChange


def commit_skip_reason(commit: Commit, config: ScrapeConfig) -> str | None:
    """Why this whole commit is dropped, or None to keep it (files are judged separately)."""
    if commit.is_merge and not config.include_merges:
        return "merge"
    if not commit.message.strip():
        return "empty_message"
    return None


def file_skip_reason(change: FileChange, config: ScrapeConfig) -> str | None:
    """Why this file's diff is dropped from a kept commit, or None to keep it."""
    if change.binary:
        return "binary_file"
    if change.submodule:
        return "submodule"
    if change.oversize or change.patch_bytes > config.max_file_diff_bytes:
        return "file_too_large"
    return None

"""Where the training text comes from: the repositories' history scraped into sequences.jsonl, or
the output directory's earlier scrape when nothing it depends on changed."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson

from pipeline.hardware import usable_cores
from pipeline.manifest import provenance_hash, tool_info
from pipeline.progress import say
from pipeline.types import Scraped
from scrapers.completions import COMPLETIONS_FILE
from scrapers.config import ScrapeConfig
from scrapers.errors import RepositoryError
from scrapers.filters import KEEPS
from scrapers.git import missing_blobs, open_repository, resolved
from scrapers.scrape import SEQUENCES_FILE
from scrapers.scrape import scrape as scrape_history
from scrapers.shard import describe_counts

PAST_DIR = "past"  # an update's output directory holds the whole history's scrape here, for retrieval


def scrape(
    repos: list[str], config: ScrapeConfig, output_dir: Path, earlier: dict[str, Any] | None = None
) -> Scraped:
    """Scrape the repositories into `output_dir`; or, given `earlier` (the manifest the output directory
    held before this run), take its scrape when the repositories' HEADs and the scrape config match."""
    key = provenance(repos, config)
    sequences_path = output_dir / SEQUENCES_FILE
    if earlier and (earlier.get("scrape") or {}).get("provenance_key") == key and sequences_path.exists():
        say(f"reusing the scrape in {output_dir} (same repositories, HEADs and scrape config)")
        return Scraped(sequences_path, earlier["repositories"], {**earlier["scrape"], "reused": True})
    result = scrape_history(repos, config, output_dir, usable_cores())
    scraped = Scraped(
        result.sequences_path,
        [vars(repository.info) for repository in result.repositories],
        {**result.to_manifest(), "provenance_key": key, "reused": False},
    )
    stats = result.stats
    say(
        f"scraped {stats.commits_seen} commits of {scraped.where} in {result.duration_s:.2f} s: "
        f"kept {stats.commits_kept} ({result.sequences['train']} train / {result.sequences['valid']} validation / "
        f"{result.sequences['eval']} held-out sequences), skipped: {stats.skipped_summary()}"
        + (
            f"; redacted {sum(stats.redactions.values())} secrets ({_origins(stats.redacted_paths)})"
            if stats.redactions
            else ""
        )
    )
    if files := scraped.summary.get("files"):
        at = ", ".join(f"{commit[:12]}" for commit in files["at"].values() if commit) or "no commit"
        say(
            f"  read {files['files']} files as they stood at {at}, before every held-out commit "
            f"(left out: {describe_counts(files['skipped'])})"
            + "".join(f"; {name}: {why}" for name, why in files["unreadable"].items())
        )
    if cut := stats.skipped.get("shallow_boundary"):
        say(
            f"  a shallow clone (`git clone --depth`): its history stops where it holds no parents "
            f"({cut} skipped as shallow_boundary); {KEEPS['shallow_boundary']} gives training the rest"
        )
    if lacking := stats.skipped.get("partial_clone"):
        say(
            f"  {lacking} of them change files whose contents this partial clone (`git clone --filter`) does "
            "not hold: git cannot diff them and the scrape fetches nothing; a clone without --filter trains on them"
        )
    return scraped


def scrape_past(repo: str, config: ScrapeConfig, rev: str, output_dir: Path) -> None:
    """The whole history up to `rev`, scraped as `config` scrapes the new commits, into `output_dir`'s
    SEQUENCES_FILE: the past an update's retrieval answers from, where it trains on the commits since
    its parent alone."""
    from dataclasses import replace

    output_dir.mkdir(parents=True, exist_ok=True)
    result = scrape_history([repo], replace(config, rev=rev), output_dir, usable_cores())
    say(
        f"scraped the history up to {rev[:12]} for retrieval: {result.stats.commits_kept} commits kept "
        f"({result.duration_s:.2f} s)"
    )


def _origins(paths, shown: int = 3) -> str:
    """Where the redacted secrets were, the most first: `in tests/test_secrets.py 12, README.md 3, and 2
    more files` (a user tells fixtures from leaks; `.scrape.redacted_paths` has them all)."""
    ranked = paths.most_common()
    listed = ", ".join(f"{path} {count}" for path, count in ranked[:shown])
    more = len(ranked) - shown
    return f"in {listed}" + (f", and {more} more {'file' if more == 1 else 'files'}" if more > 0 else "")


def provenance(repos: list[str], config: ScrapeConfig) -> str:
    """What a scrape's output depends on: this tool, the repositories and the commits their revision
    names now (HEAD, or both ends of a range), what a partial clone holds of their contents, the scrape
    config."""
    # [git directory, the resolved revisions (None: unreadable), and a partial clone's contents lacking]
    heads: list[list[Any]] = []
    for repo in repos:
        try:
            opened = open_repository(repo)
            revisions = resolved(opened, config.rev)
            # A partial clone filled in since keeps its HEAD: how many contents it lacks tells. A full clone
            # lacks none, and its key is what it was before this counted.
            missing = len(missing_blobs(opened, revisions))
            heads.append([str(opened.git_dir), revisions, *([missing] if missing else [])])
        except RepositoryError:  # the scrape reports it (and skips it, if others can be scraped)
            heads.append([str(repo), None])
    tool = tool_info()
    payload = {"tool": [tool["version"], tool["git_sha"]], "repos": heads, "config": vars(config)}
    return provenance_hash(payload)


def skipped(scraped: Scraped) -> str:
    """Commits skipped by reason, for messages."""
    return describe_counts(scraped.summary["skipped"])


def completions_path(scraped: Scraped) -> Path:
    """Where the scrape wrote the held-out commits' code-completion cases (`scrapers.completions`)."""
    return scraped.sequences_path.with_name(COMPLETIONS_FILE)


def read_files(scraped: Scraped) -> list[dict[str, Any]]:
    """The files at the split point the scrape read (`scrapers.files`), most recently changed first; none
    where it read none (`scrape.files` off, or an earlier scrape's output without them)."""
    path = files_path(scraped)
    return list(read_sequences(path)) if path else []


def files_path(scraped: Scraped) -> Path | None:
    """Where the scrape wrote the files at the split point, where it wrote them."""
    where = (scraped.summary.get("files") or {}).get("path")
    return Path(where) if where and Path(where).exists() else None


def read_sequences(path: Path) -> Iterator[dict[str, Any]]:
    """The records of sequences.jsonl, one at a time (a reader that needs a few stops early)."""
    with path.open("rb") as handle:
        for line in handle:
            if line.strip():
                yield orjson.loads(line)

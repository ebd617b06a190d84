"""git history → `sequences.jsonl`: list commits, scrape shards in parallel, deduplicate, split, write.

One `git rev-list` lists the commits; they are dealt round-robin to shards,
each scraped by ONE `git log -p` process in its own worker (never one git
process per commit). The merge walks the commits in log order (newest
first), drops exact duplicates, holds out the newest kept commits for
evaluation, and writes every sequence with its split.
"""

from __future__ import annotations

import math
import multiprocessing
import os
import signal
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
from tqdm import tqdm

from scrapers.completions import COMPLETIONS_FILE, CasesRead, write_cases
from scrapers.config import ScrapeConfig
from scrapers.errors import RepositoryError
from scrapers.files import FILES_FILE, FilesRead, read_files, split_point
from scrapers.git import (
    Repository,
    RepositoryInfo,
    describe_repository,
    lacking_content,
    open_repository,
    rev_list,
    shallow_boundaries,
)
from scrapers.shard import ScrapeStats, ShardResult, ShardTask, scrape_shard

SEQUENCES_FILE = "sequences.jsonl"
MIN_COMMITS_PER_SHARD = 500  # below this a worker process costs more than it saves
MAX_AUTO_WORKERS = 8  # git log is I/O- and memory-bound beyond this


@dataclass
class RepositoryScrape:
    """One repository's part of a scrape."""

    name: str
    """The tag its sequences carry (`repo` in sequences.jsonl)."""
    info: RepositoryInfo
    stats: ScrapeStats
    train_commits: int
    valid_commits: int
    eval_commits: int
    workers: int
    duration_s: float
    files_at: str | None = None
    """The split point, whose files training may read (None: none)."""
    files: FilesRead | None = None
    """What the files at the split point gave (None: `files` is off)."""

    def to_manifest(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "path": self.info.path,
            "head": self.info.head,
            **self.stats.to_manifest(),
            "train_commits": self.train_commits,
            "valid_commits": self.valid_commits,
            "eval_commits": self.eval_commits,
            "workers": self.workers,
            "duration_s": round(self.duration_s, 3),
        }


@dataclass
class ScrapeResult:
    sequences_path: Path
    repositories: list[RepositoryScrape]
    stats: ScrapeStats
    """All repositories together."""
    formats: list[str]
    sequences: dict[str, int]
    """Sequences written per split (`train`, `valid`, `eval`)."""
    duration_s: float
    failed: list[dict[str, str]]
    """Repositories that could not be scraped (path and error), skipped."""
    files_path: Path | None = None
    """The files at the split point (FILES_FILE; None: `files` is off)."""
    cases: CasesRead | None = None
    """The code-completion cases of the held-out and validation commits (COMPLETIONS_FILE beside the
    sequences)."""

    def files_manifest(self) -> dict[str, Any] | None:
        """What the files at the split point gave, all repositories together."""
        if self.files_path is None:
            return None
        read = [(r.name, r.files) for r in self.repositories if r.files is not None]
        skipped: Counter = Counter()
        redactions: Counter = Counter()
        for _, part in read:
            skipped.update(part.skipped)
            redactions.update(part.redactions)
        return {
            "path": str(self.files_path),
            "files": sum(part.files for _, part in read),
            "bytes": sum(part.bytes for _, part in read),
            "skipped": dict(sorted(skipped.items())),
            "redactions": dict(sorted(redactions.items())),
            "at": {name: part.commit for name, part in read},
            "unreadable": {name: part.unreadable for name, part in read if part.unreadable},
        }

    def to_manifest(self) -> dict[str, Any]:
        commits = self.stats.commits_seen
        return {
            **self.stats.to_manifest(),
            "formats": self.formats,
            "sequences": sum(self.sequences.values()),
            "split": {
                "train_commits": sum(r.train_commits for r in self.repositories),
                "valid_commits": sum(r.valid_commits for r in self.repositories),
                "eval_commits": sum(r.eval_commits for r in self.repositories),
                "train_sequences": self.sequences["train"],
                "valid_sequences": self.sequences["valid"],
                "eval_sequences": self.sequences["eval"],
            },
            "duration_s": round(self.duration_s, 3),
            "commits_per_s": round(commits / self.duration_s, 1) if self.duration_s > 0 else None,
            "workers": max((r.workers for r in self.repositories), default=0),
            "sequences_path": str(self.sequences_path),
            "per_repository": [r.to_manifest() for r in self.repositories],
            "failed_repositories": self.failed,
            "files": self.files_manifest(),
            "completions": {
                "path": str(self.sequences_path.with_name(COMPLETIONS_FILE)),
                **(self.cases or CasesRead()).to_manifest(),
            },
        }


@dataclass(frozen=True)
class _Listed:
    """A repository opened and its commits listed, ready to be sharded."""

    path: str
    git_dir: Path
    info: RepositoryInfo
    name: str
    shas: list[str]
    tasks: list[ShardTask]
    repo: Repository
    """Opened once: the split point, the files and the completion cases read through it."""


def scrape(
    repo_paths: Sequence[str | Path], config: ScrapeConfig, output_dir: Path, cores: int | None = None
) -> ScrapeResult:
    """Scrape every repository into `output_dir/sequences.jsonl`, written atomically.

    The shards of all repositories share one pool of worker processes, bounded by `cores` (the
    cores this process may use; by default its CPU affinity). With several repositories, one that
    cannot be scraped is reported and skipped; it is an error only when none can be (or when it is
    the only one).
    """
    if cores is None:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    started = time.perf_counter()
    failed: list[dict[str, str]] = []
    listed: list[_Listed] = []
    for index, repo_path in enumerate(repo_paths):
        try:
            listed.append(
                _list(repo_path, config, output_dir / f".scrape-{index}", [r.name for r in listed], cores)
            )
        except RepositoryError as err:
            failed.append({"path": str(repo_path), "error": str(err)})
    tasks = [task for repository in listed for task in repository.tasks]
    label = listed[0].name if len(listed) == 1 else f"{len(listed)} repositories"
    outcomes = iter(_run_shards(tasks, sum(len(r.shas) for r in listed), label, cores))

    path = output_dir / SEQUENCES_FILE
    partial = path.with_name(path.name + ".partial")
    seen_keys: set[bytes] = set()
    written = dict.fromkeys(SPLITS, 0)
    repositories: list[RepositoryScrape] = []
    try:
        with partial.open("wb") as out:
            for repository in listed:
                outcome = [next(outcomes) for _ in repository.tasks]
                results = [result for result in outcome if not isinstance(result, str)]
                if len(results) < len(outcome):  # a shard failed: its error message is in its place
                    error = next(result for result in outcome if isinstance(result, str))
                    failed.append({"path": repository.path, "error": error})
                    continue
                repositories.append(_merge(repository, results, config, seen_keys, out, written))
    finally:
        for task in tasks:
            task.part_path.unlink(missing_ok=True)
    if not repositories:
        partial.unlink(missing_ok=True)
        raise RepositoryError("; ".join(failure["error"] for failure in failed) or "no repository given")
    os.replace(partial, path)
    files_path = _read_files(listed, repositories, config, output_dir) if config.files else None
    cases = _write_cases(listed, repositories, config, path)
    total = ScrapeStats()
    for scraped in repositories:
        total.add(scraped.stats)
    return ScrapeResult(
        path, repositories, total, config.formats, written, time.perf_counter() - started, failed, files_path,
        cases,
    )  # fmt: skip


def _write_cases(
    listed: list[_Listed], repositories: list[RepositoryScrape], config: ScrapeConfig, sequences: Path
) -> CasesRead:
    """The code-completion cases of every repository's held-out and validation commits, beside `sequences`
    (which they are read from: one record a commit), atomically."""
    held_out: dict[str, dict[str, dict[str, Any]]] = {}
    with sequences.open("rb") as records:
        for line in records:
            if b'"split":"train"}' in line[-20:]:
                continue  # most lines: not parsed
            record = orjson.loads(line)
            held_out.setdefault(record["repo"], {}).setdefault(record["commit"], record)
    path = sequences.with_name(COMPLETIONS_FILE)
    partial = path.with_name(path.name + ".partial")
    read = CasesRead()
    with partial.open("wb") as out:
        for scraped, repo in _opened(listed, repositories):
            read.add(write_cases(repo, scraped.name, held_out.get(scraped.name, {}).values(), config, out))
    os.replace(partial, path)
    return read


def _read_files(
    listed: list[_Listed], repositories: list[RepositoryScrape], config: ScrapeConfig, output_dir: Path
) -> Path:
    """Each scraped repository's files at its split point into `output_dir`'s FILES_FILE, atomically."""
    path = output_dir / FILES_FILE
    partial = path.with_name(path.name + ".partial")
    with partial.open("wb") as out:
        for scraped, repo in _opened(listed, repositories):
            scraped.files = read_files(repo, scraped.files_at, config, scraped.name, out)
    os.replace(partial, path)
    return path


def _opened(
    listed: list[_Listed], repositories: list[RepositoryScrape]
) -> Iterator[tuple[RepositoryScrape, Repository]]:
    """Each scraped repository with the repository it was read from."""
    opened = {source.name: source.repo for source in listed}
    for scraped in repositories:
        yield scraped, opened[scraped.name]


def _list(repo_path, config: ScrapeConfig, part_prefix: Path, taken_names: list[str], cores: int) -> _Listed:
    repo = open_repository(repo_path)
    shas = rev_list(repo, config.rev, config.max_commits, config.since, config.until)
    whole_history = config.rev == "HEAD" and not (config.max_commits or config.since or config.until)
    info = describe_repository(repo, commit_count=len(shas) if whole_history else None)
    name = _unique_name(info, taken_names)
    workers = shard_count(config.workers, len(shas), cores)
    boundaries = shallow_boundaries(repo)
    lacking = lacking_content(repo, shas, config.include_merges)
    tasks = [
        ShardTask(
            repo.git_dir,
            repo.work_tree,
            shas[shard::workers],
            config,
            boundaries,
            lacking,
            Path(f"{part_prefix}-{shard}.part"),
            name,
        )
        for shard in range(workers)
    ]
    return _Listed(str(repo_path), repo.git_dir, info, name, shas, tasks, repo)


def _merge(
    repository: _Listed, results: list[ShardResult], config, seen_keys, out, written
) -> RepositoryScrape:
    """One repository's shards → its sequences in log order, deduplicated and split."""
    stats = ScrapeStats()
    for result in results:
        stats.add(result.stats)
    shas = repository.shas
    split = _assign_splits(shas, results, config, seen_keys, stats)
    _write_sequences(shas, repository.tasks, results, split, len(config.formats), out, written)
    counts = Counter(split.values())
    files_at = split_point(repository.repo, shas, split) if config.files else None
    return RepositoryScrape(
        name=repository.name,
        info=repository.info,
        stats=stats,
        train_commits=counts["train"],
        valid_commits=counts["valid"],
        eval_commits=counts["eval"],
        workers=len(repository.tasks),
        duration_s=sum(result.seconds for result in results),
        files_at=files_at,
    )


def shard_count(workers: int | str, commits: int, cores: int) -> int:
    if workers != "auto":
        return max(1, min(int(workers), commits))
    return max(1, min(cores, commits // MIN_COMMITS_PER_SHARD, MAX_AUTO_WORKERS))


def holdout_counts(kept: int, config: ScrapeConfig) -> tuple[int, int]:
    """How many of the newest kept commits are held out to score the run, and how many just older than
    those validate its choices: as configured, each at most `holdout_max_share` of the history (the
    held-out split at least one commit from 20 up)."""
    most = math.floor(kept * config.holdout_max_share)
    held_out = max(most, 1 if kept >= 20 and config.holdout_max_share else 0)
    return min(config.eval_commits, held_out), min(config.valid_commits, most)


def _assign_splits(
    shas, results: list[ShardResult], config: ScrapeConfig, seen_keys: set[bytes], stats: ScrapeStats
):
    """sha → "eval" / "valid" / "train" for every kept, non-duplicate commit, walking newest first."""
    kept = {record.sha: record for result in results for record in result.kept}
    unique = []
    for sha in shas:
        record = kept.get(sha)
        if record is None:
            continue
        if record.key in seen_keys:
            stats.skipped["duplicate"] += 1
            stats.commits_kept -= 1
            stats.files_kept -= record.files
            stats.bytes_kept -= record.bytes
            continue
        seen_keys.add(record.key)
        unique.append(sha)
    held_out, validation = holdout_counts(len(unique), config)
    return {
        sha: "eval" if position < held_out else "valid" if position < held_out + validation else "train"
        for position, sha in enumerate(unique)
    }


SPLITS = ("train", "valid", "eval")
"""Oldest to newest: trained on; held out to validate the run's choices; held out to score it."""
_TRAIN_SUFFIX = b',"split":"train"}\n'


def _write_sequences(
    shas, tasks: list[ShardTask], results, split: dict[str, str], per_commit: int, out, written
):
    """Copy the shards' sequences to `out` in log order with their split; duplicates are left out.

    Shards write every line with `"split":"train"` last, so a held-out line only has its ending
    rewritten: the text is copied as bytes, never parsed again.
    """
    kept = {record.sha for result in results for record in result.kept}
    readers = [task.part_path.open("rb") for task in tasks]
    try:
        for index, sha in enumerate(shas):
            if sha not in kept:
                continue
            # Commit `index` went to shard `index % len(tasks)`, which wrote `per_commit` lines for it, in order.
            reader = readers[index % len(tasks)]
            lines = [reader.readline() for _ in range(per_commit)]
            destination = split.get(sha)
            if destination not in (None, "train"):
                ending = b',"split":"%s"}\n' % destination.encode()
                lines = [line[: -len(_TRAIN_SUFFIX)] + ending for line in lines]
            if destination:
                out.writelines(lines)
                written[destination] += per_commit
    finally:
        for reader in readers:
            reader.close()


def _run_shards(tasks: list[ShardTask], total: int, label: str, cores: int) -> list[ShardResult | str]:
    """Run the shards (in worker processes when more than one), in order, with a progress bar on a
    terminal. A shard that fails gives its error message in place of a result."""
    counter = multiprocessing.Value("q", 0)
    if len(tasks) <= 1:
        with _progress_bar(counter, total, label):
            return [_scrape_or_error(task, counter) for task in tasks]
    # fork shares the loaded modules with the workers (spawn would import them again in each).
    method = "fork" if sys.platform.startswith("linux") else "spawn"
    context = multiprocessing.get_context(method)
    pool = context.Pool(min(len(tasks), cores), initializer=_set_worker_progress, initargs=(counter,))
    with ending_quietly(pool), _progress_bar(counter, total, label):
        return pool.map(_scrape_with_progress, tasks)


@contextmanager
def ending_quietly(pool: multiprocessing.pool.Pool) -> Iterator[multiprocessing.pool.Pool]:
    """`pool`, whose workers end with their last task when the block is done, and are stopped only when it
    is interrupted. Leaving `with pool` stops them with SIGTERM, which could hang: a worker still being
    forked (on a busy machine the others can do every task before it first runs) loses the signal to
    Python's after-fork reset and then waits for a task forever (the suite met it twice in a row)."""
    try:
        yield pool
        pool.close()
        pool.join()
    finally:
        pool.terminate()  # interrupted: stop them (after join, nothing is left to stop)


_WORKER_PROGRESS = None


def _set_worker_progress(counter) -> None:
    """A worker's start: the shared progress counter, and Ctrl-C left to the parent (a terminal sends it
    to every process of the group; the parent stops the pool). A SIGTERM ends a worker as the run's
    handler ends any process forked from it (`pipeline.record.run`), quietly."""
    global _WORKER_PROGRESS
    _WORKER_PROGRESS = counter
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _scrape_with_progress(task: ShardTask) -> ShardResult | str:
    return _scrape_or_error(task, _WORKER_PROGRESS)


def _scrape_or_error(task: ShardTask, progress) -> ShardResult | str:
    try:
        return scrape_shard(task, progress)
    except RepositoryError as err:
        return str(err)


@contextmanager
def _progress_bar(counter, total: int, label: str) -> Iterator[None]:
    """A tqdm bar fed from the shared counter, on a terminal only (quiet in logs and CI)."""
    if not sys.stderr.isatty():
        yield
        return
    bar = tqdm(total=total, desc=f"scraping {label}", unit="commit", file=sys.stderr)
    done = threading.Event()

    def follow() -> None:
        while not done.wait(0.1):
            bar.update(counter.value - bar.n)

    follower = threading.Thread(target=follow, daemon=True)
    follower.start()
    try:
        yield
    finally:
        done.set()
        follower.join()
        bar.update(counter.value - bar.n)
        bar.close()


def _unique_name(info: RepositoryInfo, taken: list[str]) -> str:
    base = Path(info.path).name.removesuffix(".git") or "repo"
    name, suffix = base, 2
    while name in taken:
        name, suffix = f"{base}-{suffix}", suffix + 1
    return name

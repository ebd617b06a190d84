#!/usr/bin/env python3
"""Scrape speed against git's own: raw `git log -p` vs repotune's full scrape, same range, one run.

    python benchmarks/bench_scrape.py /path/to/repo [--rev HEAD] [--repeat 3] [--per-commit]

Prints the median wall time of each over `--repeat` runs and the ratio to
raw git. repotune's number is the whole scrape: rev-list, sharded git log,
parsing, filters, secret redaction, formatting and writing sequences.jsonl.
PyDriller runs too when it is installed; `--per-commit` adds GitPython's
one-`commit.diff()`-per-commit approach (slow: tens of seconds on thousands
of commits).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pipeline.config import ScrapeConfig
from pipeline.hardware import usable_cores
from scrapers.git import SAFE_GIT_ENV, open_repository, rev_list
from scrapers.scrape import scrape, shard_count


def raw_git_log(git_dir: str, rev: str) -> None:
    env = {**os.environ, **SAFE_GIT_ENV, "GIT_DIR": git_dir}
    subprocess.run(
        ["git", "log", "-p", "--no-ext-diff", "--no-textconv", rev, "--"],
        env=env,
        stdout=subprocess.DEVNULL,
        check=True,
    )


def repotune_scrape(path: str, config: ScrapeConfig) -> None:
    with tempfile.TemporaryDirectory() as out:
        scrape([path], config, Path(out))


def pydriller_scrape(path: str, rev: str) -> None:
    from pydriller import Repository

    for commit in Repository(path, to_commit=rev if rev != "HEAD" else None).traverse_commits():
        for change in commit.modified_files:
            change.diff  # noqa: B018 -- the diff is what a scrape needs


def gitpython_per_commit(path: str, rev: str) -> None:
    import git

    repo = git.Repo(path)
    for commit in repo.iter_commits(rev):
        parent = commit.parents[0] if commit.parents else git.NULL_TREE
        for change in commit.diff(parent, create_patch=True):
            change.diff  # noqa: B018


def median_time(function, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        function()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("repo")
    parser.add_argument("--rev", default="HEAD")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--per-commit", action="store_true", help="also time one GitPython diff per commit")
    args = parser.parse_args()

    repo = open_repository(args.repo)
    git_dir = str(Path(repo.git_dir).resolve())
    commits = len(rev_list(repo, args.rev, None, None, None))
    config = ScrapeConfig(rev=args.rev)
    print(f"repository: {args.repo}  range: {args.rev}  commits: {commits}")
    print(f"usable cores: {usable_cores()}  repotune workers: {shard_count(config.workers, commits)}")

    results = {"raw git log -p": median_time(lambda: raw_git_log(git_dir, args.rev), args.repeat)}
    results["repotune scrape (full)"] = median_time(lambda: repotune_scrape(args.repo, config), args.repeat)
    try:
        import pydriller  # noqa: F401

        results["pydriller"] = median_time(lambda: pydriller_scrape(args.repo, args.rev), 1)
    except ImportError:
        print("pydriller: not installed (pip install pydriller to include it)")
    if args.per_commit:
        results["gitpython per-commit diff"] = median_time(
            lambda: gitpython_per_commit(args.repo, args.rev), 1
        )

    baseline = results["raw git log -p"]
    print(f"\n{'method':<28}{'wall s':>10}{'× raw git':>12}{'commits/s':>12}")
    for name, seconds in results.items():
        print(f"{name:<28}{seconds:>10.3f}{seconds / baseline:>12.2f}{commits / seconds:>12.0f}")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Scrape speed against git's own: raw `git log -p` vs repotune's full scrape, same range, one run.

    python benchmarks/bench_scrape.py /path/to/repo [--rev HEAD] [--repeat 3] [--per-commit] [--name flask]

Runs raw git and the scrape in turn, `--repeat` rounds after a warm-up
round, and prints each one's median wall time, the median of the per-round
ratios to raw git, and every round's ratio. repotune's number is the whole
scrape: rev-list, sharded git log, parsing, filters, secret redaction,
formatting and writing sequences.jsonl.
PyDriller runs too when it is installed; `--per-commit` adds GitPython's
one-`commit.diff()`-per-commit approach (slow: tens of seconds on thousands
of commits). What it prints goes to benchmarks/results/scrape-NAME.json too (docs/data.md's figure).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.measured import RESULTS, measured_by, name_option, repository_name, write_result
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
        scrape([path], config, Path(out), usable_cores())


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


def timed(function) -> float:
    started = time.perf_counter()
    function()
    return time.perf_counter() - started


def paired_rounds(functions: dict[str, Callable[[], None]], repeat: int) -> dict[str, list[float]]:
    """Wall times of each function, run once per round in turn after one untimed warm-up round:
    raw git and the scrape then share the machine's state (page cache, other load) round by round."""
    for function in functions.values():
        function()
    times: dict[str, list[float]] = {name: [] for name in functions}
    for _ in range(repeat):
        for name, function in functions.items():
            times[name].append(timed(function))
    return times


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("repo")
    parser.add_argument("--rev", default="HEAD")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--per-commit", action="store_true", help="also time one GitPython diff per commit")
    name_option(parser)
    args = parser.parse_args()

    repo = open_repository(args.repo)
    git_dir = str(repo.git_dir)
    commits = len(rev_list(repo, args.rev, None, None, None))
    config = ScrapeConfig(rev=args.rev)
    print(f"repository: {args.repo}  range: {args.rev}  commits: {commits}")
    print(
        f"usable cores: {usable_cores()}  repotune workers: {shard_count(config.workers, commits, usable_cores())}"
    )

    times = paired_rounds(
        {
            "raw git log -p": lambda: raw_git_log(git_dir, args.rev),
            "repotune scrape (full)": lambda: repotune_scrape(args.repo, config),
        },
        args.repeat,
    )
    try:
        import pydriller  # noqa: F401

        times["pydriller"] = [timed(lambda: pydriller_scrape(args.repo, args.rev))]
    except ImportError:
        print("pydriller: not installed (pip install pydriller to include it)")
    if args.per_commit:
        times["gitpython per-commit diff"] = [timed(lambda: gitpython_per_commit(args.repo, args.rev))]

    baseline = times["raw git log -p"]
    print(f"\n{'method':<28}{'wall s':>10}{'× raw git':>12}{'commits/s':>12}")
    for name, walls in times.items():
        seconds = statistics.median(walls)
        if len(walls) == len(baseline):  # the median of per-round ratios: a ratio of medians hides drift
            ratio = statistics.median(per_round_ratios(walls, baseline))
        else:  # one timed run (PyDriller, per-commit diffs), against raw git's median
            ratio = seconds / statistics.median(baseline)
        print(f"{name:<28}{seconds:>10.3f}{ratio:>12.2f}{commits / seconds:>12.0f}")
    scrape_ratios = sorted(per_round_ratios(times["repotune scrape (full)"], baseline))
    print(
        f"\nscrape / raw git per round ({args.repeat} rounds): " + " ".join(f"{r:.2f}" for r in scrape_ratios)
    )
    name = repository_name(args.name, args.repo)
    measured = {
        "repository": name,
        "rev": args.rev,
        "commits": commits,
        "rounds": args.repeat,
        "seconds": times,
    }
    path = write_result(RESULTS / f"scrape-{name}.json", measured_by() | measured | {"ratios": scrape_ratios})
    print(f"results: {path}")


def per_round_ratios(walls: list[float], baseline: list[float]) -> list[float]:
    return [wall / raw for wall, raw in zip(walls, baseline, strict=True)]


if __name__ == "__main__":
    main()

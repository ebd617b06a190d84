#!/usr/bin/env python3
"""Secret redaction on real histories: how often each rule fires, and lines for a person to judge.

    python benchmarks/bench_redaction.py /path/to/flask /path/to/requests [--sample 20] [--seed 0]

Each repository is scraped as a run scrapes it (the `diff` format: the
message, then the change). The changed lines (the diffs' `+`/`-` lines) and
the lines holding a redaction are counted, per rule and per 10,000 changed
lines; then `--sample` redacted lines drawn at random are printed with the
file they were in (their values are already replaced, so the line shows what
surrounded them). A redacted line that held no credential is a benign line
mangled: the goal is at most 1 in 10,000 changed lines.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
from collections import Counter
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pipeline.config import ScrapeConfig
from pipeline.hardware import usable_cores
from scrapers.scrape import scrape
from scrapers.secrets import MESSAGE_ORIGIN, REDACTION


def redacted_lines(repo: str) -> tuple[int, list[tuple[str, str]]]:
    """The changed lines of a repository's scrape, and each redacted line with the file it was in."""
    with tempfile.TemporaryDirectory() as out:
        scrape([repo], ScrapeConfig(format="diff"), Path(out), usable_cores())
        texts = [orjson.loads(line)["text"] for line in (Path(out) / "sequences.jsonl").open("rb")]
    changed, found = 0, []
    for text in texts:
        where = MESSAGE_ORIGIN
        for line in text.splitlines():
            if line.startswith("diff --git a/"):
                where = line.removeprefix("diff --git a/").rsplit(" b/", 1)[0]
                continue
            if line.startswith(("+", "-")) and not line.startswith(("+++ ", "--- ")):
                changed += 1
            if "<REDACTED:" in line:
                found.append((where, line))
    return changed, found


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("repos", nargs="+")
    parser.add_argument("--sample", type=int, default=20, help="redacted lines to print, drawn at random")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    changed, found = 0, []
    for repo in args.repos:
        repo_changed, repo_found = redacted_lines(repo)
        print(f"{repo}: {repo_changed:,} changed lines, {len(repo_found):,} redacted lines")
        changed += repo_changed
        found += [(f"{Path(repo).name}:{where}", line) for where, line in repo_found]

    per_rule = Counter(rule for _, line in found for rule in set(REDACTION.findall(line)))
    print(f"\nall: {changed:,} changed lines; redacted lines per 10,000 changed lines: "
          f"{len(found) / changed * 10_000:.2f}")  # fmt: skip
    print(f"{'rule':<30}{'lines':>8}{'per 10,000':>12}")
    for rule, count in per_rule.most_common():
        print(f"{rule:<30}{count:>8}{count / changed * 10_000:>12.2f}")

    print(f"\n{min(args.sample, len(found))} redacted lines drawn at random (seed {args.seed}):")
    for where, line in random.Random(args.seed).sample(found, min(args.sample, len(found))):
        print(f"  {where}\n      {line.strip()[:160]}")


if __name__ == "__main__":
    main()

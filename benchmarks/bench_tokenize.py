#!/usr/bin/env python3
"""A first run's tokenizing: the whole history (the baseline) against what a time budget can train.

    python benchmarks/bench_tokenize.py /path/to/pytest /path/to/flask [--budget 10m]

Scrapes each repository with the real CLI (`run_pipeline.py scrape`, the shipped config), then tokenizes
its scrape twice into fresh token caches, as a first run does (`prepare`, the default model): all of it,
and ahead of the budget on this machine (`tokenize_ahead`: the newest training sequences that hold what
the budget trains at 2,000 tokens/s, the held-out ones, the older ones' lengths estimated). Prints both
times and their ratio, how many sequences were tokenized, and the estimate beside the real statistics the
planner reads (tokens, median and p95 length, sequences over 512 tokens), and checks that the tokenized
sequences are the whole history's newest. Exit 0, 1 when they differ, 2 when a scrape fails. What it
prints goes to benchmarks/results/tokenize.json too (docs/training.md's figure), a repository a key.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # it imports pipeline, installed or not (as the other benchmarks)

from benchmarks.cli_scrape import scraped  # noqa: E402
from benchmarks.measured import RESULTS, measured_by, write_result  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "repos", nargs="+", help="git repositories with long histories (thousands of commits)"
    )
    parser.add_argument("--budget", default="10m", help="the time budget a run would plan (default 10m)")
    parser.add_argument(
        "--output-dir", default="bench-tokenize-output", help="one scrape folder per repository"
    )
    args = parser.parse_args()

    measured = {}
    for name, output in scraped(args.repos, args.output_dir):
        measured[name] = compare(name, output, args.budget)
        if not measured[name]["same"]:
            return 1
    path = RESULTS / "tokenize.json"
    earlier = orjson.loads(path.read_bytes())["repositories"] if path.exists() else {}
    write_result(path, measured_by() | {"budget": args.budget, "repositories": earlier | measured})
    print(f"results: {path}")
    return 0


def compare(name: str, output: Path, budget: str) -> dict:
    """Prints both tokenizations and the estimate beside the real statistics; gives them for the results."""
    from pipeline.config import load_config
    from pipeline.data.token_cache import prepare, read_split
    from pipeline.hardware import machine
    from pipeline.plan.planner import tokenize_ahead
    from pipeline.types import Launch, Scraped

    manifest = orjson.loads((output / "MANIFEST.json").read_bytes())
    scraped = Scraped(output / "sequences.jsonl", manifest["repositories"], manifest["scrape"])
    loaded = load_config(None, flags={"train.time_budget": budget})
    ahead = tokenize_ahead(machine(None, Launch()), loaded)
    results = {}
    for how, tokens in (("ahead", ahead), ("whole", None)):
        with tempfile.TemporaryDirectory() as root:
            started = time.perf_counter()
            prepared = prepare(scraped, loaded, Path(root), ahead=tokens)
            seconds = time.perf_counter() - started
            lengths = read_split(prepared.cache.directory, "train").column("length").to_numpy().tolist()
            results[how] = (seconds, prepared, lengths)
    (fast, newest, tokenized), (slow, whole, everything) = results["ahead"], results["whole"]
    print(f"\n{name}: {whole.stats.sequences:,} training sequences, budget {budget} → {ahead} tokens ahead")
    print(
        f"  tokenize all          {slow:7.1f} s\n"
        f"  tokenize ahead        {fast:7.1f} s   ({slow / fast:.1f}× faster; "
        f"{newest.tokenized or whole.stats.sequences:,} sequences)"
    )
    said = {
        "sequences": whole.stats.sequences, "ahead_tokens": ahead, "whole_s": slow, "ahead_s": fast,
        "tokenized": newest.tokenized or whole.stats.sequences,
    }  # fmt: skip
    for label, stats in (("estimated", newest.stats), ("real", whole.stats)):
        longer = sum(count for size, count in stats.length_counts.items() if size > 512)
        print(
            f"  {label:<10} tokens {stats.tokens:>12,}  median {stats.percentile(50):>6}  "
            f"p95 {stats.percentile(95):>6}  over 512 {longer:>7,}"
        )
        said[label] = {
            "tokens": int(stats.tokens),
            "median": int(stats.percentile(50)),
            "p95": int(stats.percentile(95)),
        }
    said["same"] = tokenized == everything[: len(tokenized)]
    print(f"  the tokenized sequences are the whole history's newest: {'yes' if said['same'] else 'NO'}")
    return said


if __name__ == "__main__":
    sys.exit(main())

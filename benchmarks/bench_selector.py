#!/usr/bin/env python3
"""Retrieval without a model: how much does the selector add to the lookup? Minutes, no training.

    python benchmarks/bench_selector.py /path/to/requests /path/to/flask

Scrapes each repository with the real CLI (`run_pipeline.py scrape`, the shipped config), builds its
past as a run does (`learn_past`: the index over every commit that is not held out, the selector learned
on the newest training commits) and answers two sets of commits from it, with the lookup (the message of
the most similar earlier commit) and the selector (the best of the `retrieval.k` nearest as its ranker
orders them):

- the older commits that a run chooses its suggestion system on (`suggestion.backtest`: the validation
  commits and the blocks of as many before them, each answered only from commits older than all of it,
  by a selector learned only on older ones), pooled: 400 commits decide what one block of 100 cannot;
- the held-out commits, as a run answers them.

Prints chrF and edit similarity of each, with 95% bootstrap intervals, and the paired difference
selector − lookup with its interval: a gain inside it is noise. Also times the backtest two ways, its
selectors reusing the grades the run's selector made of their commits (as a run does) and grading them
anew (the baseline), and says whether the answers are the same. For changes to retrieval and the selector,
which `bench_learning.py` shows only with a training run per repository. Exit 0, or 2 when a scrape fails.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # it imports pipeline, installed or not (as the other benchmarks)

from benchmarks.cli_scrape import scraped  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("repos", nargs="+", help="git repositories with real histories (hundreds of commits)")
    parser.add_argument(
        "--output-dir", default="bench-selector-output", help="one scrape folder per repository"
    )
    args = parser.parse_args()

    for name, output in scraped(args.repos, args.output_dir):
        report(name, output / "sequences.jsonl")
    return 0


def report(name: str, sequences: Path) -> None:
    """The lookup and the selector on the older commits (pooled blocks) and on the held-out ones."""
    from pipeline.config import load_config
    from pipeline.evaluate.suggestion import Suggester, backtest, learn_past
    from pipeline.types import Past

    config = load_config(None).config
    started = time.perf_counter()
    past = learn_past(sequences, config.retrieval, config.train.seed)
    learned = time.perf_counter()
    every = backtest(past, config.retrieval, config.train.seed)
    tested = time.perf_counter()
    # The baseline: the backtest's selectors grading their commits anew, not reusing the run's grades.
    suggester = Suggester(past.suggester.index, past.suggester.selector, past.suggester.k)
    anew = backtest(Past(past.commits, suggester, past.facts), config.retrieval, config.train.seed)
    regraded = time.perf_counter() - tested
    blocks = [block for block in every if "selector" in block]
    print(
        f"{name}: {past.facts['index']['commits']} commits indexed, selector learned on "
        f"{(past.facts['selector'] or {}).get('commits', 0)} in {learned - started:.1f} s, {len(blocks)} older "
        f"blocks in {tested - learned:.1f} s (grading their commits anew: {regraded:.1f} s, "
        f"{regraded / max(tested - learned, 1e-9):.1f}×, {'the same' if anew == every else 'DIFFERENT'} answers)"
    )
    held = past.split("eval")
    answered = {
        f"older commits ({len(blocks)} blocks)": tuple(
            [answer for block in blocks for answer in block[key]]
            for key in ("lookup", "selector", "references")
        ),
        "held-out commits": (
            [past.suggester.lookup(commit.diff) for commit in held],
            [past.suggester.select(commit.diff) for commit in held],
            [commit.message for commit in held],
        ),
    }
    for label, (lookup, selector, references) in answered.items():
        if references:
            print(f"  {label}, {len(references)}: {compare(lookup, selector, references)}")


def compare(lookup: list[str], selector: list[str], references: list[str]) -> str:
    from pipeline.evaluate.evaluation import difference_text, paired_difference, score_messages

    mine, theirs = score_messages(selector, references), score_messages(lookup, references)
    delta = paired_difference("message", lookup, selector, references)
    return (
        f"lookup {theirs['chrf']:.1f} / {theirs['edit_similarity']:.1f}, "
        f"selector {mine['chrf']:.1f} / {mine['edit_similarity']:.1f}, "
        f"selector − lookup {difference_text(delta, 'chrf')} / {difference_text(delta, 'edit_similarity')} (chrF / edit similarity)"
    )


if __name__ == "__main__":
    sys.exit(main())

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
selector − lookup with its interval: a gain inside it is noise. Then the selector on the held-out commits
as the commit hook is given a change (`git show` of each, with the hook's diff options): read whole, as
the hook read a change before (the baseline), and read as training read commits (`as_trained`: the files
the scrape kept), as it does now; and the hook's suggestion with the alternatives it shows below it, as
a user who keeps the closest of them would (against the suggestion alone, and against as many of the
lookup's nearest messages). Also times the backtest two ways, its
selectors reusing the grades the run's selector made of their commits (as a run does) and grading them
anew (the baseline), and says whether the answers are the same. For changes to retrieval and the selector,
which `bench_learning.py` shows only with a training run per repository. Exit 0, or 2 when a scrape fails.
"""

from __future__ import annotations

import argparse
import os
import re
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

    for (name, output), repo in zip(scraped(args.repos, args.output_dir), args.repos, strict=True):
        report(name, output / "sequences.jsonl", repo)
    return 0


def report(name: str, sequences: Path, repo: str) -> None:
    """The lookup and the selector on the older commits (pooled blocks) and on the held-out ones, and the
    selector on the held-out ones as the commit hook reads a change."""
    from dataclasses import replace

    from pipeline.config import load_config
    from pipeline.suggest.suggestion import Suggester, backtest, learn_past

    config = load_config(None).config
    started = time.perf_counter()
    past = learn_past(sequences, config.retrieval, config.train.seed)
    learned = time.perf_counter()
    every = backtest(past, config.retrieval, config.train.seed)
    tested = time.perf_counter()
    # The baseline: the backtest's selectors grading their commits anew, not reusing the run's grades.
    suggester = Suggester(past.suggester.index, past.suggester.selector, past.suggester.k)
    anew = backtest(replace(past, suggester=suggester), config.retrieval, config.train.seed)
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
    print(f"  {hook_reads(repo, past.suggester, held)}")
    print(f"  {picked(past.suggester, held)}")


def picked(suggester, held) -> str:
    """The hook's suggestion and the alternatives it shows below it, on the held-out commits: what a user
    who keeps the one closest to the message written gets (by edit similarity), against the suggestion
    alone, and against as many of the lookup's nearest messages picked the same way (the baseline)."""
    from pipeline.evaluate.metrics import edit_similarities, paired_difference, score_messages
    from pipeline.scores import differences
    from pipeline.use.hook import ALTERNATIVES

    shown = 1 + ALTERNATIVES
    references = [commit.message for commit in held]
    ranked, nearest = (
        [suggester.suggestions(commit.diff, shown, system, read=True) or [""] for commit in held]
        for system in ("selector", "lookup")
    )

    def closest(options: list[list[str]]) -> list[str]:
        kept = []
        for offered, reference in zip(options, references, strict=True):
            scores = edit_similarities(offered, [reference] * len(offered))
            kept.append(offered[int(scores.argmax())])  # ties: the first offered
        return kept

    first, kept, near = [row[0] for row in ranked], closest(ranked), closest(nearest)
    over_first = paired_difference("message", first, kept, references)
    over_lookup = paired_difference("message", near, kept, references)
    mine, theirs = score_messages(kept, references), score_messages(near, references)
    return (
        f"the hook's {shown} (the suggestion and {ALTERNATIVES} more), the closest kept: {mine['chrf']:.1f} / "
        f"{mine['edit_similarity']:.1f}, − the suggestion alone {differences(over_first, 'chrf')}; the lookup's {shown} nearest, the closest kept: "
        f"{theirs['chrf']:.1f} / {theirs['edit_similarity']:.1f}, the hook's − them "
        f"{differences(over_lookup, 'chrf')}"
    )


def hook_reads(repo: str, suggester, held) -> str:
    """The selector on the held-out commits given as the commit hook is given a change (`git show` of each
    with the hook's diff options): read whole (what the hook read before `as_trained`, the baseline) and
    read as training read commits (what it reads now), against the diffs the scrape kept."""
    import contextlib
    import subprocess

    from pipeline.evaluate.metrics import paired_difference, score_messages
    from pipeline.scores import differences
    from pipeline.suggest.retrieval import changed_paths
    from pipeline.use.hook import DIFF_OPTIONS, MAX_DIFF_BYTES
    from scrapers.safe_git import SAFE_GIT_ENV

    whole, read, references, differ = [], [], [], 0
    for commit in held:
        shown = subprocess.run(
            ["git", "-C", repo, "show", "--format=", *DIFF_OPTIONS, commit.sha],
            env={**os.environ, **SAFE_GIT_ENV}, capture_output=True, check=True,
        ).stdout[:MAX_DIFF_BYTES].decode("utf-8", errors="replace")  # fmt: skip
        differ += len(changed_paths(shown)) != len(changed_paths(commit.diff))
        whole.append(suggester.select(_INDEX_LINE.sub("", shown)))  # as the hook read it: no index lines
        with contextlib.chdir(repo):  # where the hook runs: a notebook's versions are read from there
            read.append(suggester.suggest(shown, "selector"))
        references.append(commit.message)
    kept = [suggester.select(commit.diff) for commit in held]
    delta = paired_difference("message", whole, read, references)
    scores = [score_messages(answers, references) for answers in (whole, read, kept)]
    whole_s, read_s, kept_s = (f"{s['chrf']:.1f} / {s['edit_similarity']:.1f}" for s in scores)
    return (
        f"held-out commits as the commit hook is given them ({differ} of {len(held)} change files the scrape "
        f"left out): read whole {whole_s}, read as trained {read_s} (the scrape's diffs: {kept_s}), "
        f"read as trained − whole {differences(delta, 'chrf')}"
    )


_INDEX_LINE = re.compile(r"^index [0-9a-f]+\.\.[0-9a-f]+.*\n", re.MULTILINE)


def compare(lookup: list[str], selector: list[str], references: list[str]) -> str:
    from pipeline.evaluate.metrics import paired_difference, score_messages
    from pipeline.scores import differences

    mine, theirs = score_messages(selector, references), score_messages(lookup, references)
    delta = paired_difference("message", lookup, selector, references)
    return (
        f"lookup {theirs['chrf']:.1f} / {theirs['edit_similarity']:.1f}, "
        f"selector {mine['chrf']:.1f} / {mine['edit_similarity']:.1f}, "
        f"selector − lookup {differences(delta, 'chrf')} (chrF / edit similarity)"
    )


if __name__ == "__main__":
    sys.exit(main())

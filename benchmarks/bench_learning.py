#!/usr/bin/env python3
"""Did the model learn the repository? Train smollm2-135m on a real history's older commits and
score it on the newest ones, before and after, with the same prompts.

    python benchmarks/bench_learning.py /path/to/requests --budget 10m

Runs the real CLI (`run_pipeline.py`, formats `diff` and `message`, the chat template, answers-only
loss) in a subprocess, then reads its manifest and prints held-out perplexity (all and per format),
the commit-message task (chrF, edit similarity, subject exact match, output lengths) and the
change task, before → after, with a few held-out commits side by side: what git has, what the base
model wrote, what the adapter writes. The goal: held-out perplexity at least 15% lower after
training, and chrF of the commit messages higher. Exit 0 when both hold, 1 when not.

Use a real history (for example psf/requests): the newest 5% of its kept commits are held out.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PERPLEXITY_GOAL = -0.15  # relative change of held-out perplexity the run must reach


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("repo", help="a git repository with a real history (hundreds of commits or more)")
    parser.add_argument("--budget", default="10m", help="the run's time budget (default 10m)")
    parser.add_argument("--model", default="smollm2-135m", help="base model (default smollm2-135m)")
    parser.add_argument("--output-dir", default="bench-learning-output", help="where the run writes")
    parser.add_argument("--samples", type=int, default=3, help="held-out commits shown side by side")
    parser.add_argument(
        "--set", dest="overrides", action="append", default=[], help="more config overrides, as for the CLI"
    )
    args = parser.parse_args()

    command = [
        sys.executable, str(ROOT / "run_pipeline.py"), "--repo", args.repo, "--output-dir", args.output_dir,
        "--model", args.model, "--budget", args.budget, "--set", "scrape.format=[diff, message]",
        *[part for override in args.overrides for part in ("--set", override)],
    ]  # fmt: skip
    print("$ " + " ".join(command), flush=True)
    finished = subprocess.run(command)  # in the caller's directory: relative paths are theirs
    if finished.returncode != 0:
        print(f"the run failed (exit {finished.returncode})", file=sys.stderr)
        return 2
    import orjson

    manifest = orjson.loads((Path(args.output_dir) / "MANIFEST.json").read_bytes())
    return report(manifest, args.samples)


def report(manifest: dict, shown: int) -> int:
    params, dataset = manifest["training_parameters"], manifest["dataset"]
    evaluation = manifest["training_report"]["evaluation"]
    before, after = evaluation["before"], evaluation["after"]
    tasks = evaluation["tasks"]
    throughput = manifest["training_report"]["throughput"]
    left_out = dataset["left_out"] or {"sequences": 0}
    print()
    print(f"model {manifest['model']['name']}, {params['style']} style, loss on {params['loss_on']}")
    print(
        f"trained {params['total_steps']} steps on the newest {params['train_sequences']} sequences "
        f"({left_out['sequences']} older left out) in {manifest['timings']['train_s']:.0f} s, "
        f"{throughput['tokens_per_s']} tokens/s; held out: {dataset['eval_sequences']} sequences "
        f"({after['tokens']} tokens scored for loss, {tasks['after']['message']['samples']} commits per task)"
    )
    rows = [("held-out perplexity", before["perplexity"], after["perplexity"])]
    rows += [
        (f"  {name} perplexity", was["perplexity"], after["per_format"][name]["perplexity"])
        for name, was in before["per_format"].items()
    ]
    for task, label in (("message", "commit message"), ("diff", "change")):
        was, now = tasks["before"][task], tasks["after"][task]
        rows += [(f"{label} {key}", was[key], now[key]) for key in ("chrf", "edit_similarity")]
        if task == "message":
            rows += [
                (f"{label} {key}", was[key], now[key])
                for key in ("subject_exact_match_pct", "first_word_match_pct", "output_chars_mean")
            ]
            rows.append(("  (reference chars)", was["reference_chars_mean"], now["reference_chars_mean"]))
        rows.append((f"{label} blank outputs", was["whitespace_only"], now["whitespace_only"]))
    print(f"\n{'metric':<34}{'before':>10}{'after':>10}{'change':>10}")
    for name, was, now in rows:
        change = f"{now / was - 1:+.1%}" if was and now is not None else ""
        print(f"{name:<34}{_show(was):>10}{_show(now):>10}{change:>10}")

    samples = list(zip(evaluation["samples"]["before"], evaluation["samples"]["after"], strict=True))
    messages = [(was, now) for was, now in samples if was["task"] == "message"][:shown]
    for was, now in messages:
        print(f"\ncommit {was['commit'][:10]}")
        print(f"  git has : {_line(was['reference'])}")
        print(f"  base    : {_line(was['output'])}")
        print(f"  adapter : {_line(now['output'])}")

    perplexity_change = after["perplexity"] / before["perplexity"] - 1
    chrf_before, chrf_after = tasks["before"]["message"]["chrf"], tasks["after"]["message"]["chrf"]
    goals = [
        (f"held-out perplexity {perplexity_change:+.1%} (goal ≤ {PERPLEXITY_GOAL:.0%})", perplexity_change <= PERPLEXITY_GOAL),
        (f"commit-message chrF {chrf_before} → {chrf_after} (goal: higher)", chrf_after > chrf_before),
    ]  # fmt: skip
    print()
    for text, met in goals:
        print(f"{'met' if met else 'NOT met'}: {text}")
    return 0 if all(met for _, met in goals) else 1


def _show(value) -> str:
    return "-" if value is None else f"{value:g}"


def _line(text: str) -> str:
    """A generation on one line: newlines shown, blank output named."""
    return repr(text[:100]) if text.strip() else "(blank: whitespace only)"


if __name__ == "__main__":
    sys.exit(main())

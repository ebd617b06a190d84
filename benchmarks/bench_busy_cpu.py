#!/usr/bin/env python3
"""Training on a shared CPU: tokens/s alone, and with another process keeping one core busy, in one run.

    python benchmarks/bench_busy_cpu.py /path/to/repo [--max-commits 300] [--budget 180] [--model smollm2-135m]

Three runs of `run_pipeline.py` on the same repository, one after the other:
alone; with a process spinning on one core (started before the run, as the
thing a person works on beside training would be) and the threads planned
(`plan.cpu_threads: auto`, followed while training); and the same busy
machine with every usable core as a thread (`plan.cpu_threads=N`, what
torch does by default). Each run's training tokens/s, the speed its plan
rested on, the steps it planned and ran, its threads and the advice it gave
are printed, and the busy runs' speed as a share of the run alone: losing one
of two cores should cost at most half (goal: >= 0.45x). What it prints goes to
benchmarks/results/busy-cpu-NAME.json too (docs/training.md's figure).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.measured import RESULTS, measured_by, name_option, repository_name, write_result  # noqa: E402  (after the path it is found on)


def spinner(share: float = 1.0) -> int:
    """A process that keeps one core busy (`share` of it: spinning that part of every 10 ms), not a child
    of this one (so nothing counts it as ours)."""
    loop = (
        "while True: pass"
        if share >= 1
        else "import time\nwhile True:\n t = time.perf_counter()\n"
        f" while time.perf_counter() - t < {share * 0.01}: pass\n time.sleep({(1 - share) * 0.01})"
    )
    started = subprocess.run(
        ["sh", "-c", f"{sys.executable} -c '{loop}' >/dev/null 2>&1 & echo $!"],
        capture_output=True,
        text=True,
        check=True,
    )
    return int(started.stdout)


def run(repo: str, out: Path, args: argparse.Namespace, *extra: str) -> dict:
    command = [
        sys.executable, str(ROOT / "run_pipeline.py"), "--repo", repo, "--output-dir", str(out),
        "--model", args.model, "--max-commits", str(args.max_commits), "--budget", f"{args.budget}s",
        "--set", "eval.samples=0", "--set", "eval.max_blocks=1", *extra,
    ]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"{' '.join(command)} failed:\n{result.stderr[-2000:]}")
    return orjson.loads((out / "MANIFEST.json").read_bytes())


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("repo")
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--max-commits", type=int, default=300)
    # At 60 s, what the plan keeps for scoring and saving left a busy run a step or two: a speed over so few
    # steps is their warm-up, not the load.
    parser.add_argument("--budget", type=int, default=180, help="each run's budget, seconds (default 180)")
    name_option(parser)
    args = parser.parse_args()
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1

    results = {}
    with tempfile.TemporaryDirectory() as scratch:
        results["alone"] = run(args.repo, Path(scratch) / "alone", args)
        for name, extra in (
            ("one core busy", ()),
            (f"one core busy, {cores} threads", (f"plan.cpu_threads={cores}",)),
        ):
            busy = spinner()
            try:
                sets = [part for value in extra for part in ("--set", value)]
                results[name] = run(args.repo, Path(scratch) / name.replace(" ", "-"), args, *sets)
            finally:
                os.kill(busy, signal.SIGKILL)

    alone = results["alone"]["training_report"]["throughput"]["tokens_per_s"]
    print(
        f"{args.repo}, {args.model}, {args.max_commits} commits, {args.budget} s budget, {cores} usable cores\n"
    )
    print(f"{'run':<28}{'tokens/s':>10}{'× alone':>9}{'planned on':>12}{'steps':>12}{'threads':>14}")
    measured = {}
    for name, manifest in results.items():
        throughput = manifest["training_report"]["throughput"]["tokens_per_s"]
        plan = manifest["training_parameters"]
        ran, planned = manifest["training_report"]["training"]["global_step"], plan["total_steps"]
        threads = [c["threads"] for c in manifest["training_report"]["hardware"]["cpu_threads"]]
        print(
            f"{name:<28}{throughput:>10.1f}{throughput / alone:>9.2f}{plan['measured_tokens_per_s']:>12.1f}"
            f"{f'{ran}/{planned}':>12}{'→'.join(map(str, threads)):>14}"
        )
        measured[name] = {
            "tokens_per_s": throughput,
            "steps": ran,
            "planned_steps": planned,
            "threads": threads,
        }
    for name, manifest in results.items():
        print(f"\n{name}: {manifest['training_report']['throughput']['suggestion']}")
    name = repository_name(args.name, args.repo)
    settings = {"model": args.model, "commits": args.max_commits, "budget_s": args.budget}
    path = write_result(RESULTS / f"busy-cpu-{name}.json", measured_by() | settings | {"runs": measured})
    print(f"results: {path}")


if __name__ == "__main__":
    main()

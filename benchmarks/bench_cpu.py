#!/usr/bin/env python3
"""CPU training speed, measured in one run against a plain loop and across precisions.

    python benchmarks/bench_cpu.py /path/to/requests                 # both comparisons
    python benchmarks/bench_cpu.py /path/to/requests --only peer     # the training stage vs the plain loop

- `peer`: the training stage's tokens/s (smollm2-135m, as the planner sets it up on this machine) against
  `../shared/peers/plain_lora_loop.py` (torch + peft, batch 1, no Trainer, no packing) in fp32 on the
  same model and the same sequences.jsonl, for about the same wall time. Goal: ≥ 2×.
- `precision`: the same model, data and steps in fp32 and in bf16 autocast (both through the CLI, the
  newest N commits, one epoch of 512-token blocks at the planned micro-batch, no time budget), printing
  the tokens/s ratio (goal ≥ 1.5×
  on a CPU with avx512_bf16 or AMX) and each run's held-out loss after training (bf16 not worse by more
  than 2%).

Run it alone: on 2 shared cores anything else running makes the ratios meaningless. Each comparison writes
its results file, benchmarks/results/cpu-peer-NAME.json and cpu-precision-NAME.json (docs/training.md's
figure is generated from the first).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # it imports pipeline, installed or not (as the other benchmarks)
from benchmarks.measured import RESULTS, measured_by, name_option, repository_name, write_result  # noqa: E402  (after the path it is found on)

PEER = ROOT.parent / "shared" / "peers" / "plain_lora_loop.py"
MODEL = "smollm2-135m"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("repo", help="a git repository with a real history")
    parser.add_argument("--only", choices=["peer", "precision"], help="run one comparison")
    parser.add_argument("--seconds", type=float, default=150, help="training time per side of `peer` (150)")
    parser.add_argument(
        "--commits",
        type=int,
        default=48,
        help="newest commits read by `precision` (48: 20 or more kept hold one out)",
    )
    parser.add_argument("--work", default="bench-cpu-output", help="scratch directory")
    parser.add_argument("--peer", default=str(PEER), help="the plain-loop peer script")
    name_option(parser)
    args = parser.parse_args()
    args.name = repository_name(args.name, args.repo)
    work = Path(args.work)
    if args.only in (None, "peer"):
        peer_comparison(args, work / "peer")
    if args.only in (None, "precision"):
        precision_comparison(args, work / "precision")
    return 0


def cli(*argv: str) -> None:
    command = [sys.executable, str(ROOT / "run_pipeline.py"), *argv]
    print("$ " + " ".join(command), flush=True)
    subprocess.run(command, check=True, stderr=subprocess.DEVNULL)  # relative paths are the caller's


def manifest(directory: Path) -> dict:
    import orjson

    return orjson.loads((directory / "MANIFEST.json").read_bytes())


def peer_comparison(args, work: Path) -> None:
    from pipeline.builtin import builtin_directory

    # Ours: the training stage under a budget of `seconds` / 0.8 (training gets a little less: what the run
    # spends before and after it comes out of the budget); tokens/s are compared, not tokens. Nothing is
    # scored: the time a run keeps for scoring its answers (minutes on a CPU) would leave no training.
    budget_s = round(args.seconds / 0.8)
    cli(
        "--repo",
        args.repo,
        "--output-dir",
        str(work),
        "--model",
        MODEL,
        "--budget",
        f"{budget_s}s",
        *("--set", "eval.samples=0", "--set", "eval.code_cases=0", "--set", "eval.block_cases=0"),
    )
    ours = manifest(work)
    throughput = ours["training_report"]["throughput"]
    command = [sys.executable, args.peer, str(builtin_directory(MODEL)), str(work / "sequences.jsonl")]
    command += ["--seconds", f"{args.seconds:.0f}"]
    print("$ " + " ".join(command), flush=True)
    printed = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    peer = float(re.findall(r"([\d.]+) tokens/s", printed)[-1])
    params = ours["training_parameters"]
    print()
    print(f"{'method':<44}{'tokens/s':>10}{'× peer':>9}")
    print(f"{'plain loop (peer), fp32, batch 1 × 512':<44}{peer:>10.1f}{1:>9.2f}")
    label = f"repotune training stage, {params['precision']}, {params['batch_size']} × {params['sequence_length']}"
    print(f"{label:<44}{throughput['tokens_per_s']:>10.1f}{throughput['tokens_per_s'] / peer:>9.2f}")
    print(
        f"  ({throughput['processed_tokens']} tokens in {ours['training_report']['training']['train_runtime_s']} s; "
        f"step time mean {throughput['step_time_s']['mean']} s)"
    )
    measured = {
        "repository": args.name,
        "seconds": args.seconds,
        "budget_s": budget_s,
        "peer_tokens_per_s": peer,
        "tokens_per_s": throughput["tokens_per_s"],
        "processed_tokens": throughput["processed_tokens"],
        "train_runtime_s": ours["training_report"]["training"]["train_runtime_s"],
        "precision": params["precision"],
        "batch_size": params["batch_size"],
        "sequence_length": params["sequence_length"],
    }
    print(f"written: {write_result(RESULTS / f'cpu-peer-{args.name}.json', measured_by() | measured)}")


def precision_comparison(args, work: Path) -> None:
    runs = {}
    for precision in ("fp32", "bf16"):
        out = work / precision
        cli(
            "--repo", args.repo, "--output-dir", str(out), "--model", MODEL, "--budget", "none",
            "--max-commits", str(args.commits), "--set", "train.epochs=1", "--set", f"plan.precision={precision}",
            "--set", "eval.samples=0", "--set", "plan.gradient_accumulation_steps=1",
            "--set", "train.max_sequence_length=512",
        )  # fmt: skip
        runs[precision] = manifest(out)
    print()
    print(f"{'precision':<10}{'steps':>7}{'tokens/s':>10}{'held-out loss after':>21}")
    for precision, run in runs.items():
        print(
            f"{precision:<10}{run['training_parameters']['total_steps']:>7}"
            f"{run['training_report']['throughput']['tokens_per_s']:>10.1f}"
            f"{run['training_report']['evaluation']['after']['loss']:>21.4f}"
        )
    fp32, bf16 = runs["fp32"], runs["bf16"]
    speedup = (
        bf16["training_report"]["throughput"]["tokens_per_s"]
        / fp32["training_report"]["throughput"]["tokens_per_s"]
    )
    worse = (
        bf16["training_report"]["evaluation"]["after"]["loss"]
        / fp32["training_report"]["evaluation"]["after"]["loss"]
        - 1
    )
    print(
        f"bf16 / fp32 speed: {speedup:.2f}× (goal ≥ 1.5×); bf16 held-out loss {worse:+.2%} vs fp32 (goal ≤ +2%)"
    )
    measured = {
        precision: {
            "steps": run["training_parameters"]["total_steps"],
            "tokens_per_s": run["training_report"]["throughput"]["tokens_per_s"],
            "held_out_loss": run["training_report"]["evaluation"]["after"]["loss"],
        }
        for precision, run in runs.items()
    }
    path = write_result(
        RESULTS / f"cpu-precision-{args.name}.json",
        measured_by() | {"repository": args.name, "commits": args.commits, "precisions": measured},
    )
    print(f"written: {path}")


if __name__ == "__main__":
    sys.exit(main())

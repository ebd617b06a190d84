#!/usr/bin/env python3
"""Does a remembered training speed, scaled by the cores' pace, predict the speed now? One run.

    python benchmarks/bench_pace.py [--rounds 6] [--model smollm2-135m] [--length 1024]

A time budget on a CPU plans with the speed an earlier run trained at on the
same machine. The same two idle cores trained 103 tokens/s one afternoon and
142 three hours later (a virtual machine's host is shared too), so the
cores' pace (`probe.cores_pace`, 2 seconds of matrix products) is timed
before training and compared with then's. This measures what the pace
predicts, with the planner's own functions, on the model and LoRA the
pipeline trains, one thread per usable core throughout: after a first idle
round, rounds take turns between the machine as it is, a process spinning
a third of the time on one core and one spinning all of it (stand-ins for
a host that lends the cores less: their load is not what a remembered
speed is checked against here). Each round times the pace, then the
training speed as the planner measures it (`probe.training_speed`: forward
and backward passes on 3 blocks after a warm-up). The first round is what
an earlier run remembered; every later round is predicted from it scaled by
the pace (its speed × pace now / pace then), as it is, and as the planner
does (`probe.pace_holds`: as it is within the pace's noise, measured again
beyond it), and the mean absolute error of each is printed (the planner's
over the rounds it does not measure again). Its speeds are seconds long,
timed right after the pace; a run's training lasts minutes, which the pace
predicts less well (probe.py's PACE_NOISE: over 9 runs scaling was worse
than the speed as it is).

About 8 minutes on 2 cores (a pass beside a spinning core costs three idle ones). Run it alone: on 2
shared cores anything else running is another load.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # it imports pipeline, installed or not (as the other benchmarks)

from benchmarks.bench_busy_cpu import spinner  # noqa: E402

LOADS = {"idle": 0.0, "third of a core": 1 / 3, "one core": 1.0}


class RandomBlocks:
    """Training blocks of random tokens: a pass costs the same whatever the tokens are."""

    def __init__(self, length: int, vocabulary: int):
        self.length, self.vocabulary = length, vocabulary

    def __len__(self) -> int:
        return 8

    def __getitem__(self, indexes: list[int]) -> dict:
        import torch

        ids = torch.randint(0, self.vocabulary, (len(indexes), self.length))
        positions = torch.arange(self.length).expand(len(indexes), -1)
        return {"input_ids": ids, "position_ids": positions, "labels": ids}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=7, help="rounds: idle, then the loads in turn (7)")
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--length", type=int, default=1024, help="tokens a block (1024, the default plan's)")
    args = parser.parse_args()

    from pipeline.base_models import quiet_library_output
    from pipeline.config import load_config
    from pipeline.hardware import usable_cores
    from pipeline.train import probe
    from pipeline.train.model import attach_lora, build_model

    quiet_library_output()
    threads = max(1, int(usable_cores()))
    model = build_model(args.model, None, 0)
    model = attach_lora(model, load_config(None).config.lora, [], 0.0)
    blocks = RandomBlocks(args.length, model.config.vocab_size)
    print(f"{args.model}, LoRA, fp32, blocks of {args.length} tokens, {threads} threads")
    print(
        f"{'round':>5}  {'load':<16} {'pace GFLOP/s':>12} {'tokens/s':>9} {'scaled':>9} {'planned':>9} {'as is':>9}"
    )
    first, errors = None, {"scaled": [], "planned": [], "as is": []}
    for index in range(args.rounds):
        load = list(LOADS)[(index - 1) % len(LOADS)] if index else "idle"
        spinning = spinner(LOADS[load]) if LOADS[load] else None
        try:
            time.sleep(0.5)  # the spinner's interpreter starting is not yet its load
            pace = probe.cores_pace(threads)
            speed = probe.training_speed(model, blocks, "fp32", False, False, threads, 1).tokens_per_s
        finally:
            if spinning:
                os.kill(spinning, signal.SIGKILL)
        if first is None:
            first = (speed, pace)
            print(f"{index + 1:>5}  {load:<16} {pace:>12.1f} {speed:>9.1f} {'(remembered)':>29}")
            continue
        predicted = {
            "scaled": first[0] * pace / first[1],
            "planned": first[0] if probe.pace_holds(first[1], pace) else None,
            "as is": first[0],
        }
        for name, value in predicted.items():
            if value is not None:
                errors[name].append(abs(value / speed - 1))
        shown = [f"{value:>9.1f}" if value else f"{'measure':>9}" for value in predicted.values()]
        print(f"{index + 1:>5}  {load:<16} {pace:>12.1f} {speed:>9.1f} {' '.join(shown)}")
    print(
        "mean absolute error of the predicted speed: "
        + ", ".join(
            f"{name} {statistics.mean(found):.1%} ({len(found)} rounds)"
            for name, found in errors.items()
            if found
        )
    )


if __name__ == "__main__":
    main()

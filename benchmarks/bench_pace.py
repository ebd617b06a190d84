#!/usr/bin/env python3
"""Does a remembered training speed, scaled by the cores' pace, predict the speed now? One run.

    python benchmarks/bench_pace.py [--rounds 6] [--model smollm2-135m] [--length 1024]

A time budget on a CPU plans with the speed an earlier run trained at on the
same machine. The same two idle cores trained 103 tokens/s one afternoon and
142 three hours later (a virtual machine's host is shared too), so the
speed is scaled by how fast the cores multiply matrices now
(`probe.cores_pace`, 2 seconds) against then. This measures that scaling
with the planner's own functions, on the model and LoRA the pipeline trains,
one thread per usable core throughout: rounds alternate between the machine
as it is and a process spinning on one core (a stand-in for a host that
lends the cores less: its load is not what a remembered speed is checked
against here). Each round times the pace, then the training speed as the
planner measures it (`probe.training_speed`: forward and backward passes on
3 blocks after a warm-up). The first round is what an earlier run
remembered; every later round is predicted from it as the planner would
(its speed × pace now / pace then) and without the pace (its speed as it
is), and the mean absolute error of each is printed.

About 7 minutes on 2 cores (a pass under the spinner costs three idle ones). Run it alone: on 2
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
    parser.add_argument("--rounds", type=int, default=6, help="rounds, alternating idle and busy (6)")
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
    print(f"{'round':>5}  {'load':<10} {'pace GFLOP/s':>12} {'tokens/s':>9} {'paced':>9} {'as is':>9}")
    first, paced_errors, unpaced_errors = None, [], []
    for index in range(args.rounds):
        busy = index % 2 == 1
        spinning = spinner() if busy else None
        try:
            time.sleep(0.5)  # the spinner's interpreter starting is not yet its load
            pace = probe.cores_pace(threads)
            speed = probe.training_speed(model, blocks, "fp32", False, False, threads, 1).tokens_per_s
        finally:
            if spinning:
                os.kill(spinning, signal.SIGKILL)
        if first is None:
            first = (speed, pace)
            print(f"{index + 1:>5}  {'idle':<10} {pace:>12.1f} {speed:>9.1f} {'(remembered)':>19}")
            continue
        paced, unpaced = first[0] * pace / first[1], first[0]
        paced_errors.append(abs(paced / speed - 1))
        unpaced_errors.append(abs(unpaced / speed - 1))
        load = "one core" if busy else "idle"
        print(f"{index + 1:>5}  {load:<10} {pace:>12.1f} {speed:>9.1f} {paced:>9.1f} {unpaced:>9.1f}")
    print(
        f"mean absolute error of the predicted speed over {len(paced_errors)} rounds: "
        f"paced {statistics.mean(paced_errors):.1%}, as remembered {statistics.mean(unpaced_errors):.1%}"
    )


if __name__ == "__main__":
    main()

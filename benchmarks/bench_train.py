#!/usr/bin/env python3
"""Training throughput: a naive baseline vs repotune's plan, on the same scraped data, in one run.

    python benchmarks/bench_train.py /path/to/repo [--steps 20] [--max-commits 400] [--gpu]

(a) baseline: the Hugging Face Trainer's defaults (micro-batch 8, fp32, no
    workers), every sequence padded to the longest allowed length, no packing;
(b) repotune: the planner's decisions for this machine, packed blocks.

Both train the same model with LoRA for `--steps` optimizer steps after a
short warmup, timed by the same callback, counting only tokens that carry a
loss (padding excluded). Prints tokens/s of each and the ratio. CPU: the
tiny model. `--gpu`: a Qwen2.5-0.5B-shaped model built from its config with
random weights (throughput does not depend on weight values; no download),
plus MFU, mean GPU utilisation and the data-loader wait share.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("repo")
    parser.add_argument(
        "--steps", type=int, default=20, help="timed optimizer steps per run, after 3 warmup steps (20)"
    )
    parser.add_argument("--max-commits", type=int, default=400, help="newest commits to scrape (400)")
    parser.add_argument("--gpu", action="store_true", help="a Qwen2.5-0.5B-shaped model on CUDA, with MFU")
    args = parser.parse_args()
    from train_throughput import benchmark  # torch and the pipeline load only now: --help is instant

    benchmark(args)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""The exported GGUF in llama.cpp: it loads, writes commit messages, and how fast, beside transformers.

    python benchmarks/bench_gguf.py --adapter RUN_DIR --repo /path/to/the/repository [--commits 5] [--type f16]
        [--adapter-only]

Exports RUN_DIR's adapter (`run_pipeline.py export`), then for each of the newest `--commits` commits asks
for its commit message twice, greedy, as training asked it (the model's chat template around the
instruction and the diff): through llama.cpp (`llama-cpp-python`, which must be installed: `pip install
llama-cpp-python` builds it from source where no wheel fits) and through transformers with the adapter
merged. Prints load times, prompt and generated tokens per second of each, the ratio, and both answers
side by side (f16: the same tokens, up to the kernels' rounding). With `--adapter-only`, llama.cpp loads the
base's GGUF with the adapter's LoRA GGUF on it (`export --adapter-only`) in place of the merged file.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PROMPT_TOKENS = 768  # diffs cut to this many tokens, as evaluation cuts them
NEW_TOKENS = 48


def newest_diffs(repo: str, count: int) -> list[tuple[str, str]]:
    shas = subprocess.run(
        ["git", "-C", repo, "rev-list", "--no-merges", f"--max-count={count}", "HEAD"],
        capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    found = []
    for sha in shas:
        diff = subprocess.run(
            ["git", "-C", repo, "show", "--format=", "--no-color", "--no-ext-diff", sha],
            capture_output=True, text=True, check=True, errors="replace",
        ).stdout  # fmt: skip
        found.append((sha, diff))
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--adapter", required=True, help="a run's output directory, or its adapter/")
    parser.add_argument("--repo", required=True, help="a repository to take diffs from")
    parser.add_argument("--commits", type=int, default=5)
    parser.add_argument("--type", dest="gguf_type", default="f16", choices=["f16", "q8_0"])
    parser.add_argument(
        "--adapter-only", action="store_true", help="the base's GGUF with the adapter's on it"
    )
    args = parser.parse_args()
    try:
        from llama_cpp import Llama
    except ImportError:
        print("llama-cpp-python is not installed: pip install llama-cpp-python", file=sys.stderr)
        return 2
    import torch

    from pipeline.data.examples import render_prompt
    from pipeline.suggest.decoding import generate_batched
    from pipeline.train.model import adapter_facts
    from pipeline.use.export import export
    from pipeline.use.generate import adapter_directory, load_adapter

    threads = len(os.sched_getaffinity(0))
    torch.set_num_threads(threads)
    with tempfile.TemporaryDirectory() as scratch:
        started = time.perf_counter()
        exported = export(args.adapter, Path(scratch) / "model.gguf", args.gguf_type, None, args.adapter_only)
        export_s = time.perf_counter() - started
        started = time.perf_counter()
        weights = {"model_path": str(exported.base), "lora_path": str(exported.gguf)} if exported.base else {}
        llama = Llama(
            **(weights or {"model_path": str(exported.gguf)}), n_ctx=2048, n_threads=threads, verbose=False
        )
        llama_load_s = time.perf_counter() - started
        started = time.perf_counter()
        model, tokenizer = load_adapter(args.adapter)
        model = model.merge_and_unload().eval()
        hf_load_s = time.perf_counter() - started
        style = adapter_facts(adapter_directory(args.adapter)).style
        totals = {"llama.cpp": [0.0, 0, 0], "transformers": [0.0, 0, 0]}  # seconds, prompt, new tokens
        for sha, diff in newest_diffs(args.repo, args.commits):
            prompt = render_prompt(tokenizer, style, "message", diff, PROMPT_TOKENS)
            ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
            llama.reset()
            started = time.perf_counter()
            out = llama.create_completion(ids, max_tokens=NEW_TOKENS, temperature=0.0, top_k=1)
            totals["llama.cpp"][0] += time.perf_counter() - started
            totals["llama.cpp"][1] += len(ids)
            totals["llama.cpp"][2] += out["usage"]["completion_tokens"]
            started = time.perf_counter()
            answer = generate_batched(model, tokenizer, [prompt], NEW_TOKENS, "fp32")[0]
            totals["transformers"][0] += time.perf_counter() - started
            totals["transformers"][1] += len(ids)
            totals["transformers"][2] += len(tokenizer(answer, add_special_tokens=False)["input_ids"])
            print(f"commit {sha[:10]}")
            print(f"  llama.cpp    : {out['choices'][0]['text'].strip()[:100]!r}")
            print(f"  transformers : {answer.strip()[:100]!r}")
    print(
        f"\nexport {export_s:.1f} s ({exported.bytes / 1e6:.0f} MB {args.gguf_type}); load: llama.cpp "
        f"{llama_load_s:.2f} s, transformers + adapter {hf_load_s:.2f} s; {threads} threads"
    )
    for name, (seconds, prompt_tokens, new_tokens) in totals.items():
        print(
            f"{name:13} {seconds:6.1f} s for {prompt_tokens} prompt + {new_tokens} new tokens: "
            f"{(prompt_tokens + new_tokens) / seconds:6.0f} tokens/s"
        )
    ratio = totals["transformers"][0] / totals["llama.cpp"][0]
    print(f"llama.cpp is {ratio:.2f}x transformers on the same prompts")
    return 0


if __name__ == "__main__":
    sys.exit(main())

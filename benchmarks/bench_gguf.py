#!/usr/bin/env python3
"""The exported GGUF in llama.cpp: it loads, writes commit messages, and how fast, beside transformers.

    python benchmarks/bench_gguf.py --adapter RUN_DIR --repo /path/to/the/repository [--commits 5] [--type f16]
        [--adapter-only] [--llama-server /path/to/llama-server]

Exports RUN_DIR's adapter (`run_pipeline.py export`), then for each of the newest `--commits` commits asks
for its commit message twice, greedy, as training asked it (the model's chat template around the
instruction and the diff): through llama.cpp (`llama-cpp-python`, which must be installed: `pip install
llama-cpp-python` builds it from source where no wheel fits) and through transformers with the adapter
merged. Prints load times, prompt and generated tokens per second of each, the ratio, and both answers
side by side (f16: the same tokens, up to the kernels' rounding). With `--adapter-only`, llama.cpp loads the
base's GGUF with the adapter's LoRA GGUF on it (`export --adapter-only`) in place of the merged file.
With `--llama-server`, llama.cpp is that server binary (as docs/use.md runs it: `-m`, and `--lora` for
the adapter alone), asked over its HTTP API with the same prompt tokens, in place of the bindings.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
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


class LlamaServer:
    """A llama-server process on a free local port, one request at a time: its OpenAI API at /v1
    (bench_serve asks it so), and `create_completion` answering greedy completions of prompt tokens as
    llama-cpp-python's does (the fields this benchmark reads)."""

    def __init__(self, binary: str, weights: dict[str, str], threads: int):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        command = [
            binary,
            "-m",
            weights["model_path"],
            "--port",
            str(self.port),
            "-t",
            str(threads),
            "-c",
            "2048",
            "--parallel",  # one request at a time, all the context its own (the default splits it in slots)
            "1",
        ]
        if "lora_path" in weights:
            command += ["--lora", weights["lora_path"]]
        self.process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2) as answer:
                    if answer.status == 200:
                        return
            except OSError:
                time.sleep(0.2)
        self.process.kill()
        raise SystemExit(f"{binary} did not answer on port {self.port} within 120 s")

    def reset(self) -> None:
        """Nothing to reset: each request is its own (`cache_prompt` off)."""

    def create_completion(self, ids: list[int], max_tokens: int, temperature: float, top_k: int) -> dict:
        asked = {"prompt": ids, "n_predict": max_tokens, "temperature": temperature, "top_k": top_k,
                 "cache_prompt": False}  # fmt: skip
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.port}/completion", data=json.dumps(asked).encode(),
            headers={"Content-Type": "application/json"},
        )  # fmt: skip
        with urllib.request.urlopen(request, timeout=600) as answer:
            found = json.loads(answer.read())
        return {
            "choices": [{"text": found["content"]}],
            "usage": {"completion_tokens": found["tokens_predicted"]},
        }

    def close(self) -> None:
        self.process.terminate()
        self.process.wait()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--adapter", required=True, help="a run's output directory, or its adapter/")
    parser.add_argument("--repo", required=True, help="a repository to take diffs from")
    parser.add_argument("--commits", type=int, default=5)
    parser.add_argument("--type", dest="gguf_type", default="f16", choices=["f16", "q8_0"])
    parser.add_argument(
        "--adapter-only", action="store_true", help="the base's GGUF with the adapter's on it"
    )
    parser.add_argument(
        "--llama-server", metavar="PATH", help="llama.cpp's server binary, in place of llama-cpp-python"
    )
    args = parser.parse_args()
    if not args.llama_server:
        try:
            from llama_cpp import Llama
        except ImportError:
            print(
                "llama-cpp-python is not installed: pip install llama-cpp-python (or give --llama-server)",
                file=sys.stderr,
            )
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
        weights = (
            {"model_path": str(exported.base), "lora_path": str(exported.gguf)}
            if exported.base
            else {"model_path": str(exported.gguf)}
        )
        llama = (
            LlamaServer(args.llama_server, weights, threads)
            if args.llama_server
            else Llama(**weights, n_ctx=2048, n_threads=threads, verbose=False)
        )
        llama_load_s = time.perf_counter() - started
        started = time.perf_counter()
        model, tokenizer = load_adapter(args.adapter)
        model = model.merge_and_unload().eval()
        hf_load_s = time.perf_counter() - started
        style = adapter_facts(adapter_directory(args.adapter)).style
        totals = {"llama.cpp": [0.0, 0, 0], "transformers": [0.0, 0, 0]}  # seconds, prompt, new tokens
        same, asked = 0, 0
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
            same += out["choices"][0]["text"].strip() == answer.strip()
            asked += 1
        if args.llama_server:
            llama.close()
    print(
        f"\nexport {export_s:.1f} s ({exported.bytes / 1e6:.0f} MB {args.gguf_type}); load: llama.cpp "
        f"{llama_load_s:.2f} s, transformers + adapter {hf_load_s:.2f} s; {threads} threads"
    )
    for name, (seconds, prompt_tokens, new_tokens) in totals.items():
        print(
            f"{name:13} {seconds:6.1f} s for {prompt_tokens} prompt + {new_tokens} new tokens: "
            f"{(prompt_tokens + new_tokens) / seconds:6.0f} tokens/s"
        )
    print(f"the same answer from both: {same} of {asked}")
    ratio = totals["transformers"][0] / totals["llama.cpp"][0]
    print(f"llama.cpp is {ratio:.2f}x transformers on the same prompts")
    return 0


if __name__ == "__main__":
    sys.exit(main())

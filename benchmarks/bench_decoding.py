#!/usr/bin/env python3
"""The evaluation's greedy answers, `decoding.py` against transformers' `model.generate`: how fast, and the same?

    python benchmarks/bench_decoding.py RUN_DIR [--rounds 2] [--device cuda --precision bf16]

Loads RUN_DIR's adapter (merged, as the evaluation merges it) and asks the run's held-out commits both
tasks as the run asked them (`task_prompts` with the run's `eval.samples`, `train.max_prompt_tokens`,
`eval.message_tokens`, its code cases and the files at its split point): the commit messages, then the
next lines alone and with context (the first token one that begins with a line break, in both). Each task is answered by the baseline,
`model.generate` in batches of 64 prompts of similar length (at most 1.5× padding, as the evaluation
called it before `decoding.py`), and by `decoding.generate_batched`, taking turns which goes first.
Prints each task's seconds, the ratio, and how many answers are the same (all of them, in fp32; in bf16
a row's padding can move a near tie). On a GPU (`--device cuda`) it measures what a GPU's run pays for
its scoring there.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # it imports pipeline, installed or not (as the other benchmarks)

BASELINE_BATCH = 64
BASELINE_SLACK = 1.5


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "run", type=Path, help="a run's output directory (MANIFEST.json, adapter/, sequences.jsonl)"
    )
    parser.add_argument("--rounds", type=int, default=2, help="times each task is answered by each")
    parser.add_argument(
        "--device", default="cpu", help="where the model answers (default cpu; cuda on a GPU)"
    )
    parser.add_argument(
        "--precision", default="fp32", choices=("fp32", "bf16"), help="as a run plans it (default fp32)"
    )
    args = parser.parse_args()

    import orjson
    import torch

    from pipeline.data.sources import read_sequences
    from pipeline.evaluate.evaluation import task_prompts
    from pipeline.suggest.completion import LINE_TOKENS, CodeIndex, cases_of, read_cases
    from pipeline.suggest.decoding import generate_batched
    from pipeline.suggest.retrieval import past_commits
    from pipeline.train.model import adapter_facts
    from pipeline.use.generate import adapter_directory, load_adapter
    from scrapers.completions import COMPLETIONS_FILE
    from scrapers.files import FILES_FILE

    manifest = orjson.loads((args.run / "MANIFEST.json").read_bytes())
    config, code_cases = manifest["config"]["effective"], manifest["training_parameters"]["code_cases"]
    model, tokenizer = load_adapter(args.run)
    model.merge_adapter()
    model.to(args.device)
    style = adapter_facts(adapter_directory(args.run)).style
    held_out = [c for c in past_commits(read_sequences(args.run / "sequences.jsonl")) if c.split == "eval"]
    asked_commits = held_out[: config["eval"]["samples"]]
    cases = cases_of(read_cases(args.run / COMPLETIONS_FILE), "eval", [c.sha for c in asked_commits])
    files = list(read_sequences(args.run / FILES_FILE)) if (args.run / FILES_FILE).exists() else []
    prompts = task_prompts(
        asked_commits, tokenizer, style, len(asked_commits), config["train"]["max_prompt_tokens"],
        cases[:code_cases], CodeIndex(files) if files else None,  # as planned: the config may say auto
    )  # fmt: skip
    where = (
        torch.cuda.get_device_name(args.device)
        if args.device.startswith("cuda")
        else f"{torch.get_num_threads()} threads"
    )
    print(f"{args.run}: {len(held_out)} held-out commits, {where}, {args.precision}")
    totals = {"generate": 0.0, "decoding": 0.0}
    for task, tokens, newline in (
        ("message", config["eval"]["message_tokens"], False),
        ("code", LINE_TOKENS, True),
        ("code_context", LINE_TOKENS, True),
    ):
        asked = [p.text for p in prompts if p.task == task]
        seconds: dict[str, list[float]] = {"generate": [], "decoding": []}
        answers: dict[str, list[str]] = {}
        for round_ in range(args.rounds):
            order = ("generate", "decoding") if round_ % 2 == 0 else ("decoding", "generate")
            for name in order:
                started = time.perf_counter()
                if name == "generate":
                    answers[name] = baseline(
                        model, tokenizer, asked, tokens, args.precision, newline, not newline
                    )
                else:
                    answers[name] = generate_batched(
                        model,
                        tokenizer,
                        asked,
                        tokens,
                        args.precision,
                        cut_loops=not newline,
                        next_line=newline,
                    )
                if args.device.startswith("cuda"):
                    torch.cuda.synchronize(args.device)
                seconds[name].append(time.perf_counter() - started)
        mean = {name: sum(values) / len(values) for name, values in seconds.items()}
        for name in totals:
            totals[name] += mean[name]
        same = sum(a == b for a, b in zip(answers["generate"], answers["decoding"], strict=True))
        print(
            f"  {task:8} {len(asked):4} prompts  model.generate {mean['generate']:6.1f} s  decoding.py "
            f"{mean['decoding']:6.1f} s  {mean['generate'] / mean['decoding']:.2f}×  same answers {same}/{len(asked)}"
        )
    print(
        f"  both      model.generate {totals['generate']:.1f} s, decoding.py {totals['decoding']:.1f} s: "
        f"{totals['generate'] / totals['decoding']:.2f}×"
    )
    return 0


def baseline(
    model,
    tokenizer,
    prompts: Sequence[str],
    max_new_tokens: int,
    precision: str,
    newline: bool,
    cut_loops: bool,
):
    """`model.generate`, greedy, in batches of similar-length prompts with left padding; with `cut_loops`
    (messages), an answer that starts over is cut where it repeats a line, as the evaluation's are; with
    `newline` (code), each prompt read without the line breaks it ends with and the answer the line after
    the first tokens that spell them (`healing`), as the decoder heals a next line."""
    import torch

    from pipeline.suggest.decoding import finished, healed_tokens, healing
    from pipeline.train.model import autocast

    device = next(model.parameters()).device
    healed = [healing(prompt) if newline else (prompt, 0) for prompt in prompts]
    encoded = tokenizer([read for read, _ in healed], add_special_tokens=False)["input_ids"]
    outputs = [""] * len(prompts)
    side, tokenizer.padding_side = tokenizer.padding_side, "left"
    stopping: dict = {}
    try:
        for chosen in similar_lengths([len(tokens) for tokens in encoded]):
            batch = tokenizer.pad({"input_ids": [encoded[i] for i in chosen]}, return_tensors="pt").to(device)
            if newline:
                breaks = [healed[i][1] for i in chosen]
                stopping["prefix_allowed_tokens_fn"] = healed_tokens(
                    tokenizer, batch["input_ids"].shape[1], breaks
                )
            with torch.no_grad(), autocast(device.type, precision):
                generated = model.generate(
                    **batch, do_sample=False, pad_token_id=tokenizer.pad_token_id,
                    eos_token_id=tokenizer.eos_token_id, **{"max_new_tokens": max_new_tokens, **stopping},
                )  # fmt: skip
            for row, index in enumerate(chosen):
                text = tokenizer.decode(
                    generated[row, batch["input_ids"].shape[1] :], skip_special_tokens=True
                )
                outputs[index] = finished(text, newline, cut_loops, next_line=newline)
    finally:
        tokenizer.padding_side = side
    return outputs


def similar_lengths(lengths: Sequence[int]) -> list[list[int]]:
    batches: list[list[int]] = []
    for index in sorted(range(len(lengths)), key=lengths.__getitem__):
        last = batches[-1] if batches else None
        if last and len(last) < BASELINE_BATCH and lengths[index] <= BASELINE_SLACK * lengths[last[0]]:
            last.append(index)
        else:
            batches.append([index])
    return batches


if __name__ == "__main__":
    sys.exit(main())

"""The machinery of bench_train.py (imported after its arguments are parsed: `--help` needs no torch)."""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch
from transformers import Trainer, TrainerCallback, TrainingArguments, default_data_collator
from transformers.trainer_callback import PrinterCallback, ProgressCallback

from pipeline.base_models import describe_model, model_config, quiet_library_output, train_tiny_tokenizer
from pipeline.config import load_config
from pipeline.data.dataset import block_dataset, packed_blocks
from pipeline.data.sources import read_sequences
from pipeline.data.token_cache import cache_meta, cache_stats, open_or_build, read_split, tokenize_sequences
from pipeline.hardware import detect_hardware, usable_cores
from pipeline.plan.planner import make_plan
from pipeline.train.model import attach_lora, build_model
from pipeline.train.monitor import HardwareMonitor, import_nvml
from pipeline.train.trainer import TrainingHistory, training_arguments
from pipeline.types import TextStyle
from scrapers.scrape import scrape

WARMUP_STEPS = 3  # excluded from the timing: first steps pay for allocation, kernels, worker start-up
H200_BF16_FLOPS = 790e12  # dense bf16 matmul rate measured on this workplace's H200 (KINDS.md)
QWEN_05B_SHAPE = {
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "vocab_size": 151936,
    "max_position_embeddings": 32768,
    "tie_word_embeddings": True,
    "rope_theta": 1000000.0,
}


class Timed(TrainerCallback):
    """Wall time and loss-carrying tokens of the optimizer steps after the warmup."""

    def __init__(self) -> None:
        self.started = 0.0
        self.seconds = 0.0
        self.tokens = 0

    def on_step_begin(self, args, state, control, **kwargs):
        if state.global_step == WARMUP_STEPS:
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            self.started = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == state.max_steps:
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            self.seconds = time.perf_counter() - self.started


class CountingTrainer(Trainer):
    def __init__(self, *args, timed: Timed, history: TrainingHistory | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.timed, self.history = timed, history

    def get_batch_samples(self, epoch_iterator, num_batches, device):
        started = time.perf_counter()
        batches, items = super().get_batch_samples(epoch_iterator, num_batches, device)
        if self.state.global_step >= WARMUP_STEPS:
            self.timed.tokens += sum(int(batch["labels"].ne(-100).sum()) for batch in batches)
            if self.history is not None:
                self.history.data_wait_s.append(time.perf_counter() - started)
        return batches, items


class PaddedSequences(torch.utils.data.Dataset):
    """The baseline's data: one sequence per row, padded (or cut) to `length`."""

    def __init__(self, sequences: list[list[int]], length: int, pad_id: int):
        self.rows = [ids[:length] for ids in sequences]
        self.length, self.pad_id = length, pad_id

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        ids = self.rows[index]
        padding = self.length - len(ids)
        return {
            "input_ids": torch.tensor(ids + [self.pad_id] * padding),
            "attention_mask": torch.tensor([1] * len(ids) + [0] * padding),
            "labels": torch.tensor(ids + [-100] * padding),
        }


def fresh_model(name: str, config, plan, gpu: bool):
    model = build_model(name, config, 0, "bf16" if gpu else plan.precision, plan.attention)
    return attach_lora(model, load_config(None).config.lora, plan.base_modules_trained, plan.lora_dropout)


def run(trainer_args: TrainingArguments, model, dataset, steps: int, history=None) -> Timed:
    trainer_args.max_steps = steps + WARMUP_STEPS
    trainer_args.save_strategy = "no"
    trainer_args.eval_strategy = "no"
    trainer_args.logging_strategy = "no"
    trainer_args.report_to = []
    timed = Timed()
    trainer = CountingTrainer(
        model=model,
        args=trainer_args,
        train_dataset=dataset,
        data_collator=default_data_collator,
        callbacks=[timed],
        timed=timed,
        history=history,
    )
    trainer.remove_callback(PrinterCallback)
    trainer.remove_callback(ProgressCallback)
    trainer.train()
    return timed


def benchmark(args) -> None:
    """Run both sides and print the table (see bench_train.py)."""
    if args.gpu and not torch.cuda.is_available():
        sys.exit("bench_train: --gpu needs a CUDA GPU, and torch sees none")
    quiet_library_output()

    loaded = load_config(None, [f"scrape.max_commits={args.max_commits}"])
    work = Path(tempfile.mkdtemp(prefix="bench-train-"))
    scrape([args.repo], loaded.config.scrape, work, usable_cores())
    records = list(read_sequences(work / "sequences.jsonl"))
    tokenizer = train_tiny_tokenizer([r["text"] for r in records if r["split"] == "train"])
    train = loaded.config.train
    raw = TextStyle("raw", "all")  # tiny has no chat template: the scraped text, every token learned
    cache = open_or_build(
        work / "cache",
        "bench",
        lambda staging: tokenize_sequences(
            records, tokenizer, raw, (train.max_sequence_length, train.max_prompt_tokens), staging
        ),
    )
    config = model_config("tiny", tokenizer)
    if args.gpu:
        for key, value in QWEN_05B_SHAPE.items():
            setattr(config, key, value)
    facts = describe_model("tiny", config, tokenizer)
    plan = make_plan(cache_stats(cache), detect_hardware(), facts, loaded)
    length = plan.sequence_length
    print(
        f"data: {cache_meta(cache)['train_sequences']} sequences, {cache_meta(cache)['train_tokens']} tokens; block/max length {length}"
    )
    print(
        f"model: {facts.parameters / 1e6:.1f}M parameters ({'Qwen2.5-0.5B shape' if args.gpu else 'tiny'}), device {plan.device}"
    )

    # (a) the baseline: Trainer defaults, padded sequences.
    sequences = read_split(cache.directory, "train").column("input_ids").to_pylist()
    baseline_args = TrainingArguments(output_dir=str(work / "baseline"), use_cpu=not args.gpu, seed=0)
    baseline = run(
        baseline_args,
        fresh_model("tiny", config, plan, args.gpu),
        PaddedSequences(sequences, length, tokenizer.pad_token_id),
        args.steps,
    )

    # (b) repotune: the plan, packed blocks.
    packed = packed_blocks(
        cache.directory,
        read_split(cache.directory, "train"),
        "train",
        length,
        tokenizer.pad_token_id,
        plan.truncate_at,
    )
    history = TrainingHistory(packed.real_tokens, packed.blocks, False, lambda: None)
    nvml = import_nvml() if args.gpu else None
    with HardwareMonitor(1.0, nvml) as monitor:
        ours = run(
            training_arguments(plan, work / "ours"),
            fresh_model("tiny", config, plan, args.gpu),
            block_dataset(packed),
            args.steps,
            history,
        )

    rows = [
        ("baseline (defaults, padded, fp32)", baseline),
        (f"repotune ({plan.precision}, packed {packed.efficiency:.0%})", ours),
    ]
    print(f"\n{'run':<40}{'tokens':>10}{'seconds':>10}{'tokens/s':>12}")
    for name, timed in rows:
        print(f"{name:<40}{timed.tokens:>10}{timed.seconds:>10.2f}{timed.tokens / timed.seconds:>12.0f}")
    ratio = (ours.tokens / ours.seconds) / (baseline.tokens / baseline.seconds)
    print(f"\nspeed-up: {ratio:.2f}× the baseline's tokens/s")
    if args.gpu:
        tokens_per_s = ours.tokens / ours.seconds
        # 6 FLOPs per parameter per token (forward + backward) plus attention, the usual MFU convention.
        flops_per_token = 6 * facts.parameters + 12 * facts.num_layers * facts.hidden_size * length
        gpu = monitor.report()["summary"]["gpus"]
        wait = sum(history.data_wait_s)
        print(
            f"MFU: {tokens_per_s * flops_per_token / H200_BF16_FLOPS:.1%} (of {H200_BF16_FLOPS / 1e12:.0f} TFLOP/s bf16)"
        )
        print(f"GPU utilisation mean: {gpu[0]['utilization_pct']['mean'] if gpu else 'n/a'}%")
        print(f"data-loader wait share: {wait / ours.seconds:.1%}")

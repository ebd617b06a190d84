"""Decide every training parameter from the data, the hardware and the config.

`make_plan` is a pure function: the same inputs give the same plan. Every
decision carries its value, its source (`planned`, `config` or `cli`) and a
one-line reason, which are printed for the user and written to the manifest.
Values the user chose (with --set, a flag, or their own config file) always
win; the shipped config's values are defaults the planner may re-derive, and
then says so.

Batching keeps one invariant: the effective batch (micro-batch × gradient
accumulation × processes) is a target fixed before any memory decision, so
a bigger or smaller GPU, a shorter sequence length, a measured probe or an
out-of-memory retry changes the micro-batch and the accumulation, never the
optimisation itself.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from pipeline.config import LoadedConfig, budget_seconds
from pipeline.data.examples import style_decisions
from pipeline.data.packing import count_blocks
from pipeline.decisions import Decisions
from pipeline.errors import ConfigError
from pipeline.hardware import GB, free_cores
from pipeline.manifest import TENSORBOARD_DIR
from pipeline.types import (
    DataStats,
    GpuInfo,
    Hardware,
    Launch,
    Machine,
    ModelFacts,
    Plan,
    Prepared,
    ProbeRow,
    Scores,
    Speed,
    TextStyle,
    TrainTime,
)

ONE_PROCESS = Launch()
UNDECIDED_STYLE = TextStyle("raw", "all")  # until the text rule decides it
TINY_LEARNING_RATE = 5e-3  # measured: the random tiny model's loss falls ~2.5 nats in 80 steps at this rate
PRETRAINED_LEARNING_RATE = 2e-4  # the usual LoRA rate for pretrained code models (QLoRA paper, peft examples)
SHORT_RUN_LEARNING_RATE = (
    5e-4  # measured: a 10-minute CPU run (55 steps) on psf/requests learns far more at 5e-4
)
SHORT_RUN_STEPS = 200  # below this many optimizer steps a run is short
TINY_TRAINED_BASE_MODULES = ["embed_tokens", "norm"]  # a random base's output scale must be learnable
SMALL_DATASET_BLOCKS = (
    2048  # below this the blocks sit in memory and worker start-up costs more than it saves
)
LOG_POINTS = 50  # aim for this many loss/LR records per run
CHECKPOINTS = 10  # aim for this many checkpoints per run
EVALUATIONS = 10  # aim for this many validations per run
PATIENCE = 3  # validations in a row without a new best before training stops (of about EVALUATIONS)
CPU_SEQUENCE_TOKENS = (
    512  # longest answer-with-prompt on a CPU: more tokens/s than 1024 (docs/development.md)
)
CPU_EVAL_BLOCKS = (
    4  # held-out blocks per format scored for loss on a CPU, where each costs a forward pass of seconds
)
CODE_CASES = 300  # next-line cases scored: from 100 commits, intervals narrow enough to decide
CPU_CODE_CASES = 100  # on a CPU, where each costs each model two prompts of a few hundred tokens
BLOCK_CASES = 100  # bodies scored: up to 96 new tokens each, where a next line takes a few
CPU_BLOCK_CASES = 30
CPU_TIME_BUDGET_S = 600.0  # a first run on a CPU: minutes, not hours
BUDGET_TRAIN_SHARE = 0.8  # of a budget, what training fills until the run knows what it spends outside it
TRAINING_TIME_LIMIT = 0.9  # of it, where training then stops; after, training fills 8/9 of its deadline
AFTER_TRAINING_S = 10.0  # the past's backtest and saving the adapter and manifest, with room to spare
UNMEASURED_AFTER_SHARE = 0.1  # of a budget: scoring the fine-tuned model, where no scoring was timed
# Answering the validation commits (eval.validate_model), over the fine-tuned model's scoring on the
# held-out ones: their messages, and their next lines by the fine-tuned and the base model, with context
# and without, where scoring answers each next line twice (measured: docs/planning.md).
VALIDATION_SHARE = 1.3
AHEAD_TOKENS_PER_S = 2000  # what a run tokenizes ahead of a budget assumes: well above what 2 cores train
# A validation (a forward pass alone, with the adapters) over a training step's tokens/s: the lower of what
# bf16 and fp32 measured (docs/development.md), so that a validation is not planned cheaper than it runs.
FORWARD_SPEEDUP = 2.4
EVAL_COST_RATIO = 20  # an evaluation inside training may cost at most 1/20 of the time between two
CHECKPOINT_INTERVAL_S = 60.0  # at most one checkpoint per minute of training
LORA_DROPOUT = 0.05  # on the adapters' input, as the LoRA and QLoRA papers train small models
CONTINUED_LR_SHARE = 0.5  # an update's peak learning rate, of its parent's
CONTINUED_WARMUP_RATIO = 0.03  # an update's warmup: the adapter is trained, the optimizer state is new
FILES_SHARE = 0.5  # of a budget's tokens, from the files: an even mix until validation measures better
MIN_BUDGET_STEPS = 96  # optimizer steps a bounded run should take to learn from what it sees
# Activation memory per token per layer is about 34 × hidden bytes in 16-bit training (Korthikanti et al.,
# "Reducing Activation Recomputation in Large Transformer Models", with memory-efficient attention).
ACTIVATION_BYTES_PER_HIDDEN = 34
LOGIT_BYTES = 6  # per vocabulary entry per token: 16-bit logits plus the fp32 copy the loss makes
ADAPTER_BYTES = 16  # per LoRA weight: fp32 weight, its gradient and AdamW's two moments
# Bits per quantized weight: NF4 is 4 bits plus block scales (64-weight blocks, double-quantised to about
# 0.127 bits, QLoRA paper); LLM.int8 is 8 bits plus an fp32 scale per row (negligible).
QUANTIZED_BITS = {"4bit": 4.127, "8bit": 8.0}
CPU_MEMORY_SHARE = 0.7  # of a CPU machine's RAM (or its cgroup limit) a training run may plan to use
MEMORY_SAFETY = 0.9  # use at most this share of GPU memory by the estimate (allocator fragmentation, kernels)


@dataclass
class Context:
    """What the rules decide from (the data, the machine, the model, the config, what was measured) and
    what earlier rules decided that later ones read, typed; `p` records every decision with its reason."""

    data: DataStats
    hardware: Hardware
    model: ModelFacts
    loaded: LoadedConfig
    launch: Launch
    probe: tuple[ProbeRow, ...]
    oom_cap: int | None
    """The largest micro-batch after a CUDA out-of-memory in training."""
    valid_tokens: int
    """Tokens of the validation commits (0: none)."""
    speed: Speed | None
    """The measured training throughput, which a time budget needs."""
    train_time: TrainTime | None
    """What the budget leaves training once the run knows what it spends before and after it."""
    p: Decisions
    gpu: GpuInfo | None = None
    """The smallest GPU, which every process must fit."""
    device: str = "cpu"
    world: int = 1
    style: TextStyle = UNDECIDED_STYLE
    precision: str = "fp32"
    sequence_length: int = 0
    blocks: int = 0
    all_sequences: int = 0
    """Training sequences before `train.newest_sequences` kept the newest alone."""
    files: DataStats = field(default_factory=lambda: DataStats({}))
    """The files at the split point, most recently changed first (none: none read)."""
    training: DataStats = field(default_factory=lambda: DataStats({}))
    """History and files in the order a time budget keeps them (`mix` says which is which)."""
    mix: tuple[bool, ...] = ()
    """For each of `training`'s sequences, whether it is a file."""
    quantization: str = "none"
    micro: int = 1
    accumulation: int = 1
    epochs: int = 1
    total_steps: int = 0


def make_plan(
    data: DataStats,
    hardware: Hardware,
    model: ModelFacts,
    loaded: LoadedConfig,
    launch: Launch = ONE_PROCESS,
    probe: tuple[ProbeRow, ...] = (),
    oom_cap: int | None = None,
    valid_tokens: int = 0,
    speed: Speed | None = None,
    train_time: TrainTime | None = None,
    files: DataStats | None = None,
) -> Plan:
    """Every rule in order, each deciding its parameters from the context and what the rules before it
    decided: the same inputs give the same plan."""
    context = Context(
        data,
        hardware,
        model,
        loaded,
        launch,
        probe,
        oom_cap,
        valid_tokens,
        speed,
        train_time,
        Decisions(loaded),
        files=files or DataStats({}),
    )
    for rule in RULES:
        rule(context)
    return Plan.from_decisions(context.p.decisions, probe, speed, train_time)


def tokenize_ahead(machine: Machine, loaded: LoadedConfig) -> int | None:
    """Training tokens worth tokenizing before the speed is measured, newest first: what the time budget
    would train at AHEAD_TOKENS_PER_S, which CPUs rarely reach (a first run on a long history then
    tokenizes a few percent of it); None: all (no budget, or several processes, which plan apart)."""
    if machine.launch.world_size > 1:
        return None
    budget = _time_budget(Decisions(loaded), _device_kind(machine.hardware), None)
    return None if budget is None else int(budget * BUDGET_TRAIN_SHARE * AHEAD_TOKENS_PER_S)


def _device_kind(hardware: Hardware) -> str:
    if hardware.cuda_usable and hardware.gpus:
        return "cuda"
    return "mps" if hardware.mps else "cpu"


def _device(c: Context) -> None:
    hardware, p = c.hardware, c.p
    c.gpu = min(hardware.gpus, key=lambda g: g.memory_gb) if hardware.gpus else None
    if _device_kind(hardware) == "cuda" and c.gpu:
        count, gpu = len(hardware.gpus), c.gpu
        c.device = p.planned(
            "device", "cuda", f"{count} CUDA GPU(s), smallest: {gpu.name} with {gpu.memory_gb:g} GB"
        )
    elif hardware.mps:
        c.device = p.planned("device", "mps", "Apple GPU (MPS) found, no CUDA")
    else:
        c.device = p.planned("device", "cpu", _no_gpu_reason(hardware))
    c.world = c.p.planned("world_size", c.launch.world_size, c.launch.reason)


def _text(c: Context) -> None:
    c.style = style_decisions(c.p, c.model.name, c.model.chat_template)


def _compute(c: Context) -> None:
    c.precision = _precision(c.p, c.device, c.gpu, c.hardware)
    _tf32(c.p, c.device, c.gpu)
    _attention(c.p, c.device, c.gpu, c.model, c.precision)


def _blocks(c: Context) -> None:
    c.all_sequences = c.data.sequences
    newest = c.p.value(lambda cfg: cfg.train.newest_sequences)
    # Only where the lengths' newest-first order is known (statistics built from counts alone have none).
    if newest and newest < c.data.sequences and len(c.data.newest_first) == c.data.sequences:
        c.data = DataStats.from_lengths(c.data.newest_first[:newest])
    c.sequence_length = _sequence_length(c.p, c.data, c.model)
    cut = _truncate_at(c.p, c.style, c.sequence_length, c.device, c.data)
    if cut:
        c.data = c.data.truncated(cut)
    share = _files_share(c.p, c.files)
    c.training, c.mix = _mixed(c.data, c.files if share else DataStats({}), share)
    c.blocks = count_blocks(c.training.length_counts, c.sequence_length)
    data, files = c.training, sum(c.mix)
    c.p.planned(
        "train_blocks",
        c.blocks,
        f"{data.tokens} tokens in {data.sequences - files} sequences"
        + (f" and {files} files" if files else "")
        + f" packed into blocks of {c.sequence_length} ({data.tokens / max(1, c.blocks * c.sequence_length):.0%} "
        "filled)",
    )


def _files_share(p: Decisions, files: DataStats) -> float:
    """Of the tokens a time budget trains, the share from the files at the split point."""
    if not p.is_auto(lambda cfg: cfg.train.files_share):
        return p.from_config("files_share", lambda cfg: cfg.train.files_share)
    if not files.sequences:
        return p.planned("files_share", 0.0, "no file to train on (scrape.files off, or none kept)")
    return p.planned(
        "files_share",
        FILES_SHARE,
        "completing the code learns from the files as they stand, a commit message from the history: "
        "half of each until validation measures a better mix",
    )


def _mixed(history: DataStats, files: DataStats, share: float) -> tuple[DataStats, tuple[bool, ...]]:
    """The newest history sequences and the most recently changed files interleaved so that every prefix
    holds about `share` of its tokens from files (a budget keeps a prefix; the newest commit first), the
    rest of one kind after the other runs out; and which of them are files."""
    if len(history.newest_first) != history.sequences:  # lengths without their order (counts alone): no mix
        return history, ()
    order: list[tuple[int, bool]] = []
    h, f, from_history, from_files = 0, 0, 0, 0
    while h < len(history.newest_first) or f < len(files.newest_first):
        total = from_history + from_files
        take_file = f < len(files.newest_first) and (
            h >= len(history.newest_first) or from_files < share * total
        )
        if take_file:
            order.append((files.newest_first[f], True))
            from_files, f = from_files + files.newest_first[f], f + 1
        else:
            order.append((history.newest_first[h], False))
            from_history, h = from_history + history.newest_first[h], h + 1
    return DataStats.from_lengths(length for length, _ in order), tuple(is_file for _, is_file in order)


def _memory(c: Context) -> None:
    c.quantization = _quantization(c.p, c.device, c.gpu, c.hardware, c.model, c.precision, c.sequence_length)
    memory = Footprint(c.model, c.precision, c.quantization, c.loaded.config.lora.r, c.sequence_length)
    c.micro, c.accumulation = _batching(c.p, c.device, c.gpu, memory, c.world, c.probe, c.oom_cap)


def _budget(c: Context) -> None:
    """Epochs, and what a time budget lets train: fewer passes, or one pass over the newest sequences."""
    p = c.p
    c.epochs = p.from_config("epochs", lambda cfg: cfg.train.epochs)
    budget = _time_budget(p, c.device, c.speed)
    seconds = _train_seconds(p, budget, c.train_time)
    if seconds and c.speed:
        fitted, epochs = _fit_budget(p, c, seconds, c.speed)
        if (fitted, epochs) != (c.blocks, c.epochs):
            c.micro, c.accumulation = _short_run_batch(p, fitted * epochs, c.micro, c.accumulation, c.world)
        c.blocks, c.epochs = fitted, epochs
    else:
        p.planned("train_sequences", c.data.sequences, f"all {c.data.sequences} training sequences")
        _all_files(p, c, "no time budget")
    if c.data.sequences < c.all_sequences:
        decided, older = p.decisions["train_sequences"], c.all_sequences - c.data.sequences
        p.because_of(
            "train_sequences",
            decided.value,
            lambda cfg: cfg.train.newest_sequences,
            f"train.newest_sequences keeps the newest {c.data.sequences} of {c.all_sequences} (the {older} "
            f"older ones are left out; every commit is still indexed); {decided.reason}",
        )
    p.planned(
        "effective_batch_size",
        c.micro * c.accumulation * c.world,
        f"{c.micro} per device × {c.accumulation} accumulation × {c.world} process(es)",
    )


def _steps(c: Context) -> None:
    p, blocks, per_step = c.p, c.blocks, c.micro * c.world
    drop_last = p.from_config("drop_last", lambda cfg: cfg.plan.drop_last)
    if drop_last and blocks < per_step:
        drop_last = p.planned(
            "drop_last", False, f"only {blocks} blocks: dropping the last micro-batch would drop all"
        )
    # Each process sees ceil(blocks / (micro × processes)) micro-batches (accelerate pads the last round so
    # all processes step together), or the floor with drop_last; the Trainer then takes
    # ceil(micro-batches / accumulation) optimizer steps per epoch.
    batches = blocks // per_step if drop_last else math.ceil(blocks / per_step)
    steps_per_epoch = math.ceil(batches / c.accumulation)
    p.planned(
        "steps_per_epoch",
        steps_per_epoch,
        f"{blocks} blocks / ({c.micro} × {c.world}) = {batches} micro-batches per process, "
        f"/ {c.accumulation} accumulation",
    )
    c.total_steps = p.planned(
        "total_steps", steps_per_epoch * c.epochs, f"{steps_per_epoch} steps × {c.epochs} epochs"
    )
    p.planned("warmup_steps", *_warmup(c.total_steps, c.loaded))


def _learning_rate(c: Context) -> None:
    p, loaded = c.p, c.loaded
    if not p.is_auto(lambda cfg: cfg.train.learning_rate):
        p.from_config("learning_rate", lambda cfg: cfg.train.learning_rate)
    elif loaded.continues:
        peak = loaded.continues["learning_rate"]
        p.planned(
            "learning_rate",
            peak * CONTINUED_LR_SHARE,
            f"continued training: {CONTINUED_LR_SHARE:g} × the parent run's peak ({peak:g}), so the new commits "
            "are learned without undoing what the adapter knows",
        )
    elif c.model.random_init:
        p.planned("learning_rate", TINY_LEARNING_RATE, "randomly initialised tiny model: a large step")
    elif c.total_steps < SHORT_RUN_STEPS:
        p.planned(
            "learning_rate",
            SHORT_RUN_LEARNING_RATE,
            f"a short run ({c.total_steps} < {SHORT_RUN_STEPS} steps): LoRA's usual "
            f"{PRETRAINED_LEARNING_RATE:g} moves too little in so few steps",
        )
    else:
        p.planned(
            "learning_rate", PRETRAINED_LEARNING_RATE, "usual LoRA learning rate for a pretrained model"
        )


def _optimizer(c: Context) -> None:
    p = c.p
    p.from_config("lr_scheduler", lambda cfg: cfg.train.lr_scheduler)
    p.planned(
        "optimizer",
        "adamw_torch_fused",
        "AdamW with PyTorch's fused kernel: one launch per step for all parameters",
    )
    p.from_config("weight_decay", lambda cfg: cfg.train.weight_decay)
    p.from_config("max_grad_norm", lambda cfg: cfg.train.max_grad_norm)


def _trained_modules(c: Context) -> None:
    p = c.p
    if c.loaded.continues:
        p.planned(
            "base_modules_trained",
            c.loaded.continues.get("base_modules_trained") or [],
            "continued training: the parent run's adapter trains what it trained",
        )
    elif c.model.random_init:
        p.planned(
            "base_modules_trained",
            TINY_TRAINED_BASE_MODULES,
            "random base: LoRA alone cannot rescale frozen random embeddings, so they and the norms train too",
        )
    else:
        p.planned("base_modules_trained", [], "pretrained base: only the LoRA adapters train")
    _lora_dropout(p, c.device)


def _machine_use(c: Context) -> None:
    _dataloader(c.p, c.device, c.blocks, c.hardware)
    _cpu_threads(c.p, c.hardware)


def _checks_and_saves(c: Context) -> None:
    """Evaluation during training, checkpoints, logging: as often as they are worth their cost."""
    speed = c.speed
    step_s = c.micro * c.accumulation * c.world * c.sequence_length / speed.tokens_per_s if speed else None
    eval_blocks = _evaluation_bound(c.p, c.device)
    _cadence(c.p, c.total_steps, c.valid_tokens, step_s, eval_blocks, c.sequence_length, speed)
    c.p.from_config("save_total_limit", lambda cfg: cfg.train.save_total_limit)


def _passed_through(c: Context) -> None:
    """What the Trainer receives as configured (see README)."""
    c.p.from_config("fsdp", lambda cfg: cfg.distributed.fsdp)
    c.p.from_config("fsdp_config", lambda cfg: cfg.distributed.fsdp_config)
    c.p.from_config("deepspeed", lambda cfg: cfg.distributed.deepspeed)
    c.p.from_config("torch_compile", lambda cfg: cfg.train.torch_compile)
    c.p.from_config("seed", lambda cfg: cfg.train.seed)
    _trackers(c.p)


RULES: tuple[Callable[[Context], None], ...] = (
    _device,
    _text,
    _compute,
    _blocks,
    _memory,
    _budget,
    _steps,
    _learning_rate,
    _optimizer,
    _trained_modules,
    _machine_use,
    _checks_and_saves,
    _passed_through,
)
"""The plan, in the order its decisions are taken and printed. A new parameter is its config field, the
rule that decides it, its `Plan` field and the schema's entry for it (`tests/test_structure.py` fails
until the three agree), and its consumer: the Trainer's options (`train.trainer.trainer_options`), or
another stage named in that test's `CONSUMED_ELSEWHERE`; a decision that reaches neither fails it."""


def plan_for(
    prepared: Prepared,
    machine: Machine,
    loaded: LoadedConfig,
    probe: tuple[ProbeRow, ...] = (),
    oom_cap: int | None = None,
    speed: Speed | None = None,
    train_time: TrainTime | None = None,
) -> Plan:
    """The plan for this data and model on this machine (again after a probe, a speed measurement, the
    time spent before training or an out-of-memory: see `make_plan`)."""
    return make_plan(
        prepared.stats,
        machine.hardware,
        prepared.facts,
        loaded,
        machine.launch,
        probe,
        oom_cap,
        prepared.counts["valid_tokens"],
        speed,
        train_time,
        prepared.files,
    )


def planned_again(
    plan: Plan,
    prepared: Prepared,
    machine: Machine,
    loaded: LoadedConfig,
    oom_cap: int | None = None,
    train_time: TrainTime | None = None,
) -> Plan:
    """`plan` made again with what it was fitted to (its batch probe and the probe's note, the measured
    speed, the time its budget left training), for `prepared` (its data tokenized further), after an
    out-of-memory (`oom_cap`) or for the time now left (`train_time`)."""
    again = plan_for(
        prepared, machine, loaded, plan.probe, oom_cap, plan.speed, train_time or plan.train_time
    )
    return replace(again, probe_note=plan.probe_note)


def _sequence_length(p: Decisions, data: DataStats, model: ModelFacts) -> int:
    if not p.is_auto(lambda cfg: cfg.train.sequence_length):
        return p.from_config("sequence_length", lambda cfg: cfg.train.sequence_length)
    config = p.loaded.config.train
    limit = min(config.max_sequence_length, model.max_positions or config.max_sequence_length)
    p95 = data.percentile(95)
    length = min(limit, max(64, math.ceil(p95 / 64) * 64))
    how = (
        f"capped at {limit} (max_sequence_length or the model's limit)"
        if length == limit and p95 > limit
        else "rounded up to a multiple of 64"
    )
    return p.planned(
        "sequence_length", length, f"p95 of {data.sequences} sequence lengths is {p95} tokens, {how}"
    )


def _truncate_at(p: Decisions, style: TextStyle, length: int, device: str, data: DataStats) -> int | None:
    """Where a long sequence is cut: an answer keeps its prompt in front of it, so such a sequence keeps
    its first tokens (on a CPU at most CPU_SEQUENCE_TOKENS, since attention costs the square of a
    sequence's length); raw text is split into block-sized pieces instead (None), every token learned."""
    if style.loss_on != "response":
        longer = sum(count for size, count in data.length_counts.items() if size > length)
        return p.planned(
            "truncate_at",
            None,
            f"raw text, every token learned: the {longer} sequences longer than a {length}-token block are "
            "split into block-sized pieces",
        )
    cut, why = length, f"the {length}-token block"
    if (
        device == "cpu"
        and length > CPU_SEQUENCE_TOKENS
        and not p.explicit(lambda cfg: cfg.train.sequence_length)
    ):
        cut = CPU_SEQUENCE_TOKENS
        why = (
            f"{cut} tokens on a CPU, where attention costs the square of a sequence's length (measured: "
            f"11% more tokens/s than {length}-token sequences, so a time budget trains more commits); "
            "blocks still pack two"
        )
    longer = sum(count for size, count in data.length_counts.items() if size > cut)
    return p.planned(
        "truncate_at",
        cut,
        f"{longer} of {data.sequences} sequences are longer than {why}: each keeps its first {cut} tokens "
        "(its prompt and the start of its answer), since a piece of an answer cut off from its prompt "
        "teaches nothing about answering it",
    )


def _precision(p: Decisions, device: str, gpu, hardware: Hardware) -> str:
    if not p.is_auto(lambda cfg: cfg.plan.precision):
        return p.from_config("precision", lambda cfg: cfg.plan.precision)
    if device == "cuda" and gpu.bf16:
        return p.planned("precision", "bf16", f"compute capability {_cc(gpu)} supports bfloat16")
    if device == "cuda":
        return p.planned(
            "precision", "fp16", f"compute capability {_cc(gpu)} has no bfloat16: fp16 with loss scaling"
        )
    if device == "cpu" and hardware.cpu_bf16:
        return p.planned(
            "precision",
            "bf16",
            f"the CPU has {hardware.cpu_bf16}: bfloat16 autocast trains 1.5–1.9× faster than fp32 on such CPUs",
        )
    if device == "cpu":
        return p.planned(
            "precision",
            "fp32",
            "no avx512_bf16 or AMX on this CPU: bfloat16 would be emulated, slower than fp32",
        )
    return p.planned("precision", "fp32", f"{device}: mixed precision would not speed training up here")


def _tf32(p: Decisions, device: str, gpu) -> None:
    if not p.is_auto(lambda cfg: cfg.plan.tf32):
        p.from_config("tf32", lambda cfg: cfg.plan.tf32)
    elif device == "cuda" and gpu.compute_capability and gpu.compute_capability >= (8, 0):
        p.planned("tf32", True, f"compute capability {_cc(gpu)}: TF32 tensor cores for the fp32 matmuls")
    else:
        p.planned("tf32", False, "TF32 needs a CUDA GPU of compute capability 8.0 or newer")


def _attention(p: Decisions, device: str, gpu, model: ModelFacts, precision: str) -> None:
    if not p.is_auto(lambda cfg: cfg.plan.attention):
        p.from_config("attention", lambda cfg: cfg.plan.attention)
    elif (
        device == "cuda"
        and model.supports_flash_attention
        and gpu.compute_capability
        and gpu.compute_capability >= (8, 0)
        and precision in ("bf16", "fp16")
    ):
        p.planned("attention", "flash_attention_2", "flash-attn is installed and supports this GPU and model")
    elif device == "cpu" and model.supports_sdpa and model.supports_attention_backend:
        p.planned(
            "attention",
            "segments",
            "CPU: causal attention once per packed sequence (matmuls up to 512 tokens, the fused kernel "
            "above), instead of one block-wide masked call that scores every token against the whole block",
        )
    elif model.supports_sdpa:
        why = (
            "flash-attn not installed"
            if device == "cuda" and not model.supports_flash_attention
            else "fused kernels"
        )
        p.planned(
            "attention", "sdpa", f"PyTorch scaled-dot-product attention ({why}); honours packed position ids"
        )
    else:
        p.planned("attention", "eager", f"{model.name} has no SDPA implementation")


def _quantization(
    p: Decisions, device: str, gpu, hardware: Hardware, model: ModelFacts, precision: str, length: int
) -> str:
    """Load the frozen base in 4 bits (QLoRA) when its weights would not fit beside the activations,
    the adapters and their optimizer state at micro-batch 1 (with checkpointing)."""
    if not p.is_auto(lambda cfg: cfg.plan.quantization):
        chosen = p.from_config("quantization", lambda cfg: cfg.plan.quantization)
        if chosen != "none" and model.random_init:
            raise ConfigError(
                f"`plan.quantization` {chosen} loads a pretrained base in fewer bits; {model.name} is built in "
                "code with random weights: set plan.quantization=none, or choose a pretrained --model"
            )
        if chosen != "none" and device not in ("cuda", "cpu"):
            raise ConfigError(
                f"`plan.quantization` {chosen} needs CUDA or a CPU (bitsandbytes has no {device} kernels); "
                "set plan.quantization=none"
            )
        return chosen
    if model.random_init:
        return p.planned(
            "quantization", "none", "a random base built in code: its weights are few and trained"
        )
    memory_gb = hardware.memory_limit_gb or hardware.ram_total_gb
    if device == "cuda":
        room, where = gpu.memory_gb * MEMORY_SAFETY, f"{gpu.name}'s {gpu.memory_gb:g} GB"
    elif device == "cpu" and memory_gb:
        room, where = memory_gb * CPU_MEMORY_SHARE, f"{CPU_MEMORY_SHARE:.0%} of {memory_gb:g} GB of RAM"
    else:
        return p.planned("quantization", "none", f"{device}: bitsandbytes' 4-bit kernels need CUDA or a CPU")
    rank = p.loaded.config.lora.r
    dense = Footprint(model, precision, "none", rank, length)
    needed = dense.total_gb(1, checkpointing=True)
    weights = f"{dense.weights_gb:.1f} GB of {precision} weights"
    if needed <= room:
        return p.planned(
            "quantization", "none", f"{weights} train in {needed:.1f} GB at micro-batch 1, within {where}"
        )
    nf4 = Footprint(model, precision, "4bit", rank, length)
    reason = (
        f"{weights} need {needed:.1f} GB to train at micro-batch 1, more than {where} hold "
        f"({room:.1f} GB usable): NF4 4-bit weights with double quantisation, {precision} compute "
        f"({nf4.weights_gb:.1f} GB of weights, {nf4.total_gb(1, checkpointing=True):.1f} GB in all)"
    )
    if nf4.total_gb(1, checkpointing=True) > room:
        reason += "; still over: expect to run out of memory (a smaller model or a shorter train.max_sequence_length)"
    return p.planned("quantization", "4bit", reason)


def _batching(
    p: Decisions,
    device: str,
    gpu: GpuInfo | None,
    memory: Footprint,
    world: int,
    probe: tuple[ProbeRow, ...],
    oom_cap: int | None,
) -> tuple[int, int]:
    """Micro-batch and accumulation for a fixed effective-batch target; records both."""
    tier, tier_reason = _batch_tier(device, gpu, p.loaded)
    target, target_reason = _batch_target(p, tier, world)
    explicit_accumulation = p.explicit(lambda cfg: cfg.plan.gradient_accumulation_steps)
    if p.explicit(lambda cfg: cfg.plan.batch_size):
        micro = p.from_config("batch_size", lambda cfg: cfg.plan.batch_size)
        _fit_memory(p, device, gpu, memory, micro, shrink=False)
    else:
        micro_limit, limit_reason = _micro_limit(p, device, gpu, memory, probe, tier, tier_reason)
        if explicit_accumulation:
            micro = p.planned("batch_size", micro_limit, limit_reason)
        else:
            # The fewest micro-batches that reach the target, each no larger than memory allows.
            accumulation = math.ceil(target / (world * micro_limit))
            micro = p.planned(
                "batch_size",
                math.ceil(target / (world * accumulation)),
                f"{limit_reason}; target effective batch {target} = {target_reason}",
            )
    if explicit_accumulation:
        accumulation = p.value(lambda cfg: cfg.plan.gradient_accumulation_steps)
    else:
        accumulation = max(1, math.ceil(target / (world * micro)))
    if oom_cap is not None and micro > oom_cap:
        # Out of memory in training: smaller micro-batches, more of them, the same effective batch.
        target = micro * accumulation * world
        p.planned(
            "batch_size",
            oom_cap,
            f"capped at {oom_cap}: CUDA ran out of memory at larger micro-batches (planned {micro})",
        )
        micro, accumulation = oom_cap, math.ceil(target / (world * oom_cap))
        p.planned(
            "gradient_accumulation_steps", accumulation, f"raised to keep the effective batch at {target}"
        )
    elif explicit_accumulation or accumulation == p.value(lambda cfg: cfg.plan.gradient_accumulation_steps):
        p.from_config("gradient_accumulation_steps", lambda cfg: cfg.plan.gradient_accumulation_steps)
    else:
        p.planned(
            "gradient_accumulation_steps",
            accumulation,
            f"reaches the target effective batch {target} with micro-batch {micro} × {world} process(es)",
        )
    return micro, accumulation


def _batch_target(p: Decisions, tier: int, world: int) -> tuple[int, str]:
    """The effective batch, fixed before any memory decision: as configured, or the tier's."""
    if p.explicit(lambda cfg: cfg.plan.effective_batch_size):
        target = p.value(lambda cfg: cfg.plan.effective_batch_size)
        return target, f"effective_batch_size {target} as configured"
    if p.explicit(lambda cfg: cfg.plan.batch_size) and p.explicit(
        lambda cfg: cfg.plan.gradient_accumulation_steps
    ):
        target = (
            p.value(lambda cfg: cfg.plan.batch_size)
            * p.value(lambda cfg: cfg.plan.gradient_accumulation_steps)
            * world
        )
        return target, "batch_size × gradient_accumulation_steps as configured"
    accumulation = (
        1
        if p.is_auto(lambda cfg: cfg.plan.gradient_accumulation_steps)
        else p.value(lambda cfg: cfg.plan.gradient_accumulation_steps)
    )
    return (
        tier * accumulation * world,
        f"tier batch {tier} × accumulation {accumulation} × {world} process(es)",
    )


def _micro_limit(
    p: Decisions,
    device: str,
    gpu: GpuInfo | None,
    memory: Footprint,
    probe: tuple[ProbeRow, ...],
    tier: int,
    tier_reason: str,
) -> tuple[int, str]:
    """The largest micro-batch memory allows: what the probe fitted, else the tier's size scaled to the
    block length, shrunk where the memory estimate says it does not fit; and why."""
    plan, length = p.loaded.config.plan, memory.sequence_length
    fitting = [row.batch_size for row in probe if row.fits]
    if fitting:
        limit = max(fitting)
        reason = f"largest micro-batch the probe fitted with {plan.probe_headroom:.0%} memory headroom"
    elif device == "cpu":
        # A CPU trains a larger micro-batch no faster per token, and slower where its activations outgrow
        # the caches (the reason below says by how much; docs/development.md keeps the runs).
        limit = max(1, plan.batch_reference_tokens // length)
        reason = (
            f"cpu: about {plan.batch_reference_tokens} tokens a micro-batch ({limit} × {length}), the tier "
            f"batch {tier} by accumulation: a CPU trains larger micro-batches no faster per token (1 × 1024 "
            "tokens ran 8% (bf16) and 13% (fp32) faster than 3 × 1024 on 2 cores)"
        )
    else:
        limit = max(1, tier * plan.batch_reference_tokens // length)
        reason = f"{tier_reason}: batch {tier}"
        if length != plan.batch_reference_tokens:
            reason += f", × {plan.batch_reference_tokens}/{length} for {length}-token blocks"
    limit, memory_reason = _fit_memory(p, device, gpu, memory, limit)
    return limit, f"{reason}{memory_reason}"


def _fit_memory(p, device, gpu, memory: Footprint, micro, shrink: bool = True) -> tuple[int, str]:
    """Turn on gradient checkpointing, and halve the micro-batch, until the memory estimate fits;
    with `shrink` off (the user fixed the micro-batch) only checkpointing is decided."""
    if not p.is_auto(lambda cfg: cfg.plan.gradient_checkpointing):
        checkpointing = p.from_config("gradient_checkpointing", lambda cfg: cfg.plan.gradient_checkpointing)
        wanted = micro
        if shrink and device == "cuda" and memory.model.parameters:
            while micro > 1 and not _fits(gpu, memory, micro, checkpointing):
                micro //= 2
        return micro, _halved(wanted, micro, gpu)
    if device != "cuda" or not memory.model.parameters:
        p.planned(
            "gradient_checkpointing", False, f"{device}: activations live in RAM, which is not the limit here"
        )
        return micro, ""
    if _fits(gpu, memory, micro, checkpointing=False):
        p.planned(
            "gradient_checkpointing",
            False,
            f"micro-batch {micro} is estimated to fit {gpu.memory_gb:g} GB without it",
        )
        return micro, ""
    if not shrink or _fits(gpu, memory, micro, checkpointing=True):
        p.planned(
            "gradient_checkpointing",
            True,
            f"micro-batch {micro} fits {gpu.memory_gb:g} GB only by recomputing activations",
        )
        return micro, ""
    wanted = micro
    while micro > 1 and not _fits(gpu, memory, micro, checkpointing=True):
        micro //= 2
    p.planned(
        "gradient_checkpointing", True, f"memory is tight on {gpu.memory_gb:g} GB: recompute activations"
    )
    return micro, _halved(wanted, micro, gpu)


def _halved(wanted: int, micro: int, gpu) -> str:
    """The micro-batch reason's tail when memory made it smaller."""
    if micro == wanted:
        return ""
    return f", halved from {wanted} to {micro} to fit {gpu.memory_gb:g} GB by the estimate"


@dataclass(frozen=True)
class Footprint:
    """Training memory on one device, estimated from the model's config alone (no weights loaded)."""

    model: ModelFacts
    precision: str
    quantization: str
    """`none`, `4bit` (NF4) or `8bit` (LLM.int8): how the frozen linear weights are stored."""
    lora_rank: int
    sequence_length: int

    @property
    def weights_gb(self) -> float:
        """The frozen base in the compute dtype (fp32 or 16-bit), its linear layers quantized if planned;
        the embeddings and the output layer stay dense, as bitsandbytes leaves them."""
        dense_bytes = 4 if self.precision == "fp32" else 2
        quantized = self.model.linear_parameters if self.quantization != "none" else 0
        bits = QUANTIZED_BITS.get(self.quantization, 0.0)
        return ((self.model.parameters - quantized) * dense_bytes + quantized * bits / 8) / GB

    @property
    def adapters_gb(self) -> float:
        """The LoRA weights with their gradients and AdamW moments, in fp32."""
        return self.lora_rank * self.model.linear_widths * ADAPTER_BYTES / GB

    def activations_gb(self, micro: int, checkpointing: bool) -> float:
        """What the backward pass keeps (fp32 doubles it), and the logits the loss computes."""
        scale = 2 if self.precision == "fp32" else 1
        tokens = micro * self.sequence_length
        per_layer = ACTIVATION_BYTES_PER_HIDDEN * self.model.hidden_size * scale
        # Checkpointing keeps each layer's input plus one layer's full activations at a time.
        layers = (
            (self.model.num_layers * 2 * scale / ACTIVATION_BYTES_PER_HIDDEN + 1)
            if checkpointing
            else self.model.num_layers
        )
        return (tokens * per_layer * layers + tokens * self.model.vocab_size * LOGIT_BYTES) / GB

    def total_gb(self, micro: int, checkpointing: bool) -> float:
        return self.weights_gb + self.adapters_gb + self.activations_gb(micro, checkpointing)


def _fits(gpu, memory: Footprint, micro: int, checkpointing: bool) -> bool:
    return memory.total_gb(micro, checkpointing) <= gpu.memory_gb * MEMORY_SAFETY


def _cpu_threads(p: Decisions, hardware: Hardware) -> None:
    """torch's intra-op threads wait for each other at every operation: one on a core another process
    keeps busy stalls them all (one thread on the free core trained twice as fast as two on both:
    docs/planning.md), so the threads are the cores left free, and training follows the load as it
    changes."""
    cores = hardware.usable_cores
    if not p.is_auto(lambda cfg: cfg.plan.cpu_threads):
        p.from_config("cpu_threads", lambda cfg: cfg.plan.cpu_threads)
        p.planned("follow_free_cores", False, "plan.cpu_threads is set: training keeps it")
        return
    busy = hardware.busy_cores
    if busy is None:
        unmeasured = (
            "not measured" if hardware.source == "detected" else f"not measured for {hardware.source}"
        )
        p.planned("cpu_threads", cores, f"{cores} usable cores (other processes' load: {unmeasured})")
    else:
        free = free_cores(cores, busy)
        others = f" ({'; '.join(hardware.busy_processes)})" if hardware.busy_processes else ""
        p.planned(
            "cpu_threads",
            free,
            f"{cores} usable cores, other processes busy on {busy:.1f} of them when the run started{others}"
            if free < cores
            else f"{cores} usable cores, idle when the run started (other processes: {busy:.1f} core)",
        )
    p.planned(
        "follow_free_cores",
        hardware.source == "detected",
        "training checks the CPU other processes take at each hardware sample and follows the free cores"
        if hardware.source == "detected"
        else f"planning for {hardware.source}, not this machine",
    )


def _dataloader(p: Decisions, device: str, blocks: int, hardware: Hardware) -> None:
    if p.is_auto(lambda cfg: cfg.plan.num_workers):
        workers = p.planned("num_workers", *_workers(blocks, hardware))
    else:
        workers = p.from_config("num_workers", lambda cfg: cfg.plan.num_workers)
        if workers >= hardware.usable_cores:
            cap = max(0, hardware.usable_cores - 1)
            workers = p.planned(
                "num_workers",
                cap,
                f"configured {workers}; the training loop needs one of the {hardware.usable_cores} usable cores",
            )
    if p.value(lambda cfg: cfg.plan.pin_memory) and device != "cuda":
        p.planned("pin_memory", False, f"pin_memory only speeds up host-to-GPU copies; device is {device}")
    else:
        p.from_config("pin_memory", lambda cfg: cfg.plan.pin_memory)
    if workers:
        p.planned("persistent_workers", True, "keep the workers between epochs instead of forking them again")
        p.planned("prefetch_factor", 4 if device == "cuda" else 2, "batches each worker prepares ahead")
    else:
        p.planned("persistent_workers", False, "no worker processes")
        p.planned("prefetch_factor", None, "no worker processes")


def _workers(blocks: int, hardware: Hardware) -> tuple[int, str]:
    if blocks < SMALL_DATASET_BLOCKS:
        return 0, f"{blocks} blocks sit in memory; worker start-up would cost more than it saves"
    physical = hardware.cpu_physical_cores or hardware.usable_cores
    # Leave a core for the training loop itself.
    workers = max(0, min(physical // 2, hardware.usable_cores - 1))
    return workers, f"{physical} physical cores // 2, at most {hardware.usable_cores} usable cores - 1"


def _validate_model(p: Decisions, device: str) -> None:
    """Whether the fine-tuned model answers the validation commits, so it can be chosen to suggest."""
    budget = p.decisions["time_budget_s"].value
    if not p.is_auto(lambda cfg: cfg.eval.validate_model):
        p.from_config("validate_model", lambda cfg: cfg.eval.validate_model)
    elif device != "cpu" or budget is None:
        p.planned(
            "validate_model",
            True,
            f"{device}{'' if budget else ', no time budget'}: the fine-tuned model answers the validation "
            "commits too, so it makes the suggestions where it beats the repository's past there beyond noise",
        )
    else:
        p.planned(
            "validate_model",
            False,
            f"a CPU with a {budget:.0f} s budget: answering the validation commits (messages, and next lines "
            "by the fine-tuned and the base model) takes longer than the fine-tuned model's scoring, from "
            "training, for a model that minutes of CPU training have not made better than retrieval on any "
            "repository measured; messages come from the retrieval system that validates best, next lines "
            "from the fine-tuned model with context (eval.validate_model=true validates both)",
        )


def _cadence(
    p: Decisions,
    total_steps: int,
    valid_tokens: int,
    step_s: float | None,
    eval_blocks: int | None,
    length: int,
    speed: Speed | None,
) -> None:
    """How often to log, evaluate and checkpoint: about LOG_POINTS, EVALUATIONS and CHECKPOINTS per
    run, spaced further where the measured step time says they would cost more than they protect."""
    if p.value(lambda cfg: cfg.monitor.track_per_step_metrics):
        p.because_of(
            "logging_steps",
            1,
            lambda cfg: cfg.monitor.track_per_step_metrics,
            "track_per_step_metrics: record every step",
        )
    elif p.is_auto(lambda cfg: cfg.train.logging_steps):
        every = max(1, total_steps // LOG_POINTS)
        p.planned("logging_steps", every, f"about {LOG_POINTS} loss/LR points over {total_steps} steps")
    else:
        p.from_config("logging_steps", lambda cfg: cfg.train.logging_steps)
    _eval_steps(p, total_steps, valid_tokens, step_s, eval_blocks, length, speed)
    _patience(p, p.decisions["eval_steps"].value, total_steps)
    if not p.is_auto(lambda cfg: cfg.train.save_steps):
        p.from_config("save_steps", lambda cfg: cfg.train.save_steps)
    elif step_s:
        every = max(math.ceil(total_steps / CHECKPOINTS), math.ceil(CHECKPOINT_INTERVAL_S / step_s))
        p.planned(
            "save_steps",
            every,
            f"about {CHECKPOINTS} checkpoints over {total_steps} steps of about {step_s:.0f} s, "
            f"at most one per {CHECKPOINT_INTERVAL_S:.0f} s",
        )
    else:
        every = max(1, math.ceil(total_steps / CHECKPOINTS))
        p.planned("save_steps", every, f"about {CHECKPOINTS} checkpoints over {total_steps} steps")


def _eval_steps(
    p: Decisions,
    total_steps: int,
    valid_tokens: int,
    step_s: float | None,
    eval_blocks: int | None,
    length: int,
    speed: Speed | None,
) -> None:
    """Validations during training: about EVALUATIONS, each costing at most 1/EVAL_COST_RATIO of the time
    between two, none without validation commits."""
    if not valid_tokens:
        p.planned(
            "eval_steps",
            None,
            "no validation commits (a short history, or scrape.valid_commits is 0): the last step is kept",
        )
    elif not p.is_auto(lambda cfg: cfg.train.eval_steps):
        p.from_config("eval_steps", lambda cfg: cfg.train.eval_steps)
    elif step_s and eval_blocks and speed:
        # A validation is a forward pass over the validation blocks of each format (two by default).
        cost_s = min(valid_tokens, 2 * eval_blocks * length) / (FORWARD_SPEEDUP * speed.tokens_per_s)
        fitted = evaluation_interval(
            total_steps,
            max(math.ceil(total_steps / EVALUATIONS), math.ceil(EVAL_COST_RATIO * cost_s / step_s)),
        )
        if fitted is None:
            p.planned(
                "eval_steps",
                None,
                f"a validation costs about {cost_s:.0f} s and a step {step_s:.0f} s: not {EVAL_COST_RATIO}× "
                "its cost in between, so the last step is kept",
            )
        else:
            p.planned(
                "eval_steps",
                fitted,
                f"every {fitted} steps of about {step_s:.0f} s: a validation (about "
                f"{cost_s:.0f} s) costs at most 1/{EVAL_COST_RATIO} of the time between two",
            )
    else:
        every = max(1, math.ceil(total_steps / EVALUATIONS))
        p.planned(
            "eval_steps",
            every,
            f"about {EVALUATIONS} validations over {total_steps} steps: the best is kept",
        )


def _patience(p: Decisions, eval_steps: int | None, total_steps: int) -> None:
    if eval_steps is None:
        p.planned("early_stopping_patience", None, "no validations during training: nothing to stop on")
    elif not p.is_auto(lambda cfg: cfg.train.early_stopping_patience):
        p.from_config("early_stopping_patience", lambda cfg: cfg.train.early_stopping_patience)
    else:
        p.planned(
            "early_stopping_patience",
            PATIENCE,
            f"stop after {PATIENCE} validations in a row without a new best (of about "
            f"{max(1, total_steps // eval_steps)}): the rest of the run would fit the training commits, not "
            "the repository; the best weights are kept either way",
        )


def evaluation_interval(total_steps: int, every: int) -> int | None:
    """The smallest interval of at least `every` steps whose last evaluation inside training is not in
    the final half-interval, where it would repeat the evaluation after training; None when none fits."""
    while every < total_steps and total_steps % every < every / 2:
        every += 1
    return every if every < total_steps else None


def _time_budget(p: Decisions, device: str, speed: Speed | None) -> float | None:
    """The training stage's wall-clock bound in seconds (None: no bound), and the speed it is met at."""
    if p.is_auto(lambda cfg: cfg.train.time_budget):
        if device == "cpu":
            budget = p.planned(
                "time_budget_s",
                CPU_TIME_BUDGET_S,
                f"CPU: a first run is bounded to {CPU_TIME_BUDGET_S / 60:g} minutes "
                "(--budget sets another bound, --budget none trains everything)",
            )
        else:
            budget = p.planned("time_budget_s", None, f"{device}: the whole history, no time bound")
    else:
        configured = p.value(lambda cfg: cfg.train.time_budget)
        budget = p.because_of(
            "time_budget_s",
            budget_seconds(configured),
            lambda cfg: cfg.train.time_budget,
            f"train.time_budget {configured}",
        )
    if budget is None:
        p.planned("measured_tokens_per_s", None, "no time budget: nothing to measure for")
    elif speed is None:
        p.planned(
            "measured_tokens_per_s",
            None,
            "not measured: this machine's speed is measured once the model is loaded (not for a hardware profile)",
        )
    else:
        p.planned("measured_tokens_per_s", round(speed.tokens_per_s, 1), f"measured by {speed.how}")
    return budget


def _train_seconds(p: Decisions, budget: float | None, train_time: TrainTime | None) -> float | None:
    """What training fills of a time budget at the measured speed: BUDGET_TRAIN_SHARE of it (stopping at
    TRAINING_TIME_LIMIT) until the run knows what it spends before and after training, then as much of
    the deadline that leaves (8/9 of it, stopping at the deadline itself)."""
    if budget is None:
        return p.planned("train_seconds", None, "no time budget")
    if train_time is None:
        return p.planned(
            "train_seconds",
            budget * BUDGET_TRAIN_SHARE,
            f"{BUDGET_TRAIN_SHARE:.0%} of the {budget:.0f} s budget, until the run has spent what comes before "
            "training (then the budget less that and what comes after)",
        )
    least, fill = budget * (1 - TRAINING_TIME_LIMIT), BUDGET_TRAIN_SHARE / TRAINING_TIME_LIMIT
    seconds = max(least, train_time.seconds) * fill
    why = (
        f"{fill:.0%} of the {train_time.seconds:.0f} s {train_time.why}"
        if train_time.seconds >= least
        else f"{train_time.why}: {f'only {train_time.seconds:.0f} s' if train_time.seconds >= 1 else 'nothing'}, "
        f"so {fill:.0%} of {least:.0f} s, the least it trains (the run outlasts its budget)"
    )
    return p.planned(
        "train_seconds",
        round(seconds, 1),
        f"{why}; training stops at the deadline, and validates inside it",
    )


def time_left(budget_s: float, spent_s: float, before: Scores, validates: bool = False) -> TrainTime:
    """What a time budget leaves training just before it starts: the budget less what the run spent
    (scraping, tokenizing, loading, measuring) and what comes after training: scoring the fine-tuned
    model, as long as the base model's scoring took (now, or when its scores were cached), its answers to
    the validation commits where it `validates` (VALIDATION_SHARE of that), and AFTER_TRAINING_S. Scoring
    the base model now is left out where its answers were `kept` for the next run (a repository's first
    run): charged to one run's budget, that once-only cost left a first CPU run a step or two."""
    scored = before.scored_in_s if before.cached else before.seconds
    if scored is None:
        scored = budget_s * UNMEASURED_AFTER_SHARE
        how = (
            f"{scored:.0f} s scoring the fine-tuned model ({UNMEASURED_AFTER_SHARE:.0%} of the budget: the base "
            "model's cached scores do not say what scoring took)"
        )
    else:
        when = " when cached" if before.cached else ""
        how = f"{scored:.0f} s scoring the fine-tuned model, what the base model's scoring took{when}"
    validation = scored * VALIDATION_SHARE if validates else 0.0
    if validates:
        how += f"; {validation:.0f} s its answers to the validation commits"
    after = scored + validation + AFTER_TRAINING_S
    once = before.seconds if before.kept else 0.0
    before_training = (
        f"; not the {once:.0f} s scoring the base model took, once for this repository: its answers are cached"
        if once
        else ", scoring the base model"
    )
    return TrainTime(
        budget_s - (spent_s - once) - after,
        f"the {budget_s:.0f} s budget leaves after {spent_s - once:.0f} s spent before training (scraping, "
        f"tokenizing, loading, measuring{before_training}) and {after:.0f} s after it "
        f"({how}; {AFTER_TRAINING_S:.0f} s the past's backtest and saving)",
    )


def first_run_note(plan: Plan, before: Scores) -> str | None:
    """What a run with a time budget says where it scored the base model and kept its answers for the next
    run (a repository's first run): that scoring, left out of the budget, makes this run that much longer;
    None otherwise."""
    if not (plan.time_budget_s and before.kept):
        return None
    return (
        f"scoring the base model took {before.seconds:.0f} s, once for this repository (its answers are cached "
        f"now): left out of the {plan.time_budget_s:.0f} s budget, so this run takes about that much longer"
    )


def deadline_s(train_seconds: float | None) -> float | None:
    """Where training stops whatever its steps: the deadline `train_seconds` (a plan's) were fitted to."""
    return train_seconds * TRAINING_TIME_LIMIT / BUDGET_TRAIN_SHARE if train_seconds else None


def _all_files(p: Decisions, c: Context, why: str) -> None:
    files = sum(c.mix)
    p.planned(
        "train_files", files, f"all {files} files ({why})" if files else "no file (files_share 0, or none)"
    )


def _fit_budget(p: Decisions, c: Context, seconds: float, speed: Speed) -> tuple[int, int]:
    """Blocks and epochs that fit the training seconds at the measured speed: every pass that fits, else
    one pass over the newest sequences and most recently changed files that fit, mixed as `files_share`
    says (the rest are left out, and said so)."""
    data, length, blocks, epochs = c.training, c.sequence_length, c.blocks, c.epochs
    history = c.data.sequences
    affordable = max(1, int(speed.tokens_per_s * seconds) // length)
    at_speed = f"{seconds:.0f} s × {speed.tokens_per_s:.0f} tokens/s"
    if affordable >= blocks * epochs:
        p.planned("train_sequences", history, f"all {history}: {epochs} passes fit {at_speed}")
        _all_files(p, c, f"{epochs} passes fit")
        return blocks, epochs
    if affordable >= blocks:
        passes = p.planned(
            "epochs", affordable // blocks, f"{affordable // blocks} of {epochs} passes fit {at_speed}"
        )
        p.planned("train_sequences", history, f"all {history}: {passes} passes fit {at_speed}")
        _all_files(p, c, f"{passes} passes fit")
        return blocks, passes
    p.planned("epochs", 1, f"not one pass over all {blocks} blocks fits {at_speed}: one over the newest")
    # The longest prefix of the mixed order whose packed blocks fit (packing is monotone in what it is given).
    low, high = 1, len(data.newest_first)
    while low < high:
        middle = (low + high + 1) // 2
        if count_blocks(Counter(data.newest_first[:middle]), length) <= affordable:
            low = middle
        else:
            high = middle - 1
    used = count_blocks(Counter(data.newest_first[:low]), length)
    files, every_file = sum(c.mix[:low]), sum(c.mix)
    kept, tokens = low - files, sum(data.newest_first[:low])
    file_tokens = sum(size for size, is_file in zip(data.newest_first[:low], c.mix, strict=False) if is_file)
    p.planned(
        "train_sequences",
        kept,
        f"the newest {kept} of {history} sequences ({tokens - file_tokens} tokens) fit {at_speed}"
        + (" beside the files" if every_file else "")
        + f"; the {history - kept} older ones ({c.data.tokens - tokens + file_tokens} tokens) are left out",
    )
    if every_file and not files:
        p.planned("train_files", 0, f"none of the {every_file} files fits beside the newest sequences")
    elif every_file:
        p.planned(
            "train_files",
            files,
            f"the {files} most recently changed of {every_file} files ({file_tokens} tokens, "
            f"{file_tokens / max(1, tokens):.0%} of what fits); the {every_file - files} older ones are left out",
        )
    else:
        _all_files(p, c, "")
    p.planned(
        "train_blocks", used, f"{tokens} tokens of the first {low} sequences and files in blocks of {length}"
    )
    return used, 1


def _short_run_batch(p: Decisions, blocks: int, micro: int, accumulation: int, world: int) -> tuple[int, int]:
    """A bounded run takes enough optimizer steps to learn: a smaller effective batch when it would
    take fewer than MIN_BUDGET_STEPS."""
    if (
        p.explicit(lambda cfg: cfg.plan.effective_batch_size)
        or p.explicit(lambda cfg: cfg.plan.batch_size)
        or p.explicit(lambda cfg: cfg.plan.gradient_accumulation_steps)
    ):
        return micro, accumulation
    target = max(world, blocks // MIN_BUDGET_STEPS)
    if micro * accumulation * world <= target:
        return micro, accumulation
    micro = max(1, min(micro, target // world))
    accumulation = max(1, target // (micro * world))
    why = f"a bounded run of {blocks} blocks: effective batch {micro * accumulation * world} gives about "
    why += (
        f"{blocks // (micro * accumulation * world)} optimizer steps (at least {MIN_BUDGET_STEPS} to learn)"
    )
    p.planned("batch_size", micro, why)
    p.planned("gradient_accumulation_steps", accumulation, why)
    return micro, accumulation


def _trackers(p: Decisions) -> None:
    names = p.loaded.config.train.trackers  # each checked when the config was loaded
    if not names:
        p.because_of(
            "report_to",
            [],
            lambda cfg: cfg.train.report_to,
            "no experiment tracker (train.report_to is empty)",
        )
        return
    where = f" (event files in OUTPUT_DIR/{TENSORBOARD_DIR})" if "tensorboard" in names else ""
    p.because_of(
        "report_to",
        names,
        lambda cfg: cfg.train.report_to,
        f"the Trainer logs loss, learning rate and evaluations to {', '.join(names)}{where}; the plan is "
        "attached when training begins, the manifest when it ends",
    )


def _lora_dropout(p: Decisions, device: str) -> None:
    if not p.is_auto(lambda cfg: cfg.lora.dropout):
        p.from_config("lora_dropout", lambda cfg: cfg.lora.dropout)
    elif device == "cpu":
        p.planned(
            "lora_dropout",
            0.0,
            "CPU: dropout copies every adapted layer's input each step (measured: a quarter of a "
            "smollm2-135m step); a short CPU run sees each commit once or twice and does not overfit",
        )
    else:
        p.planned("lora_dropout", LORA_DROPOUT, f"{device}: the usual LoRA dropout, nearly free here")


def _evaluation_bound(p: Decisions, device: str) -> int | None:
    """Held-out blocks per format scored for loss: all on a GPU; on a CPU a fixed few (not fitted to the
    measured speed, which varies: the same held-out blocks make runs comparable). And the generation
    tasks' bound: commits and new tokens."""
    config = p.loaded.config.eval
    p.from_config(
        "eval_samples",
        lambda cfg: cfg.eval.samples,
        f"the {config.samples} newest held-out commits (or all, where fewer are held out: the scoreboard says "
        "how many), asked before and after training: a commit message of "
        f"at most {config.message_tokens} new tokens and the next line at lines they added, greedy, answered "
        "in batches, each answer leaving its batch when it ends (suggest/decoding.py)",
    )
    if not p.is_auto(lambda cfg: cfg.eval.code_cases):
        p.from_config("code_cases", lambda cfg: cfg.eval.code_cases)
    elif device == "cpu":
        p.planned(
            "code_cases",
            CPU_CODE_CASES,
            f"{CPU_CODE_CASES} next lines: on a CPU each is two prompts of a few hundred tokens for each model, "
            f"and more would take the budget's training time (eval.code_cases={CODE_CASES} decides finer)",
        )
    else:
        p.planned("code_cases", CODE_CASES, f"{device}: {CODE_CASES} next lines, a few of each asked commit")
    if not p.is_auto(lambda cfg: cfg.eval.block_cases):
        p.from_config("block_cases", lambda cfg: cfg.eval.block_cases)
    elif device == "cpu" and p.decisions["time_budget_s"].value:
        p.planned(
            "block_cases",
            0,
            "a CPU with a time budget: bodies cost each model a quarter of its scoring, which the budget's "
            f"training needs more, and {CPU_BLOCK_CASES} give intervals about 20 points wide (eval.block_cases=N "
            f"scores them; without a budget a CPU scores {CPU_BLOCK_CASES})",
        )
    else:
        cases = CPU_BLOCK_CASES if device == "cpu" else BLOCK_CASES
        p.planned(
            "block_cases",
            cases,
            f"{device}: {cases} bodies under a line that opens one, two of each asked commit at most (each up "
            f"to 96 new tokens of each model{', a line’s time several times over' if device == 'cpu' else ''})",
        )
    _validate_model(p, device)
    if not p.is_auto(lambda cfg: cfg.eval.max_blocks):
        return p.from_config("eval_blocks", lambda cfg: cfg.eval.max_blocks)
    if device != "cpu":
        return p.planned(
            "eval_blocks", None, f"{device}: every held-out block (an evaluation costs little here)"
        )
    return p.planned(
        "eval_blocks",
        CPU_EVAL_BLOCKS,
        f"held-out loss on at most {CPU_EVAL_BLOCKS} blocks per format: on a CPU each costs seconds; the same "
        "blocks in every run on this data, so runs compare",
    )


def _warmup(total_steps: int, loaded: LoadedConfig) -> tuple[int, str]:
    plan = loaded.config.plan
    if loaded.continues and not loaded.explicit("plan.warmup_ratio"):
        steps = min(max(1, math.ceil(CONTINUED_WARMUP_RATIO * total_steps)), max(0, total_steps - 1))
        return steps, (
            f"continued training: the adapter is trained already, so a short warmup ({CONTINUED_WARMUP_RATIO:g} × "
            f"{total_steps} steps, at least 1) only settles the optimizer's fresh moments"
        )
    # round() first: 0.1 × 70 is 7.000000000000001 in floating point, which ceil() makes 8.
    by_ratio = math.ceil(round(plan.warmup_ratio * total_steps, 9))
    steps, reason = by_ratio, f"{plan.warmup_ratio:g} × {total_steps} total steps, rounded up"
    if by_ratio < plan.warmup_steps_min:
        if plan.override_min_warmup:
            reason += f" (below warmup_steps_min {plan.warmup_steps_min}: allowed by override_min_warmup)"
        else:
            steps, reason = plan.warmup_steps_min, f"raised to warmup_steps_min {plan.warmup_steps_min}"
    if steps > plan.warmup_steps_max:
        steps, reason = plan.warmup_steps_max, f"capped at warmup_steps_max {plan.warmup_steps_max}"
    # Warmup must end before training does, or the peak learning rate is never reached.
    if steps >= total_steps:
        steps, reason = max(0, total_steps - 1), f"{reason}; cut to total_steps - 1 so the run leaves warmup"
    return steps, reason


def _batch_tier(device: str, gpu, loaded: LoadedConfig) -> tuple[int, str]:
    plan = loaded.config.plan
    if device != "cuda":
        return plan.batch_size_cpu, f"{device} tier"
    memory = gpu.memory_gb
    if memory >= plan.gpu_memory_threshold_large_gb:
        return (
            plan.batch_size_large_gpu,
            f"large GPU tier ({memory:g} GB ≥ {plan.gpu_memory_threshold_large_gb:g} GB)",
        )
    if memory >= plan.gpu_memory_threshold_medium_gb:
        return (
            plan.batch_size_medium_gpu,
            f"medium GPU tier ({memory:g} GB ≥ {plan.gpu_memory_threshold_medium_gb:g} GB)",
        )
    return (
        plan.batch_size_small_gpu,
        f"small GPU tier ({memory:g} GB < {plan.gpu_memory_threshold_medium_gb:g} GB)",
    )


def _no_gpu_reason(hardware: Hardware) -> str:
    if hardware.gpus and not hardware.cuda_usable:
        return "GPUs present but this torch build cannot use CUDA"
    return "no CUDA GPU or Apple MPS found"


def _cc(gpu) -> str:
    capability = gpu.compute_capability
    return f"{capability[0]}.{capability[1]}" if capability else "unknown"


def format_plan(plan: Plan) -> str:
    rows = [("parameter", "value", "source", "reason")]
    rows += [(name, _show(d.value), d.source, d.reason) for name, d in plan.decisions.items()]
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    return "\n".join(
        f"  {row[0]:<{widths[0]}}  {row[1]:<{widths[1]}}  {row[2]:<{widths[2]}}  {row[3]}" for row in rows
    )


def _show(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, list):
        return ",".join(map(str, value)) or "-"
    return str(value)

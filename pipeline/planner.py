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
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pipeline.config import LoadedConfig
from pipeline.hardware import GB, Hardware
from pipeline.packing import count_blocks

TINY_LEARNING_RATE = 5e-3  # measured: the random tiny model's loss falls ~2.5 nats in 80 steps at this rate
PRETRAINED_LEARNING_RATE = 2e-4  # the usual LoRA rate for pretrained code models (QLoRA paper, peft examples)
TINY_TRAINED_BASE_MODULES = ["embed_tokens", "norm"]  # a random base's output scale must be learnable
SMALL_DATASET_BLOCKS = (
    2048  # below this the blocks sit in memory and worker start-up costs more than it saves
)
LOG_POINTS = 50  # aim for this many loss/LR records per run
CHECKPOINTS = 10  # aim for this many checkpoints per run
EVALUATIONS = 10  # aim for this many held-out evaluations per run
# Activation memory per token per layer is about 34 × hidden bytes in 16-bit training (Korthikanti et al.,
# "Reducing Activation Recomputation in Large Transformer Models", with memory-efficient attention).
ACTIVATION_BYTES_PER_HIDDEN = 34
LOGIT_BYTES = 6  # per vocabulary entry per token: 16-bit logits plus the fp32 copy the loss makes
MEMORY_SAFETY = 0.9  # use at most this share of GPU memory by the estimate (allocator fragmentation, kernels)


@dataclass(frozen=True)
class Decision:
    value: Any
    source: str
    """`planned` (derived here), `config` (a config value) or `cli` (a --set or flag)."""
    reason: str


@dataclass(frozen=True)
class DataStats:
    """What the planner needs to know about the tokenized training data."""

    length_counts: Mapping[int, int]
    """Histogram of tokens per training sequence (EOS included) → how many sequences."""

    @classmethod
    def from_lengths(cls, lengths) -> DataStats:
        return cls(Counter(lengths))

    @property
    def sequences(self) -> int:
        return sum(self.length_counts.values())

    @property
    def tokens(self) -> int:
        return sum(length * count for length, count in self.length_counts.items())

    def percentile(self, pct: float) -> int:
        """Nearest-rank percentile of the sequence lengths (an actual length from the data)."""
        rank = max(1, math.ceil(pct / 100 * self.sequences))
        seen = 0
        for length in sorted(self.length_counts):
            seen += self.length_counts[length]
            if seen >= rank:
                return length
        return 0


@dataclass(frozen=True)
class ModelFacts:
    name: str
    random_init: bool
    """The tiny model: randomly initialised, so it needs a higher learning rate."""
    max_positions: int | None
    """Longest context the model supports (tokens), if it says."""
    parameters: int = 0
    hidden_size: int = 0
    num_layers: int = 0
    vocab_size: int = 0
    supports_sdpa: bool = True
    supports_flash_attention: bool = False
    """The model class has a flash-attention path and the flash_attn package is installed."""


@dataclass(frozen=True)
class Launch:
    """How many processes train together, which one this is, and how we know."""

    world_size: int = 1
    reason: str = "one process"
    rank: int = 0
    local_rank: int = 0
    local_world_size: int = 1
    launcher: str | None = None
    """`torchrun` or `accelerate`; None for a plain process (or a plan for a described machine)."""

    @property
    def nodes(self) -> int:
        return max(1, self.world_size // max(1, self.local_world_size))

    @property
    def writes(self) -> bool:
        """Only rank 0 writes the manifest, the sequences, the cache and the adapter."""
        return self.rank == 0


@dataclass(frozen=True)
class ProbeRow:
    batch_size: int
    peak_memory_gb: float | None
    step_time_s: float | None
    fits: bool


@dataclass(frozen=True)
class Plan:
    decisions: dict[str, Decision]
    probe: tuple[ProbeRow, ...] = field(default=())

    def __getitem__(self, name: str) -> Any:
        return self.decisions[name].value

    def to_manifest(self) -> dict[str, Any]:
        """Flat values (the paths users' jq scripts read) plus every decision with its reason."""
        flat = {name: decision.value for name, decision in self.decisions.items()}
        flat["decisions"] = {
            name: {"value": d.value, "source": d.source, "reason": d.reason}
            for name, d in self.decisions.items()
        }
        flat["batch_probe"] = [vars(row) for row in self.probe]
        return flat


class _Planner:
    def __init__(self, loaded: LoadedConfig):
        self.loaded = loaded
        self.decisions: dict[str, Decision] = {}

    def planned(self, name: str, value: Any, reason: str) -> Any:
        self.decisions[name] = Decision(value, "planned", reason)
        return value

    def from_config(self, name: str, key: str, reason: str | None = None) -> Any:
        """Record a value taken as configured; `key` is its `section.field`."""
        value = self.value(key)
        source = self.loaded.source_of(key)
        where = f"--set {key}" if source == "cli" else f"{self.loaded.label()}: {key}"
        self.decisions[name] = Decision(value, source, reason or f"set by {where}")
        return value

    def because_of(self, name: str, value: Any, key: str, reason: str) -> Any:
        """Record a value that a config switch (`key`) implies rather than states."""
        self.decisions[name] = Decision(value, self.loaded.source_of(key), reason)
        return value

    def value(self, key: str) -> Any:
        section, field_name = key.split(".")
        return getattr(getattr(self.loaded.config, section), field_name)

    def is_auto(self, key: str) -> bool:
        return self.value(key) == "auto"

    def explicit(self, key: str) -> bool:
        return self.loaded.explicit(key) and not self.is_auto(key)


def make_plan(
    data: DataStats,
    hardware: Hardware,
    model: ModelFacts,
    loaded: LoadedConfig,
    launch: Launch = Launch(),
    probe: tuple[ProbeRow, ...] = (),
    oom_cap: int | None = None,
    has_eval: bool = False,
) -> Plan:
    """`probe`: measured micro-batch fits (CUDA); `oom_cap`: the largest micro-batch after a CUDA
    out-of-memory in training; `has_eval`: there are held-out commits to evaluate on."""
    config = loaded.config
    p = _Planner(loaded)

    gpu = min(hardware.gpus, key=lambda g: g.memory_gb) if hardware.gpus else None
    if hardware.cuda_usable and gpu:
        count = len(hardware.gpus)
        device = p.planned(
            "device", "cuda", f"{count} CUDA GPU(s), smallest: {gpu.name} with {gpu.memory_gb:g} GB"
        )
    elif hardware.mps:
        device = p.planned("device", "mps", "Apple GPU (MPS) found, no CUDA")
    else:
        device = p.planned("device", "cpu", _no_gpu_reason(hardware))
    world = p.planned("world_size", launch.world_size, launch.reason)

    precision = _precision(p, device, gpu)
    _tf32(p, device, gpu)
    _attention(p, device, gpu, model, precision)

    max_length = min(
        config.train.max_sequence_length, model.max_positions or config.train.max_sequence_length
    )
    if p.is_auto("train.sequence_length"):
        p95 = data.percentile(95)
        length = min(max_length, max(64, math.ceil(p95 / 64) * 64))
        how = (
            f"capped at {max_length} (max_sequence_length or the model's limit)"
            if length == max_length and p95 > max_length
            else "rounded up to a multiple of 64"
        )
        sequence_length = p.planned(
            "sequence_length",
            length,
            f"p95 of {data.sequences} sequence lengths is {p95} tokens, {how}",
        )
    else:
        sequence_length = p.from_config("sequence_length", "train.sequence_length")

    blocks = count_blocks(data.length_counts, sequence_length)
    p.planned(
        "train_blocks",
        blocks,
        f"{data.tokens} tokens in {data.sequences} sequences packed into blocks of {sequence_length} "
        f"({data.tokens / max(1, blocks * sequence_length):.0%} filled)",
    )

    micro, accumulation = _batching(p, device, gpu, model, precision, sequence_length, world, probe, oom_cap)
    p.planned(
        "effective_batch_size",
        micro * accumulation * world,
        f"{micro} per device × {accumulation} accumulation × {world} process(es)",
    )
    epochs = p.from_config("epochs", "train.epochs")

    drop_last = p.from_config("drop_last", "plan.drop_last")
    per_step = micro * world
    if drop_last and blocks < per_step:
        drop_last = p.planned(
            "drop_last", False, f"only {blocks} blocks: dropping the last micro-batch would drop all"
        )
    # Each process sees ceil(blocks / (micro × processes)) micro-batches (accelerate pads the last round so
    # all processes step together), or the floor with drop_last; the Trainer then takes
    # ceil(micro-batches / accumulation) optimizer steps per epoch.
    batches = blocks // per_step if drop_last else math.ceil(blocks / per_step)
    steps_per_epoch = math.ceil(batches / accumulation)
    p.planned(
        "steps_per_epoch",
        steps_per_epoch,
        f"{blocks} blocks / ({micro} × {world}) = {batches} micro-batches per process, / {accumulation} accumulation",
    )
    total_steps = p.planned(
        "total_steps", steps_per_epoch * epochs, f"{steps_per_epoch} steps × {epochs} epochs"
    )
    p.planned("warmup_steps", *_warmup(total_steps, loaded))

    if p.is_auto("train.learning_rate"):
        if model.random_init:
            p.planned("learning_rate", TINY_LEARNING_RATE, "randomly initialised tiny model: a large step")
        else:
            p.planned(
                "learning_rate", PRETRAINED_LEARNING_RATE, "usual LoRA learning rate for a pretrained model"
            )
    else:
        p.from_config("learning_rate", "train.learning_rate")
    p.from_config("lr_scheduler", "train.lr_scheduler")
    p.planned(
        "optimizer",
        "adamw_torch_fused",
        "AdamW with PyTorch's fused kernel: one launch per step for all parameters",
    )
    if model.random_init:
        p.planned(
            "base_modules_trained",
            TINY_TRAINED_BASE_MODULES,
            "random base: LoRA alone cannot rescale frozen random embeddings, so they and the norms train too",
        )
    else:
        p.planned("base_modules_trained", [], "pretrained base: only the LoRA adapters train")

    _dataloader(p, device, blocks, hardware)
    _cadence(p, total_steps, has_eval)
    p.from_config("torch_compile", "train.torch_compile")
    p.from_config("seed", "train.seed")
    return Plan(dict(p.decisions), probe)


def _precision(p: _Planner, device: str, gpu) -> str:
    if not p.is_auto("plan.precision"):
        return p.from_config("precision", "plan.precision")
    if device == "cuda" and gpu.bf16:
        return p.planned("precision", "bf16", f"compute capability {_cc(gpu)} supports bfloat16")
    if device == "cuda":
        return p.planned(
            "precision", "fp16", f"compute capability {_cc(gpu)} has no bfloat16: fp16 with loss scaling"
        )
    return p.planned("precision", "fp32", f"{device}: mixed precision would not speed training up here")


def _tf32(p: _Planner, device: str, gpu) -> None:
    if not p.is_auto("plan.tf32"):
        p.from_config("tf32", "plan.tf32")
    elif device == "cuda" and gpu.compute_capability and gpu.compute_capability >= (8, 0):
        p.planned("tf32", True, f"compute capability {_cc(gpu)}: TF32 tensor cores for the fp32 matmuls")
    else:
        p.planned("tf32", False, "TF32 needs a CUDA GPU of compute capability 8.0 or newer")


def _attention(p: _Planner, device: str, gpu, model: ModelFacts, precision: str) -> None:
    if not p.is_auto("plan.attention"):
        p.from_config("attention", "plan.attention")
    elif (
        device == "cuda"
        and model.supports_flash_attention
        and gpu.compute_capability
        and gpu.compute_capability >= (8, 0)
        and precision in ("bf16", "fp16")
    ):
        p.planned("attention", "flash_attention_2", "flash-attn is installed and supports this GPU and model")
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


def _batching(p, device, gpu, model, precision, sequence_length, world, probe, oom_cap) -> tuple[int, int]:
    """Micro-batch and accumulation for a fixed effective-batch target; records both."""
    plan = p.loaded.config.plan
    tier, tier_reason = _batch_tier(device, gpu, p.loaded)
    explicit_micro = p.explicit("plan.batch_size")
    explicit_accumulation = p.explicit("plan.gradient_accumulation_steps")

    if p.explicit("plan.effective_batch_size"):
        target = p.value("plan.effective_batch_size")
        target_reason = f"effective_batch_size {target} as configured"
    elif explicit_micro and explicit_accumulation:
        target = p.value("plan.batch_size") * p.value("plan.gradient_accumulation_steps") * world
        target_reason = "batch_size × gradient_accumulation_steps as configured"
    else:
        accumulation_default = (
            1
            if p.is_auto("plan.gradient_accumulation_steps")
            else p.value("plan.gradient_accumulation_steps")
        )
        target = tier * accumulation_default * world
        target_reason = f"tier batch {tier} × accumulation {accumulation_default} × {world} process(es)"

    if explicit_micro:
        micro = p.from_config("batch_size", "plan.batch_size")
        _fit_memory(p, device, gpu, model, precision, sequence_length, micro, shrink=False)
    else:
        fitting = [row.batch_size for row in probe if row.fits]
        if fitting:
            micro_limit = max(fitting)
            limit_reason = (
                f"largest micro-batch the probe fitted with {plan.probe_headroom:.0%} memory headroom"
            )
        else:
            micro_limit = max(1, tier * plan.batch_reference_tokens // sequence_length)
            limit_reason = f"{tier_reason}: batch {tier}"
            if sequence_length != plan.batch_reference_tokens:
                limit_reason += (
                    f", × {plan.batch_reference_tokens}/{sequence_length} for {sequence_length}-token blocks"
                )
        micro_limit, memory_reason = _fit_memory(
            p, device, gpu, model, precision, sequence_length, micro_limit
        )
        if explicit_accumulation:
            micro = p.planned("batch_size", micro_limit, f"{limit_reason}{memory_reason}")
        else:
            # The fewest micro-batches that reach the target, each no larger than memory allows.
            accumulation = math.ceil(target / (world * micro_limit))
            micro = p.planned(
                "batch_size",
                math.ceil(target / (world * accumulation)),
                f"{limit_reason}{memory_reason}; target effective batch {target} = {target_reason}",
            )
    if explicit_accumulation:
        accumulation = p.value("plan.gradient_accumulation_steps")
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
    elif explicit_accumulation or accumulation == p.value("plan.gradient_accumulation_steps"):
        p.from_config("gradient_accumulation_steps", "plan.gradient_accumulation_steps")
    else:
        p.planned(
            "gradient_accumulation_steps",
            accumulation,
            f"reaches the target effective batch {target} with micro-batch {micro} × {world} process(es)",
        )
    return micro, accumulation


def _fit_memory(
    p, device, gpu, model, precision, sequence_length, micro, shrink: bool = True
) -> tuple[int, str]:
    """Turn on gradient checkpointing, and halve the micro-batch, until the memory estimate fits;
    with `shrink` off (the user fixed the micro-batch) only checkpointing is decided."""
    if not p.is_auto("plan.gradient_checkpointing"):
        checkpointing = p.from_config("gradient_checkpointing", "plan.gradient_checkpointing")
        wanted = micro
        if shrink and device == "cuda" and model.parameters:
            while micro > 1 and not _fits(gpu, model, precision, sequence_length, micro, checkpointing):
                micro //= 2
        return micro, _halved(wanted, micro, gpu)
    if device != "cuda" or not model.parameters:
        p.planned(
            "gradient_checkpointing", False, f"{device}: activations live in RAM, which is not the limit here"
        )
        return micro, ""
    if _fits(gpu, model, precision, sequence_length, micro, checkpointing=False):
        p.planned(
            "gradient_checkpointing",
            False,
            f"micro-batch {micro} is estimated to fit {gpu.memory_gb:g} GB without it",
        )
        return micro, ""
    if not shrink or _fits(gpu, model, precision, sequence_length, micro, checkpointing=True):
        p.planned(
            "gradient_checkpointing",
            True,
            f"micro-batch {micro} fits {gpu.memory_gb:g} GB only by recomputing activations",
        )
        return micro, ""
    wanted = micro
    while micro > 1 and not _fits(gpu, model, precision, sequence_length, micro, checkpointing=True):
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


def estimated_memory_gb(
    model: ModelFacts, precision: str, sequence_length: int, micro: int, checkpointing: bool
) -> float:
    """Rough training memory on one GPU: weights, activations and logits (LoRA states are negligible)."""
    weight_bytes = 4 if precision in ("fp32", "fp16") else 2  # fp16 trains on fp32 master weights
    activation_scale = 2 if precision == "fp32" else 1
    tokens = micro * sequence_length
    per_layer = ACTIVATION_BYTES_PER_HIDDEN * model.hidden_size * activation_scale
    # Checkpointing keeps each layer's input plus one layer's full activations at a time.
    layers = (
        (model.num_layers * 2 * activation_scale / ACTIVATION_BYTES_PER_HIDDEN + 1)
        if checkpointing
        else model.num_layers
    )
    activations = tokens * per_layer * layers
    logits = tokens * model.vocab_size * LOGIT_BYTES
    return (model.parameters * weight_bytes + activations + logits) / GB


def _fits(gpu, model, precision, sequence_length, micro, checkpointing) -> bool:
    needed = estimated_memory_gb(model, precision, sequence_length, micro, checkpointing)
    return needed <= gpu.memory_gb * MEMORY_SAFETY


def _dataloader(p: _Planner, device: str, blocks: int, hardware: Hardware) -> None:
    if p.is_auto("plan.num_workers"):
        workers = p.planned("num_workers", *_workers(blocks, hardware))
    else:
        workers = p.from_config("num_workers", "plan.num_workers")
        if workers >= hardware.usable_cores:
            cap = max(0, hardware.usable_cores - 1)
            workers = p.planned(
                "num_workers",
                cap,
                f"configured {workers}; the training loop needs one of the {hardware.usable_cores} usable cores",
            )
    if p.value("plan.pin_memory") and device != "cuda":
        p.planned("pin_memory", False, f"pin_memory only speeds up host-to-GPU copies; device is {device}")
    else:
        p.from_config("pin_memory", "plan.pin_memory")
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


def _cadence(p: _Planner, total_steps: int, has_eval: bool) -> None:
    if p.value("monitor.track_per_step_metrics"):
        p.because_of(
            "logging_steps", 1, "monitor.track_per_step_metrics", "track_per_step_metrics: record every step"
        )
    elif p.is_auto("train.logging_steps"):
        every = max(1, total_steps // LOG_POINTS)
        p.planned("logging_steps", every, f"about {LOG_POINTS} loss/LR points over {total_steps} steps")
    else:
        p.from_config("logging_steps", "train.logging_steps")
    if not has_eval:
        p.planned(
            "eval_steps", None, "no held-out commits to evaluate (fewer than 20 kept, or eval_fraction 0)"
        )
    elif p.is_auto("train.eval_steps"):
        every = max(1, math.ceil(total_steps / EVALUATIONS))
        p.planned(
            "eval_steps",
            every,
            f"about {EVALUATIONS} evaluations of the held-out commits over {total_steps} steps",
        )
    else:
        p.from_config("eval_steps", "train.eval_steps")
    if p.is_auto("train.save_steps"):
        every = max(1, math.ceil(total_steps / CHECKPOINTS))
        p.planned("save_steps", every, f"about {CHECKPOINTS} checkpoints over {total_steps} steps")
    else:
        p.from_config("save_steps", "train.save_steps")


def _warmup(total_steps: int, loaded: LoadedConfig) -> tuple[int, str]:
    plan = loaded.config.plan
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

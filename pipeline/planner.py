"""Decide every training parameter from the data, the hardware and the config.

`make_plan` is a pure function: the same inputs give the same plan. Every
decision carries its value, its source (`planned`, `config` or `cli`) and a
one-line reason, which are printed for the user and written to the manifest.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pipeline.config import LoadedConfig
from pipeline.hardware import Hardware
from pipeline.packing import count_blocks

TINY_LEARNING_RATE = 5e-3  # measured: the random tiny model's loss falls ~2.5 nats in 80 steps at this rate
TINY_TRAINED_BASE_MODULES = ["embed_tokens", "norm"]  # a random base's output scale must be learnable
PRETRAINED_LEARNING_RATE = 2e-4  # the usual LoRA rate for pretrained code models (QLoRA paper, peft examples)
SMALL_DATASET_BLOCKS = (
    2048  # below this the blocks sit in memory and worker start-up costs more than it saves
)
LOG_POINTS = 50  # aim for this many loss/LR records per run
CHECKPOINTS = 10  # aim for this many checkpoints per run


@dataclass(frozen=True)
class Decision:
    value: Any
    source: str
    """`planned` (derived here), `config` (a config value) or `cli` (a --set or flag)."""
    reason: str


@dataclass(frozen=True)
class DataStats:
    """What the planner needs to know about the tokenized training data."""

    token_lengths: tuple[int, ...]
    """Tokens per training sequence, EOS included."""

    @property
    def sequences(self) -> int:
        return len(self.token_lengths)


@dataclass(frozen=True)
class ModelFacts:
    name: str
    random_init: bool
    """The tiny model: randomly initialised, so it needs a higher learning rate."""
    max_positions: int | None
    """Longest context the model supports (tokens), if it says."""


@dataclass(frozen=True)
class Plan:
    decisions: dict[str, Decision]

    def __getitem__(self, name: str) -> Any:
        return self.decisions[name].value

    def to_manifest(self) -> dict[str, Any]:
        """Flat values (the paths users' jq scripts read) plus every decision with its reason."""
        flat = {name: decision.value for name, decision in self.decisions.items()}
        flat["decisions"] = {
            name: {"value": d.value, "source": d.source, "reason": d.reason}
            for name, d in self.decisions.items()
        }
        return flat


class _Planner:
    def __init__(self, loaded: LoadedConfig):
        self.loaded = loaded
        self.decisions: dict[str, Decision] = {}

    def planned(self, name: str, value: Any, reason: str) -> Any:
        self.decisions[name] = Decision(value, "planned", reason)
        return value

    def because_of(self, name: str, value: Any, key: str, reason: str) -> Any:
        """Record a value that a config switch (`key`) implies rather than states."""
        self.decisions[name] = Decision(value, self.loaded.source_of(key), reason)
        return value

    def from_config(self, name: str, key: str, reason: str | None = None) -> Any:
        """Record a value taken as configured; `key` is its `section.field`."""
        section, field_name = key.split(".")
        value = getattr(getattr(self.loaded.config, section), field_name)
        source = self.loaded.source_of(key)
        where = f"--set {key}" if source == "cli" else f"{self.loaded.label()}: {key}"
        self.decisions[name] = Decision(value, source, reason or f"set by {where}")
        return value

    def is_auto(self, key: str) -> bool:
        section, field_name = key.split(".")
        return getattr(getattr(self.loaded.config, section), field_name) == "auto"


def make_plan(data: DataStats, hardware: Hardware, model: ModelFacts, loaded: LoadedConfig) -> Plan:
    config = loaded.config
    p = _Planner(loaded)

    if hardware.cuda_usable and hardware.gpus:
        gpu = hardware.gpus[0]
        device = p.planned("device", "cuda", f"CUDA GPU found: {gpu.name}, {gpu.memory_gb:g} GB")
    elif hardware.mps:
        device = p.planned("device", "mps", "Apple GPU (MPS) found, no CUDA")
    else:
        device = p.planned("device", "cpu", _no_gpu_reason(hardware))

    if device == "cuda" and hardware.gpus[0].bf16:
        p.planned("precision", "bf16", f"compute capability {_cc(hardware)} supports bfloat16")
    elif device == "cuda":
        p.planned(
            "precision", "fp16", f"compute capability {_cc(hardware)} has no bfloat16; fp16 with loss scaling"
        )
    else:
        p.planned("precision", "fp32", f"{device}: mixed precision would not speed training up here")

    max_length = min(
        config.train.max_sequence_length, model.max_positions or config.train.max_sequence_length
    )
    if p.is_auto("train.sequence_length"):
        p95 = _percentile(data.token_lengths, 95)
        length = min(max_length, max(64, math.ceil(p95 / 64) * 64))
        capped = " (capped by max_sequence_length or the model)" if length == max_length else ""
        sequence_length = p.planned(
            "sequence_length",
            length,
            f"p95 of {data.sequences} sequence lengths is {p95} tokens, rounded up to 64{capped}",
        )
    else:
        sequence_length = p.from_config("sequence_length", "train.sequence_length")

    blocks = count_blocks(data.token_lengths, sequence_length)
    total_tokens = sum(data.token_lengths)
    p.planned(
        "train_blocks",
        blocks,
        f"{total_tokens} tokens in {data.sequences} sequences packed into blocks of {sequence_length} "
        f"({total_tokens / max(1, blocks * sequence_length):.0%} filled)",
    )

    if p.is_auto("plan.batch_size"):
        batch_size = p.planned("batch_size", *_batch_tier(device, hardware, loaded))
    else:
        batch_size = p.from_config("batch_size", "plan.batch_size")
    accumulation = p.from_config("gradient_accumulation_steps", "plan.gradient_accumulation_steps")
    world_size = p.planned("world_size", 1, "one process")
    p.planned(
        "effective_batch_size",
        batch_size * accumulation * world_size,
        f"{batch_size} per device × {accumulation} accumulation × {world_size} process(es)",
    )
    epochs = p.from_config("epochs", "train.epochs")

    # The Hugging Face Trainer takes ceil(batches / accumulation) optimizer steps per epoch
    # (the last step of an epoch may accumulate fewer micro-batches).
    batches_per_epoch = math.ceil(blocks / (batch_size * world_size))
    steps_per_epoch = math.ceil(batches_per_epoch / accumulation)
    p.planned(
        "steps_per_epoch",
        steps_per_epoch,
        f"{blocks} blocks / ({batch_size} × {world_size}) = {batches_per_epoch} micro-batches, / {accumulation} accumulation",
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
    if model.random_init:
        p.planned(
            "base_modules_trained",
            TINY_TRAINED_BASE_MODULES,
            "random base: LoRA alone cannot rescale frozen random embeddings, so they and the norms train too",
        )
    else:
        p.planned("base_modules_trained", [], "pretrained base: only the LoRA adapters train")

    if p.is_auto("plan.num_workers"):
        p.planned("num_workers", *_workers(blocks, hardware))
    else:
        workers = p.from_config("num_workers", "plan.num_workers")
        if workers > hardware.usable_cores:
            p.planned(
                "num_workers",
                hardware.usable_cores,
                f"configured {workers}, capped at the {hardware.usable_cores} usable cores",
            )
    if config.plan.pin_memory and device != "cuda":
        p.planned("pin_memory", False, f"pin_memory only helps host-to-GPU copies; device is {device}")
    else:
        p.from_config("pin_memory", "plan.pin_memory")

    if config.monitor.track_per_step_metrics:
        p.because_of(
            "logging_steps", 1, "monitor.track_per_step_metrics", "track_per_step_metrics: record every step"
        )
    elif p.is_auto("train.logging_steps"):
        every = max(1, total_steps // LOG_POINTS)
        p.planned("logging_steps", every, f"about {LOG_POINTS} loss/LR points over {total_steps} steps")
    else:
        p.from_config("logging_steps", "train.logging_steps")
    if p.is_auto("train.save_steps"):
        every = max(1, math.ceil(total_steps / CHECKPOINTS))
        p.planned("save_steps", every, f"about {CHECKPOINTS} checkpoints over {total_steps} steps")
    else:
        p.from_config("save_steps", "train.save_steps")
    p.from_config("seed", "train.seed")
    return Plan(dict(p.decisions))


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


def _batch_tier(device: str, hardware: Hardware, loaded: LoadedConfig) -> tuple[int, str]:
    plan = loaded.config.plan
    if device != "cuda":
        return plan.batch_size_cpu, f"{device} tier: batch_size_cpu"
    gpu = min(hardware.gpus, key=lambda g: g.memory_gb)
    memory = gpu.memory_gb
    if memory >= plan.gpu_memory_threshold_large_gb:
        return (
            plan.batch_size_large_gpu,
            f"{gpu.name} has {memory:g} GB ≥ {plan.gpu_memory_threshold_large_gb:g} GB: large tier",
        )
    if memory >= plan.gpu_memory_threshold_medium_gb:
        return (
            plan.batch_size_medium_gpu,
            f"{gpu.name} has {memory:g} GB ≥ {plan.gpu_memory_threshold_medium_gb:g} GB: medium tier",
        )
    return (
        plan.batch_size_small_gpu,
        f"{gpu.name} has {memory:g} GB < {plan.gpu_memory_threshold_medium_gb:g} GB: small tier",
    )


def _workers(blocks: int, hardware: Hardware) -> tuple[int, str]:
    if blocks < SMALL_DATASET_BLOCKS:
        return 0, f"{blocks} blocks sit in memory; worker start-up would cost more than it saves"
    physical = hardware.cpu_physical_cores or hardware.usable_cores
    # Leave a core for the training loop itself.
    workers = max(0, min(physical // 2, hardware.usable_cores - 1))
    return workers, f"{physical} physical cores // 2, at most {hardware.usable_cores} usable cores - 1"


def _no_gpu_reason(hardware: Hardware) -> str:
    if hardware.gpus and not hardware.cuda_usable:
        return "GPUs present but this torch build cannot use CUDA"
    return "no CUDA GPU or Apple MPS found"


def _cc(hardware: Hardware) -> str:
    capability = hardware.gpus[0].compute_capability
    return f"{capability[0]}.{capability[1]}" if capability else "unknown"


def _percentile(values: Sequence[int], pct: float) -> int:
    """Nearest-rank percentile (an actual value from the data)."""
    if not values:
        return 0
    ordered = sorted(values)
    rank = max(1, math.ceil(pct / 100 * len(ordered)))
    return ordered[rank - 1]

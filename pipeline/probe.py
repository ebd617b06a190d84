"""Measure this machine instead of guessing: the largest micro-batch that fits, the training speed.

- Batch probe (CUDA): a few real forward/backward steps at increasing
  micro-batch sizes, stopping at the first out-of-memory or the first size
  whose peak memory leaves less than the configured headroom.
  `probe_batch_sizes` takes the step as a function, so tests simulate
  out-of-memory on the CPU; `cuda_step` is the real one.
- Training speed (for a time budget): what a finished run measured on this
  machine for the same model and plan (kept in `~/.cache/repotune/speeds.json`),
  or else a real forward and backward on a training block.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import orjson

from pipeline.builtin import cache_home
from pipeline.dataset import ARRAYS
from pipeline.hardware import GB
from pipeline.manifest import utc_now, write_manifest
from pipeline.model import autocast
from pipeline.planner import ProbeRow, Speed
from pipeline.token_cache import provenance_hash


class ProbeOutOfMemory(Exception):
    """A probe step ran out of device memory."""


def candidate_sizes(largest: int) -> list[int]:
    """1, 2, 4, ... up to `largest` (which is always tried)."""
    sizes, size = [], 1
    while size < largest:
        sizes.append(size)
        size *= 2
    return [*sizes, largest]


def probe_batch_sizes(
    run_step: Callable[[int], tuple[float, float]], largest: int, memory_gb: float, headroom: float
) -> tuple[ProbeRow, ...]:
    """Try micro-batches up to `largest`; `run_step(batch)` returns (peak memory GB, seconds) or raises
    ProbeOutOfMemory."""
    rows = []
    for batch in candidate_sizes(largest):
        try:
            peak_gb, seconds = run_step(batch)
        except ProbeOutOfMemory:
            rows.append(ProbeRow(batch, None, None, False))
            break
        fits = peak_gb <= memory_gb * (1 - headroom)
        rows.append(ProbeRow(batch, round(peak_gb, 3), round(seconds, 4), fits))
        if not fits:
            break
    return tuple(rows)


def cuda_step(model, dataset, precision: str, largest: int) -> Callable[[int], tuple[float, float]]:
    """A real forward/backward step on `batch` training blocks (repeated if there are fewer), on the GPU."""
    import torch

    rows = dataset[: min(len(dataset), largest)]
    available = len(rows["input_ids"])

    def run(batch: int) -> tuple[float, float]:
        index = torch.arange(batch) % available
        inputs = {key: rows[key][index].cuda() for key in ARRAYS}
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        started = time.perf_counter()
        try:
            with autocast("cuda", precision):
                loss = model(**inputs).loss
            loss.backward()
            torch.cuda.synchronize()
        except torch.cuda.OutOfMemoryError as err:
            raise ProbeOutOfMemory(str(err)) from None
        finally:
            model.zero_grad(set_to_none=True)
        return torch.cuda.max_memory_allocated() / GB, time.perf_counter() - started

    return run


def training_speed(model, dataset, precision: str, gradient_checkpointing: bool, per_answer: bool) -> Speed:
    """Tokens/s of a forward and backward on a training block, as training will run it (through the
    per-answer loss when the plan averages per answer): the fastest of three passes, since the first
    also allocates and picks kernels, and a shared machine slows any one pass."""
    from pipeline.trainer import answer_logits, per_answer_loss

    block = dataset[0]
    device = next(model.parameters()).device
    if gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    was_training = model.training
    model.train()
    inputs = {key: block[key][None].to(device) for key in ARRAYS}
    fastest = float("inf")
    try:
        for _ in range(3):
            started = time.perf_counter()
            with autocast(device.type, precision):
                loss = per_answer_loss(*answer_logits(model, inputs)) if per_answer else model(**inputs).loss
            loss.backward()
            fastest = min(fastest, time.perf_counter() - started)
            model.zero_grad(set_to_none=True)
    finally:
        model.train(was_training)
        if gradient_checkpointing:
            model.gradient_checkpointing_disable()
    tokens = int(inputs["position_ids"].numel())
    return Speed(
        tokens / fastest,
        f"the fastest of 3 forward and backward passes on a {tokens}-token block in {precision}",
    )


def speed_key(hardware, model_name: str, plan) -> str:
    """What a training speed depends on: the machine, the model and how it trains."""
    parts = [
        hardware.platform,
        hardware.cpu_bf16,
        hardware.usable_cores,
        [gpu.name for gpu in hardware.gpus],
        hardware.torch_version,
        model_name,
        plan["precision"],
        plan["sequence_length"],
        plan["gradient_checkpointing"],
        plan["attention"],
    ]
    return provenance_hash({"speed": parts})[:20]


def remembered_speed(key: str) -> Speed | None:
    """The training speed an earlier run measured on this machine for the same model and plan."""
    try:
        entry = orjson.loads(_speeds_file().read_bytes())[key]
    except (OSError, ValueError, KeyError):
        return None
    return Speed(entry["tokens_per_s"], f"an earlier run's training on this machine, {entry['measured_at']}")


def remember_speed(key: str, tokens_per_s: float) -> None:
    """Keep a finished run's training speed for the next run's time budget (best effort)."""
    path = _speeds_file()
    try:
        speeds = orjson.loads(path.read_bytes())
    except (OSError, ValueError):
        speeds = {}
    speeds[key] = {"tokens_per_s": round(tokens_per_s, 1), "measured_at": utc_now()}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_manifest(path, speeds)
    except OSError:
        pass  # a read-only cache only costs the next run a measurement


def _speeds_file() -> Path:
    return cache_home() / "speeds.json"

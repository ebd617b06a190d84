"""Measure the largest micro-batch that fits on the GPU, instead of guessing from memory tiers.

A few real forward/backward steps at increasing micro-batch sizes, stopping
at the first out-of-memory or the first size whose peak memory leaves less
than the configured headroom. `probe_batch_sizes` takes the step as a
function, so tests simulate out-of-memory on the CPU; `cuda_step` is the real
one.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from pipeline.dataset import ARRAYS
from pipeline.hardware import GB
from pipeline.planner import ProbeRow


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

    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
    rows = dataset[: min(len(dataset), largest)]
    available = len(rows["input_ids"])

    def run(batch: int) -> tuple[float, float]:
        index = torch.arange(batch) % available
        inputs = {key: rows[key][index].cuda() for key in ARRAYS}
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        started = time.perf_counter()
        try:
            with torch.autocast("cuda", dtype=dtype, enabled=dtype is not None):
                loss = model(**inputs, use_cache=False).loss
            loss.backward()
            torch.cuda.synchronize()
        except torch.cuda.OutOfMemoryError as err:
            raise ProbeOutOfMemory(str(err)) from None
        finally:
            model.zero_grad(set_to_none=True)
        return torch.cuda.max_memory_allocated() / GB, time.perf_counter() - started

    return run

"""Where the training time went: throughput, data-loader wait, and what to change."""

from __future__ import annotations

from typing import Any

from pipeline.monitor import summarize_values
from pipeline.types import Plan

DATA_BOUND_SHARE = (
    0.2  # waiting for batches more than this share of step time means the input pipeline limits
)
LOW_GPU_UTILISATION_PCT = 70


def throughput_report(
    history, plan: Plan, monitor_report: dict[str, Any], usable_cores: int, efficiency: float
) -> dict[str, Any]:
    """`efficiency`: real tokens per block slot of the trained blocks (the rest is padding)."""
    runtime = history.train_runtime_s or 0.0
    processed = round(history.blocks * plan.sequence_length * efficiency)
    step_total = sum(history.step_time_s)
    wait_share = sum(history.data_wait_s) / step_total if step_total else None
    verdict, suggestion = _bottleneck(wait_share, plan, monitor_report, usable_cores)
    overhead = monitor_report.get("monitor_overhead_s") or 0.0
    return {
        "trained_tokens": history.trained_tokens,
        "processed_tokens": processed,
        "tokens_per_s": round(processed / runtime, 1) if runtime else None,
        "samples_per_s": round(history.blocks / runtime, 3) if runtime else None,
        "step_time_s": summarize_values(history.step_time_s),
        "data_wait_s": summarize_values(history.data_wait_s),
        "data_wait_share_pct": round(100 * wait_share, 2) if wait_share is not None else None,
        "bottleneck": verdict,
        "suggestion": suggestion,
        "monitor_overhead_pct": round(100 * overhead / runtime, 4) if runtime else None,
    }


def _bottleneck(wait_share, plan: Plan, monitor_report, usable_cores: int) -> tuple[str | None, str | None]:
    if wait_share is None:
        return None, None
    if wait_share > DATA_BOUND_SHARE:
        workers, most = plan.num_workers, max(0, usable_cores - 1)
        if workers < most:
            advice = f"raise plan.num_workers from {workers} to {most}"
        elif plan.device == "cuda" and not plan.pin_memory:
            advice = "set plan.pin_memory=true"
        else:
            advice = (
                "tokenize and pack ahead of time (the `prepare` command) or use a machine with more cores"
            )
        return "data-bound", f"the training loop waits for batches {wait_share:.0%} of the time: {advice}"
    gpus = monitor_report.get("summary", {}).get("gpus") or []
    busy = [gpu["utilization_pct"]["mean"] for gpu in gpus if gpu["utilization_pct"]["mean"] is not None]
    if busy and min(busy) < LOW_GPU_UTILISATION_PCT:
        return "compute-bound", (
            f"GPU utilisation averages {min(busy):.0f}% with little data wait: raise plan.batch_size "
            "(or keep plan.batch_probe on), or try train.torch_compile=true"
        )
    if plan.device == "cpu":
        return "compute-bound", "the CPU is the limit: a CUDA GPU would train this many times faster"
    return "compute-bound", "the accelerator is busy; more speed needs a faster device or more of them"

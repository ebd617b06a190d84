"""Where the training time went: throughput, data-loader wait, and what to change."""

from __future__ import annotations

from typing import Any

from pipeline.hardware import BUSY_CORES_NAMED
from pipeline.train.monitor import busiest_over, summarize_values
from pipeline.types import Plan

DATA_BOUND_SHARE = (
    0.2  # waiting for batches more than this share of step time means the input pipeline limits
)
LOW_GPU_UTILISATION_PCT = 70
# torch.compile repays only a long run: it compiles for longer than a short run trains before its first
# step, and again at the epoch's last, smaller micro-batch (each new shape compiles anew; docs/training.md).
COMPILE_REPAYS_AFTER_S = 1800
# What a CPU run would gain on a GPU, estimated from arithmetic: a LoRA step costs about 4 FLOPs per base
# parameter per token (the forward's 2, the backward's 2 for input gradients; frozen weights get none), and
# the GPU people start with, an RTX 2060, peaks at 25.8 TFLOP/s in fp16 with fp32 accumulation, of which
# small-model training typically uses about 30%.
LORA_FLOPS_PER_PARAMETER = 4
REFERENCE_GPU = "an RTX 2060"
REFERENCE_GPU_FLOPS = 25.8e12 * 0.3


def throughput_report(
    history, plan: Plan, monitor_report: dict[str, Any], usable_cores: int, efficiency: float, parameters: int
) -> dict[str, Any]:
    """`efficiency`: real tokens per block slot of the trained blocks (the rest is padding); `parameters`:
    the base model's."""
    runtime = history.train_runtime_s or 0.0
    processed = history.processed_tokens(plan.sequence_length, efficiency)
    step_total = sum(history.step_time_s)
    wait_share = sum(history.data_wait_s) / step_total if step_total else None
    tokens_per_s = processed / runtime if runtime else None
    # What a time budget's plan measures (passes, no validation) and plans the validations beside: the
    # speed the next run here plans with. Counting the validations in it made a run that validated often
    # plan the next well below what its steps ran at.
    stepping = runtime - history.validation_s
    step_tokens_per_s = processed / stepping if runtime and stepping > 0 else None
    verdict, suggestion = _bottleneck(
        wait_share, plan, monitor_report, usable_cores, tokens_per_s, parameters, runtime
    )
    overhead = monitor_report.get("monitor_overhead_s") or 0.0
    return {
        "trained_tokens": history.trained_tokens,
        "processed_tokens": processed,
        "tokens_per_s": round(tokens_per_s, 1) if tokens_per_s else None,
        "validation_s": round(history.validation_s, 3),
        "step_tokens_per_s": round(step_tokens_per_s, 1) if step_tokens_per_s else None,
        "samples_per_s": round(history.blocks / runtime, 3) if runtime else None,
        "step_time_s": summarize_values(history.step_time_s),
        "data_wait_s": summarize_values(history.data_wait_s),
        "data_wait_share_pct": round(100 * wait_share, 2) if wait_share is not None else None,
        "bottleneck": verdict,
        "suggestion": suggestion,
        "monitor_overhead_pct": round(100 * overhead / runtime, 4) if runtime else None,
    }


def _bottleneck(
    wait_share,
    plan: Plan,
    monitor_report,
    usable_cores: int,
    tokens_per_s: float | None,
    parameters: int,
    runtime_s: float,
) -> tuple[str | None, str | None]:
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
        compile_advice = (
            ", or try train.torch_compile=true with plan.drop_last=true (it compiles for minutes, and "
            "again for each new batch shape)"
            if runtime_s >= COMPILE_REPAYS_AFTER_S and not plan.torch_compile
            else ""
        )
        return "compute-bound", (
            f"GPU utilisation averages {min(busy):.0f}% with little data wait: raise plan.batch_size "
            f"above {plan.batch_size} (or keep plan.batch_probe on){compile_advice}"
        )
    if plan.device == "cpu":
        other = (monitor_report.get("summary", {}).get("other_cores") or {}).get("mean")
        if other is not None and other >= BUSY_CORES_NAMED:
            busiest = busiest_over(monitor_report.get("samples") or [])
            named = f" (the busiest: {'; '.join(busiest)})" if busiest else ""
            left = max(usable_cores - other, 0.5)
            return "cpu-shared", (
                f"other processes took {other:.1f} of the {usable_cores} usable cores while this trained{named}: "
                f"it trained on the {left:.1f} left; with them stopped it could train about "
                f"{usable_cores / left:.1f}× faster, and beyond that {gpu_speedup(tokens_per_s, parameters)}"
            )
        return "compute-bound", f"the CPU is the limit: {gpu_speedup(tokens_per_s, parameters)}"
    return "compute-bound", "the accelerator is busy; more speed needs a faster device or more of them"


def gpu_speedup(tokens_per_s: float | None, parameters: int) -> str:
    """How many times faster the reference GPU would train, from the FLOP/s this run reached."""
    if not (tokens_per_s and parameters):
        return "a CUDA GPU would train many times faster"
    reached = tokens_per_s * LORA_FLOPS_PER_PARAMETER * parameters
    return (
        f"{REFERENCE_GPU} would train about {REFERENCE_GPU_FLOPS / reached:.0f}× faster (estimate: "
        f"{REFERENCE_GPU_FLOPS / 1e12:.1f} TFLOP/s, 30% of its fp16 peak, against the {reached / 1e9:.0f} GFLOP/s "
        f"reached here at {LORA_FLOPS_PER_PARAMETER} FLOPs per parameter per token)"
    )

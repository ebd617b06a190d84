"""Measure this machine instead of guessing: the largest micro-batch that fits, the training speed.

- Batch probe (CUDA): a few real forward/backward steps at increasing
  micro-batch sizes, stopping at the first out-of-memory or the first size
  whose peak memory leaves less than the configured headroom.
  `probe_batch_sizes` takes the step as a function, so tests simulate
  out-of-memory on the CPU; `cuda_step` is the real one.
- Training speed (for a time budget): what a finished run measured on this
  machine for the same model and plan (kept in `~/.cache/repotune/speeds.json`)
  while other processes took about as much of the CPU as they do now, scaled
  by how much faster or slower the cores multiply matrices now than then, or
  else a real forward and backward on training blocks, on the machine as it is.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import orjson

from pipeline.builtin import cache_home
from pipeline.config import LoadedConfig
from pipeline.data.dataset import ARRAYS, block_dataset
from pipeline.hardware import GB
from pipeline.manifest import provenance_hash, utc_now, write_json
from pipeline.plan.planner import deadline_s, plan_for
from pipeline.progress import say
from pipeline.train.model import autocast
from pipeline.types import Machine, PackedSplit, Plan, Prepared, ProbeRow, Speed, TrainOutcome, TrainTime

MIN_STEPS_FOR_SPEED = 5  # a run this long measures its speed well enough for the next run's budget


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


SPEED_BLOCKS = (
    3  # training blocks timed, spread over the data: blocks differ (a long change, many short messages)
)
# A first pass shorter than this warms every timed micro-batch, not only the first: on a GPU a shape's
# first pass pays for loading and choosing its kernels, and timed after a single warm-up the passes took
# several times what training's steps then took, so the plan trained a fraction of what fit. On a CPU a
# pass costs seconds and its first one only allocates: more warm-ups would cost a run for nothing
# (docs/training.md).
WARM_EVERY_BELOW_S = 3.0


def training_speed(
    model,
    dataset,
    precision: str,
    gradient_checkpointing: bool,
    per_answer: bool,
    threads: int,
    batch: int,
) -> Speed:
    """Tokens/s of a forward and backward on micro-batches of `batch` training blocks, as training will
    run them (through the per-answer loss when the plan averages per answer): SPEED_BLOCKS micro-batches
    spread over the data, after untimed passes that allocate and pick kernels (each of them first where
    a pass is cheap, see WARM_EVERY_BELOW_S). Blocks differ: the first packed block holds the longest
    answers, whose logits cost most, so timing it alone undersold a typical step by a third."""
    import torch

    from pipeline.train.loss import answer_logits, per_answer_loss  # heavy: torch

    torch.set_num_threads(threads)  # as training will: the cores other processes leave free
    device = next(model.parameters()).device
    if gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    was_training = model.training
    model.train()
    chosen = sorted({round(i * (len(dataset) - 1) / max(1, SPEED_BLOCKS - 1)) for i in range(SPEED_BLOCKS)})

    def one_pass(first: int) -> tuple[float, int]:
        blocks = dataset[[(first + i) % len(dataset) for i in range(batch)]]
        inputs = {key: blocks[key].to(device) for key in ARRAYS}
        started = time.perf_counter()
        with autocast(device.type, precision):
            loss = per_answer_loss(*answer_logits(model, inputs)) if per_answer else model(**inputs).loss
        loss.backward()
        if device.type == "cuda":
            torch.cuda.synchronize()  # the clock waits for the backward's kernels, not only their launch
        model.zero_grad(set_to_none=True)
        return time.perf_counter() - started, int(inputs["position_ids"].numel())

    try:
        first, _ = one_pass(chosen[0])  # allocates and picks kernels: not what a step costs
        warm_each = first < WARM_EVERY_BELOW_S
        if warm_each:
            for index in chosen[1:]:
                one_pass(index)
        timed = [one_pass(index) for index in chosen]
    finally:
        model.train(was_training)
        if gradient_checkpointing:
            model.gradient_checkpointing_disable()
    seconds, tokens = sum(t for t, _ in timed), sum(n for _, n in timed)
    return Speed(
        tokens / seconds,
        f"forward and backward passes on {len(chosen)} micro-batches of {batch} training block(s) spread "
        f"over the data ({tokens} tokens, after a warm-up pass{' on each' if warm_each else ''}) in {precision}",
    )


def speed_key(hardware, model_name: str, plan: Plan) -> str:
    """What a training speed depends on: the machine, the model and how it trains."""
    parts = [
        hardware.platform,
        hardware.cpu_bf16,
        hardware.usable_cores,
        [gpu.name for gpu in hardware.gpus],
        hardware.torch_version,
        model_name,
        plan.precision,
        plan.sequence_length,
        plan.gradient_checkpointing,
        plan.attention,
        plan.truncate_at,
        plan.quantization,
        plan.lora_dropout,
        plan.cpu_threads,
    ]
    return provenance_hash({"speed": parts})[:20]


SAME_LOAD_CORES = 0.5  # a remembered speed holds while other processes take within this many cores of then
# The same cores can train a third faster or slower hours apart, with no other process on them (a virtual
# machine's host is shared too), and a remembered speed then plans far short of the budget. So the cores' pace is timed before training and kept beside the speed; where it moved further than
# its own noise (PACE_NOISE), the machine changed: the speed is measured again.
PACE_SECONDS = 2.0
# The first products in a process ran 77 GFLOP/s where the next two seconds ran 136: a product or two
# did not warm it.
PACE_WARM_SECONDS = 0.5
# A pace says that the machine changed, not by how much. Five minutes of 2-second paces of the same
# idle cores had a standard deviation of 12% of their mean (76 to 146 GFLOP/s; 60-second ones 4%: the
# host's speed moves over tens of seconds), and the minutes of training that follow do not move with them: over 9 default
# runs on those cores (2026-11-26/27) the paces read 0.67 to 1.27 of the remembered run's while the
# speeds trained stayed within 0.88 to 1.14 of its. Scaling the speed by the pace beyond 20% (as this
# did) planned 14.9% off on average (34.5% at worst, all 4 scaled runs worse than unscaled), the speed
# as it is 6.0% (13.1%).
PACE_NOISE = 0.3
# A run's speed differs from the last run's on the same cores by up to about this much (above): a run
# that trained faster than that left some of its budget unused, and says so.
SPEED_NOISE = 0.2


def cores_pace(threads: int) -> float:
    """GFLOP/s of float32 matrix products shaped like a small model's MLP, on `threads` threads over
    PACE_SECONDS: what a training step mostly does, measured in a fraction of one."""
    import torch

    torch.set_num_threads(threads)  # as training will
    a, b = torch.randn(512, 576), torch.randn(576, 1536)
    warm = time.perf_counter() + PACE_WARM_SECONDS
    while time.perf_counter() < warm:  # allocating and starting the threads are not the pace
        a @ b
    products, started = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - started) < PACE_SECONDS:
        a @ b
        products += 1
    return round(2 * 512 * 576 * 1536 * products / elapsed / 1e9, 1)


def remembered_speed(key: str, busy_cores: float | None, pace: float | None) -> tuple[Speed | None, str]:
    """The training speed an earlier run measured on this machine for the same model and plan, if other
    processes take about as much of the CPU now (`busy_cores`) as they did then and the cores run at
    about the pace they ran at then (`pace`, from `cores_pace`; `pace_holds`); else (None, why not)."""
    try:
        entry = orjson.loads(_speeds_file().read_bytes())[key]
    except (OSError, ValueError, KeyError):
        return None, ""
    remembered = f"the speed remembered from {entry['measured_at']} ({entry['tokens_per_s']} tokens/s)"
    then = entry.get("busy_cores") or 0.0
    if busy_cores is not None and abs(busy_cores - then) >= SAME_LOAD_CORES:
        return None, f"; {remembered} had {then:.1f} cores taken by other processes, now {busy_cores:.1f}"
    how = f"an earlier run's training on this machine, {entry['measured_at']}"
    pace_then = entry.get("cores_gflops")
    if not (pace and pace_then):  # a GPU's, or remembered before the pace was
        return Speed(entry["tokens_per_s"], how, pace), ""
    if not pace_holds(pace_then, pace):
        return None, f"; the cores ran {pace_then} GFLOP/s for {remembered}, now {pace}"
    paces = f"its cores' pace now ({pace} GFLOP/s, {pace_then} then) within what two seconds of it vary by"
    return Speed(entry["tokens_per_s"], f"{how}, as it is: {paces}", pace), ""


def pace_holds(pace_then: float, pace: float) -> bool:
    """Whether the cores' pace now is within its own noise (PACE_NOISE) of then's: the remembered speed
    holds as it is; beyond it the machine changed, by more than the pace can say."""
    return 1 / (1 + PACE_NOISE) <= pace / pace_then <= 1 + PACE_NOISE


def resumed_speed(earlier: dict[str, Any] | None) -> Speed | None:
    """The speed the run being resumed was planned with (`earlier`: its manifest), so the plan (and its
    data) match the checkpoint's."""
    measured = ((earlier or {}).get("training_parameters") or {}).get("measured_tokens_per_s")
    return Speed(measured, "the run being resumed, whose plan it keeps") if measured else None


def resumed_train_time(earlier: dict[str, Any] | None) -> TrainTime | None:
    """The training time the run being resumed was planned for (`earlier`: its manifest), so the plan
    (and its data) match the checkpoint's; None where that run did not record one."""

    deadline = deadline_s(((earlier or {}).get("training_parameters") or {}).get("train_seconds"))
    return TrainTime(deadline, "the run being resumed planned") if deadline else None


def remember_speed(outcome: TrainOutcome, machine: Machine, model_name: str) -> None:
    """Keep a finished run's training speed on this machine (its steps', validations left out, as the
    probe measures) for the next run's time budget, with how much of the CPU other processes took
    meanwhile."""
    tokens_per_s = (outcome.throughput or {}).get("step_tokens_per_s")
    steps = outcome.history["training"]["global_step"] or 0
    busy = ((outcome.hardware or {}).get("summary") or {}).get("other_cores", {}).get("mean")
    pace = outcome.plan.speed.cores_gflops if outcome.plan.speed else None
    if tokens_per_s and machine.hardware.source == "detected" and steps >= MIN_STEPS_FOR_SPEED:
        _store_speed(speed_key(machine.hardware, model_name, outcome.plan), tokens_per_s, busy, pace)


def _store_speed(key: str, tokens_per_s: float, busy_cores: float | None, pace: float | None) -> None:
    """Best effort: a read-only cache only costs the next run a measurement."""
    path = _speeds_file()
    try:
        speeds = orjson.loads(path.read_bytes())
    except (OSError, ValueError):
        speeds = {}
    speeds[key] = {
        "tokens_per_s": round(tokens_per_s, 1),
        "measured_at": utc_now(),
        "busy_cores": busy_cores,
        "cores_gflops": pace,
    }
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json(path, speeds)
    except OSError:
        pass


def _speeds_file() -> Path:
    return cache_home() / "speeds.json"


def measure(
    prepared: Prepared,
    machine: Machine,
    loaded: LoadedConfig,
    plan: Plan,
    model,
    train: PackedSplit,
    resumed: Speed | None = None,
) -> Plan:
    """Measure what the plan needs from this machine, and plan again: on CUDA the largest micro-batch
    that fits (same effective batch), under a time budget the training speed. `model`: the loaded model
    (with LoRA); `resumed`: the speed of the run being resumed, taken again so the plan (and its data)
    match the checkpoint's."""

    probe_note, speed_note = batch_probe_skipped(plan, machine, loaded), speed_skipped(plan, machine)
    rows = plan.probe
    if not probe_note:
        largest = plan.effective_batch_size // plan.world_size
        gpu = min(machine.hardware.gpus, key=lambda g: g.memory_gb)
        model.cuda()
        step = cuda_step(model, block_dataset(train), plan.precision, largest)
        rows = probe_batch_sizes(step, largest, gpu.memory_gb, loaded.config.plan.probe_headroom)
        plan = plan_for(prepared, machine, loaded, rows)
        say(
            f"batch probe: {[(row.batch_size, row.peak_memory_gb, row.fits) for row in rows]} → micro-batch {plan.batch_size}"
        )
    if not speed_note:
        key = speed_key(machine.hardware, prepared.facts.name, plan)
        pace = cores_pace(plan.cpu_threads) if plan.device == "cpu" else None
        speed: Speed | None
        if resumed:  # its plan kept; the pace is for the speed this run leaves to the next
            speed, stale = replace(resumed, cores_gflops=pace), ""
        else:
            speed, stale = remembered_speed(key, machine.hardware.busy_cores, pace)
        if speed is None:
            speed = training_speed(
                model,
                block_dataset(train),
                plan.precision,
                plan.gradient_checkpointing,
                plan.loss_average == "answer",
                plan.cpu_threads,
                # A GPU's speed grows with the micro-batch: timed one block at a time, it measures a
                # fraction of what training runs at, and a budget trains a fraction of its time. A CPU's
                # barely does, and each of its passes costs seconds.
                plan.batch_size if plan.device == "cuda" else 1,
            )
            speed = replace(speed, how=speed.how + stale, cores_gflops=pace)
        plan = plan_for(prepared, machine, loaded, rows, speed=speed)
        say(f"training speed {speed.tokens_per_s:.0f} tokens/s, measured by {speed.how}")
    return replace(plan, probe_note=probe_note)


def needs_measuring(plan: Plan, machine: Machine, loaded: LoadedConfig) -> bool:
    """Whether `measure` would run anything (it needs the model loaded then)."""
    return not (batch_probe_skipped(plan, machine, loaded) and speed_skipped(plan, machine))


def speed_skipped(plan: Plan, machine: Machine) -> str | None:
    if not plan.time_budget_s:
        return "no time budget"
    if machine.launch.world_size > 1:  # (only rank 0 knows the hardware it planned for)
        return "several processes: set plan.batch_size and train.epochs instead of a time budget"
    if machine.hardware.source != "detected":
        return f"planning for {machine.hardware.source}, which is not this machine"
    return None


def batch_probe_skipped(plan: Plan, machine: Machine, loaded: LoadedConfig) -> str | None:
    if not loaded.config.plan.batch_probe:
        return "plan.batch_probe is off"
    if machine.launch.world_size > 1:
        return "skipped with several processes: probe once on one GPU (the `plan` command) or set plan.batch_size"
    if machine.hardware.source != "detected":
        return f"skipped: planning for {machine.hardware.source}, which is not this machine"
    if plan.device != "cuda":
        return f"skipped: the probe measures GPU memory and the device is {plan.device}"
    if loaded.explicit("plan.batch_size"):
        return "skipped: plan.batch_size was set explicitly"
    if plan.fsdp or plan.deepspeed:
        return "skipped: FSDP/DeepSpeed shard the model; set plan.batch_size"
    return None

"""Run the Hugging Face Trainer on packed blocks, and record what happened.

- `RepotuneTrainer` times how long each optimizer step waits for its batches
  (the data-loader wait that tells data-bound from compute-bound runs) and
  counts the tokens that carry a loss.
- `TrainingHistory` keeps loss, learning rate, evaluations, step times and
  epoch summaries, and hands them to `on_update` after every log so the
  manifest is current mid-run.
- `GracefulStop` turns a stop signal (SIGINT, SIGTERM, SIGHUP) into "save a checkpoint, then stop";
  the data-loader workers leave them to it (`workers`).
- `CheckpointStamp` writes what a checkpoint was trained on next to it, so
  `--resume` can refuse a checkpoint from other data or another batch.
- `train` turns a CUDA out-of-memory into `OutOfMemory` (the adapter back to
  its initial weights) for the planning stage to plan again with, and a
  non-finite loss into a clear failure.
"""

from __future__ import annotations

import math
import signal
import socket
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import orjson
import torch
from transformers import Trainer, TrainerCallback, TrainingArguments, default_data_collator
from transformers.trainer_callback import PrinterCallback, ProgressCallback

from pipeline.config import MonitorConfig
from pipeline.data.dataset import block_dataset
from pipeline.errors import Interrupted, PipelineError, TrainingError
from pipeline.hardware import usable_cores
from pipeline.manifest import MANIFEST_FILE, finite, write_json
from pipeline.plan.planner import deadline_s
from pipeline.progress import clock, say
from pipeline.signals import on_stop_signals
from pipeline.train.distributed import Coordinator
from pipeline.train.loss import answer_logits, held_out_loss, per_answer_loss, perplexity, sequence_ids
from pipeline.train.model import STAMP_FILE, AdapterFacts, newest_checkpoint, record_base
from pipeline.train.monitor import HardwareMonitor, import_nvml
from pipeline.train.performance import throughput_report
from pipeline.train.probe import SPEED_NOISE
from pipeline.train.trackers import attach_trackers, tracker_failure
from pipeline.train.workers import leaving_signals_to_the_run
from pipeline.types import PackedSplit, Plan, TrainOutcome

FILLED_SHARE = 0.9  # of its training share, a plan that fills a time budget (`budget_unused`)


class RepotuneTrainer(Trainer):
    """The Hugging Face Trainer, measuring data waits and trained tokens per optimizer step, and
    averaging the loss over answers instead of tokens when the plan says so."""

    def __init__(self, *args, history: TrainingHistory, precision: str, per_answer: bool = False, **kwargs):
        super().__init__(*args, **kwargs)
        self.history = history
        self.precision = precision
        self.per_answer = per_answer
        if per_answer:
            self.loss_is_scaled_for_ga = False  # a mean per micro-batch: the Trainer divides by accumulation

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        if not (self.per_answer and model.training) or return_outputs:
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        if self.args.world_size > 1:  # a DDP/FSDP wrapper syncs gradients through its own forward
            logits = model(input_ids=inputs["input_ids"], position_ids=inputs["position_ids"]).logits
            learned = inputs["labels"][:, 1:].ne(-100)
            selected = logits[:, :-1][learned], inputs["labels"][:, 1:][learned]
            return per_answer_loss(*selected, sequence_ids(inputs["position_ids"])[learned])
        # accelerate puts autocast around the model's own forward; the decoder is called directly here.
        with self.accelerator.autocast():
            return per_answer_loss(*answer_logits(model, inputs))

    def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix="eval"):
        """Validation loss, computed as the held-out loss before and after training is (token-weighted over
        every format's blocks)."""
        scored = held_out_loss(
            self.model,
            eval_dataset or self.eval_dataset,
            self.args.per_device_eval_batch_size,
            self.precision,
        )
        if self.is_in_train:  # inside the training time (not the final one after it)
            self.history.validation_s += scored["seconds"]
        metrics = {f"{metric_key_prefix}_loss": scored["loss"]}
        self.log(metrics)
        self.control = self.callback_handler.on_evaluate(self.args, self.state, self.control, metrics)
        return metrics

    def get_train_dataloader(self):
        """The Trainer's loader, whose workers leave the stop signals to the run (`workers`)."""
        loader = super().get_train_dataloader()
        torch_loader = getattr(loader, "base_dataloader", loader)  # inside accelerate's wrapper, if any
        torch_loader.worker_init_fn = leaving_signals_to_the_run(torch_loader.worker_init_fn)
        return loader

    def get_batch_samples(self, epoch_iterator, num_batches, device):
        started = time.perf_counter()
        batches, items = super().get_batch_samples(epoch_iterator, num_batches, device)
        self.history.data_wait_s.append(time.perf_counter() - started)
        self.history.trained_tokens += sum(int(batch["labels"].ne(-100).sum()) for batch in batches)
        self.history.blocks += sum(len(batch["labels"]) for batch in batches)
        return batches, items


@dataclass
class TrainingHistory(TrainerCallback):
    tokens_per_epoch: int
    blocks_per_epoch: int
    include_epoch_summary: bool
    on_update: Callable[[], None]
    loss_history: list[dict[str, Any]] = field(default_factory=list)
    lr_history: list[dict[str, Any]] = field(default_factory=list)
    eval_history: list[dict[str, Any]] = field(default_factory=list)
    epoch_summaries: list[dict[str, Any]] = field(default_factory=list)
    step_time_s: list[float] = field(default_factory=list)
    data_wait_s: list[float] = field(default_factory=list)
    trained_tokens: int = 0
    """Tokens that carried a loss (padding and sequence starts excluded)."""
    blocks: int = 0
    diverged: dict[str, Any] | None = None
    """Step and value of a non-finite loss, which stops training."""
    time_limit: dict[str, Any] | None = None
    """Step and time at which the time budget's hard limit stopped training."""
    global_step: int = 0
    start_step: int = 0
    """The step training began at in this process (a resumed run's checkpoint step)."""
    train_runtime_s: float | None = None
    validation_s: float = 0.0
    """Seconds of `train_runtime_s` spent validating."""
    kept: dict[str, Any] | None = None
    """The step whose adapter weights were kept (the best on validation, or the last) and why training
    stopped where it did; None without validation during training."""
    _epoch_started: float = 0.0
    _epoch_losses: list[float] = field(default_factory=list)
    _epoch_first_block: int = 0
    _last_step_end: float = 0.0
    _train_started: float = 0.0

    def reset(self) -> None:
        """Forget an attempt that ran out of memory: the retry starts from step 0."""
        for name in (
            "loss_history",
            "lr_history",
            "eval_history",
            "epoch_summaries",
            "step_time_s",
            "data_wait_s",
        ):
            getattr(self, name).clear()
        self.trained_tokens = self.blocks = 0
        self.validation_s = 0.0

    def resume_from(self, log_history: list[dict[str, Any]]) -> None:
        """Take the history logged before a checkpoint (trainer_state.json) as this run's start."""
        for entry in log_history:
            if "loss" in entry:
                self._record_log(entry["step"], entry)

    def on_train_begin(self, args, state, control, **kwargs):
        self._train_started = self._last_step_end = time.perf_counter()
        self.start_step = state.global_step

    def processed_tokens(self, sequence_length: int, efficiency: float) -> int:
        """Real tokens (padding excluded) of the blocks trained so far; `efficiency`: real tokens per slot."""
        return round(self.blocks * sequence_length * efficiency)

    def elapsed_s(self) -> float:
        """Seconds since training began in this process."""
        return time.perf_counter() - self._train_started if self._train_started else 0.0

    def on_epoch_begin(self, args, state, control, **kwargs):
        self._epoch_started = time.perf_counter()
        self._epoch_losses = []
        self._epoch_first_block = self.blocks

    def on_step_end(self, args, state, control, **kwargs):
        now = time.perf_counter()
        self.step_time_s.append(now - self._last_step_end)
        self._last_step_end = now
        # Always record the final step, so the history (and summary.last) ends where training did; and with
        # validation during training, score the last step too: it competes with the best one.
        if state.global_step == state.max_steps:
            control.should_log = True
            control.should_evaluate = args.eval_strategy != "no"

    def on_log(self, args, state, control, logs=None, **kwargs):
        logs = logs or {}
        if "loss" not in logs:
            return
        self.global_step = state.global_step
        if not math.isfinite(logs["loss"]):
            self.diverged = {"step": state.global_step, "loss": str(logs["loss"])}
            control.should_training_stop = True
        self._record_log(state.global_step, logs)
        self.on_update()

    def _record_log(self, step: int, logs: dict[str, Any]) -> None:
        epoch = round(logs.get("epoch", 0.0), 4)
        loss = logs["loss"]
        self.loss_history.append(
            {"step": step, "epoch": epoch, "loss": finite(loss), "grad_norm": finite(logs.get("grad_norm"))}
        )
        self.lr_history.append({"step": step, "epoch": epoch, "learning_rate": logs.get("learning_rate")})
        if math.isfinite(loss):
            self._epoch_losses.append(loss)

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        loss = (metrics or {}).get("eval_loss")
        if loss is not None and state.global_step:
            self.eval_history.append(
                {"step": state.global_step, "loss": finite(loss), "perplexity": perplexity(loss)}
            )
            self.on_update()

    def on_epoch_end(self, args, state, control, **kwargs):
        if not self.include_epoch_summary:
            return
        duration = time.perf_counter() - self._epoch_started
        losses = self._epoch_losses
        # The blocks this epoch really trained (an interrupted epoch trained only some), in real tokens.
        share = (
            (self.blocks - self._epoch_first_block) / self.blocks_per_epoch if self.blocks_per_epoch else 1.0
        )
        tokens = round(self.tokens_per_epoch * min(1.0, share))
        self.epoch_summaries.append(
            {
                "epoch": len(self.epoch_summaries) + 1,
                "end_step": state.global_step,
                "loss_mean": round(sum(losses) / len(losses), 6) if losses else None,
                "loss_min": min(losses) if losses else None,
                "loss_max": max(losses) if losses else None,
                "duration_s": round(duration, 3),
                "tokens": tokens,
                "tokens_per_s": round(tokens / duration, 1) if duration > 0 else None,
            }
        )
        self.on_update()

    def on_train_end(self, args, state, control, **kwargs):
        self.train_runtime_s = time.perf_counter() - self._train_started
        self.global_step = state.global_step

    def report(self) -> dict[str, Any]:
        losses = [(entry["step"], entry["loss"]) for entry in self.loss_history if entry["loss"] is not None]
        best = min(losses, key=lambda item: item[1]) if losses else None
        return {
            "training": {
                "global_step": self.global_step,
                "loss_history": self.loss_history,
                "epoch_summaries": self.epoch_summaries,
                "summary": {
                    "first": losses[0][1] if losses else None,
                    "last": losses[-1][1] if losses else None,
                    "min": best[1] if best else None,
                    "min_step": best[0] if best else None,
                },
                "train_runtime_s": round(self.train_runtime_s, 3) if self.train_runtime_s else None,
                "diverged": self.diverged,
                "time_limit": self.time_limit,
                "kept": self.kept,
            },
            "learning_rate": {"history": self.lr_history},
        }


class FollowFreeCores(TrainerCallback):
    """Before each step, the CPU threads that other processes leave free, as the monitor's last two samples
    agree on them: torch's threads wait for each other at every operation, so one on a core that another
    process keeps busy stalls them all. Each change is recorded and said."""

    def __init__(self, monitor: HardwareMonitor):
        self.monitor, self.cores = monitor, usable_cores()

    def on_step_begin(self, args, state, control, **kwargs):
        free = self.monitor.free_cores(self.cores)
        if free is None or free == torch.get_num_threads():
            return
        torch.set_num_threads(free)
        other = self.monitor.samples[-1]["other_cores"]
        self.monitor.cpu_threads.append({"step": state.global_step, "threads": free, "other_cores": other})
        say(
            f"  other processes take {other:.1f} of {self.cores} cores: training on {free} thread(s) from here"
        )


class KeepBest(TrainerCallback):
    """The adapter weights that scored the lowest validation loss, kept in memory (LoRA's are megabytes),
    and early stopping: training stops after `patience` validations in a row without a new best. After
    training, `restore` puts the best weights back when the last step is not the best."""

    def __init__(self, model, patience: int | None):
        self.model, self.patience = model, patience
        self.best: dict[str, Any] | None = None
        self.last: dict[str, Any] | None = None
        self.stopped: dict[str, Any] | None = None
        self._weights: dict[str, Any] | None = None
        self._worse = 0

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        loss = (metrics or {}).get("eval_loss")
        if loss is None or not math.isfinite(loss) or not state.global_step:
            return
        self.last = {"step": state.global_step, "validation_loss": round(loss, 6)}
        if self.best is None or loss < self.best["validation_loss"]:
            self.best, self._worse = dict(self.last), 0
            self._weights = {
                name: tensor.detach().clone()
                for name, tensor in self.model.state_dict().items()
                if "lora_" in name or "modules_to_save" in name
            }
            return
        self._worse += 1
        if self.patience and self._worse >= self.patience and state.global_step < state.max_steps:
            self.stopped = {
                "step": state.global_step,
                "reason": f"validation loss did not improve on step {self.best['step']}'s "
                f"{self.best['validation_loss']:.4f} in {self._worse} validations (patience {self.patience})",
            }
            control.should_training_stop = True

    def restore(self) -> dict[str, Any] | None:
        """Load the best weights if the last validation is not the best; what was kept, and why."""
        if self.best is None or self.last is None:
            return None
        kept_best = self.last is not None and self.last["step"] != self.best["step"]
        if kept_best:
            self.model.load_state_dict(self._weights, strict=False)
        return {
            "kept": "best" if kept_best else "last",
            "step": self.best["step"] if kept_best else self.last["step"],
            "validation_loss": self.best["validation_loss"],
            "last_step": self.last["step"],
            "last_validation_loss": self.last["validation_loss"],
            "stopped_early": self.stopped,
        }


class GracefulStop(TrainerCallback):
    """A stop signal: finish the current step, save a checkpoint, stop. A second signal stops at once.

    With several processes, `agree` makes every rank stop at the same step (a rank that stopped
    alone would leave the others waiting in a collective)."""

    def __init__(self, agree: Callable[[bool], bool] = bool) -> None:
        self.received: int | None = None
        self.agree = agree
        self._handlers = ExitStack()

    def __enter__(self) -> GracefulStop:
        self._handlers.enter_context(on_stop_signals(self._handle))
        return self

    def __exit__(self, *exc) -> None:
        self._handlers.close()

    def _handle(self, signum: int) -> None:
        if self.received is not None:
            raise KeyboardInterrupt
        self.received = signum

    def on_step_end(self, args, state, control, **kwargs):
        if self.agree(self.received is not None):
            self.received = self.received or signal.SIGTERM
            control.should_save = True
            control.should_training_stop = True
            control.should_log = True  # the history, and the manifest's current step, end where training did


class TimeLimit(TrainerCallback):
    """Stops training (with a checkpoint) once it has run `seconds`: the hard edge of a time budget,
    for when the measured speed was optimistic."""

    def __init__(self, seconds: float, history: TrainingHistory):
        self.seconds, self.history = seconds, history
        self._started = 0.0

    def on_train_begin(self, args, state, control, **kwargs):
        self._started = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        elapsed = time.perf_counter() - self._started
        if elapsed > self.seconds and state.global_step < state.max_steps:
            self.history.time_limit = {
                "step": state.global_step,
                "elapsed_s": round(elapsed, 1),
                "limit_s": round(self.seconds, 1),
            }
            control.should_save = True
            control.should_training_stop = True


class CheckpointStamp(TrainerCallback):
    """Writes what each checkpoint was trained on (data fingerprint, effective batch, total steps), and
    what `generate` needs to use its adapter (how it reads prompts, the tokenizer)."""

    def __init__(self, stamp: dict[str, Any], facts: AdapterFacts, tokenizer):
        self.stamp, self.facts, self.tokenizer = stamp, facts, tokenizer

    def on_save(self, args, state, control, **kwargs):
        checkpoint = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        if state.is_world_process_zero and checkpoint.is_dir():
            record_base(checkpoint, self.facts)
            self.tokenizer.save_pretrained(checkpoint)
            # Last and atomic: its presence is what makes the checkpoint complete (see resumable_checkpoint).
            write_json(checkpoint / STAMP_FILE, {**self.stamp, "step": state.global_step})


def training_arguments(plan: Plan, checkpoint_dir: Path) -> TrainingArguments:
    """Every planned decision, as the Hugging Face Trainer takes it."""
    return TrainingArguments(**trainer_options(plan, checkpoint_dir))


def trainer_options(plan: Plan, checkpoint_dir: Path) -> dict[str, Any]:
    """The Trainer's arguments as a plan gives them (a test checks each decision reaches them, or is
    consumed elsewhere)."""
    evaluating = plan.eval_steps is not None
    return dict(
        output_dir=str(checkpoint_dir),
        per_device_train_batch_size=plan.batch_size,
        per_device_eval_batch_size=plan.batch_size,
        gradient_accumulation_steps=plan.gradient_accumulation_steps,
        num_train_epochs=plan.epochs,
        learning_rate=plan.learning_rate,
        lr_scheduler_type=plan.lr_scheduler,
        optim=plan.optimizer,
        warmup_steps=plan.warmup_steps,
        weight_decay=plan.weight_decay,
        max_grad_norm=plan.max_grad_norm,
        logging_steps=plan.logging_steps,
        logging_first_step=True,
        logging_nan_inf_filter=False,  # the default hides a NaN loss behind the running mean
        eval_strategy="steps" if evaluating else "no",
        eval_steps=plan.eval_steps,
        prediction_loss_only=True,
        save_strategy="steps",
        save_steps=plan.save_steps,
        save_total_limit=plan.save_total_limit,
        bf16=plan.precision == "bf16",
        fp16=plan.precision == "fp16",
        tf32=plan.tf32 if plan.device == "cuda" else None,  # the Trainer rejects tf32 without CUDA
        activation_checkpointing=plan.gradient_checkpointing,
        # Non-reentrant: with frozen embeddings (LoRA) the layer inputs need no grad, which breaks reentrant.
        activation_checkpointing_kwargs={"use_reentrant": False} if plan.gradient_checkpointing else None,
        torch_compile=plan.torch_compile,
        use_cpu=plan.device == "cpu",
        dataloader_num_workers=plan.num_workers,
        dataloader_pin_memory=plan.pin_memory,
        dataloader_persistent_workers=plan.persistent_workers,
        dataloader_prefetch_factor=plan.prefetch_factor,
        dataloader_drop_last=plan.drop_last,
        seed=plan.seed,
        data_seed=plan.seed,
        report_to=plan.report_to or "none",
        remove_unused_columns=False,  # position_ids carry the packing boundaries
        ddp_find_unused_parameters=False,  # every LoRA parameter is used: skip DDP's search each step
        fsdp=plan.fsdp,
        fsdp_config=plan.fsdp_config,
        deepspeed=plan.deepspeed,
    )


@dataclass
class Job:
    """Everything one training run needs."""

    model: Any
    train: PackedSplit
    validation: dict[str, Any] | None
    """Validation blocks by format, scored during training: the checkpoint kept and when to stop are
    chosen on them (never on the held-out commits)."""
    plan: Plan
    checkpoint_dir: Path
    data_key: str
    """The token cache's key: what the blocks were made from."""
    monitor: MonitorConfig
    coordinator: Coordinator
    facts: AdapterFacts
    """How the adapter reads prompts, recorded in each checkpoint for `generate`."""
    tokenizer: Any
    resume: bool = False
    on_progress: Callable[[dict[str, Any], list[dict[str, Any]]], None] = lambda report, evaluations: None
    """After every log: the training report so far and the evaluations during training."""
    oom_retries: tuple[dict[str, Any], ...] = ()
    """The micro-batches that ran out of CUDA memory before this plan (recorded with the outcome)."""

    @property
    def stamp(self) -> dict[str, Any]:
        """What the checkpoints are trained on (data, effective batch, total steps), for --resume."""
        return {
            "dataset_fingerprint": f"{self.data_key}:{self.plan.sequence_length}:{self.train.blocks}",
            "effective_batch_size": self.plan.effective_batch_size,
            "total_steps": self.plan.total_steps,
        }


class OutOfMemory(Exception):
    """CUDA ran out of memory at the plan's micro-batch; `retry` says where. The adapter is back to its
    initial weights: the stage that plans plans again with this fact, and training starts again."""

    def __init__(self, retry: dict[str, Any]):
        super().__init__(retry["error"])
        self.retry = retry


def train_within_memory(job: Job, replan: Callable[[int], Plan]) -> TrainOutcome:
    """Train; after a CUDA out-of-memory, plan again with that measured fact (`replan` given at most half
    the micro-batch: the same effective batch) and train again from the adapter's initial weights."""
    while True:
        try:
            return train(job)
        except OutOfMemory as oom:
            cap = oom.retry["batch_size"] // 2
            say(
                f"CUDA out of memory at micro-batch {oom.retry['batch_size']}: planning again with at most {cap}"
            )
            job = replace(job, plan=replan(cap), oom_retries=(*job.oom_retries, oom.retry))


def train(job: Job) -> TrainOutcome:
    """Train to the end (resuming from the newest complete checkpoint with `job.resume`, stopping at a
    time budget's hard edge), with a progress line per logged step; throughput and hardware are gathered
    from every rank. A CUDA out-of-memory raises `OutOfMemory`."""
    plan, launch = job.plan, job.coordinator.launch
    # One sampler per node: the local rank 0 of each.
    monitor = HardwareMonitor(
        job.monitor.collection_interval_seconds, import_nvml() if launch.local_rank == 0 else None
    )
    time_limit = deadline_s(plan.train_seconds)
    progress = _Progress(job, monitor, time_limit)
    history = TrainingHistory(
        job.train.real_tokens, math.ceil(job.train.blocks / plan.world_size),  # this process's share
        job.monitor.include_epoch_summary, progress,
    )  # fmt: skip
    progress.history = history
    resumed_from = None
    if job.resume:
        resumed_from = resumable_checkpoint(job.checkpoint_dir, job.stamp)
        log_history = orjson.loads((resumed_from / "trainer_state.json").read_bytes())["log_history"]
        history.resume_from(log_history)
        say(f"resuming from {resumed_from}")
    retries = list(job.oom_retries)
    torch.set_num_threads(plan.cpu_threads)
    monitor.cpu_threads.append({"step": history.start_step, "threads": plan.cpu_threads, "other_cores": None})
    try:
        with monitor:
            _train_once(job, history, monitor, resumed_from, time_limit)
    except Interrupted as err:  # what ran until the signal is recorded, then the run ends
        err.partial = _outcome(job, history, job.plan, monitor, retries, resumed_from)
        raise
    if history.time_limit:
        say(
            f"stopped at step {history.time_limit['step']} of {plan.total_steps}: the time budget's limit "
            f"({history.time_limit['limit_s']:.0f} s of training) was reached; the speed was measured at "
            f"{plan.measured_tokens_per_s} tokens/s"
        )
    outcome = _outcome(job, history, job.plan, monitor, retries, resumed_from)
    if unused := budget_unused(plan, history.train_runtime_s, outcome.throughput):
        say(unused)
    return outcome


def budget_unused(plan: Plan, runtime_s: float | None, throughput: dict[str, Any] | None) -> str | None:
    """Why training ended well inside the time its budget gives it, when the plan filled that time and the
    machine then trained faster than the speed it was planned at (a shared host speeds up too, when the
    other work on it ends); else None."""
    planned = plan.measured_tokens_per_s
    share = plan.train_seconds
    if not (share and planned and runtime_s and throughput and throughput.get("step_tokens_per_s")):
        return None
    ran = throughput["step_tokens_per_s"]  # the steps', as the plan's speed is
    if throughput["processed_tokens"] / planned < FILLED_SHARE * share or ran < planned * (1 + SPEED_NOISE):
        return None
    return (
        f"trained in {runtime_s:.0f} s of the {share:.0f} s the time budget gives training: this machine "
        f"trained {ran:.0f} tokens/s where the plan rested on {planned:.0f}; the next run here plans with "
        f"the speed it trained at"
    )


def _outcome(
    job: Job,
    history: TrainingHistory,
    plan: Plan,
    monitor: HardwareMonitor,
    retries: list[dict[str, Any]],
    resumed_from: Path | None,
) -> TrainOutcome:
    """What training did (to its end, or to a signal), with every rank's throughput and hardware."""
    hardware, throughput = _gathered(job, history, plan, monitor)
    return TrainOutcome(
        history.report(),
        history.eval_history,
        plan,
        retries,
        throughput,
        hardware,
        resumed_from.name if resumed_from else None,
    )


class _Progress:
    """After every log: the live report to `job.on_progress` and, for each new step, one progress line
    with the loss, learning rate, tokens/s, elapsed time and the time left."""

    def __init__(self, job: Job, monitor: HardwareMonitor, time_limit: float | None):
        self.job, self.monitor, self.time_limit = job, monitor, time_limit
        self.history: TrainingHistory  # set once the history (which calls this after every log) exists
        self.shown_step: int | None = None

    def __call__(self) -> None:
        history = self.history
        self.job.on_progress({**history.report(), "hardware": self.monitor.report()}, history.eval_history)
        last = history.loss_history[-1] if history.loss_history else {}
        if last and last["step"] != self.shown_step:
            self.shown_step = last["step"]
            loss = "not finite" if last["loss"] is None else f"{last['loss']:.4f}"
            rate = history.lr_history[-1]["learning_rate"]
            say(
                f"  step {last['step']}/{self.job.plan.total_steps}  loss {loss}  lr {rate:.2e}{self._pace(last['step'])}"
            )

    def _pace(self, step: int) -> str:
        """Tokens/s, elapsed and left, from the steps this process ran (a resumed run's earlier steps ran
        elsewhere in time)."""
        history, plan = self.history, self.job.plan
        elapsed, done = history.elapsed_s(), step - history.start_step
        if done <= 0 or elapsed <= 0:
            return ""
        tokens = history.processed_tokens(plan.sequence_length, self.job.train.efficiency)
        left = (plan.total_steps - step) * elapsed / done
        until = ""
        if self.time_limit is not None and elapsed + left > self.time_limit:
            left, until = max(0.0, self.time_limit - elapsed), " (the time budget)"
        return f"  {tokens / elapsed:,.0f} tokens/s  elapsed {clock(elapsed)}  left {clock(left)}{until}"


def _gathered(
    job: Job, history: TrainingHistory, plan: Plan, monitor: HardwareMonitor
) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """This node's hardware with every node's (from each node's local rank 0), and throughput over every
    rank; (empty, None) on the ranks that do not write."""
    launch = job.coordinator.launch
    node = launch.rank // max(1, launch.local_world_size)
    mine: dict[str, Any] = {"tokens": history.trained_tokens, "blocks": history.blocks}
    if launch.local_rank == 0:
        mine["hardware"] = {"node": node, "hostname": socket.gethostname(), **monitor.report()}
    gathered = job.coordinator.gather(mine)
    if not launch.writes:
        return {}, None
    history.trained_tokens = sum(part["tokens"] for part in gathered)
    history.blocks = sum(part["blocks"] for part in gathered)
    hardware = {**monitor.report(), "nodes": [part["hardware"] for part in gathered if "hardware" in part]}
    counted = getattr(job.model, "get_nb_trainable_parameters", None)  # peft counts 4-bit weights unpacked
    parameters = counted()[1] if counted else sum(p.numel() for p in job.model.parameters())
    throughput = throughput_report(
        history, plan, monitor.report(), usable_cores(), job.train.efficiency, parameters
    )
    return hardware, throughput


def resumable_checkpoint(checkpoints: Path, stamp: dict[str, Any]) -> Path:
    """The newest complete checkpoint, if it was trained on the same data with the same batch.

    Complete means repotune's stamp is in it: the stamp is written, atomically, after everything
    the Trainer saves, so a run killed mid-save leaves a checkpoint that is passed over here.
    """
    latest = newest_checkpoint(checkpoints)
    if latest is None:
        raise PipelineError(
            f"--resume: no checkpoint in {checkpoints} that finished saving; run without --resume to start afresh"
        )
    saved = orjson.loads((latest / STAMP_FILE).read_bytes())
    for key, what in (
        ("dataset_fingerprint", "the training data"),
        ("effective_batch_size", "the effective batch"),
        ("total_steps", "the total steps"),
    ):
        if saved.get(key) != stamp[key]:
            raise PipelineError(
                f"--resume: {what} changed since {latest.name} ({saved.get(key)} → {stamp[key]}); "
                "resume with the same repository, config and hardware, or start afresh without --resume"
            )
    return latest


def build_trainer(job: Job, history: TrainingHistory, time_limit: float | None) -> RepotuneTrainer:
    trainer = RepotuneTrainer(
        model=job.model,
        args=training_arguments(job.plan, job.checkpoint_dir),
        train_dataset=block_dataset(job.train),
        eval_dataset=job.validation or None,
        data_collator=default_data_collator,
        callbacks=[history, CheckpointStamp(job.stamp, job.facts, job.tokenizer)]
        + ([TimeLimit(time_limit, history)] if time_limit else []),
        history=history,
        precision=job.plan.precision,
        per_answer=job.plan.loss_average == "answer",
    )
    # Both print raw log dicts to stdout; TrainingHistory reports progress on stderr instead.
    trainer.remove_callback(PrinterCallback)
    trainer.remove_callback(ProgressCallback)
    if job.plan.report_to:
        decisions = job.plan.to_manifest()["decisions"]
        attach_trackers(
            trainer, job.checkpoint_dir.parent, job.checkpoint_dir.parent / MANIFEST_FILE, decisions
        )
    return trainer


def _train_once(
    job: Job,
    history: TrainingHistory,
    monitor: HardwareMonitor,
    resume_from: Path | None,
    time_limit: float | None,
) -> None:
    """Train to the end with the job's plan; after a CUDA out-of-memory, the adapter's initial weights
    are restored and `OutOfMemory` raised."""
    initial = {
        name: tensor.detach().clone()
        for name, tensor in job.model.state_dict().items()
        if "lora_" in name or "modules_to_save" in name
    }
    trainer = build_trainer(job, history, time_limit)
    stop = GracefulStop(job.coordinator.any)
    keep = KeepBest(job.model, job.plan.early_stopping_patience)
    for callback in (stop, keep, *([FollowFreeCores(monitor)] if job.plan.follow_free_cores else [])):
        trainer.add_callback(callback)
    try:
        with stop:
            trainer.train(resume_from_checkpoint=str(resume_from) if resume_from else None)
    except torch.OutOfMemoryError as err:
        retry = _out_of_memory(job, trainer.state.global_step, err)
        job.model.load_state_dict(initial, strict=False)
        del trainer
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        raise OutOfMemory(retry) from None
    except Exception as err:
        if why := tracker_failure(err, job.plan.report_to):
            raise TrainingError(why) from None
        raise
    _ended_well(job, history, trainer, stop)
    if keep.last is not None and keep.last["step"] != trainer.state.global_step:
        trainer.evaluate()  # a time limit or an early stop ended training between two validations
    history.kept = keep.restore()


def _out_of_memory(job: Job, step: int, err: Exception) -> dict[str, Any]:
    """What a CUDA out-of-memory at this micro-batch is recorded as; at micro-batch 1, or with several
    processes (which would have to plan again together), the advice instead."""
    if job.plan.world_size > 1:
        raise PipelineError(
            f"CUDA ran out of memory at micro-batch {job.plan.batch_size} on one of {job.plan.world_size} "
            "processes; set plan.batch_size lower (or plan.gradient_checkpointing=true) and run again"
        )
    if job.plan.batch_size == 1:
        raise TrainingError(
            "CUDA ran out of memory even at micro-batch 1; set plan.gradient_checkpointing=true, "
            "a shorter train.max_sequence_length, or a smaller model"
        ) from None
    return {"batch_size": job.plan.batch_size, "step": step, "error": str(err).splitlines()[0]}


def _ended_well(job: Job, history: TrainingHistory, trainer: RepotuneTrainer, stop: GracefulStop) -> None:
    """A diverged loss and a signal end the run here, each with what to do next."""
    if history.diverged:
        raise TrainingError(
            f"the loss became {history.diverged['loss']} at step {history.diverged['step']}; "
            f"lower train.learning_rate (it was {job.plan.learning_rate:g})"
        )
    if stop.received is not None:
        name = signal.Signals(stop.received).name
        raise Interrupted(
            f"interrupted by {name} at step {trainer.state.global_step}; a checkpoint was saved: "
            "run the same command with --resume to continue",
            signum=stop.received,
            checkpointed=True,
        )

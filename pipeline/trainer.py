"""Run the Hugging Face Trainer on packed blocks and record what happened.

`TrainingHistory` is a Trainer callback that keeps the loss and learning-rate
history of every logged step and a summary of every epoch, and hands the
report to `on_update` after each log so the manifest is current mid-run.
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import transformers
from transformers import Trainer, TrainerCallback, TrainingArguments, default_data_collator
from transformers.trainer_callback import PrinterCallback, ProgressCallback

from pipeline.config import Config
from pipeline.errors import TrainingError
from pipeline.manifest import finite
from pipeline.planner import Plan


class TrainingHistory(TrainerCallback):
    def __init__(self, tokens_per_epoch: int, include_epoch_summary: bool, on_update: Callable[[], None]):
        self.tokens_per_epoch = tokens_per_epoch
        self.include_epoch_summary = include_epoch_summary
        self.on_update = on_update
        self.loss_history: list[dict[str, Any]] = []
        self.lr_history: list[dict[str, Any]] = []
        self.epoch_summaries: list[dict[str, Any]] = []
        self.diverged: dict[str, Any] | None = None
        """Step and value of a non-finite loss, which stops training."""
        self.global_step = 0
        self._epoch_started = 0.0
        self._epoch_losses: list[float] = []
        self._train_started = 0.0
        self.train_runtime_s: float | None = None

    def on_train_begin(self, args, state, control, **kwargs):
        self._train_started = time.perf_counter()

    def on_epoch_begin(self, args, state, control, **kwargs):
        self._epoch_started = time.perf_counter()
        self._epoch_losses = []

    def on_log(self, args, state, control, logs=None, **kwargs):
        logs = logs or {}
        if "loss" not in logs:
            return
        step, epoch, loss = state.global_step, round(logs.get("epoch", 0.0), 4), logs["loss"]
        self.global_step = step
        if not math.isfinite(loss):
            self.diverged = {"step": step, "loss": str(loss)}
            control.should_training_stop = True
        self.loss_history.append(
            {"step": step, "epoch": epoch, "loss": finite(loss), "grad_norm": finite(logs.get("grad_norm"))}
        )
        self.lr_history.append({"step": step, "epoch": epoch, "learning_rate": logs.get("learning_rate")})
        if math.isfinite(loss):
            self._epoch_losses.append(loss)
        self.on_update()

    def on_step_end(self, args, state, control, **kwargs):
        # Always record the final step, so the history (and summary.last) ends where training did.
        if state.global_step == state.max_steps:
            control.should_log = True

    def on_epoch_end(self, args, state, control, **kwargs):
        if not self.include_epoch_summary:
            return
        duration = time.perf_counter() - self._epoch_started
        losses = self._epoch_losses
        self.epoch_summaries.append(
            {
                "epoch": len(self.epoch_summaries) + 1,
                "end_step": state.global_step,
                "loss_mean": round(sum(losses) / len(losses), 6) if losses else None,
                "loss_min": min(losses) if losses else None,
                "loss_max": max(losses) if losses else None,
                "duration_s": round(duration, 3),
                "tokens": self.tokens_per_epoch,
                "tokens_per_s": round(self.tokens_per_epoch / duration, 1) if duration > 0 else None,
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
            },
            "learning_rate": {"history": self.lr_history},
        }


def training_arguments(plan: Plan, config: Config, checkpoint_dir: Path) -> TrainingArguments:
    """Every planned decision, as the Hugging Face Trainer takes it."""
    return TrainingArguments(
        output_dir=str(checkpoint_dir),
        per_device_train_batch_size=plan["batch_size"],
        gradient_accumulation_steps=plan["gradient_accumulation_steps"],
        num_train_epochs=plan["epochs"],
        learning_rate=plan["learning_rate"],
        lr_scheduler_type=plan["lr_scheduler"],
        warmup_steps=plan["warmup_steps"],
        weight_decay=config.train.weight_decay,
        max_grad_norm=config.train.max_grad_norm,
        logging_steps=plan["logging_steps"],
        logging_first_step=True,
        logging_nan_inf_filter=False,  # the default hides a NaN loss behind the running mean
        save_strategy="steps",
        save_steps=plan["save_steps"],
        save_total_limit=config.train.save_total_limit,
        bf16=plan["precision"] == "bf16",
        fp16=plan["precision"] == "fp16",
        tf32=plan["tf32"] if plan["device"] == "cuda" else None,  # the Trainer rejects tf32 without CUDA
        activation_checkpointing=plan["gradient_checkpointing"],
        # Non-reentrant: with frozen embeddings (LoRA) the layer inputs need no grad, which breaks reentrant.
        activation_checkpointing_kwargs={"use_reentrant": False} if plan["gradient_checkpointing"] else None,
        use_cpu=plan["device"] == "cpu",
        dataloader_num_workers=plan["num_workers"],
        dataloader_pin_memory=plan["pin_memory"],
        dataloader_persistent_workers=plan["persistent_workers"],
        dataloader_prefetch_factor=plan["prefetch_factor"],
        dataloader_drop_last=plan["drop_last"],
        seed=plan["seed"],
        data_seed=plan["seed"],
        report_to="none",
        remove_unused_columns=False,  # position_ids carry the packing boundaries
    )


def quiet_library_output() -> None:
    """Keep stdout for results: no save progress bars, no warning that is not ours to fix."""
    transformers.utils.logging.disable_progress_bar()
    # peft calls a transformers helper that transformers 5 renamed.
    warnings.filterwarnings(
        "ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning
    )


def train(model, dataset, plan: Plan, config: Config, checkpoint_dir: Path, history: TrainingHistory) -> None:
    trainer = Trainer(
        model=model,
        args=training_arguments(plan, config, checkpoint_dir),
        train_dataset=dataset,
        data_collator=default_data_collator,
        callbacks=[history],
    )
    # Both print raw log dicts to stdout; TrainingHistory reports progress on stderr instead.
    trainer.remove_callback(PrinterCallback)
    trainer.remove_callback(ProgressCallback)
    trainer.train()
    if history.diverged:
        raise TrainingError(
            f"the loss became {history.diverged['loss']} at step {history.diverged['step']}; "
            f"lower train.learning_rate (it was {plan['learning_rate']:g})"
        )

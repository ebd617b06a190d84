"""Experiment trackers: the Trainer's own `report_to` integrations (TensorBoard, MLflow, W&B, and every
other the installed transformers supports), checked before training, with the run's plan decisions
attached when training begins and its manifest when training ends, where the tracker takes them."""

from __future__ import annotations

import traceback
from pathlib import Path
from typing import Any

import orjson
from transformers import TrainerCallback

from pipeline.manifest import TENSORBOARD_DIR

# Module a tracker's code lives in, where it is not its report_to name.
_MODULES = {"tensorboard": "tensorboard", "azure_ml": "azureml", "flyte": "flytekit", "kubeflow": "kfp"}


def tracker_failure(err: BaseException, names: list[str]) -> str | None:
    """When a tracker's own code raised while training (a tracking URI its backend cannot serve, a login
    it lacks), what to tell the user in one line; None when the error came from elsewhere."""
    frames = [frame.filename.replace("\\", "/") for frame in traceback.extract_tb(err.__traceback__)]
    if not any(path.endswith("transformers/integrations/integration_utils.py") for path in frames):
        return None
    # The tracker whose package the innermost of its frames is in, else the one transformers was calling.
    named = [name for path in frames for name in names if f"/{_MODULES.get(name, name)}/" in path]
    name = named[-1] if named else ", ".join(names)
    first_line = (str(err).strip().splitlines() or [type(err).__name__])[0]
    return (
        f"`train.report_to`: {name} failed when training began or logged: {type(err).__name__}: "
        f"{first_line[:300]} (fix the tracker's own settings, e.g. its environment variables, or leave it "
        "out of train.report_to)"
    )


def attach_trackers(trainer, output_dir: Path, manifest_path: Path, decisions: dict[str, Any]) -> None:
    """Point TensorBoard at OUTPUT_DIR/tensorboard and attach the plan (when training begins) and the
    manifest (when it ends) to each tracker the trainer reports to."""
    from transformers.integrations import TensorBoardCallback

    handler = trainer.callback_handler
    for callback in handler.callbacks:
        if isinstance(callback, TensorBoardCallback) and callback.logging_dir is None:
            callback.logging_dir = str(output_dir / TENSORBOARD_DIR)
    # The manifest goes first at the end (the trackers' own on_train_end closes their runs), the plan last
    # at the start (their on_train_begin opens them).
    handler.callbacks.insert(0, _AttachManifest(handler, manifest_path))
    handler.add_callback(_AttachPlan(handler, decisions))


def _tensorboard_writer(handler):
    from transformers.integrations import TensorBoardCallback

    return next(
        (c.tb_writer for c in handler.callbacks if isinstance(c, TensorBoardCallback) and c.tb_writer),
        None,
    )


def _reports_to(args, name: str) -> bool:
    return name in (args.report_to or [])


class _AttachPlan(TrainerCallback):
    """The plan decisions, as a table (TensorBoard), an artifact (MLflow) or run config (W&B)."""

    def __init__(self, handler, decisions: dict[str, Any]):
        self.handler, self.decisions = handler, decisions

    def on_train_begin(self, args, state, control, **kwargs):
        if not state.is_world_process_zero:
            return
        if writer := _tensorboard_writer(self.handler):
            rows = [
                f"| {name} | {d['value']} | {d['source']} | {d['reason']} |"
                for name, d in self.decisions.items()
            ]
            writer.add_text(
                "repotune/plan",
                "\n".join(["| parameter | value | source | reason |", "|---|---|---|---|", *rows]),
            )
            writer.flush()
        if _reports_to(args, "mlflow"):
            import mlflow

            if mlflow.active_run():
                mlflow.log_dict(self.decisions, "repotune/plan.json")
        if _reports_to(args, "wandb"):
            import wandb

            if wandb.run is not None:
                values = {name: d["value"] for name, d in self.decisions.items()}
                wandb.run.config.update({"repotune": values}, allow_val_change=True)


class _AttachManifest(TrainerCallback):
    """MANIFEST.json as training left it: text (TensorBoard), an artifact (MLflow), a run file (W&B)."""

    def __init__(self, handler, manifest_path: Path):
        self.handler, self.manifest_path = handler, manifest_path

    def on_train_end(self, args, state, control, **kwargs):
        if not (state.is_world_process_zero and self.manifest_path.exists()):
            return
        if writer := _tensorboard_writer(self.handler):
            text = orjson.dumps(
                orjson.loads(self.manifest_path.read_bytes()), option=orjson.OPT_INDENT_2
            ).decode()
            writer.add_text("repotune/manifest", f"```json\n{text}\n```", state.global_step)
            writer.flush()
        if _reports_to(args, "mlflow"):
            import mlflow

            if mlflow.active_run():
                mlflow.log_artifact(str(self.manifest_path), "repotune")
        if _reports_to(args, "wandb"):
            import wandb

            if wandb.run is not None:
                wandb.save(str(self.manifest_path), base_path=str(self.manifest_path.parent), policy="now")
                # Ended here, not when the process exits: the run's file is whole once training is (a longer
                # run's last steps were still unwritten when the run returned), and a second run is a new one.
                wandb.finish()

"""The pipeline's stages: each runs one package's work and records it in the manifest.

torch and transformers are imported inside the stages that need them, so the
CLI (and `--help`) stays fast.
"""

from __future__ import annotations

import hashlib
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.dataset import TokenizedData, read_sequences, tokenize
from pipeline.errors import RepositoryError
from pipeline.hardware import detect_hardware
from pipeline.planner import ModelFacts, Plan, make_plan
from pipeline.run import Run
from scrapers.scrape import ScrapeResult
from scrapers.scrape import scrape as scrape_repositories

ADAPTER_DIR = "adapter"
BASE_MODEL_DIR = "base_model"
CHECKPOINT_DIR = "checkpoints"


def say(message: str) -> None:
    """Progress for the person at the terminal; stdout is kept for results."""
    print(message, file=sys.stderr, flush=True)


def scrape(run: Run, repos: list[str]) -> ScrapeResult:
    with run.stage("scrape"):
        result = scrape_repositories(repos, run.config.scrape, run.output_dir)
    infos = [vars(scraped.info) for scraped in result.repositories]
    run.record(repository=infos[0], repositories=infos, scrape=result.to_manifest())
    stats = result.stats
    where = result.repositories[0].info.path if len(infos) == 1 else f"{len(infos)} repositories"
    say(
        f"scraped {stats.commits_seen} commits of {where} in {result.duration_s:.2f} s: "
        f"kept {stats.commits_kept} ({result.sequences['train']} train / {result.sequences['eval']} eval sequences), "
        f"skipped: {stats.skipped_summary()}"
        + (f"; redacted {sum(stats.redactions.values())} secrets" if stats.redactions else "")
    )
    return result


@dataclass(frozen=True)
class Prepared:
    tokenizer: Any
    facts: ModelFacts
    data: TokenizedData


def prepare(run: Run, scraped: ScrapeResult) -> Prepared:
    from pipeline.model import load_tokenizer

    texts = [
        record["text"] for record in read_sequences(scraped.sequences_path) if record["split"] == "train"
    ]
    if not texts:
        where = ", ".join(r.info.path for r in scraped.repositories)
        raise RepositoryError(
            f"{where}: no commit survived the filters (skipped: {scraped.stats.skipped_summary()}); nothing to train on"
        )
    with run.stage("tokenize"):
        tokenizer, facts = load_tokenizer(run.config.train.model, texts)
        data = tokenize(texts, tokenizer)
    run.record(
        model={
            "name": facts.name,
            "random_init": facts.random_init,
            "note": "randomly initialised base model (no download): the adapter shows the pipeline works, "
            "not what a pretrained model would learn"
            if facts.random_init
            else None,
            "max_positions": facts.max_positions,
            "vocab_size": len(tokenizer),
        },
        dataset=data.to_manifest(),
    )
    return Prepared(tokenizer, facts, data)


def plan(run: Run, prepared: Prepared) -> Plan:
    with run.stage("plan"):
        hardware = detect_hardware()
        result = make_plan(prepared.data.stats(), hardware, prepared.facts, run.loaded)
    run.record(hardware=hardware.to_manifest(), training_parameters=result.to_manifest())
    say(format_plan(result))
    return result


def format_plan(plan: Plan) -> str:
    rows = [("parameter", "value", "source", "reason")]
    rows += [(name, _show(d.value), d.source, d.reason) for name, d in plan.decisions.items()]
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    return "\n".join(
        f"  {row[0]:<{widths[0]}}  {row[1]:<{widths[1]}}  {row[2]:<{widths[2]}}  {row[3]}" for row in rows
    )


def _show(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def train(run: Run, prepared: Prepared, plan: Plan) -> None:
    from pipeline.dataset import training_blocks
    from pipeline.model import attach_lora, build_model
    from pipeline.monitor import HardwareMonitor, import_nvml
    from pipeline.trainer import TrainingHistory, quiet_library_output
    from pipeline.trainer import train as run_trainer

    quiet_library_output()

    config = run.config
    tokenizer = prepared.tokenizer
    with run.stage("pack"):
        dataset, packed = training_blocks(prepared.data, plan["sequence_length"], tokenizer.pad_token_id)
    run.doc["dataset"].update(
        {
            "train_blocks": len(packed.input_ids),
            "block_size": plan["sequence_length"],
            "real_tokens": packed.real_tokens,
            "packing_efficiency": round(packed.efficiency, 4),
            "packing_method": "position_ids restart per sequence (block-diagonal causal attention)",
        }
    )
    with run.stage("load_model"):
        model = build_model(config.train.model, tokenizer, plan["seed"], dtype=plan["precision"])
        base_dir = None
        if prepared.facts.random_init:
            # A random base cannot be downloaded again: keep it beside the adapter.
            base_dir = run.output_dir / BASE_MODEL_DIR
            model.save_pretrained(base_dir)
            tokenizer.save_pretrained(base_dir)
            model.name_or_path = str(base_dir.resolve())
        model = attach_lora(model, config.lora, plan["base_modules_trained"])
    trainable, total = _parameter_counts(model)
    run.doc["model"].update({"parameters_total": total, "parameters_trainable": trainable})

    monitor = HardwareMonitor(config.monitor.collection_interval_seconds, import_nvml())

    shown_step = 0

    def record_progress() -> None:
        nonlocal shown_step
        report = history.report()
        report["hardware"] = monitor.report()
        last = history.loss_history[-1] if history.loss_history else {}
        run.doc["run"].update(current_step=last.get("step"), latest_loss=last.get("loss"))
        run.record(training_report=report)
        if last and last["step"] != shown_step:
            shown_step = last["step"]
            loss = "not finite" if last["loss"] is None else f"{last['loss']:.4f}"
            say(
                f"  step {shown_step}/{plan['total_steps']}  loss {loss}  lr {history.lr_history[-1]['learning_rate']:.2e}"
            )

    history = TrainingHistory(packed.real_tokens, config.monitor.include_epoch_summary, record_progress)
    say(f"training {plan['total_steps']} steps on {plan['device']} ({trainable:,} trainable parameters)")
    with run.stage("train"), monitor:
        run_trainer(model, dataset, plan, config, run.output_dir / CHECKPOINT_DIR, history)
    record_progress()

    with run.stage("save"):
        adapter_dir = run.output_dir / ADAPTER_DIR
        model.save_pretrained(adapter_dir)
        tokenizer.save_pretrained(adapter_dir)
    run.record(outputs=_outputs(run, adapter_dir, base_dir))


def _parameter_counts(model) -> tuple[int, int]:
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return trainable, sum(p.numel() for p in model.parameters())


def _outputs(run: Run, adapter_dir: Path, base_dir: Path | None) -> dict[str, Any]:
    files = [
        {"path": str(path.relative_to(run.output_dir)), "bytes": path.stat().st_size, "sha256": _sha256(path)}
        for path in sorted(adapter_dir.rglob("*"))
        if path.is_file()
    ]
    return {
        "output_dir": str(run.output_dir.resolve()),
        "adapter_dir": str(adapter_dir.resolve()),
        "adapter_files": files,
        "base_model_dir": str(base_dir.resolve()) if base_dir else None,
        "sequences_path": str((run.output_dir / "sequences.jsonl").resolve()),
        "manifest_path": str(run.manifest_path.resolve()),
    }


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()

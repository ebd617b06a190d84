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

import orjson

from pipeline.dataset import TokenizedData, read_sequences, tokenize
from pipeline.distributed import launch_for_profile, launch_from_environment
from pipeline.errors import RepositoryError
from pipeline.hardware import detect_hardware, load_hardware_profile
from pipeline.manifest import tool_info
from pipeline.planner import ModelFacts, Plan, make_plan
from pipeline.run import Run
from scrapers.git import open_repository
from scrapers.scrape import SEQUENCES_FILE
from scrapers.scrape import scrape as scrape_repositories

ADAPTER_DIR = "adapter"
BASE_MODEL_DIR = "base_model"
CHECKPOINT_DIR = "checkpoints"


def say(message: str) -> None:
    """Progress for the person at the terminal; stdout is kept for results."""
    print(message, file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Scraped:
    sequences_path: Path
    where: str
    """The repository path(s), for messages."""
    skipped: str
    """Commits skipped by reason, for messages."""


def scrape(run: Run, repos: list[str], reuse: bool = False) -> Scraped:
    """Scrape the repositories, or, with `reuse`, take the output directory's scrape when nothing changed."""
    key = scrape_provenance(repos, run)
    previous = run.previous or {}
    sequences_path = run.output_dir / SEQUENCES_FILE
    if reuse and (previous.get("scrape") or {}).get("provenance_key") == key and sequences_path.exists():
        section = {**previous["scrape"], "reused": True}
        run.record(repository=previous["repository"], repositories=previous["repositories"], scrape=section)
        say(f"reusing the scrape in {run.output_dir} (same repositories, HEADs and scrape config)")
        return Scraped(sequences_path, _where(previous["repositories"]), _skipped(section["skipped"]))
    with run.stage("scrape"):
        result = scrape_repositories(repos, run.config.scrape, run.output_dir)
    infos = [vars(scraped.info) for scraped in result.repositories]
    section = {**result.to_manifest(), "provenance_key": key, "reused": False}
    run.record(repository=infos[0], repositories=infos, scrape=section)
    stats = result.stats
    say(
        f"scraped {stats.commits_seen} commits of {_where(infos)} in {result.duration_s:.2f} s: "
        f"kept {stats.commits_kept} ({result.sequences['train']} train / {result.sequences['eval']} eval sequences), "
        f"skipped: {stats.skipped_summary()}"
        + (f"; redacted {sum(stats.redactions.values())} secrets" if stats.redactions else "")
    )
    return Scraped(result.sequences_path, _where(infos), stats.skipped_summary())


def scrape_provenance(repos: list[str], run: Run) -> str:
    """What a scrape's output depends on: this tool, the repositories at their HEADs, the scrape config."""
    heads = []
    for repo in repos:
        opened = open_repository(repo)
        heads.append([str(Path(opened.git_dir).resolve()), opened.head.commit.hexsha])
    tool = tool_info()
    payload = {
        "tool": [tool["version"], tool["git_sha"]],
        "repos": heads,
        "config": run.config.to_dict()["scrape"],
    }
    return hashlib.sha256(orjson.dumps(payload, option=orjson.OPT_SORT_KEYS)).hexdigest()


def _where(infos: list[dict[str, Any]]) -> str:
    return infos[0]["path"] if len(infos) == 1 else f"{len(infos)} repositories"


def _skipped(skipped: dict[str, int]) -> str:
    return ", ".join(f"{reason} {count}" for reason, count in sorted(skipped.items())) or "none"


@dataclass(frozen=True)
class Prepared:
    tokenizer: Any
    model_config: Any
    facts: ModelFacts
    data: TokenizedData


def prepare(run: Run, scraped: Scraped) -> Prepared:
    """Tokenizer (trained, for tiny), the model's architecture facts, and the tokenized training split."""
    from pipeline.model import describe_model, load_tokenizer, model_config

    texts = [
        record["text"] for record in read_sequences(scraped.sequences_path) if record["split"] == "train"
    ]
    if not texts:
        raise RepositoryError(
            f"{scraped.where}: no commit survived the filters (skipped: {scraped.skipped}); nothing to train on"
        )
    with run.stage("tokenize"):
        tokenizer = load_tokenizer(run.config.train.model, texts)
        config = model_config(run.config.train.model, tokenizer)
        facts = describe_model(run.config.train.model, config)
        data = tokenize(texts, tokenizer)
    run.record(
        model={
            "name": facts.name,
            "random_init": facts.random_init,
            "note": "randomly initialised base model (no download): the adapter shows the pipeline works, "
            "not what a pretrained model would learn"
            if facts.random_init
            else None,
            "parameters_total": facts.parameters,
            "parameters_trainable": None,
            "hidden_size": facts.hidden_size,
            "num_layers": facts.num_layers,
            "vocab_size": len(tokenizer),
            "max_positions": facts.max_positions,
        },
        dataset=data.to_manifest(),
    )
    return Prepared(tokenizer, config, facts, data)


def plan(run: Run, prepared: Prepared, hardware_profile: str | None = None) -> Plan:
    """Detect (or load) the hardware and plan; the decisions go to `.training_parameters`."""
    with run.stage("plan"):
        if hardware_profile:
            hardware = load_hardware_profile(hardware_profile)
            launch = launch_for_profile(hardware)
        else:
            hardware = detect_hardware()
            launch = launch_from_environment()
        result = make_plan(prepared.data.stats(), hardware, prepared.facts, run.loaded, launch)
    run.hardware, run.launch = hardware, launch
    run.record(hardware=hardware.to_manifest(), training_parameters=result.to_manifest())
    return result


def format_plan(plan: Plan) -> str:
    rows = [("parameter", "value", "source", "reason")]
    rows += [(name, _show(d.value), d.source, d.reason) for name, d in plan.decisions.items()]
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    return "\n".join(
        f"  {row[0]:<{widths[0]}}  {row[1]:<{widths[1]}}  {row[2]:<{widths[2]}}  {row[3]}" for row in rows
    )


def _show(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, list):
        return ",".join(map(str, value)) or "-"
    return str(value)


@dataclass
class Loaded:
    """The model ready to train and the packed training blocks."""

    model: Any
    dataset: Any
    packed: Any
    base_dir: Path | None


def load_for_training(run: Run, prepared: Prepared, plan: Plan) -> Loaded:
    from pipeline.dataset import training_blocks
    from pipeline.model import attach_lora, build_model

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
        model = build_model(
            run.config.train.model, prepared.model_config, plan["seed"], plan["precision"], plan["attention"]
        )
        base_dir = None
        if prepared.facts.random_init:
            # A random base cannot be downloaded again: keep it beside the adapter.
            base_dir = run.output_dir / BASE_MODEL_DIR
            model.save_pretrained(base_dir)
            tokenizer.save_pretrained(base_dir)
            model.name_or_path = str(base_dir.resolve())
        model = attach_lora(model, run.config.lora, plan["base_modules_trained"])
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    run.doc["model"]["parameters_trainable"] = trainable
    return Loaded(model, dataset, packed, base_dir)


def probe_and_replan(run: Run, prepared: Prepared, plan: Plan, loaded: Loaded | None = None) -> Plan:
    """On CUDA, measure the largest micro-batch that fits and plan again with it (same effective batch).
    Loads the model when `loaded` is not given (the `plan` command)."""
    reason = _probe_skipped(run, plan)
    if reason:
        run.doc["training_parameters"]["batch_probe_note"] = reason
        run.save()
        return plan
    from pipeline.probe import cuda_step, probe_batch_sizes

    loaded = loaded or load_for_training(run, prepared, plan)
    largest = plan["effective_batch_size"] // plan["world_size"]
    gpu = min(run.hardware.gpus, key=lambda g: g.memory_gb)
    loaded.model.cuda()
    with run.stage("batch_probe"):
        step = cuda_step(loaded.model, loaded.dataset, plan["precision"], largest)
        rows = probe_batch_sizes(step, largest, gpu.memory_gb, run.config.plan.probe_headroom)
    replanned = make_plan(prepared.data.stats(), run.hardware, prepared.facts, run.loaded, run.launch, rows)
    run.record(training_parameters={**replanned.to_manifest(), "batch_probe_note": None})
    say(
        f"batch probe: {[(row.batch_size, row.peak_memory_gb, row.fits) for row in rows]} → micro-batch {replanned['batch_size']}"
    )
    return replanned


def _probe_skipped(run: Run, plan: Plan) -> str | None:
    if not run.config.plan.batch_probe:
        return "plan.batch_probe is off"
    if run.hardware.source != "detected":
        return f"skipped: planning for {run.hardware.source}, which is not this machine"
    if plan["device"] != "cuda":
        return f"skipped: the probe measures GPU memory and the device is {plan['device']}"
    if run.loaded.explicit("plan.batch_size"):
        return "skipped: plan.batch_size was set explicitly"
    return None


def train(run: Run, prepared: Prepared, plan: Plan, loaded: Loaded) -> None:
    from pipeline.monitor import HardwareMonitor, import_nvml
    from pipeline.trainer import TrainingHistory, quiet_library_output
    from pipeline.trainer import train as run_trainer

    quiet_library_output()
    config = run.config
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

    history = TrainingHistory(
        loaded.packed.real_tokens, config.monitor.include_epoch_summary, record_progress
    )
    trainable = run.doc["model"]["parameters_trainable"]
    say(f"training {plan['total_steps']} steps on {plan['device']} ({trainable:,} trainable parameters)")
    with run.stage("train"), monitor:
        run_trainer(loaded.model, loaded.dataset, plan, config, run.output_dir / CHECKPOINT_DIR, history)
    record_progress()

    with run.stage("save"):
        adapter_dir = run.output_dir / ADAPTER_DIR
        loaded.model.save_pretrained(adapter_dir)
        prepared.tokenizer.save_pretrained(adapter_dir)
    run.record(outputs=_outputs(run, adapter_dir, loaded.base_dir))


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
        "sequences_path": str((run.output_dir / SEQUENCES_FILE).resolve()),
        "manifest_path": str(run.manifest_path.resolve()),
    }


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()

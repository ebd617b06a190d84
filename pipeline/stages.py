"""The pipeline's stages: each runs one package's work and records it in the manifest.

torch and transformers are imported inside the stages that need them, so the
CLI (and `--help`) stays fast.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from pipeline.dataset import PackedSplit, read_sequences
from pipeline.distributed import launch_for_profile
from pipeline.errors import PipelineError, RepositoryError
from pipeline.examples import TextStyle
from pipeline.hardware import GB, detect_hardware, load_hardware_profile
from pipeline.manifest import sha256_file
from pipeline.planner import DataStats, ModelFacts, Plan, Speed, make_plan, text_style
from pipeline.run import Run
from pipeline.token_cache import TokenCache, provenance_hash
from scrapers.git import open_repository
from scrapers.scrape import SEQUENCES_FILE
from scrapers.scrape import scrape as scrape_repositories
from scrapers.shard import describe_counts

MIN_STEPS_FOR_SPEED = 5  # a run this long measures its speed well enough for the next run's budget
TRAINING_TIME_LIMIT = 0.9  # of a time budget: training stops here even if the planned steps are not done
ADAPTER_DIR = "adapter"
BASE_MODEL_DIR = "base_model"
CHECKPOINT_DIR = "checkpoints"


def say(message: str) -> None:
    """Progress for the person at the terminal (rank 0 only, under torchrun); stdout is kept for results."""
    if os.environ.get("RANK", "0") == "0":
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
        return Scraped(sequences_path, _where(previous["repositories"]), describe_counts(section["skipped"]))
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
        try:
            opened = open_repository(repo)
            heads.append([str(Path(opened.git_dir).resolve()), opened.head.commit.hexsha])
        except RepositoryError:  # the scrape reports it (and skips it, if others can be scraped)
            heads.append([str(repo), None])
    tool = run.doc["tool"]
    payload = {
        "tool": [tool["version"], tool["git_sha"]],
        "repos": heads,
        "config": run.config.to_dict()["scrape"],
    }
    return provenance_hash(payload)


def _where(infos: list[dict[str, Any]]) -> str:
    return infos[0]["path"] if len(infos) == 1 else f"{len(infos)} repositories"


@dataclass(frozen=True)
class Prepared:
    tokenizer: Any
    model_config: Any
    facts: ModelFacts
    cache: TokenCache
    stats: DataStats
    """Token-length histogram of the training split."""
    eval_tokens: int
    """Tokens of the held-out sequences (0: nothing is held out)."""
    style: TextStyle
    """How records became tokens (evaluation prompts are rendered the same way)."""


def cache_root(run: Run) -> Path:
    return (
        Path(run.config.output.cache_dir).expanduser()
        if run.config.output.cache_dir
        else run.output_dir / "cache"
    )


def prepare(run: Run, scraped: Scraped) -> Prepared:
    """Tokenize into the provenance-keyed cache (or load it), and describe the model for the planner."""
    from pipeline.model import (
        describe_model,
        load_saved_tokenizer,
        model_config,
        pretrained_tokenizer,
        quiet_library_output,
        tokenizer_recipe,
        train_tiny_tokenizer,
    )
    from pipeline.token_cache import cache_key, open_or_build, tokenize_sequences

    quiet_library_output()
    model_name = run.config.train.model
    if not run.doc["scrape"]["split"]["train_sequences"]:
        raise RepositoryError(
            f"{scraped.where}: no commit survived the filters (skipped: {scraped.skipped}); nothing to train on"
        )

    with run.stage("tokenize"):
        pretrained = pretrained_tokenizer(model_name)  # loaded once: for the key, and to tokenize on a miss
        style = text_style(run.loaded, model_name, bool(pretrained is not None and pretrained.chat_template))
        max_tokens = (run.config.train.max_sequence_length, run.config.train.max_prompt_tokens)

        def build(staging: Path) -> dict[str, int]:  # only on a cache miss: a hit reads none of the sequences
            records = list(read_sequences(scraped.sequences_path))
            tokenizer = (
                pretrained
                if pretrained is not None
                else train_tiny_tokenizer(record["text"] for record in records if record["split"] == "train")
            )
            tokenizer.save_pretrained(staging / "tokenizer")
            return tokenize_sequences(records, tokenizer, style, max_tokens, staging)

        key = cache_key(
            run.doc["scrape"]["provenance_key"], model_name, tokenizer_recipe(pretrained), style, max_tokens
        )
        cache = open_or_build(cache_root(run), key, build)
        tokenizer = load_saved_tokenizer(cache.directory / "tokenizer")
        config = model_config(model_name, tokenizer)
        facts = describe_model(model_name, config, tokenizer)
        stats = cache.stats()
    meta = cache.meta()
    run.record(
        model={
            "name": facts.name,
            "random_init": facts.random_init,
            "pretrained": not facts.random_init,
            "source": facts.source,
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
        dataset={
            "cache": cache.to_manifest(),
            "train_sequences": meta["train_sequences"],
            "eval_sequences": meta["eval_sequences"],
            "train_tokens": meta["train_tokens"],
            "eval_tokens": meta["eval_tokens"],
            "token_length_median": stats.percentile(50),
            "token_length_p95": stats.percentile(95),
            "token_length_max": max(stats.length_counts),
        },
    )
    say(f"token cache {'hit' if cache.hit else 'built'}: {cache.directory} ({cache.seconds:.2f} s)")
    return Prepared(tokenizer, config, facts, cache, stats, meta["eval_tokens"], style)


def plan(run: Run, prepared: Prepared, hardware_profile: str | None = None) -> Plan:
    """Detect (or load) the hardware and plan; the decisions go to `.training_parameters`."""
    with run.stage("plan"):
        if hardware_profile:
            run.hardware = load_hardware_profile(hardware_profile)
            run.planned_launch = launch_for_profile(run.hardware)
        else:
            run.hardware, run.planned_launch = detect_hardware(), run.launch
        result = _make_plan(run, prepared)
    run.record(hardware=run.hardware.to_manifest(), training_parameters=result.to_manifest())
    return result


def _make_plan(
    run: Run, prepared: Prepared, probe=(), oom_cap: int | None = None, speed: Speed | None = None
) -> Plan:
    """The plan for this data on the hardware and launch the plan stage chose (after a probe, a speed
    measurement, or an OOM)."""
    return make_plan(
        prepared.stats,
        run.hardware,
        prepared.facts,
        run.loaded,
        run.planned_launch,
        probe,
        oom_cap,
        prepared.eval_tokens,
        speed,
    )


def cache_summary(run: Run) -> str:
    """What `prepare` made: the cache key and place, and the counts."""
    dataset, cache = run.doc["dataset"], run.doc["dataset"]["cache"]
    state = "found" if cache["hit"] else f"built in {cache['seconds']:.2f} s"
    return "\n".join(
        [
            f"token cache {cache['key']} ({state})",
            f"  location   {cache['dir']}",
            f"  sequences  {dataset['train_sequences']} train, {dataset['eval_sequences']} held out",
            f"  tokens     {dataset['train_tokens']} train, {dataset['eval_tokens']} held out",
            f"  blocks     {dataset['train_blocks']} train, {dataset['eval_blocks']} held out, of {dataset['block_size']} tokens "
            f"({dataset['packing_efficiency']:.1%} filled)",
            f"  took       {run.doc['total_execution_time_seconds']:.2f} s",
        ]
    )


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


@dataclass(frozen=True)
class Setup:
    """What every rank needs before training: the prepared data, the plan, the packed blocks."""

    prepared: Prepared
    plan: Plan
    train: PackedSplit | None
    eval: dict[str, PackedSplit] | None
    """Held-out blocks by format."""


def prepare_training(run: Run, repos: list[str]) -> Setup:
    """Rank 0 scrapes, tokenizes, plans and packs; the other ranks wait for it and receive the result."""

    def on_rank_zero() -> Setup:
        prepared = prepare(run, scrape(run, repos, reuse=True))
        decisions = plan(run, prepared)
        return Setup(prepared, decisions, *pack(run, prepared, decisions))

    return run.coordinator.share(on_rank_zero)


def pack(run: Run, prepared: Prepared, plan: Plan) -> tuple[PackedSplit, dict[str, PackedSplit]]:
    """The training blocks, and the held-out blocks of each format (scored apart: a commit message
    and a change are different tasks)."""
    from pipeline.dataset import packed_blocks

    tokenizer, cache, length = prepared.tokenizer, prepared.cache, plan["sequence_length"]
    cut = plan["truncate_at"]
    with run.stage("pack"):
        train = packed_blocks(
            cache.directory, cache.split("train"), "train", length, tokenizer.pad_token_id, cut
        )
        held_out = {}
        if prepared.eval_tokens:
            import pyarrow.compute as pc

            split = cache.split("eval")
            for name in sorted(set(split.column("format").to_pylist())):
                rows = split.filter(pc.equal(split.column("format"), name))
                held_out[name] = packed_blocks(
                    cache.directory, rows, f"eval-{name}", length, tokenizer.pad_token_id, cut
                )
    run.doc["dataset"].update(
        {
            "block_size": length,
            "train_blocks": train.blocks,
            "eval_blocks": sum(split.blocks for split in held_out.values()),
            "real_tokens": train.real_tokens,
            "packing_efficiency": round(train.efficiency, 4),
            "packing_method": "best-fit-decreasing blocks; position_ids restart per sequence "
            f"(block-diagonal causal attention with {plan['attention']}); first label of each sequence masked"
            + (
                "; prompt tokens masked (loss on the answer only)"
                if prepared.style.loss_on == "response"
                else ""
            )
            + (
                f"; a sequence longer than {cut} tokens keeps its first {cut}"
                if cut
                else f"; a sequence longer than {length} tokens is split into {length}-token pieces"
            ),
        }
    )
    return train, held_out


@dataclass
class Loaded:
    model: Any
    base_dir: Path | None


def load_model(run: Run, setup: Setup) -> Loaded:
    """The base model with LoRA attached (every rank builds its own copy)."""
    from pipeline.model import attach_lora, build_model, quiet_library_output

    quiet_library_output()  # on every rank: the others skip `prepare`, where rank 0 did this
    prepared, plan = setup.prepared, setup.plan
    device = f"cuda:{run.launch.local_rank}" if plan["device"] == "cuda" else plan["device"]
    with run.stage("load_model"):
        model = build_model(
            run.config.train.model,
            prepared.model_config,
            plan["seed"],
            plan["precision"],
            plan["attention"],
            plan["quantization"],
            device,
        )
        run.doc["model"].update(
            quantization=plan["quantization"], weights_gb=round(model.get_memory_footprint() / GB, 3)
        )
        base_dir = None
        if prepared.facts.random_init:
            # A random base cannot be downloaded again: keep it beside the adapter.
            base_dir = run.output_dir / BASE_MODEL_DIR
            if run.launch.writes:
                model.save_pretrained(base_dir)
                prepared.tokenizer.save_pretrained(base_dir)
            model.name_or_path = str(base_dir.resolve())
        model = attach_lora(model, run.config.lora, plan["base_modules_trained"], plan["lora_dropout"])
    run.doc["model"]["parameters_trainable"] = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return Loaded(model, base_dir)


def probe_and_replan(run: Run, setup: Setup, loaded: Loaded | None = None, resume: bool = False) -> Setup:
    """Measure what the plan needs from this machine, and plan again: on CUDA the largest micro-batch
    that fits (same effective batch), under a time budget the training speed (then the newest
    sequences that fit are packed). Packs and loads the model itself when not given them (`plan`).
    `resume`: the interrupted run's measured speed is taken again, so the plan (and its data) match
    the checkpoint's."""
    plan, prepared = setup.plan, setup.prepared
    probe_skipped, speed_skipped = _probe_skipped(run, plan), _speed_skipped(run, plan)
    run.doc["training_parameters"]["batch_probe_note"] = probe_skipped
    if probe_skipped and speed_skipped:
        run.save()
        return setup
    train = setup.train or pack(run, prepared, plan)[0]
    loaded = loaded or load_model(run, Setup(prepared, plan, train, None))
    rows = plan.probe
    if not probe_skipped:
        from pipeline.probe import cuda_step, probe_batch_sizes

        largest = plan["effective_batch_size"] // plan["world_size"]
        gpu = min(run.hardware.gpus, key=lambda g: g.memory_gb)
        loaded.model.cuda()
        with run.stage("batch_probe"):
            step = cuda_step(loaded.model, train.dataset(), plan["precision"], largest)
            rows = probe_batch_sizes(step, largest, gpu.memory_gb, run.config.plan.probe_headroom)
        plan = _make_plan(run, prepared, rows)
        say(
            f"batch probe: {[(row.batch_size, row.peak_memory_gb, row.fits) for row in rows]} → micro-batch {plan['batch_size']}"
        )
    speed = None
    if not speed_skipped:
        from pipeline.probe import remembered_speed, speed_key, training_speed

        speed = _resumed_speed(run) if resume else None
        speed = speed or remembered_speed(speed_key(run.hardware, prepared.facts.name, plan))
        if speed is None:
            with run.stage("speed_probe"):
                speed = training_speed(
                    loaded.model,
                    train.dataset(),
                    plan["precision"],
                    plan["gradient_checkpointing"],
                    plan["loss_average"] == "answer",
                )
        plan = _make_plan(run, prepared, rows, speed=speed)
        say(
            f"training speed {speed.tokens_per_s:.0f} tokens/s, measured by {speed.how}: "
            f"{plan['train_sequences']} of {prepared.stats.sequences} sequences fit the "
            f"{plan['time_budget_s']:.0f} s budget"
        )
    run.record(training_parameters={**plan.to_manifest(), "batch_probe_note": probe_skipped})
    return Setup(prepared, plan, _bounded(run, prepared, plan, train), setup.eval)


def show_plan(setup: Setup) -> None:
    """The plan's decisions, for the person at the terminal (the final plan, after any measurement)."""
    say(format_plan(setup.plan))


def _resumed_speed(run: Run) -> Speed | None:
    measured = ((run.previous or {}).get("training_parameters") or {}).get("measured_tokens_per_s")
    return Speed(measured, "the run being resumed, whose plan it keeps") if measured else None


def _speed_skipped(run: Run, plan: Plan) -> str | None:
    if not plan["time_budget_s"]:
        return "no time budget"
    if run.launch.world_size > 1:  # (only rank 0 knows the hardware it planned for)
        return "several processes: set plan.batch_size and train.epochs instead of a time budget"
    if run.hardware.source != "detected":
        return f"planning for {run.hardware.source}, which is not this machine"
    return None


def _bounded(run: Run, prepared: Prepared, plan: Plan, train: PackedSplit) -> PackedSplit:
    """The training blocks the plan keeps: all, or those of the newest sequences a time budget fits
    (packed apart and cached under their count)."""
    from pipeline.dataset import packed_blocks

    kept, total = plan["train_sequences"], prepared.stats.sequences
    if kept >= total:
        return train
    cache = prepared.cache
    with run.stage("pack"):
        newest = packed_blocks(
            cache.directory,
            cache.split("train").slice(0, kept),
            f"train-newest-{kept}",
            plan["sequence_length"],
            prepared.tokenizer.pad_token_id,
            plan["truncate_at"],
        )
    left_out = prepared.stats.tokens - sum(prepared.stats.newest_first[:kept])
    run.doc["dataset"].update(
        train_blocks=newest.blocks,
        real_tokens=newest.real_tokens,
        packing_efficiency=round(newest.efficiency, 4),
        left_out={"sequences": total - kept, "tokens": left_out, "reason": "time budget (train.time_budget)"},
    )
    return newest


def _probe_skipped(run: Run, plan: Plan) -> str | None:
    if not run.config.plan.batch_probe:
        return "plan.batch_probe is off"
    if run.launch.world_size > 1:
        return "skipped with several processes: probe once on one GPU (the `plan` command) or set plan.batch_size"
    if run.hardware.source != "detected":
        return f"skipped: planning for {run.hardware.source}, which is not this machine"
    if plan["device"] != "cuda":
        return f"skipped: the probe measures GPU memory and the device is {plan['device']}"
    if run.loaded.explicit("plan.batch_size"):
        return "skipped: plan.batch_size was set explicitly"
    if run.config.distributed.fsdp or run.config.distributed.deepspeed:
        return "skipped: FSDP/DeepSpeed shard the model; set plan.batch_size"
    return None


def train(run: Run, setup: Setup, loaded: Loaded, resume: bool = False) -> None:
    """Evaluate, train (resuming, retrying out-of-memory), evaluate again, save the adapter (rank 0)."""
    from pipeline.evaluation import evaluation_report, format_evaluation, task_prompts
    from pipeline.model import AdapterFacts, record_base
    from pipeline.monitor import HardwareMonitor, import_nvml
    from pipeline.trainer import Job, TrainingHistory
    from pipeline.trainer import train as run_trainer

    config, prepared, plan = run.config, setup.prepared, setup.plan
    # One sampler per node: the local rank 0 of each.
    monitor = HardwareMonitor(
        config.monitor.collection_interval_seconds, import_nvml() if run.launch.local_rank == 0 else None
    )
    progress = _Progress(run, monitor)
    history = TrainingHistory(setup.train.real_tokens, config.monitor.include_epoch_summary, progress)
    held_out = {name: split.dataset(plan["eval_blocks"]) for name, split in (setup.eval or {}).items()}
    stamp = {
        "dataset_fingerprint": f"{prepared.cache.key}:{plan['sequence_length']}:{setup.train.blocks}",
        "effective_batch_size": plan["effective_batch_size"],
        "total_steps": plan["total_steps"],
    }
    checkpoints = run.output_dir / CHECKPOINT_DIR
    dataset = setup.train.dataset()
    job = Job(
        loaded.model,
        dataset,
        held_out or None,
        plan,
        config,
        checkpoints,
        history,
        stamp,
        agree=run.coordinator.any,
    )
    if plan["time_budget_s"]:
        job.time_limit_s = plan["time_budget_s"] * TRAINING_TIME_LIMIT
    progress.job = job
    if resume:
        _resume(run, job)
    writes = run.launch.writes
    prompts = []
    if writes and plan["eval_samples"]:
        records = read_sequences(run.output_dir / SEQUENCES_FILE)
        prompts = task_prompts(
            records, prepared.tokenizer, prepared.style, plan["eval_samples"], config.train.max_prompt_tokens
        )
    note = None if held_out else "no held-out commits: fewer than 20 were kept, or scrape.eval_fraction is 0"

    with run.stage("evaluate_before"):
        before, tasks_before, samples_before = _evaluate(run, loaded.model, prepared, plan, held_out, prompts)
    run.record(
        training_report={
            "evaluation": evaluation_report(before, None, tasks_before, None, samples_before, [], [], note)
        }
    )

    trainable = run.doc["model"]["parameters_trainable"]
    say(
        f"training {plan['total_steps']} steps on {plan['device']} × {plan['world_size']} ({trainable:,} trainable parameters)"
    )
    with run.stage("train"), monitor:
        _, final_plan = run_trainer(job, *_out_of_memory_handlers(run, setup))
    if history.time_limit:
        say(
            f"stopped at step {history.time_limit['step']} of {plan['total_steps']}: the time budget's limit "
            f"({history.time_limit['limit_s']:.0f} s of training) was reached; the speed was measured at "
            f"{plan['measured_tokens_per_s']} tokens/s"
        )

    with run.stage("evaluate_after"):
        after, tasks_after, samples_after = _evaluate(
            run, loaded.model, prepared, final_plan, held_out, prompts
        )
    report = run.doc["training_report"]
    report["evaluation"] = evaluation_report(
        before, after, tasks_before, tasks_after, samples_before, samples_after, history.eval_history, note
    )
    progress()
    _record_throughput(run, history, final_plan, monitor, setup.train.efficiency)
    for line in format_evaluation(report["evaluation"]):
        say(line)

    if writes:
        with run.stage("save"):
            adapter_dir = run.output_dir / ADAPTER_DIR
            loaded.model.save_pretrained(adapter_dir)
            record_base(adapter_dir, AdapterFacts(config.train.model, prepared.style, plan["quantization"]))
            prepared.tokenizer.save_pretrained(adapter_dir)
        run.record(outputs=_outputs(run, adapter_dir, loaded.base_dir))


def _evaluate(run: Run, model, prepared: Prepared, plan: Plan, held_out: dict[str, Any], prompts: list):
    """Held-out loss on every rank (the same on each); the task metrics on rank 0, which has the prompts."""
    import torch

    from pipeline.evaluation import held_out_loss, run_tasks

    device = (
        torch.device("cuda", run.launch.local_rank)
        if plan["device"] == "cuda"
        else torch.device(plan["device"])
    )
    model.to(device)
    loss = held_out_loss(model, held_out, plan["batch_size"], plan["precision"])
    if not prompts:
        return loss, None, []
    eval_config = run.config.eval
    tokens = {"message": eval_config.message_tokens, "diff": eval_config.diff_tokens}
    scores, samples = run_tasks(model, prepared.tokenizer, prepared.style, prompts, tokens, plan["precision"])
    return loss, scores, samples


class _Progress:
    """After every log: the live manifest (history so far, this node's hardware, step, loss) and,
    for each new step, one progress line."""

    def __init__(self, run: Run, monitor):
        self.run, self.monitor = run, monitor
        self.job = None
        self.shown_step: int | None = None

    def __call__(self) -> None:
        run, history = self.run, self.job.history
        report = {**history.report(), "hardware": self.monitor.report()}
        report["evaluation"] = {**run.doc["training_report"]["evaluation"], "history": history.eval_history}
        last = history.loss_history[-1] if history.loss_history else {}
        run.doc["run"].update(current_step=last.get("step"), latest_loss=last.get("loss"))
        run.record(training_report={**run.doc["training_report"], **report})
        if last and last["step"] != self.shown_step:
            self.shown_step = last["step"]
            loss = "not finite" if last["loss"] is None else f"{last['loss']:.4f}"
            rate = history.lr_history[-1]["learning_rate"]
            say(f"  step {last['step']}/{self.job.plan['total_steps']}  loss {loss}  lr {rate:.2e}")


def _record_throughput(run: Run, history, plan: Plan, monitor, efficiency: float) -> None:
    """Throughput over every rank, and each node's hardware (gathered from the nodes' local rank 0)."""
    import socket

    from pipeline.hardware import usable_cores
    from pipeline.performance import throughput_report

    node = run.launch.rank // max(1, run.launch.local_world_size)
    mine = {"tokens": history.trained_tokens, "blocks": history.blocks}
    if run.launch.local_rank == 0:
        mine["hardware"] = {"node": node, "hostname": socket.gethostname(), **monitor.report()}
    gathered = run.coordinator.gather(mine)
    if not run.launch.writes:
        return
    history.trained_tokens = sum(part["tokens"] for part in gathered)
    history.blocks = sum(part["blocks"] for part in gathered)
    report = run.doc["training_report"]
    report["hardware"]["nodes"] = [part["hardware"] for part in gathered if "hardware" in part]
    report["throughput"] = throughput_report(history, plan, monitor.report(), usable_cores(), efficiency)
    run.save()
    speed = report["throughput"]["tokens_per_s"]
    if speed and run.hardware.source == "detected" and history.global_step >= MIN_STEPS_FOR_SPEED:
        from pipeline.probe import remember_speed, speed_key

        remember_speed(speed_key(run.hardware, run.doc["model"]["name"], plan), speed)


def _out_of_memory_handlers(run: Run, setup: Setup):
    """What to do after a CUDA out-of-memory: record it, and plan again with half the micro-batch."""
    retries: list[dict[str, Any]] = run.doc["training_parameters"]["oom_retries"]

    def record(retry: dict[str, Any]) -> None:
        if run.launch.world_size > 1:
            raise PipelineError(
                f"CUDA ran out of memory at micro-batch {retry['batch_size']} on one of {run.launch.world_size} "
                "processes; set plan.batch_size lower (or plan.gradient_checkpointing=true) and run again"
            )
        retries.append(retry)
        say(
            f"CUDA out of memory at micro-batch {retry['batch_size']}: retrying with {retry['batch_size'] // 2}"
        )

    def replan(cap: int) -> Plan:
        smaller = _make_plan(run, setup.prepared, setup.plan.probe, cap, setup.plan.speed)
        run.record(training_parameters={**smaller.to_manifest(), "oom_retries": retries})
        return smaller

    return replan, record


def _resume(run: Run, job) -> None:
    job.resume_from = resumable_checkpoint(job.checkpoint_dir, job.stamp)
    log_history = orjson.loads((job.resume_from / "trainer_state.json").read_bytes())["log_history"]
    job.history.resume_from(log_history)
    run.doc["run"]["resumed_from"] = job.resume_from.name
    say(f"resuming from {job.resume_from}")


def resumable_checkpoint(checkpoints: Path, stamp: dict[str, Any]) -> Path:
    """The newest complete checkpoint, if it was trained on the same data with the same batch.

    Complete means repotune's stamp is in it: the stamp is written, atomically, after everything
    the Trainer saves, so a run killed mid-save leaves a checkpoint that is passed over here.
    """
    from pipeline.trainer import STAMP_FILE

    complete = [path for path in checkpoints.glob("checkpoint-*") if (path / STAMP_FILE).exists()]
    if not complete:
        raise PipelineError(
            f"--resume: no checkpoint in {checkpoints} that finished saving; run without --resume to start afresh"
        )
    latest = max(complete, key=lambda path: int(path.name.rsplit("-", 1)[1]))
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


def _outputs(run: Run, adapter_dir: Path, base_dir: Path | None) -> dict[str, Any]:
    files = [
        {
            "path": str(path.relative_to(run.output_dir)),
            "bytes": path.stat().st_size,
            "sha256": sha256_file(path),
        }
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

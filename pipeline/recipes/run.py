"""A run, top to bottom: scrape → data → plan → train → suggest → evaluate → record.

`run` is the sequence; the functions after it are its steps, each a few calls into the stages, which
`update` shares. Torch comes with training: the modules that load it are imported where training begins,
not by `--help` or `scrape`.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from pipeline.base_models import check_available
from pipeline.config import LoadedConfig
from pipeline.data.dataset import keep_newest, pack, validation_blocks
from pipeline.data.sources import files_path
from pipeline.data.sources import scrape as scrape_sources
from pipeline.data.token_cache import prepare
from pipeline.evaluate.scoreboard import after_training, before_training
from pipeline.hardware import machine
from pipeline.plan.planner import (
    first_run_note,
    format_plan,
    plan_for,
    planned_again,
    time_left,
    tokenize_ahead,
)  # fmt: skip
from pipeline.progress import say
from pipeline.record.card import model_card
from pipeline.record.run import Record, open_run
from pipeline.scores import DEFAULT_CODE_SYSTEM
from pipeline.suggest.suggestion import Suggester, for_use, learn_past
from pipeline.train.model import (
    CHECKPOINT_DIR,
    DATA_LIBRARIES,
    TRAINING_LIBRARIES,
    facts_for,
    load_libraries,
    load_model,
    save_adapter,
)
from pipeline.train.probe import measure, remember_speed, resumed_speed, resumed_train_time
from pipeline.types import Data, Loaded, Scores, TrainOutcome


def run(loaded: LoadedConfig, argv: list[str], repos: list[str], resume: bool) -> Record:
    """Scrape → tokenize → plan → pack → load → measure → evaluate → plan for the time left → train →
    evaluate → save. Under torchrun / accelerate launch, rank 0 prepares the data and every rank trains."""
    with open_run(loaded, "run", argv, repos, distributed=True) as record:
        data = record.shared(lambda: prepare_data(record, loaded, repos, ahead=True))
        model, data = fit_to_machine(record, loaded, data, resume)
        outcome, suggester = train_and_evaluate(record, loaded, data, model, resume)
        if record.writes:
            save(record, loaded, model, data, outcome, suggester)
        record.finish("completed")
    return record


def prepare_data(
    record: Record,
    loaded: LoadedConfig,
    repos: list[str],
    hardware_profile: str | None = None,
    sample: int | None = None,
    ahead: bool = False,
) -> Data:
    """Scrape (or reuse the scrape) → tokenize → plan → pack: what training needs from the history
    (with `sample`, token statistics estimated from that many sequences unless they are cached; with
    `ahead`, a history not cached yet tokenized only as far back as a time budget could train)."""
    config = loaded.config
    check_available(config.train.model)  # a model that cannot be loaded is said before the scrape, not after
    scraped = record.step("scrape", scrape_sources, repos, config.scrape, record.output_dir, record.previous)
    record.step("imports", load_libraries, DATA_LIBRARIES)
    planned_for = record.step("detect", machine, hardware_profile, record.launch, record.load)
    prepared = record.step(
        "tokenize", prepare, scraped, loaded, record.cache_root(config.output.cache_dir), sample,
        tokenize_ahead(planned_for, loaded) if ahead else None,
    )  # fmt: skip
    plan = record.step("plan", plan_for, prepared, planned_for, loaded)
    packed = record.step("pack", pack, prepared, plan)
    return Data(scraped, prepared, planned_for, plan, packed)


def fit_to_machine(
    record: Record, loaded: LoadedConfig, data: Data, resume: bool, continue_from: Path | None = None
) -> tuple[Loaded, Data]:
    """Load the model (with `continue_from`'s adapter, for an update), measure what the plan needs from
    this machine (the largest micro-batch that fits a GPU, the training speed for a time budget) and plan
    again."""
    config = loaded.config
    record.step("imports_training", load_libraries, TRAINING_LIBRARIES, data.plan.quantization)
    model = record.step(
        "load_model", load_model, config.train.model, data.prepared, data.plan, config.lora, record.launch,
        record.output_dir, continue_from,
    )  # fmt: skip
    resumed = resumed_speed(record.previous) if resume else None
    plan = record.step(
        "measure", measure, data.prepared, data.machine, loaded, data.plan, model.model, data.packed.train,
        resumed,
    )  # fmt: skip
    return model, replace(data, plan=plan)


def train_and_evaluate(
    record: Record, loaded: LoadedConfig, data: Data, model: Loaded, resume: bool, history: Path | None = None
) -> tuple[TrainOutcome, Suggester | None]:
    """Index the repository's past (with an update's `history`: the whole history's scrape, where its own
    holds the new commits alone), evaluate on the held-out commits, plan training for what the time budget
    has left, train, evaluate again beside the past's systems; the training's outcome and the suggestion
    system to save beside the adapter (None on ranks that do not write)."""
    config = loaded.config
    past = (
        record.step(
            "retrieval", learn_past, data.scraped.sequences_path, config.retrieval, data.plan.seed, history
        )
        if record.writes
        else None
    )
    evaluation = before_training(record.step, model, data, past, loaded)
    record.add(evaluation)
    data = fit_to_time_left(record, loaded, data, evaluation.before, resume)
    outcome = train(record, loaded, data, model, resume)
    kept_in = record.output_dir if record.writes else None
    evaluation = after_training(record.step, model, data, outcome, past, evaluation, config, kept_in)
    record.add(evaluation)
    if record.writes:
        remember_speed(outcome, data.machine, data.prepared.facts.name)
    if not (past and evaluation.chosen):
        return outcome, None
    return outcome, for_use(
        past, evaluation.chosen, config.scrape, evaluation.code_chosen or DEFAULT_CODE_SYSTEM
    )


def fit_to_time_left(record: Record, loaded: LoadedConfig, data: Data, before: Scores, resume: bool) -> Data:
    """Plan training again for what its time budget leaves now that the run has spent what comes before
    it (a resumed run: what its first run planned); where that plan trains more than the history tokenized
    ahead of its budget (this machine is faster than that assumed), tokenize all of it first; keep the
    blocks the plan trains on, print it."""
    measured, train_time = data.plan, None
    if measured.time_budget_s and measured.speed:
        train_time = (
            resumed_train_time(record.previous)
            if resume
            else time_left(measured.time_budget_s, record.elapsed_s, before, measured.validate_model)
        )
    plan = planned_again(measured, data.prepared, data.machine, loaded, train_time=train_time)
    if data.prepared.tokenized is not None and plan.train_sequences > data.prepared.tokenized:
        say(
            f"the budget trains more than the newest {data.prepared.tokenized:,} sequences: tokenizing the rest"
        )
        cache_root = record.cache_root(loaded.config.output.cache_dir)
        prepared = record.step("tokenize_rest", prepare, data.scraped, loaded, cache_root)
        plan = planned_again(measured, prepared, data.machine, loaded, train_time=train_time)
        data = replace(data, prepared=prepared, packed=record.step("pack", pack, prepared, plan))
    record.add(plan)
    packed = record.step("pack", keep_newest, data.packed, data.prepared, plan)
    say(format_plan(plan))
    if not resume and (note := first_run_note(plan, before)):
        say(note)
    return replace(data, plan=plan, packed=packed)


def train(record: Record, loaded: LoadedConfig, data: Data, model: Loaded, resume: bool) -> TrainOutcome:
    """Train the plan on the packed blocks (resuming where asked, planning again after an out-of-memory)."""
    from pipeline.train.trainer import Job, train_within_memory  # heavy: torch and transformers' Trainer

    plan, prepared, packed = data.plan, data.prepared, data.packed
    say(
        f"training {plan.total_steps} steps on {plan.device} × {plan.world_size} ({model.trainable_parameters:,} trainable parameters)"
    )
    facts = facts_for(prepared, plan, loaded.config)
    job = Job(
        model.model, packed.train, validation_blocks(packed, plan.eval_blocks), plan, record.output_dir / CHECKPOINT_DIR,
        prepared.cache.key, loaded.config.monitor, record.coordinator, facts, prepared.tokenizer, resume,
        record.progress,
    )  # fmt: skip
    replan = lambda cap: planned_again(job.plan, prepared, data.machine, loaded, oom_cap=cap)  # noqa: E731
    return record.step("train", train_within_memory, job, replan)


def save(
    record: Record, loaded: LoadedConfig, model: Loaded, data: Data, outcome: TrainOutcome,
    suggester: Suggester | None,
) -> None:  # fmt: skip
    """The adapter, its tokenizer, its suggestion system and its model card, in the output directory."""
    record.step(
        "save", save_adapter, model, data.prepared, outcome.plan, record.output_dir,
        loaded.config, suggester, model_card(record.doc), files_path(data.scraped),
    )  # fmt: skip

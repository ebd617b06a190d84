#!/usr/bin/env python3
"""repotune: fine-tune a code language model on a git repository's own history.

    python run_pipeline.py --repo /path/to/repo

Each command reads as the list of stages it runs; the work is in `scrapers/`
and `pipeline/`, and everything is recorded in OUTPUT_DIR/MANIFEST.json.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path
from shlex import quote
from typing import TYPE_CHECKING, Any

from pipeline.config import LoadedConfig
from pipeline.record.run import Record, open_run
from pipeline.types import Data, Evaluation, Loaded, Machine, Prepared, Scores, TrainOutcome
from pipeline.use.cli import (
    Command,
    as_text,
    command_flags,
    diff_options,
    export_options,
    generate_options,
    hardware_profile_option,
    hook_options,
    loaded_config,
    monitor_options,
    parse_args,
    report_options,
    resume_option,
    run_command,
    update_options,
)
from scrapers.safe_git import forget_inherited_repository

if TYPE_CHECKING:  # torch comes with it: loaded where training starts, not for --help
    from pipeline.train.trainer import Job


def run(args: argparse.Namespace) -> None:
    """Scrape → tokenize → plan → pack → load → measure → evaluate → plan for the time left → train →
    evaluate → save, then print the manifest path. Under torchrun / accelerate launch, rank 0 prepares the
    data and every rank trains."""
    from pipeline.record.card import model_card
    from pipeline.train.model import save_adapter

    loaded = loaded_config(args)
    with open_run(loaded, "run", args.argv, args.repos, distributed=True) as record:
        data = record.shared(lambda: prepare_data(record, loaded, args.repos, ahead=True))
        model, data = fit_to_machine(record, loaded, data, args.resume)
        outcome, suggester = train_and_evaluate(record, loaded, data, model, args.resume)
        if record.writes:
            record.step(
                "save", save_adapter, model, data.prepared, outcome.plan, record.output_dir,
                loaded.config.train.max_prompt_tokens, suggester, model_card(record.doc),
            )  # fmt: skip
        record.finish("completed")
    record.announce()


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
    from pipeline.data.dataset import pack
    from pipeline.data.sources import scrape as scrape_sources
    from pipeline.data.token_cache import prepare
    from pipeline.hardware import machine
    from pipeline.plan.planner import plan_for, tokenize_ahead
    from pipeline.train.model import DATA_LIBRARIES, load_libraries

    config = loaded.config
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
    from pipeline.train.model import TRAINING_LIBRARIES, load_libraries, load_model
    from pipeline.train.probe import measure, resumed_speed

    config = loaded.config
    record.step("imports_training", load_libraries, TRAINING_LIBRARIES)
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


def fit_to_time_left(record: Record, loaded: LoadedConfig, data: Data, before: Scores, resume: bool) -> Data:
    """Plan training again for what its time budget leaves now that the run has spent what comes before
    it (a resumed run: what its first run planned); where that plan trains more than the history tokenized
    ahead of its budget (this machine is faster than that assumed), tokenize all of it first; keep the
    blocks the plan trains on, print it."""
    from pipeline.data.dataset import keep_newest, pack
    from pipeline.data.token_cache import prepare
    from pipeline.plan.planner import format_plan, planned_again, time_left
    from pipeline.progress import say
    from pipeline.train.probe import resumed_train_time

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
    return replace(data, plan=plan, packed=packed)


def train_and_evaluate(
    record: Record, loaded: LoadedConfig, data: Data, model: Loaded, resume: bool, history: Path | None = None
) -> tuple[TrainOutcome, Any]:
    """Index the repository's past (with an update's `history`: the whole history's scrape, where its own
    holds the new commits alone), evaluate on the held-out commits, plan training for what the time budget
    has left, train (resuming, retrying an out-of-memory), evaluate again beside the lookup and the suggestion system; the training's outcome
    and the suggestion system to save beside the adapter (None on ranks that do not write)."""
    from pipeline.data.dataset import held_out_blocks, validation_blocks
    from pipeline.evaluate.evaluation import (
        EVALUATION_FILE,
        base_scores_cache,
        evaluate,
        evaluate_base,
        format_evaluation,
        held_out_note,
        score_past,
        task_prompts,
        validation_answers,
        write_answers,
    )
    from pipeline.evaluate.suggestion import for_use, learn_past
    from pipeline.progress import say
    from pipeline.train.model import CHECKPOINT_DIR, facts_for
    from pipeline.train.probe import remember_speed
    from pipeline.train.trainer import Job

    config, prepared, plan = loaded.config, data.prepared, data.plan
    held_out = held_out_blocks(data.packed, plan.eval_blocks)
    past = (
        record.step(
            "retrieval", learn_past, data.scraped.sequences_path, config.retrieval, plan.seed, history
        )
        if record.writes
        else None
    )
    prompts = (
        task_prompts(
            past.split("eval"),
            prepared.tokenizer,
            prepared.style,
            plan.eval_samples,
            config.train.max_prompt_tokens,
        )
        if past
        else ()
    )
    cache = base_scores_cache(config.eval, prepared.facts, loaded.continues is not None)
    before = record.step(
        "evaluate_before", evaluate_base, model.model, held_out, prompts, plan, prepared, config.eval, cache
    )
    record.add(Evaluation(before, None, [], prompts))
    data = fit_to_time_left(record, loaded, data, before, resume)
    prepared, plan, packed = data.prepared, data.plan, data.packed

    say(
        f"training {plan.total_steps} steps on {plan.device} × {plan.world_size} ({model.trainable_parameters:,} trainable parameters)"
    )
    facts = facts_for(prepared, plan, config.train.max_prompt_tokens)
    job = Job(
        model.model, packed.train, validation_blocks(packed, plan.eval_blocks), plan, record.output_dir / CHECKPOINT_DIR,
        prepared.cache.key, config.monitor, record.coordinator, facts, prepared.tokenizer, resume, record.progress,
    )  # fmt: skip
    outcome = record.step("train", train_within_memory, job, prepared, data.machine, loaded)

    after = record.step(
        "evaluate_after", evaluate, model.model, held_out, prompts, outcome.plan, prepared, config.eval,
        "the fine-tuned model",
    )  # fmt: skip
    evaluation, suggester = Evaluation(before, after, outcome.evaluations, prompts), None
    if past:
        answers = None
        if plan.validate_model:
            answers = record.step(
                "evaluate_validation", validation_answers, model.model, past, prepared, outcome.plan,
                config.eval, config.train.max_prompt_tokens,
            )  # fmt: skip
        scored = record.step(
            "evaluate_past", score_past, past, prompts, after, config.retrieval, outcome.plan.seed, answers
        )
        evaluation = Evaluation(
            before, after, outcome.evaluations, prompts, scored.nearest_commit, scored.selector, scored.suggested,
            scored.system,
            held_out_note(len(past.split("eval")), plan.eval_samples, data.scraped.summary), answers,
        )  # fmt: skip
        suggester = for_use(past, scored.system["name"], config.scrape)
    record.add(evaluation)
    for line in format_evaluation(evaluation):
        say(line)
    if record.writes:
        write_answers(record.output_dir / EVALUATION_FILE, evaluation)
        remember_speed(outcome, data.machine, prepared.facts.name)
    return outcome, suggester


def train_within_memory(job: Job, prepared: Prepared, machine: Machine, loaded: LoadedConfig) -> TrainOutcome:
    """Train; after a CUDA out-of-memory, plan again with that measured fact (at most half the micro-batch,
    the same effective batch) and train again from the adapter's initial weights."""
    from dataclasses import replace

    from pipeline.plan.planner import planned_again
    from pipeline.progress import say
    from pipeline.train.trainer import OutOfMemory, train

    while True:
        try:
            return train(job)
        except OutOfMemory as oom:
            cap = oom.retry["batch_size"] // 2
            say(
                f"CUDA out of memory at micro-batch {oom.retry['batch_size']}: planning again with at most {cap}"
            )
            plan = planned_again(job.plan, prepared, machine, loaded, oom_cap=cap)
            job = replace(job, plan=plan, oom_retries=(*job.oom_retries, oom.retry))


def update(args: argparse.Namespace) -> None:
    """Continue a run's adapter on the commits made since it: check the parent → scrape the new commits →
    tokenize → plan (short warmup, lower peak) → train from the parent's adapter → evaluate on the newest
    commits and on the parent's held-out ones (forgetting) → save, with the lineage in the manifest.
    Retrieval answers from the whole history (scraped again up to the new HEAD into PAST_DIR)."""
    import shutil

    from pipeline.data.sources import PAST_DIR, SEQUENCES_FILE, scrape_past
    from pipeline.evaluate.evaluation import evaluate
    from pipeline.progress import say
    from pipeline.record.card import model_card
    from pipeline.record.lineage import (
        check_tokenizer,
        describe_forgetting,
        find_parent,
        forgetting,
        parent_held_out,
        update_config,
    )
    from pipeline.train.model import save_adapter
    from pipeline.use.hook import installed_adapter

    parent = find_parent(args.parent, args.repos, args.model)
    loaded = update_config(parent, args.config, args.overrides, command_flags(args))
    with open_run(loaded, "update", args.argv, [str(parent.repo)]) as record:
        record.add(parent.lineage())
        if parent.up_to_date:
            say(
                f"up to date: HEAD {parent.new_head[:12]} is what {parent.directory} trained on; nothing to train"
            )
            record.finish("up_to_date")
            record.announce()
            return
        say(f"updating {parent.directory} with {len(parent.commits_added)} new commits")
        data = prepare_data(record, loaded, [parent.repo])
        check_tokenizer(parent, data.prepared)
        model, data = fit_to_machine(record, loaded, data, False, parent.adapter_dir)
        prepared, plan = data.prepared, data.plan
        earlier = parent_held_out(parent, prepared, loaded, plan, record.output_dir / "parent_held_out")
        loss_only = (model.model, earlier, (), plan, prepared, loaded.config.eval)  # no task prompts
        kept = record.step(
            "evaluate_parent_before", evaluate, *loss_only, "the parent on its held-out commits"
        )
        past = record.output_dir / PAST_DIR
        try:
            record.step("scrape_past", scrape_past, parent.repo, loaded.config.scrape, parent.new_head, past)
            outcome, suggester = train_and_evaluate(record, loaded, data, model, False, past / SEQUENCES_FILE)
        finally:  # read once, by this run alone: the index saved beside the adapter holds what use needs of it
            shutil.rmtree(past, ignore_errors=True)  # (rails: 526 MB), and a failed update leaves none behind
        after = record.step(
            "evaluate_parent_after", evaluate, *loss_only, "the update on the parent's held-out commits"
        )
        record.add(parent.lineage(forgetting(kept, after)))
        say(describe_forgetting(parent.directory, kept, after))
        record.step(
            "save", save_adapter, model, data.prepared, outcome.plan, record.output_dir,
            loaded.config.train.max_prompt_tokens, suggester, model_card(record.doc),
        )  # fmt: skip
        record.finish("completed")
    if installed_adapter(parent.repo) == parent.adapter_dir.resolve():
        say(
            f"the commit hook in {parent.repo} still suggests with {parent.directory}: "
            f"`hook install --repo {quote(str(parent.repo))} --adapter {quote(str(record.output_dir))}` moves it "
            "to this update"
        )
    record.announce()


def scrape(args: argparse.Namespace) -> None:
    """Scrape only: sequences.jsonl and the scrape sections of the manifest."""
    from pipeline.data.sources import scrape as scrape_sources

    loaded = loaded_config(args)
    with open_run(loaded, "scrape", args.argv, args.repos) as record:
        record.step("scrape", scrape_sources, args.repos, loaded.config.scrape, record.output_dir)
        record.finish("scraped")
    record.announce()


def plan(args: argparse.Namespace) -> None:
    """Scrape (or reuse the scrape), plan, print the decisions; train nothing. Token statistics come from
    the token cache, or from a sample of a history not tokenized yet."""
    from pipeline.data.token_cache import PLAN_SAMPLE
    from pipeline.plan.planner import format_plan
    from pipeline.train.probe import needs_measuring

    loaded = loaded_config(args)
    with open_run(loaded, "plan", args.argv, args.repos) as record:
        data = prepare_data(record, loaded, args.repos, args.hardware_profile, PLAN_SAMPLE)
        decided = data.plan
        if needs_measuring(
            decided, data.machine, loaded
        ):  # (it loads the model: a time budget on this machine)
            decided = fit_to_machine(record, loaded, data, resume=False)[1].plan
        record.finish("planned")
    print(format_plan(decided))
    record.announce()


def prepare(args: argparse.Namespace) -> None:
    """Scrape, tokenize into the token cache and pack, without training: a later `run` hits the cache."""
    from pipeline.data.token_cache import cache_summary

    loaded = loaded_config(args)
    with open_run(loaded, "prepare", args.argv, args.repos) as record:
        data = prepare_data(record, loaded, args.repos, args.hardware_profile)
        record.finish("prepared")
    print(cache_summary(data, record.elapsed_s))
    record.announce()


def monitor(args: argparse.Namespace) -> None:
    """Watch GPUs, CPU and RAM (and a process) with the pipeline's sampler; a summary and advice at the end."""
    from pipeline.config import load_config
    from pipeline.errors import PipelineError
    from pipeline.use.watch import fitted_interval, format_summary, watch

    for name in ("duration", "interval"):
        if (value := getattr(args, name)) is not None and not value > 0:
            example = {"duration": 60, "interval": 1}[name]
            raise PipelineError(
                f"--{name} {value:g}: give a number of seconds above 0 (e.g. --{name} {example})"
            )
    configured = load_config(None).config.monitor.collection_interval_seconds
    interval = args.interval or fitted_interval(configured, args.duration)
    report = watch(args.duration, interval, args.pid, args.output, args.argv)
    print(format_summary(report))
    print(args.output)


def generate(args: argparse.Namespace) -> None:
    """Load base model + adapter: print a continuation of --prompt (and with --alternatives the next best
    messages), or --merge into a standalone model."""
    from pipeline.errors import PipelineError
    from pipeline.progress import say
    from pipeline.use import generate as generation
    from pipeline.use.hook import check_alternatives, commented

    if args.merge:
        print(generation.merge(args.adapter, args.merge))
        return
    if args.alternatives and args.task != "message":
        raise PipelineError("--alternatives are commit messages: use it with --task message")
    check_alternatives(args.alternatives)
    if args.max_new_tokens is not None and args.max_new_tokens < 1:
        raise PipelineError(
            f"--max-new-tokens {args.max_new_tokens}: give how many tokens to write, 1 or more"
        )
    if args.prompt == "-" and sys.stdin.isatty():  # nothing piped: say what it waits for
        say(
            "reading the prompt from the terminal: paste it, then Ctrl-D (or pipe it in: git diff --cached --no-ext-diff | …)"
        )
    prompt = as_text(sys.stdin.read() if args.prompt == "-" else args.prompt)
    if args.task != "message":
        print(generation.generate(args.adapter, prompt, args.max_new_tokens, args.task, args.system))
        return
    answer, *more = generation.commit_messages(
        args.adapter, prompt, args.alternatives, args.system, args.max_new_tokens
    )
    print(answer)
    if more:
        print("\n" + commented(more, "#"), end="")


def export(args: argparse.Namespace) -> None:
    """Merge the adapter into its base and write a GGUF file (llama.cpp, Ollama) and a Modelfile."""
    from pipeline.use.export import export as write_gguf

    exported = write_gguf(args.adapter, args.output, args.gguf_type)
    print(
        f"wrote {exported.gguf} ({exported.gguf_type}, {exported.tensors} tensors, "
        f"{exported.bytes / 1e6:.0f} MB) and {exported.modelfile}"
    )
    # Commands to paste into a shell, so quoted: a path may hold a space.
    print(
        f"  ollama: cd {quote(str(exported.gguf.parent))} && ollama create repotune -f "
        f"{quote(exported.modelfile.name)}"
    )
    print(f"  llama.cpp: llama-cli -m {quote(str(exported.gguf))}")
    print(
        f"  a message for the staged change, its files read as training read them: {exported.staged} | ollama run repotune"
    )


def hook(args: argparse.Namespace) -> None:
    """Install (or uninstall) a prepare-commit-msg hook that suggests a message and never blocks a commit."""
    from pipeline.errors import PipelineError
    from pipeline.use import hook as commit_hook

    if args.action == "uninstall":
        print(commit_hook.uninstall(args.repo))
        return
    if not args.adapter:
        raise PipelineError("hook install: give --adapter DIR (a run's output directory, or its adapter/)")
    print(commit_hook.install(args.repo, args.adapter, args.timeout, args.alternatives))


def diff(args: argparse.Namespace) -> int:
    """What changed between two runs; exit 0 identical, 1 different, 2 a tripped --fail-if."""
    from pipeline.use.diff import run_diff

    text, messages, code = run_diff(args.before, args.after, args)
    print(text)
    for message in messages:
        print(message, file=sys.stderr)
    return code


def report(args: argparse.Namespace) -> None:
    """One HTML page (plots embedded) for a manifest, or comparing several; prints its path."""
    from pathlib import Path

    from pipeline.manifest import manifest_file
    from pipeline.use.report import write_report

    manifests = [manifest_file(Path(path)) for path in args.manifests]
    default = manifests[0].with_name("report.html") if len(manifests) == 1 else Path("compare.html")
    print(write_report(manifests, Path(args.output) if args.output else default, args.names))


COMMANDS = {
    "run": Command(
        run, "scrape, plan and train a LoRA adapter (the default command)", resume_option, needs_git=True
    ),
    "update": Command(
        update,
        "continue a run's adapter on the commits made since it, with lineage and forgetting measured",
        update_options,
        needs_repo=False,
        needs_git=True,
    ),
    "scrape": Command(
        scrape, "turn the repository's history into sequences.jsonl, without training", needs_git=True
    ),
    "plan": Command(
        plan,
        "decide every training parameter and say why, without training",
        hardware_profile_option,
        needs_git=True,
    ),
    "generate": Command(
        generate, "generate with a trained adapter, or merge it into its base model", generate_options, False
    ),
    "export": Command(
        export, "merge the adapter and write a GGUF file for llama.cpp and Ollama", export_options, False
    ),
    "hook": Command(
        hook,
        "install a git hook that suggests commit messages (never blocking a commit)",
        hook_options,
        False,
        needs_git=True,
    ),
    "diff": Command(diff, "compare two manifests: what changed, by how much", diff_options, False),
    "report": Command(
        report, "write one self-contained HTML page about a run, or comparing runs", report_options, False
    ),
    "prepare": Command(
        prepare,
        "scrape and tokenize into the token cache without training",
        hardware_profile_option,
        needs_git=True,
    ),
    "monitor": Command(
        monitor, "watch GPUs, CPU and RAM (and a process), then summarise and advise", monitor_options, False
    ),
}


def main(argv: list[str] | None = None) -> int:
    # Python writes the bytecode of what a command imports even where PYTHONDONTWRITEBYTECODE (common in
    # containers) says not to, as `make` does: otherwise every command compiles torch, transformers and
    # the rest anew (2 cores: a run's training libraries 29-35 s to import instead of 11-13.5, `generate`
    # 5.4-6.0 s instead of 1.6-2.0).
    sys.dont_write_bytecode = False
    forget_inherited_repository()
    args = parse_args(sys.argv[1:] if argv is None else argv, COMMANDS)
    return run_command(COMMANDS[args.command], args)


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""repotune: fine-tune a code language model on a git repository's own history.

    python run_pipeline.py --repo /path/to/repo

Each command reads as the list of stages it runs; the work is in `scrapers/`
and `pipeline/`, and everything is recorded in OUTPUT_DIR/MANIFEST.json.
"""

from __future__ import annotations

import argparse
import sys

from pipeline import stages
from pipeline.cli import (
    Command,
    diff_options,
    generate_options,
    hardware_profile_option,
    loaded_config,
    monitor_options,
    parse_args,
    report_options,
    resume_option,
    run_command,
)
from pipeline.run import open_run


def run(args: argparse.Namespace) -> None:
    """Scrape → tokenize → plan → train (→ evaluate), then print the manifest path.
    Under torchrun / accelerate launch, rank 0 prepares the data and every rank trains."""
    with open_run(loaded_config(args), "run", args.argv, distributed=True) as record:
        setup = stages.prepare_training(record, args.repos)
        loaded = stages.load_model(record, setup)
        setup = stages.probe_and_replan(record, setup, loaded, resume=args.resume)
        stages.show_plan(setup)
        stages.train(record, setup, loaded, resume=args.resume)
        record.finish("completed")
    record.announce()


def scrape(args: argparse.Namespace) -> None:
    """Scrape only: sequences.jsonl and the scrape sections of the manifest."""
    with open_run(loaded_config(args), "scrape", args.argv) as record:
        stages.scrape(record, args.repos)
        record.finish("scraped")
    record.announce()


def plan(args: argparse.Namespace) -> None:
    """Scrape (or reuse the scrape), plan, print the decisions; train nothing."""
    with open_run(loaded_config(args), "plan", args.argv) as record:
        prepared = stages.prepare(record, stages.scrape(record, args.repos, reuse=True))
        decisions = stages.plan(record, prepared, args.hardware_profile)
        decisions = stages.probe_and_replan(record, stages.Setup(prepared, decisions, None, None)).plan
        record.finish("planned")
    print(stages.format_plan(decisions))
    record.announce()


def prepare(args: argparse.Namespace) -> None:
    """Scrape, tokenize into the token cache and pack, without training: a later `run` hits the cache."""
    with open_run(loaded_config(args), "prepare", args.argv) as record:
        prepared = stages.prepare(record, stages.scrape(record, args.repos, reuse=True))
        decisions = stages.plan(record, prepared, args.hardware_profile)
        stages.pack(record, prepared, decisions)
        record.finish("prepared")
    print(stages.cache_summary(record))
    record.announce()


def monitor(args: argparse.Namespace) -> None:
    """Watch GPUs, CPU and RAM (and a process) with the pipeline's sampler; a summary and advice at the end."""
    from pipeline.config import load_config
    from pipeline.watch import format_summary, watch

    interval = args.interval or load_config(None).config.monitor.collection_interval_seconds
    report = watch(args.duration, interval, args.pid, args.output, args.argv)
    print(format_summary(report))
    print(args.output)


def generate(args: argparse.Namespace) -> None:
    """Load base model + adapter: print a continuation of --prompt, or --merge into a standalone model."""
    from pipeline import generate as generation

    if args.merge:
        print(generation.merge(args.adapter, args.merge))
    else:
        prompt = sys.stdin.read() if args.prompt == "-" else args.prompt
        print(generation.generate(args.adapter, prompt, args.max_new_tokens, args.task))


def diff(args: argparse.Namespace) -> int:
    """What changed between two runs; exit 0 identical, 1 different, 2 a tripped --fail-if."""
    from pipeline.diff import run_diff

    text, messages, code = run_diff(args.before, args.after, args)
    print(text)
    for message in messages:
        print(message, file=sys.stderr)
    return code


def report(args: argparse.Namespace) -> None:
    """One HTML page (plots embedded) for a manifest; prints its path."""
    from pathlib import Path

    from pipeline.report import write_report

    manifest = Path(args.manifest)
    print(write_report(manifest, Path(args.output) if args.output else manifest.with_name("report.html")))


COMMANDS = {
    "run": Command(run, "scrape, plan and train a LoRA adapter (the default command)", resume_option),
    "scrape": Command(scrape, "turn the repository's history into sequences.jsonl, without training"),
    "plan": Command(
        plan, "decide every training parameter and say why, without training", hardware_profile_option
    ),
    "generate": Command(
        generate, "generate with a trained adapter, or merge it into its base model", generate_options, False
    ),
    "diff": Command(diff, "compare two manifests: what changed, by how much", diff_options, False),
    "report": Command(report, "write one self-contained HTML page about a run", report_options, False),
    "prepare": Command(
        prepare, "scrape and tokenize into the token cache without training", hardware_profile_option
    ),
    "monitor": Command(
        monitor, "watch GPUs, CPU and RAM (and a process), then summarise and advise", monitor_options, False
    ),
}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv, COMMANDS)
    return run_command(COMMANDS[args.command].handler, args)


if __name__ == "__main__":
    sys.exit(main())

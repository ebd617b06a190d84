#!/usr/bin/env python3
"""repotune: fine-tune a code language model on a git repository's own history.

    repotune --repo /path/to/repo        # python run_pipeline.py --repo … works too

A table of contents: each command below names the recipe (`pipeline/recipes/`: the stages a run goes
through, in order) or the take-home use (`pipeline/use/`) that does its work; everything a run does is
recorded in OUTPUT_DIR/MANIFEST.json.
"""

from __future__ import annotations

import argparse
import sys

from pipeline.data.token_cache import cache_summary
from pipeline.plan.planner import format_plan
from pipeline.recipes import run as recipes
from pipeline.recipes import stages
from pipeline.recipes.update import update as recipes_update
from pipeline.record.lineage import find_parent, update_config
from pipeline.use import commands as use
from pipeline.use.cli import (
    Command,
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
    runs_options,
    serve_options,
    update_options,
)
from scrapers.safe_git import forget_inherited_repository


def run(args: argparse.Namespace) -> None:
    """Scrape → data → plan → train → suggest → evaluate → record (`pipeline.recipes.run.run`)."""
    recipes.run(loaded_config(args), args.argv, args.repos, args.resume).announce()


def update(args: argparse.Namespace) -> None:
    """Continue a run's adapter on the commits made since it (`pipeline.recipes.update.update`)."""
    parent = find_parent(args.parent, args.repos, args.model)
    loaded = update_config(parent, args.config, args.overrides, command_flags(args))
    recipes_update(parent, loaded, args.argv).announce()


def scrape(args: argparse.Namespace) -> None:
    """Scrape only: sequences.jsonl and the scrape sections of the manifest."""
    stages.scrape(loaded_config(args), args.argv, args.repos).announce()


def plan(args: argparse.Namespace) -> None:
    """Scrape (or reuse the scrape), plan, print the decisions; train nothing."""
    record, decided = stages.plan(loaded_config(args), args.argv, args.repos, args.hardware_profile)
    print(format_plan(decided))
    record.announce()


def prepare(args: argparse.Namespace) -> None:
    """Scrape, tokenize into the token cache and pack, without training: a later `run` hits the cache."""
    record, data = stages.prepare(loaded_config(args), args.argv, args.repos, args.hardware_profile)
    print(cache_summary(data, record.elapsed_s))
    record.announce()


def generate(args: argparse.Namespace) -> None:
    """Load base model + adapter: print a continuation of --prompt, or --merge into a standalone model."""
    if args.merge:
        print(use.generation.merge(args.adapter, args.merge))
        return
    use.generate(
        args.adapter, args.prompt, args.task, args.system, args.max_new_tokens, args.alternatives, args.path,
        args.after,
    )  # fmt: skip


def export(args: argparse.Namespace) -> None:
    """Merge the adapter into its base and write a GGUF file (llama.cpp, Ollama) and a Modelfile, or the
    adapter alone beside its base."""
    use.export(args.adapter, args.output, args.gguf_type, args.name, args.adapter_only)


def serve(args: argparse.Namespace) -> None:
    """Answer as an OpenAI-compatible server (completions, chat, a diff's commit message) until Ctrl-C."""
    use.serve(args.adapter, args.host, args.port, args.name)


def hook(args: argparse.Namespace) -> None:
    """Install (or uninstall) a prepare-commit-msg hook that suggests a message and never blocks a commit."""
    use.hook(args.action, args.repo, args.adapter, args.timeout, args.alternatives)


def diff(args: argparse.Namespace) -> int:
    """What changed between two runs; exit 0 identical, 1 different (with --fail-if: 1 a condition
    tripped, 0 none did); 2 an error."""
    return use.diff(args.before, args.after, args)


def runs(args: argparse.Namespace) -> None:
    """The runs an output directory keeps under runs/, as a table (`pipeline.record.history`)."""
    use.runs(args.output_dir, args.only_changed)


def report(args: argparse.Namespace) -> None:
    """One HTML page (plots embedded) for a manifest, or comparing several; prints its path."""
    use.report(args.manifests, args.output, args.names)


def monitor(args: argparse.Namespace) -> None:
    """Watch GPUs, CPU and RAM (and a process) with the pipeline's sampler; a summary and advice at the end."""
    use.monitor(args.duration, args.interval, args.pid, args.output, args.argv)


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
        chooses_commits=False,
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
    "serve": Command(
        serve, "answer editors and tools as an OpenAI-compatible server on this machine", serve_options, False
    ),
    "hook": Command(
        hook,
        "install a git hook that suggests commit messages (never blocking a commit)",
        hook_options,
        False,
        needs_git=True,
    ),
    "runs": Command(
        runs, "list the runs an output directory keeps, with their key scores", runs_options, False
    ),
    "diff": Command(
        diff,
        "compare two runs (default: the newest two kept): what changed, by how much",
        diff_options,
        False,
    ),
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
    forget_inherited_repository()
    args = parse_args(sys.argv[1:] if argv is None else argv, COMMANDS)
    return run_command(COMMANDS[args.command], args)


if __name__ == "__main__":
    sys.exit(main())

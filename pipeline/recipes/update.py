"""An update, top to bottom: a run's adapter continued on the commits made since it, with its lineage and
what it forgot of its parent's held-out commits measured."""

from __future__ import annotations

import shutil
from shlex import quote
from typing import Any

from pipeline.config import LoadedConfig
from pipeline.data.sources import PAST_DIR, SEQUENCES_FILE, scrape_past
from pipeline.evaluate.evaluation import evaluate
from pipeline.progress import say
from pipeline.recipes.run import fit_to_machine, prepare_data, save, train_and_evaluate
from pipeline.record.lineage import (
    Parent,
    check_tokenizer,
    describe_forgetting,
    forgetting,
    parent_held_out,
)
from pipeline.record.run import Record, open_run
from pipeline.types import Data, Loaded, Scores
from pipeline.use.hook import installed_adapter


def update(parent: Parent, loaded: LoadedConfig, argv: list[str]) -> Record:
    """Scrape the new commits → tokenize → plan (short warmup, lower peak) → train from the parent's
    adapter → evaluate on the newest commits and on the parent's held-out ones (forgetting) → save, with
    the lineage in the manifest. Retrieval answers from the whole history (scraped again up to the new
    HEAD into PAST_DIR)."""
    with open_run(loaded, "update", argv, [str(parent.repo)]) as record:
        record.add(parent.lineage())
        if parent.up_to_date:
            say(
                f"up to date: HEAD {parent.new_head[:12]} is what {parent.directory} trained on; nothing to train"
            )
            record.finish("up_to_date")
            return record
        say(f"updating {parent.directory} with {len(parent.commits_added)} new commits")
        data = prepare_data(record, loaded, [parent.repo])
        check_tokenizer(parent, data.prepared)
        model, data = fit_to_machine(record, loaded, data, False, parent.adapter_dir)
        earlier = parent_held_out(
            parent, data.prepared, loaded, data.plan, record.output_dir / "parent_held_out"
        )
        kept = on_the_parents_held_out(record, loaded, model, data, earlier, before=True)
        past = record.output_dir / PAST_DIR
        try:
            record.step("scrape_past", scrape_past, parent.repo, loaded.config.scrape, parent.new_head, past)
            outcome, suggester = train_and_evaluate(record, loaded, data, model, False, past / SEQUENCES_FILE)
        finally:  # read once, by this run alone: the index saved beside the adapter holds what use needs of it
            shutil.rmtree(
                past, ignore_errors=True
            )  # (hundreds of MB), and a failed update leaves none behind
        after = on_the_parents_held_out(record, loaded, model, data, earlier, before=False)
        record.add(parent.lineage(forgetting(kept, after)))
        say(describe_forgetting(parent.directory, kept, after))
        save(record, loaded, model, data, outcome, suggester)
        record.finish("completed")
    say_where_the_hook_points(parent, record)
    return record


def on_the_parents_held_out(
    record: Record, loaded: LoadedConfig, model: Loaded, data: Data, earlier: dict[str, Any], before: bool
) -> Scores:
    """The loss on the parent's held-out commits (`earlier`; no task prompts): before training, what the
    update keeps of it; after, what it forgot."""
    step, who = (
        ("evaluate_parent_before", "the parent on its held-out commits")
        if before
        else ("evaluate_parent_after", "the update on the parent's held-out commits")
    )
    return record.step(
        step, evaluate, model.model, earlier, (), data.plan, data.prepared, loaded.config.eval, who
    )


def say_where_the_hook_points(parent: Parent, record: Record) -> None:
    """Where the commit hook of the parent's repository still suggests with the parent, how to move it."""
    if installed_adapter(parent.repo) == parent.adapter_dir.resolve():
        say(
            f"the commit hook in {parent.repo} still suggests with {parent.directory}: "
            f"`hook install --repo {quote(str(parent.repo))} --adapter {quote(str(record.output_dir))}` moves it "
            "to this update"
        )

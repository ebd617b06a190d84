"""Incremental update (`update --from OUTPUT_DIR`): the parent run, checked before anything runs (it
completed, its adapter and base are there, the HEAD it trained on is still in the history); the config
that continues it on the commits made since; and the parent's held-out commits, scored before and after
the update trains, so forgetting shows."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.base_models import load_saved_tokenizer
from pipeline.config import LoadedConfig, load_config
from pipeline.data.dataset import block_dataset, held_out_splits
from pipeline.data.sources import read_sequences
from pipeline.data.token_cache import read_split, tokenize_sequences
from pipeline.errors import PipelineError
from pipeline.evaluate.report import relative_change
from pipeline.manifest import MANIFEST_FILE, load_manifest, sha256_file
from pipeline.record.history import run_that_read
from pipeline.train.model import ADAPTER_DIR, BASE_MODEL_DIR
from pipeline.types import Lineage, Plan, Prepared, Scores
from scrapers.git import head_commit, is_ancestor, open_repository, rev_list
from scrapers.scrape import SEQUENCES_FILE, holdout_counts

# Parent overrides an update does not replay: where it writes and what it reads are its own, its base is
# the parent's, and its learning rate is planned for continued training.
NOT_REPLAYED = ("output.", "scrape.rev", "scrape.max_commits", "scrape.since", "scrape.until", "train.model",
                "train.learning_rate")  # fmt: skip


@dataclass(frozen=True)
class Parent:
    """The run an update continues, and what happened in the repository since."""

    directory: Path
    manifest: dict[str, Any]
    manifest_path: Path
    """Its MANIFEST.json, or the record it kept under runs/ where a later run stopped before reading the
    history and wrote its own."""
    sha256: str
    repo: str
    old_head: str
    new_head: str
    commits_added: list[str]
    base_model: str
    """What the update loads: the parent's model, or the random base it saved beside its adapter."""

    @property
    def adapter_dir(self) -> Path:
        return self.directory / ADAPTER_DIR

    @property
    def up_to_date(self) -> bool:
        return not self.commits_added

    @property
    def plan(self) -> dict[str, Any]:
        return self.manifest.get("training_parameters") or {}

    def lineage(self, forgetting: dict[str, Any] | None = None) -> Lineage:
        return Lineage(
            self.manifest_path,
            self.sha256,
            self.old_head,
            self.new_head,
            self.commits_added,
            forgetting,
        )


def find_parent(directory: str, repos: list[str], model: str | None) -> Parent:
    """The run in `directory`, if an update can continue it; else one line saying why and what to do."""
    where = Path(directory)
    # Where a later run stopped before reading the history, the adapter is still the run's before it.
    path, manifest = run_that_read(where, load_manifest(where / MANIFEST_FILE))
    status = manifest.get("status")
    if status != "completed":
        raise PipelineError(
            f"--from {where}: that run did not complete (status {status}); finish it first (its own command "
            "with --resume) or train afresh with repotune --repo PATH"
        )
    if not (where / ADAPTER_DIR / "adapter_config.json").is_file():
        raise PipelineError(
            f"--from {where}: no adapter in {where / ADAPTER_DIR} (deleted or moved?); an update continues "
            "one: train afresh with repotune --repo PATH"
        )
    trained = manifest.get("repositories") or []
    if len(trained) != 1 or len(repos) > 1:
        raise PipelineError(
            f"--from {where}: an update follows one repository; that run trained on {len(trained)}"
        )
    described = manifest.get("model") or {}
    # An update of a tiny run loads the random base its first run saved (…/base_model): still tiny.
    same = {
        described.get("name"),
        "tiny" if Path(str(described.get("name"))).name == BASE_MODEL_DIR else None,
    }
    if model and model not in same:
        raise PipelineError(
            f"--model {model}: {where} trained an adapter for {described.get('name')}, and an adapter only "
            f"continues on its own base model; train afresh with --model {model}"
        )
    base = str(where / BASE_MODEL_DIR) if described.get("random_init") else str(described.get("name"))
    if described.get("random_init") and not (where / BASE_MODEL_DIR).is_dir():
        raise PipelineError(
            f"--from {where}: its random base model is missing ({where / BASE_MODEL_DIR}); train afresh"
        )
    repo = repos[0] if repos else trained[0]["path"]
    opened = open_repository(repo)
    old_head, new_head = (manifest.get("repository") or {}).get("head"), head_commit(opened)
    if not old_head or not new_head:
        raise PipelineError(f"{repo}: no HEAD to compare with the one {where} trained on")
    if not is_ancestor(opened, old_head, new_head):
        raise PipelineError(
            f"{repo}: history rewritten: {old_head[:12]}, the HEAD {where} trained on, is not in the history "
            f"of HEAD {new_head[:12]} (a rebase, amend or force-push?); an update cannot tell what is new, "
            f"so train afresh: repotune --repo {repo} --output-dir NEW_DIR"
        )
    added = rev_list(opened, f"{old_head}..{new_head}", None, None, None)
    return Parent(where, manifest, path, sha256_file(path), repo, old_head, new_head, added, base)


def update_config(
    parent: Parent, config: Path | None, overrides: list[str], flags: dict[str, Any]
) -> LoadedConfig:
    """The parent's config (its file and overrides, less what an update decides itself), then this
    command's --set and flags; the range is the new commits, the base the parent's."""
    ranges = ("scrape.rev", "scrape.max_commits", "scrape.since", "scrape.until")
    given = {*flags, *(text.split("=", 1)[0].strip() for text in overrides)}
    chosen = [key for key in ranges if key in given]
    if chosen:
        raise PipelineError(
            f"update reads the commits made since its parent, so {', '.join(chosen)} cannot be set; "
            "for another range, train afresh"
        )
    previous = parent.manifest.get("config") or {}
    source = Path(previous["source"]) if previous.get("source") else None
    replayed = {
        key: value
        for key, value in (previous.get("overrides") or {}).items()
        if not key.startswith(NOT_REPLAYED)
    }
    output_dir = flags.get("output.dir") or f"{parent.directory}-update-{parent.new_head[:8]}"
    if Path(output_dir).resolve() == parent.directory.resolve():
        raise PipelineError("--output-dir: an update writes beside the run it continues, not over it")
    forced = {
        "train.model": parent.base_model,
        "scrape.rev": f"{parent.old_head}..{parent.new_head}",
        "output.dir": output_dir,
    }
    loaded = load_config(
        config or (source if source and source.exists() else None),
        overrides,
        {**flags, **forced},
        base=replayed,
    )
    # Hold out the newest new commit when the scrape would hold out none (it needs 20), and validate on none.
    added = len(parent.commits_added)
    if (
        added >= 2
        and not holdout_counts(added, loaded.config.scrape)[0]
        and not loaded.explicit("scrape.holdout_max_share")
    ):
        one = {"scrape.holdout_max_share": math.ceil(10_000 / added) / 10_000, "scrape.valid_commits": 0}
        loaded = load_config(loaded.path, overrides, {**flags, **forced, **one}, base=replayed)
    return dataclasses.replace(loaded, continues=parent.plan)


def check_tokenizer(parent: Parent, prepared: Prepared) -> None:
    """The update tokenizes as the parent did, or its adapter would read other tokens."""
    if load_saved_tokenizer(parent.adapter_dir).get_vocab() != prepared.tokenizer.get_vocab():
        raise PipelineError(
            f"--from {parent.directory}: the tokenizer of {parent.base_model} is not the one that run trained "
            "with (a different model package or path?); an adapter only continues with its own tokenizer: "
            "train afresh"
        )


def parent_held_out(parent: Parent, prepared: Prepared, loaded: LoadedConfig, plan: Plan, directory: Path):
    """The parent's held-out commits, tokenized and packed as this update trains, by format ({} when the
    parent kept none, or its sequences.jsonl is gone)."""

    sequences = parent.directory / SEQUENCES_FILE
    records = (
        [record for record in read_sequences(sequences) if record["split"] == "eval"]
        if sequences.exists()
        else []
    )
    if not records:
        return {}
    train = loaded.config.train
    tokenize_sequences(
        records,
        prepared.tokenizer,
        prepared.style,
        (train.max_sequence_length, train.max_prompt_tokens),
        directory,
    )
    table = read_split(directory, "eval")
    splits = held_out_splits(
        directory, table, plan.sequence_length, prepared.tokenizer.pad_token_id, plan.truncate_at
    )
    return {name: block_dataset(split, plan.eval_blocks) for name, split in splits.items()}


def forgetting(before: Scores, after: Scores) -> dict[str, Any]:
    """The parent's held-out loss before and after the update: a rise is what the update forgot."""

    return {
        "before": before.loss,
        "after": after.loss,
        "relative_change": relative_change(before.loss, after.loss),
    }


def describe_forgetting(parent_dir: Path, before: Scores, after: Scores) -> str:
    """One line: the parent's held-out loss before and after the update."""
    change = forgetting(before, after)
    if change["relative_change"] is None:
        return (
            f"{parent_dir}'s held-out commits: not scored (it held none out, or its sequences.jsonl is gone)"
        )
    verdict = "forgotten" if change["relative_change"] > 0 else "kept"
    return (
        f"{parent_dir}'s held-out commits: loss {change['before']['loss']:.4f} → {change['after']['loss']:.4f} "
        f"({change['relative_change']:+.1%}: what it knew is {verdict})"
    )

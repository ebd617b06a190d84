"""The commands that run the first stages alone: the scrape, the plan, the token cache."""

from __future__ import annotations

from pipeline.config import LoadedConfig
from pipeline.data.sources import scrape as scrape_sources
from pipeline.data.token_cache import PLAN_SAMPLE
from pipeline.recipes.run import fit_to_machine, prepare_data
from pipeline.record.run import Record, open_run
from pipeline.train.probe import needs_measuring
from pipeline.types import Data, Plan


def scrape(loaded: LoadedConfig, argv: list[str], repos: list[str]) -> Record:
    """Scrape only: sequences.jsonl and the scrape sections of the manifest."""
    with open_run(loaded, "scrape", argv, repos) as record:
        record.step("scrape", scrape_sources, repos, loaded.config.scrape, record.output_dir)
        record.finish("scraped")
    return record


def plan(
    loaded: LoadedConfig, argv: list[str], repos: list[str], hardware_profile: str | None
) -> tuple[Record, Plan]:
    """Scrape (or reuse the scrape), plan; train nothing. Token statistics come from the token cache, or
    from a sample of a history not tokenized yet; a time budget on this machine loads the model to
    measure its speed."""
    with open_run(loaded, "plan", argv, repos) as record:
        data = prepare_data(record, loaded, repos, hardware_profile, PLAN_SAMPLE)
        decided = data.plan
        if needs_measuring(decided, data.machine, loaded):
            decided = fit_to_machine(record, loaded, data, resume=False)[1].plan
        record.finish("planned")
    return record, decided


def prepare(
    loaded: LoadedConfig, argv: list[str], repos: list[str], hardware_profile: str | None
) -> tuple[Record, Data]:
    """Scrape, tokenize into the token cache and pack, without training: a later `run` hits the cache."""
    with open_run(loaded, "prepare", argv, repos) as record:
        data = prepare_data(record, loaded, repos, hardware_profile)
        record.finish("prepared")
    return record, data

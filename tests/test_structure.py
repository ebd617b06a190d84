"""The shape of a run: scrapers/ stands alone, the plan is typed, the manifest is checked when a run ends."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

from pipeline.config import load_config
from pipeline.planner import make_plan
from pipeline.record import open_run
from pipeline.types import Plan
from tests.test_planner import TINY, cpu_machine, same_length

ROOT = Path(__file__).resolve().parent.parent


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return names


def test_scrapers_import_nothing_from_pipeline():
    for path in sorted((ROOT / "scrapers").glob("*.py")):
        assert not [name for name in imported_modules(path) if name.split(".")[0] == "pipeline"], path.name


def test_every_decision_is_a_plan_attribute_and_none_is_missing():
    plan = make_plan(same_length(100, 64), cpu_machine(), TINY, load_config(None))
    fields = {field.name for field in dataclasses.fields(Plan)} - {
        "decisions",
        "probe",
        "speed",
        "probe_note",
    }
    assert list(plan.decisions) and set(plan.decisions) == fields
    assert all(getattr(plan, name) == decision.value for name, decision in plan.decisions.items())
    decisions = dict(plan.decisions)
    del decisions["warmup_steps"]
    with pytest.raises(TypeError, match="warmup_steps"):
        Plan.from_decisions(decisions)


def test_a_finished_manifest_that_breaks_the_schema_is_a_bug_said_at_once(tmp_path):
    loaded = load_config(None, [f"output.dir={tmp_path / 'out'}"])
    broken = pytest.raises(RuntimeError, match=r"does not match its schema: training_parameters.batch_size")
    with broken, open_run(loaded, "plan", []) as record:
        record.doc["training_parameters"]["batch_size"] = "eight"
        record.finish("planned")

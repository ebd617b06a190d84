"""The shape of a run: scrapers/ stands alone, the plan is typed, the manifest is checked when a run ends."""

from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path

import pytest

from pipeline.config import load_config
from pipeline.plan.planner import make_plan
from pipeline.record.run import open_run
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


def project_imports() -> dict[str, set[str]]:
    """Each module of pipeline/ and scrapers/ → the project modules it imports, wherever in it (inside
    functions and under TYPE_CHECKING too)."""
    graph = {}
    for package in ("pipeline", "scrapers"):
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            graph[name] = {
                module
                for module in imported_modules(path)
                if module.split(".")[0] in ("pipeline", "scrapers")
            }
    return graph


def test_no_module_imports_itself_back():
    graph = project_imports()

    def cycle_from(start: str, module: str, path: tuple[str, ...]) -> tuple[str, ...] | None:
        for imported in sorted(graph.get(module, ())):
            if imported == start:
                return (*path, imported)
            if imported not in path and (found := cycle_from(start, imported, (*path, imported))):
                return found
        return None

    for module in graph:
        assert cycle_from(module, module, (module,)) is None, " → ".join(
            cycle_from(module, module, (module,))
        )


def test_the_values_stages_pass_import_no_stage():
    assert project_imports()["pipeline.types"] == set()


STAGES = ("data", "plan", "train", "suggest", "evaluate", "record", "use", "recipes")
"""pipeline/'s subpackages in the order a run flows, then the recipes that run them in order; the modules
directly in pipeline/ are the ground floor (the values, the config, the machine, the manifest's format)
that every stage stands on."""


def test_imports_run_one_way_down_the_stages():
    def floor(module: str) -> int:
        parts = module.split(".")
        return STAGES.index(parts[1]) if len(parts) > 2 and parts[1] in STAGES else -1

    upward = [
        f"{module} imports {imported}"
        for module, imports in project_imports().items()
        if module.startswith("pipeline")
        for imported in imports
        if imported.startswith("pipeline") and floor(imported) > floor(module)
    ]
    assert not upward, upward


def test_every_decision_is_a_plan_attribute_and_none_is_missing():
    plan = make_plan(same_length(100, 64), cpu_machine(), TINY, load_config(None))
    fields = {field.name for field in dataclasses.fields(Plan)} - {
        "decisions",
        "probe",
        "speed",
        "train_time",
        "probe_note",
    }
    assert list(plan.decisions) and set(plan.decisions) == fields
    assert all(getattr(plan, name) == decision.value for name, decision in plan.decisions.items())
    decisions = dict(plan.decisions)
    del decisions["warmup_steps"]
    with pytest.raises(TypeError, match="warmup_steps"):
        Plan.from_decisions(decisions)


def test_the_schema_has_every_decision_and_nothing_else():
    """A new plan parameter is its config field and its decision: the schema's training_parameters must
    follow, or this fails (the decisions, then what the plan records beside them)."""
    from pipeline.manifest import SCHEMA

    plan = make_plan(same_length(100, 64), cpu_machine(), TINY, load_config(None))
    section = SCHEMA["properties"]["training_parameters"]
    beside = {"decisions", "decision_order", "batch_probe", "batch_probe_note", "oom_retries"}
    assert set(section["properties"]) == set(plan.decisions) | beside
    assert set(section["required"]) == set(section["properties"])


def test_a_finished_manifest_that_breaks_the_schema_is_a_bug_said_at_once(tmp_path):
    loaded = load_config(None, [f"output.dir={tmp_path / 'out'}"])
    broken = pytest.raises(RuntimeError, match=r"does not match its schema: training_parameters.batch_size")
    with broken, open_run(loaded, "plan", [], []) as record:
        record.doc["training_parameters"]["batch_size"] = "eight"
        record.finish("planned")


def sources() -> list[Path]:
    """The project's code: the entry point, pipeline/ and scrapers/."""
    return [
        ROOT / "run_pipeline.py",
        *(path for package in ("pipeline", "scrapers") for path in sorted((ROOT / package).rglob("*.py"))),
    ]


def test_no_function_is_longer_than_a_screen():
    """60 lines at most, the entry point's too: a longer one is a list of steps waiting for names."""
    long = [
        f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for path in sources()
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.end_lineno - node.lineno + 1 > 60
    ]
    assert not long, long


def test_the_entry_point_is_a_table_of_contents():
    """run_pipeline.py names what each command does: 200 lines at most, each command 20 at most, and no
    loop, retry or check of its own (those live with the stage they belong to)."""
    source = (ROOT / "run_pipeline.py").read_text()
    assert len(source.splitlines()) <= 200
    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef) and node.name != "main":
            assert node.end_lineno - node.lineno + 1 <= 20, node.name
            work = [
                type(inner).__name__
                for inner in ast.walk(node)
                if isinstance(inner, ast.For | ast.While | ast.Try | ast.Raise)
            ]
            assert not work, f"{node.name}: {work}"


CONSUMED_ELSEWHERE = {
    "device": "train.model (where the model is loaded); the Trainer's use_cpu",
    "world_size": "train.distributed",
    "style": "data.examples (chat or raw)",
    "loss_on": "data.examples (the loss mask)",
    "loss_average": "train.loss",
    "attention": "train.model",
    "sequence_length": "data.dataset.pack",
    "truncate_at": "data.examples",
    "train_blocks": "data.dataset.keep_newest",
    "quantization": "train.model",
    "time_budget_s": "train.trainer (the deadline)",
    "measured_tokens_per_s": "the manifest (what the budget was planned on)",
    "train_seconds": "train.trainer (the deadline)",
    "train_sequences": "data.dataset.keep_newest",
    "files_share": "plan (the order train_sequences and train_files are kept in)",
    "train_files": "data.dataset.keep_newest",
    "effective_batch_size": "the batch size times the accumulation (both passed to the Trainer)",
    "steps_per_epoch": "the manifest (what the epochs come to)",
    "total_steps": "train.trainer (the progress line, the scheduler's horizon through the epochs)",
    "base_modules_trained": "train.model (modules_to_save)",
    "lora_dropout": "train.model (LoraConfig)",
    "cpu_threads": "train.trainer (torch's threads)",
    "follow_free_cores": "train.trainer (threads that follow the free cores)",
    "eval_samples": "evaluate.evaluation (the held-out answers scored)",
    "code_cases": "evaluate.scoreboard (the next lines asked)",
    "block_cases": "evaluate.scoreboard (the bodies asked)",
    "validate_model": "evaluate.evaluation (the validation answers)",
    "eval_blocks": "data.dataset (held-out and validation blocks)",
    "early_stopping_patience": "train.trainer (the early-stopping callback)",
}
"""The decisions that reach training other than through the Trainer's arguments, and what consumes each."""


def _another(name: str, value):
    """A value other than `value` for a decision, of its kind."""
    others = {"precision": "bf16", "lr_scheduler": "linear", "optimizer": "adamw_torch", "fsdp": "full_shard"}
    if name in others:
        return others[name]
    if isinstance(value, bool):
        return not value
    if isinstance(value, int | float):
        return value * 2 + 1
    if isinstance(value, list):
        return [*value, "tensorboard"]
    return {"eval_steps": 5, "prefetch_factor": 2, "fsdp_config": {"min_num_params": 1}}.get(
        name, "elsewhere.json"
    )


def test_every_planned_decision_reaches_training():
    """A decision the planner takes and nothing consumes is planned, printed and recorded, then ignored:
    each one changes the Trainer's arguments when it changes, or says what else consumes it. Adding a
    training parameter without passing it on fails here."""
    from pipeline.train.trainer import trainer_options

    cpu = make_plan(same_length(100, 64), cpu_machine(), TINY, load_config(None))
    assert not set(CONSUMED_ELSEWHERE) - set(cpu.decisions), "a decision named here is no longer planned"
    gpu = dataclasses.replace(cpu, device="cuda")  # what the arguments take on a GPU alone (tf32, pinning)

    given = {id(plan): trainer_options(plan, Path("checkpoints")) for plan in (cpu, gpu)}

    def reaches(plan, name: str) -> bool:
        try:
            changed = dataclasses.replace(plan, **{name: _another(name, getattr(plan, name))})
            return trainer_options(changed, Path("checkpoints")) != given[id(plan)]
        except Exception:  # the options refuse the value: they read it
            return True

    ignored = [
        name
        for name in sorted(set(cpu.decisions) - set(CONSUMED_ELSEWHERE))
        if not (reaches(cpu, name) or reaches(gpu, name))
    ]
    assert not ignored, (
        "planned but never given to the Trainer (pass them in trainer_options, or name their consumer in "
        f"CONSUMED_ELSEWHERE): {ignored}"
    )


_FIGURE = re.compile(
    r"\[[+−-]?\d+\.\d+, ?[+−-]?\d+\.\d+\]"  # an interval: [+0.9, +2.2]
    r"|(?<![\w.])[+−]\d+\.\d+ ?/ ?[+−]\d+\.\d+"  # a pair of differences: +1.1 / +0.6
    r"|\b\d+(?:\.\d+)? (?:s|ms|minutes) (?:of|where|against|instead of) \d"  # one timing set against another
    r"|\b\d+\.\d+ ?(?:s|ms|MB|GB)\b"  # a timing or a size to the decimal: 0.61 s, 1.5 GB
    r"|\b\d[\d,]* (?:tokens/s|MB|GB)\b"  # a speed or a size: 2,777 tokens/s, 526 MB
    r"|\b\d+(?:\.\d+)?× (?:as fast|faster|slower)"  # a ratio: 2.0× as fast
    r"|\bmeasured(?: on \d|: \d)"  # measured on 2 cores, measured: 0.5 s
)
"""A measured figure as they were pasted into docstrings and comments."""


def test_no_docstring_or_comment_holds_a_measured_figure():
    """Figures go stale with the next change: the code says what it does and why, the docs keep the
    figures (generated from benchmarks/), and a docstring points there."""
    found = []
    for path in sources():
        lines = path.read_text().splitlines()
        texts = [
            (getattr(node, "lineno", 1), ast.get_docstring(node, clean=False) or "")
            for node in ast.walk(ast.parse("\n".join(lines)))
            if isinstance(node, ast.Module | ast.FunctionDef | ast.ClassDef | ast.AsyncFunctionDef)
        ]
        texts += [(number, line.split("#", 1)[1]) for number, line in enumerate(lines, 1) if "#" in line]
        found += [f"{path.relative_to(ROOT)}:{number}" for number, text in texts if _FIGURE.search(text)]
    assert not found, found


def test_project_imports_are_at_the_top_unless_they_load_something_heavy():
    """An import inside a function hides the dependency graph from readers and tools; one is there only
    where it would load torch, transformers, GitPython or the like on a path that does not need them, and
    a `# heavy:` comment says which (on its line or the one above)."""
    unmarked, kept = [], 0
    for path in sources():
        lines = path.read_text().splitlines()
        for function in ast.walk(ast.parse("\n".join(lines))):
            if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for node in ast.walk(function):
                if not isinstance(node, ast.Import | ast.ImportFrom):
                    continue
                names = (
                    [node.module or ""] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
                )
                if any(name.split(".")[0] in ("pipeline", "scrapers") for name in names):
                    kept += 1
                    said = lines[node.lineno - 1] + lines[node.lineno - 2]
                    if "# heavy:" not in said:
                        unmarked.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not unmarked, unmarked
    assert kept <= 15


def test_use_imports_nothing_from_the_scoreboard():
    """What users take home (use/) stands on the suggestion system (suggest/), never on the evaluation: a
    new scored system changes evaluate/ and suggest/ alone."""
    found = [
        f"{module} imports {imported}"
        for module, imports in project_imports().items()
        if module.startswith("pipeline.use")
        for imported in imports
        if imported.startswith("pipeline.evaluate")
    ]
    assert not found, found


def test_the_run_reaches_the_evaluation_through_its_entry_points():
    """The recipes and the entry point call `before_training` and `after_training` (an update's forgetting
    check `evaluate` too), so a new scored system touches evaluate/ and suggest/, never the CLI."""
    allowed = {"before_training", "after_training", "evaluate"}
    found = []
    for path in [ROOT / "run_pipeline.py", *sorted((ROOT / "pipeline" / "recipes").glob("*.py"))]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("pipeline.evaluate"):
                found += [f"{path.name}: {alias.name}" for alias in node.names if alias.name not in allowed]
    assert not found, found


def test_every_test_of_the_machines_load_is_in_the_module_make_test_runs_alone():
    """`make test`'s quiet pass collects tests/test_busy_cpu.py alone (collecting the suite would import
    all of it again): a `quiet_machine` test anywhere else would be left out of both passes."""
    marked = [
        path.name
        for path in sorted((ROOT / "tests").glob("test_*.py"))
        if "mark.quiet_machine" in path.read_text()
        and path.name not in ("test_busy_cpu.py", Path(__file__).name)
    ]
    assert not marked, marked
    assert "pytestmark = pytest.mark.quiet_machine" in (ROOT / "tests" / "test_busy_cpu.py").read_text()

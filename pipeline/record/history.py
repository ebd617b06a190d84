"""Runs kept: each run's small files (its manifest and the scoreboard's answers) copied under the output
directory's `runs/`, so a run again in the same directory does not destroy the last one's record, and
`repotune runs` lists them as a table (`diff` with no runs named compares the newest two)."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from pipeline.errors import PipelineError
from pipeline.manifest import EVALUATION_FILE, MANIFEST_FILE, read_manifest, trained_on
from pipeline.progress import aligned
from pipeline.scores import CODE_LABELS
from pipeline.train.model import ADAPTER_DIR

RUNS_DIR = "runs"


def kept_name(manifest: dict[str, Any]) -> str:
    """A run's folder under runs/: when it started (so names sort as runs began), then its id."""
    run = manifest.get("run") or {}
    started = str(run.get("started_at") or "")
    stamp = started.replace("-", "").replace(":", "").split(".")[0] + "Z" if started else "unknown"
    return f"{stamp}-{run.get('id') or 'run'}"


def written_during(path: Path, manifest: dict[str, Any]) -> bool:
    """Whether `path` was written while the run `manifest` records ran (not by a run before it)."""
    run = manifest.get("run") or {}
    try:
        started = datetime.fromisoformat(str(run["started_at"]).replace("Z", "+00:00")).timestamp()
        return path.is_file() and path.stat().st_mtime >= started
    except (KeyError, ValueError, OSError):
        return False


def keep(output_dir: Path, manifest: dict[str, Any], adapter: bool = False) -> Path:
    """Copy the run `manifest` records (written last to output_dir) into runs/, with the scoreboard's
    answers where this run wrote them and, where asked, its adapter; the folder it went to."""
    folder = output_dir / RUNS_DIR / kept_name(manifest)
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy2(output_dir / MANIFEST_FILE, folder / MANIFEST_FILE)
    answers = output_dir / EVALUATION_FILE
    if written_during(answers, manifest):
        shutil.copy2(answers, folder / EVALUATION_FILE)
    if adapter and (output_dir / ADAPTER_DIR).is_dir():
        shutil.copytree(output_dir / ADAPTER_DIR, folder / ADAPTER_DIR, dirs_exist_ok=True)
    return folder


def keep_previous(output_dir: Path, previous: dict[str, Any] | None) -> None:
    """Keep the run this directory recorded before, where nothing kept it (killed with kill -9, or run by a
    version that kept nothing), before this run replaces its files."""
    if previous is None or not (previous.get("run") or {}).get("id"):
        return
    if not (output_dir / RUNS_DIR / kept_name(previous) / MANIFEST_FILE).is_file():
        keep(output_dir, previous)


def kept_runs(output_dir: Path) -> list[Path]:
    """The kept runs' folders, oldest first."""
    root = output_dir / RUNS_DIR
    return (
        sorted(path for path in root.iterdir() if (path / MANIFEST_FILE).is_file()) if root.is_dir() else []
    )


def newest_two(output_dir: Path) -> tuple[Path, Path]:
    """The two newest kept runs of `output_dir` that read a history (what `diff` compares when no runs are
    named): a run that stopped before it (a model name that is not one) has nothing to compare, and beside
    a run that did, every figure would read as new."""
    kept = kept_manifests(output_dir)
    read = [folder for folder, manifest in kept if manifest and read_a_history(manifest)]
    if len(read) < 2:
        held = f"holds {len(read)} kept run" + ("" if len(read) == 1 else "s") + " that read a history"
        stopped = len(kept) - len(read)
        held += f" ({stopped} more stopped before reading one)" if stopped else ""
        raise PipelineError(
            f"{output_dir} {held}: run again there to compare two, or name them (repotune diff BEFORE AFTER)"
        )
    return read[-2], read[-1]


def kept_manifests(output_dir: Path) -> list[tuple[Path, dict[str, Any] | None]]:
    """Each kept run's folder and its manifest (None: unreadable), oldest first."""
    kept: list[tuple[Path, dict[str, Any] | None]] = []
    for folder in kept_runs(output_dir):
        try:
            kept.append((folder, read_manifest(folder / MANIFEST_FILE)))
        except (OSError, ValueError):
            kept.append((folder, None))
    return kept


def run_that_read(output_dir: Path, manifest: dict[str, Any]) -> tuple[Path, dict[str, Any]]:
    """The run whose adapter and checkpoints `output_dir` holds, given `manifest`, the directory's own: that
    run, or where it stopped before reading a history (a model name that is not one, which touches
    neither), the newest kept run that read one; with the path its manifest is read from."""
    if not read_a_history(manifest):
        for folder, kept in reversed(kept_manifests(output_dir)):
            if kept and read_a_history(kept):
                return folder / MANIFEST_FILE, kept
    return output_dir / MANIFEST_FILE, manifest


def trained_there(output_dir: Path, manifest: dict[str, Any]) -> list[tuple[str, str]]:
    """What the adapter and checkpoints in `output_dir` learned (`trained_on`), given `manifest`, the
    directory's own: a later run that stopped before reading a history left them as they were."""
    return trained_on(run_that_read(output_dir, manifest)[1])


def read_a_history(manifest: dict[str, Any]) -> bool:
    """Whether the run got as far as reading its repositories' history (one that stopped before, at a
    model name that is not one, wrote its manifest and nothing else)."""
    return _get(manifest, "scrape", "commits_seen") is not None


def _get(manifest: dict[str, Any], *keys: str) -> Any:
    value: Any = manifest
    for key in keys:
        value = value.get(key) if isinstance(value, dict) else None
    return value


def _budget(manifest: dict[str, Any]) -> str:
    """The time budget the plan set; the one asked for (`auto`, `10m`) where the run ended before a plan."""
    if not _get(manifest, "training_parameters", "decisions", "time_budget_s"):
        return str(_get(manifest, "config", "effective", "train", "time_budget") or "none")
    seconds = _get(manifest, "training_parameters", "time_budget_s")
    if not seconds:
        return "none"
    return f"{seconds / 60:g}m" if seconds % 60 == 0 else f"{seconds:.0f}s"


def _score(task: Any, *metrics: str) -> str:
    if not isinstance(task, dict) or task.get(metrics[0]) is None:
        return "-"
    return " / ".join(f"{task[metric]:.1f}" for metric in metrics if task.get(metric) is not None)


def _chosen_code(manifest: dict[str, Any]) -> Any:
    """The next-line scores of the system the run chose to write them (`code_system`): the suggestions
    hold messages alone, a next line's writer is scored under its own name."""
    evaluation = _get(manifest, "training_report", "evaluation")
    name = _get(evaluation, "code_system", "name")
    if name not in CODE_LABELS:
        return None
    phase, task, _ = CODE_LABELS[name]
    return _get(evaluation, "tasks", phase, task)


def _repository(manifest: dict[str, Any]) -> str:
    """The repositories a run read; where it stopped before reading one, the one it was asked to read."""
    read = manifest.get("repositories") or [manifest.get("repository") or {}]
    paths = [str(entry.get("path") or "") for entry in read]
    names = [Path(path.removesuffix("/.git")).name for path in paths if path] or ["-"]
    return ", ".join(names)


COLUMNS: dict[str, Callable[[dict[str, Any]], str]] = {
    "started": lambda m: str(_get(m, "run", "started_at") or "-")[:16].replace("T", " "),
    "command": lambda m: str(_get(m, "run", "command") or "-"),
    "repository": _repository,
    "commit": lambda m: ", ".join(str(e.get("head") or "")[:7] for e in m.get("repositories") or []) or "-",
    # A run that ended before it loaded its model (a name that is not one) shows the name it was given.
    "model": lambda m: str(
        _get(m, "model", "name") or _get(m, "config", "effective", "train", "model") or "-"
    ),
    "budget": _budget,
    "steps": lambda m: str(_get(m, "training_report", "training", "global_step") or "-"),
    "message chrF / ES": lambda m: _score(
        _get(m, "training_report", "evaluation", "tasks", "suggested", "message"), "chrf", "edit_similarity"
    ),
    "code EM / ES": lambda m: _score(_chosen_code(m), "exact_match_pct", "edit_similarity"),
    "status": lambda m: str(m.get("status") or "-"),
}
"""What `repotune runs` shows of each run: the scores are the suggestions' (the systems the run chose)."""


def runs_table(output_dir: Path, only_changed: bool = False) -> str:
    """The kept runs of `output_dir` as an aligned table, oldest first; `only_changed`: the columns whose
    values differ between runs (the run's folder always)."""
    kept = kept_manifests(output_dir)
    if not kept:
        if not output_dir.is_dir():
            raise PipelineError(
                f"{output_dir}: no such directory (name the --output-dir a run wrote to: repotune runs DIR)"
            )
        return f"{output_dir} keeps no runs yet: a run there keeps its record under {output_dir / RUNS_DIR}"
    rows = []
    for folder, manifest in kept:
        read = manifest or {"status": "unreadable"}
        rows.append([folder.name] + [column(read) for column in COLUMNS.values()])
    header = ["run", *COLUMNS]
    shown = [0] + [
        index for index in range(1, len(header)) if not only_changed or len({row[index] for row in rows}) > 1
    ]
    return "\n".join(aligned([[header[i] for i in shown]] + [[row[i] for i in shown] for row in rows])) + (
        f"\n\n{len(rows)} run{'s' if len(rows) != 1 else ''} kept in {output_dir / RUNS_DIR} (repotune diff "
        f"{output_dir} compares the newest two that read a history; repotune report {output_dir / RUNS_DIR}/RUN … any of them)"
    )

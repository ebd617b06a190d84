"""What the benchmarks share: where their results files go and how they are written (the docs' figures
are generated from them: benchmarks/figures.py), what measured them, and the percentiles they print."""

from __future__ import annotations

import argparse
import statistics
import subprocess
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"


def write_result(path: Path, document: dict[str, Any]) -> Path:
    """A benchmark's results file (in RESULTS by default: what the figures are generated from)."""
    import orjson

    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(orjson.dumps(document, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS) + b"\n")
    return path


def measured_by() -> dict[str, Any]:
    """Which repotune commit measured (and whether its tracked files had changes not committed), on how
    many cores and which GPUs (as a run detects them)."""
    from pipeline.hardware import detect_hardware

    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True)
    changed = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    hardware = detect_hardware()
    return {
        "repotune": head.stdout.strip(),
        "uncommitted": bool(changed.stdout.strip()),
        "cores": hardware.usable_cores,
        "gpus": [g.name for g in hardware.gpus],
    }


def name_option(parser: argparse.ArgumentParser) -> None:
    """`--name`: what the results call the repository (a fetched mirror's folder is only `repo`)."""
    parser.add_argument(
        "--name", help="what to call the repository in the results (default: its folder's name)"
    )


def repository_name(given: str | None, path: str) -> str:
    """The name `--name` gave, else the repository folder's."""
    return given or Path(path).resolve().name


def percentile(values: list[float], q: int) -> float:
    """Interpolated between the two nearest (so p50 is the median)."""
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1] if len(values) > 1 else values[0]

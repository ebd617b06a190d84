"""What the benchmarks share: where their results files go and how they are written (the docs' figures
are generated from them: benchmarks/figures.py), what measured them, and the percentiles they print."""

from __future__ import annotations

import statistics
import subprocess
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"


def write_result(path: Path, document: dict[str, Any]) -> Path:
    """A benchmark's results file (in RESULTS by default: what the figures are generated from)."""
    import orjson

    path.write_bytes(orjson.dumps(document, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS) + b"\n")
    return path


def machine() -> dict[str, Any]:
    """Which repotune commit measured, on how many cores (a GPU's figures would name it)."""
    from pipeline.hardware import usable_cores

    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True)
    return {"repotune": head.stdout.strip(), "cores": usable_cores(), "gpus": []}


def percentile(values: list[float], q: int) -> float:
    """Interpolated between the two nearest (so p50 is the median)."""
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1] if len(values) > 1 else values[0]

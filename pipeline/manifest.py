"""MANIFEST.json: one JSON document per run, rewritten atomically as the run goes.

Written with orjson: keys sorted, 2-space indent, trailing newline (so even a
`git diff` of two manifests reads well). Every write goes to a temporary file
in the same directory, is flushed to disk, then renamed over the old one, so
a reader (or a killed run) never sees a half-written file.
"""

from __future__ import annotations

import math
import os
import subprocess
import uuid
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

import orjson

MANIFEST_FILE = "MANIFEST.json"
SCHEMA_VERSION = "1.0.0"
_DUMP_OPTIONS = (
    orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS | orjson.OPT_APPEND_NEWLINE | orjson.OPT_SERIALIZE_NUMPY
)


def utc_now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def new_manifest(command: str, argv: list[str]) -> dict[str, Any]:
    """A manifest for a run that is starting: every section present, null until measured."""
    return {
        "schema_version": SCHEMA_VERSION,
        "status": "running",
        "error": None,
        "tool": tool_info(),
        "run": {
            "id": uuid.uuid4().hex[:12],
            "command": command,
            "argv": argv,
            "started_at": utc_now(),
            "finished_at": None,
            "current_step": None,
            "latest_loss": None,
        },
        "config": None,
        "repository": None,
        "scrape": None,
        "dataset": None,
        "hardware": None,
        "training_parameters": None,
        "training_report": None,
        "outputs": None,
        "timings": {},
        "total_execution_time_seconds": None,
    }


def tool_info() -> dict[str, Any]:
    try:
        version = metadata.version("repotune")
    except metadata.PackageNotFoundError:
        version = None
    return {"name": "repotune", "version": version, "git_sha": _tool_git_sha()}


def _tool_git_sha() -> str | None:
    """The commit of the repotune checkout running now, when it is one."""
    root = Path(__file__).resolve().parent.parent
    if not (root / ".git").exists():
        return None
    try:
        result = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return result.stdout.strip() or None


def finite(value: float | None) -> float | None:
    """A float for the manifest: NaN and ±Infinity become null (JSON has neither)."""
    if value is None or not math.isfinite(value):
        return None
    return float(value)


def write_manifest(path: Path, document: dict[str, Any]) -> None:
    """Replace `path` with `document` atomically (temp file in the same directory, fsync, rename)."""
    data = orjson.dumps(document, option=_DUMP_OPTIONS)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(temporary, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, path)


def read_manifest(path: Path) -> dict[str, Any]:
    return orjson.loads(path.read_bytes())

"""MANIFEST.json: one JSON document per run, rewritten atomically as the run goes.

Written with orjson: keys sorted, 2-space indent, trailing newline (so even a
`git diff` of two manifests reads well). Every write goes to a temporary file
in the same directory, is flushed to disk, then renamed over the old one, so
a reader (or a killed run) never sees a half-written file.
"""

from __future__ import annotations

import hashlib
import math
import os
import socket
import subprocess
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

import orjson

from pipeline.errors import PipelineError
from scrapers.git import strip_credentials
from scrapers.safe_git import run_safe_git
from scrapers.secrets import redact_all

MANIFEST_FILE = "MANIFEST.json"
EVALUATION_FILE = "evaluation.jsonl"  # every held-out question and each system's answer, beside it
TENSORBOARD_DIR = "tensorboard"  # train.report_to=[tensorboard]: event files beside MANIFEST.json
SCHEMA_PATH = Path(__file__).resolve().parent / "manifest.schema.json"
SCHEMA = orjson.loads(SCHEMA_PATH.read_bytes())
SCHEMA_ID = SCHEMA["$id"]
SCHEMA_VERSION = "1.2.0"  # semver: the major changes only when a path users read changes meaning or goes
_DUMP_OPTIONS = (
    orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS | orjson.OPT_APPEND_NEWLINE | orjson.OPT_SERIALIZE_NUMPY
)


def provenance_hash(payload: dict[str, Any]) -> str:
    """sha256 of the payload as JSON with sorted keys: the same inputs always give the same key."""
    return hashlib.sha256(orjson.dumps(payload, option=orjson.OPT_SORT_KEYS)).hexdigest()


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def utc_now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def new_manifest(command: str, argv: list[str]) -> dict[str, Any]:
    """A manifest for a run that is starting: every key the schema defines, null until measured."""
    return conform(
        {
            "$schema": SCHEMA_ID,
            "schema_version": SCHEMA_VERSION,
            "status": "running",
            "tool": tool_info(),
            "run": {
                "id": uuid.uuid4().hex[:12],
                "command": command,
                "argv": recorded_argv(argv),
                "started_at": utc_now(),
                "status": "running",
                "pid": os.getpid(),
                "hostname": socket.gethostname(),
            },
        }
    )


def recorded_argv(argv: Sequence[str]) -> list[str]:
    """The command line as a run's record keeps it: a URL without its user info (a clone URL pasted with
    its token as `--repo`) and every secret the history's redaction finds replaced, as a scrape records
    the repository's remote. Only a word that holds a URL is read as one (a `?` ends a URL's path)."""
    urls = [
        strip_credentials(arg) if "://" in arg and "@" in arg and not any(c.isspace() for c in arg) else arg
        for arg in argv
    ]
    return [text for text, _ in redact_all(urls)]


def recorded_error(error: str, argv: Sequence[str]) -> str:
    """An error as a run's record keeps it: the words of the command line it repeats as `recorded_argv`
    keeps them, and any other secret redacted (the terminal got it as it was)."""
    for typed, kept in zip(argv, recorded_argv(argv), strict=True):
        if typed != kept:
            error = error.replace(typed, kept)
    return redact_all([error])[0][0]


def mark_finished(document: dict[str, Any], status: str, error: str | None = None) -> None:
    """Record how the run ended: at the top level for the one-word question (`jq .status`), and in
    `run` with the rest of the run's record."""
    document["status"] = document["run"]["status"] = status
    document["error"] = document["run"]["error"] = error
    document["run"]["finished_at"] = utc_now()


def conform(document: dict[str, Any]) -> dict[str, Any]:
    """`document` with every key the schema defines present (missing ones null, [] or {})."""
    return _conform(SCHEMA, document)


def _conform(node: dict[str, Any], value: Any) -> Any:
    node = _resolve(node)
    if value is None:
        return _skeleton(node)
    if "properties" in node and isinstance(value, dict):
        return {
            **value,
            **{key: _conform(child, value.get(key)) for key, child in node["properties"].items()},
        }
    return value


def _skeleton(node: dict[str, Any]) -> Any:
    node = _resolve(node)
    types = node.get("type", [])
    types = types if isinstance(types, list) else [types]
    if "null" in types or not types:
        return None  # a value that can be "not measured"
    if "properties" in node:
        return {key: _skeleton(child) for key, child in node["properties"].items()}
    if "array" in types:
        return []
    if "object" in types:
        return {}  # a map (reasons, decisions, timings): empty until something is counted
    return None


def _resolve(node: dict[str, Any]) -> dict[str, Any]:
    reference = node.get("$ref")
    return SCHEMA["$defs"][reference.rsplit("/", 1)[1]] if reference else node


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
        result = run_safe_git(
            ["-C", str(root), "rev-parse", "HEAD"],
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


def write_json(path: Path, document: dict[str, Any]) -> None:
    """Replace `path` with `document` atomically (temp file in the same directory, fsync, rename): how
    the run's record writes MANIFEST.json, and every other JSON file a crash must not leave half written
    (a checkpoint's stamp, the remembered speeds, `monitor`'s report)."""
    data = orjson.dumps(document, option=_DUMP_OPTIONS)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(temporary, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)  # a full disk leaves no half-written file behind
        raise


def schema_problems(document: dict[str, Any]) -> list[str]:
    """Where `document` breaks the manifest schema (empty when it matches), one line per problem."""
    from jsonschema import Draft202012Validator

    validator = Draft202012Validator(SCHEMA, format_checker=Draft202012Validator.FORMAT_CHECKER)
    return [
        f"{'.'.join(map(str, error.absolute_path)) or '(root)'}: {error.message}"
        for error in validator.iter_errors(document)
    ]


def read_manifest(path: Path) -> dict[str, Any]:
    return orjson.loads(path.read_bytes())


def manifest_file(path: Path) -> Path:
    """The manifest a user means: the file given, or the one in the run's output directory given."""
    return path / MANIFEST_FILE if (path / MANIFEST_FILE).is_file() else path


def trained_on(manifest: dict[str, Any]) -> list[tuple[str, str]]:
    """The repositories a run learned, from its manifest: each one's path and the commit it trained up to."""
    return [
        (str(learned.get("path")), str(learned.get("head"))) for learned in manifest.get("repositories") or []
    ]


def load_manifest(path: Path) -> dict[str, Any]:
    """A manifest a user points a command at; anything that is not one is a one-line error naming it."""

    try:
        data = path.read_bytes()
    except IsADirectoryError:
        raise PipelineError(
            f"{path} is a directory without a {MANIFEST_FILE}, not a run's output directory"
        ) from None
    except OSError as err:
        raise PipelineError(f"cannot read {path}: {err.strerror or err}") from None
    if not data.strip():
        raise PipelineError(
            f"{path} is empty, not a manifest (a run still writing it? try again when it ends)"
        )
    try:
        document = orjson.loads(data)
    except orjson.JSONDecodeError as err:
        if "utf-8" in str(err).lower():
            raise PipelineError(f"{path} is not UTF-8 text, so not a manifest") from None
        raise PipelineError(f"{path} is not valid JSON ({err}); a manifest is always complete JSON") from None
    if not isinstance(document, dict):
        raise PipelineError(f"{path} holds a JSON {type(document).__name__}, not a manifest (a JSON object)")
    return document


def write_text_output(path: Path, text: str) -> Path:
    """Write a command's output file, making its folder as `--output-dir` and `export` do; an unwritable
    path is a one-line error naming it."""

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    except (FileExistsError, NotADirectoryError):  # mkdir's: a file stands where a folder would be
        file = next(parent for parent in path.parents if parent.exists())
        raise PipelineError(f"cannot write {path}: {file} is a file, not a folder") from None
    except OSError as err:
        raise PipelineError(f"cannot write {path}: {err.strerror or err}") from None
    return path

"""Jupyter notebooks read as their cells' source, not as the JSON git diffs.

git diffs a notebook as JSON: each line of code a quoted string with its `\\n`, between execution
counts, metadata and outputs (base64 images, printed tables). A model trained on that learns JSON
punctuation, and retrieval indexes output numbers as if they were names. Both versions of a
changed notebook are read instead (`scrapers.git.blob_contents` in a scrape; `contents_here` in the
commit hook, which does without GitPython's import), each rendered in the percent format
that jupytext, VS Code and Spyder read as a notebook (`# %%` before a code cell, `# %% [markdown]`
before a Markdown cell, whose lines are commented), without outputs, counts or metadata, and diffed
with git's context. The commit hook and `generate` read a staged notebook the same way
(`scrapers.filters.as_trained`), from the repository they run in.
"""

from __future__ import annotations

import dataclasses
import difflib
import subprocess
from collections.abc import Callable, Iterable, Sequence

import orjson

from scrapers.commit import FileChange
from scrapers.safe_git import run_safe_git

SUFFIX = ".ipynb"
MAX_BYTES = 64 << 20
"""A notebook's version is read up to this size (bytes; one at a time): its outputs make it large."""

Contents = Callable[[Sequence[str]], dict[str, bytes]]
"""Blob ids → their bytes (those that could be read)."""


def is_notebook(change: FileChange) -> bool:
    """A notebook's change. Also one git called binary: above the scrape's `max_file_bytes` git does
    not diff a file, and a notebook is that large for its outputs (plots as base64), not its source."""
    return change.path.endswith(SUFFIX) and not change.submodule


def blobs_of(changes: Iterable[FileChange]) -> list[str]:
    """The blob ids of both versions of every notebook among `changes`."""
    return sorted(
        {blob for change in changes if is_notebook(change) for blob in (change.old_blob, change.blob) if blob}
    )


def as_source(change: FileChange, contents: dict[str, bytes], context: int) -> FileChange:
    """A notebook's change as a diff of its cells' source (`context` lines around each change): no
    hunk where only outputs, counts or metadata changed (the notebook was run again: its name is all
    there is to say). As git gave it where a version could not be read or is not a notebook (a
    conflict committed into it), and for any other file."""
    if not is_notebook(change):
        return change
    old = cells_source(contents.get(change.old_blob or "")) if change.status != "A" else []
    new = cells_source(contents.get(change.blob or "")) if change.status != "D" else []
    if old is None or new is None:
        return change
    lines = difflib.unified_diff(old, new, n=context, lineterm="")
    hunks = "".join(f"{line}\n" for line in list(lines)[2:])  # without difflib's ---/+++ lines
    return dataclasses.replace(
        change, hunks=hunks, patch_bytes=len(hunks.encode()), oversize=False, binary=False
    )


def cells_source(raw: bytes | None) -> list[str] | None:
    """A notebook's cells in the percent format, one string per line; None where `raw` is not a
    notebook (nbformat 4's `cells`, or nbformat 3's `worksheets`, whose code cells hold `input`)."""
    if raw is None:
        return None
    try:
        notebook = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(notebook, dict):
        return None
    cells = notebook.get("cells")
    if cells is None and isinstance(notebook.get("worksheets"), list):
        cells = [
            cell
            for sheet in notebook["worksheets"]
            if isinstance(sheet, dict) and isinstance(sheet.get("cells"), list)
            for cell in sheet["cells"]
        ]
    if not isinstance(cells, list):
        return None
    lines: list[str] = []
    for cell in cells:
        if not isinstance(cell, dict):
            return None
        kind = cell.get("cell_type")
        source = cell.get("source", cell.get("input", ""))
        text = "".join(map(str, source)) if isinstance(source, list) else str(source)
        if lines:
            lines.append("")
        if kind == "code":
            lines += ["# %%", *text.splitlines()]
        else:  # markdown, raw, nbformat 3's heading: prose, commented as jupytext comments it
            lines += [f"# %% [{kind or 'markdown'}]", *(f"# {line}".rstrip() for line in text.splitlines())]
    return lines


def parse_batch(blobs: Sequence[str], output: bytes) -> dict[str, bytes]:
    """`git cat-file --batch`'s output for `blobs` (each `<id> <type> <size>` and the bytes, or
    `<name> missing`), in the order asked: by the ids as asked, which a diff may abbreviate."""
    contents: dict[str, bytes] = {}
    at = 0
    for blob in blobs:
        end = output.find(b"\n", at)
        if end < 0:
            break
        header = output[at:end].split()
        at = end + 1
        if len(header) == 3 and header[2].isdigit():
            size = int(header[2])
            if header[1] == b"blob" and size <= MAX_BYTES:  # what the scrape would read
                contents[blob] = output[at : at + size]
            at += size + 1
    return contents


def contents_here(blobs: Sequence[str]) -> dict[str, bytes]:
    """The blobs from the repository of the current directory (where the commit hook and `generate`
    run), read with the scraper's safe settings; none outside a repository."""
    if not blobs:
        return {}
    try:
        output = run_safe_git(
            ["cat-file", "--batch"], input="\n".join(blobs).encode() + b"\n", capture_output=True, timeout=10
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    return parse_batch(blobs, output)

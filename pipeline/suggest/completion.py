"""Completing a repository's code: the next line at a cursor, or the body under a line that opens one (a
block), by a model or by the repository's own lines.

- **The prompt** is what code models are pretrained on: the file as `<filename>path` then its text up to
  the cursor (`bare_prompt`); with retrieved context, the repository format, `<repo_name>`, then each
  retrieved chunk of another file and the file itself after `<file_sep>path` (`context_prompt`). It ends
  at the cursor, after the line break that ends the last line and any blank lines under it; the model
  reads it without them and its answer spells them first (`generate_batched`'s `next_line`: token
  healing); a block's answer is cut where a line is indented less than its first (`body_of`). A model
  whose tokenizer has fill-in-the-middle tokens is also given the lines after the cursor (`infill`), as
  training's infilled files were, the prefix ending before its last line break.
- **The context** is BM25 over chunks of the files as they stood at the split point (`CodeIndex`), other
  files than the one being edited, queried with the names in the lines before the cursor; the last chunk
  is the file's own lines out of the prompt's window (before it, or after the cursor) that share the most
  of those names, where some do (`own_chunk`).
- **The lookup for code** needs no model: the line (or the body) that follows the most similar lines
  elsewhere in the repository (the no-model floor every model must beat).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from pipeline.data.examples import infill_text
from pipeline.suggest.retrieval import import_bm25s, name_terms
from scrapers.completions import AFTER_LINES, BEFORE_LINES, BLOCK_LINES, indent_of

CHUNK_LINES = 10  # a retrieved chunk of another file
CONTEXT_CHUNKS = 2  # chunks a prompt carries
QUERY_LINES = 20  # the lines before the cursor that query the chunks
LOOKUP_LINES = 3  # the lines before the cursor the lookup matches, and before a line of another file
# The lines before the cursor a prompt keeps, at most (about the 20 lines published baselines give): on a
# CPU, reading the prompts is nearly all a score costs.
PROMPT_CHARS = 800
CHUNK_CHARS = 400  # of a retrieved chunk
AFTER_CHARS = 400  # of the file after the cursor, for a model that infills
LINE_TOKENS = 32  # most tokens generated for one line
BLOCK_TOKENS = 96  # and for a block's body


@dataclass(frozen=True)
class CodeCase:
    """A line a held-out (or validation) commit added, with its file as an editor holds it then."""

    commit: str
    split: str
    repo: str
    path: str
    before: str
    """The file's lines before the cursor, each ending in its line break."""
    line: str
    """The line that was written there."""
    after: str = ""
    """The file's lines after it."""
    kind: str = "line"
    """`line`, or `block`: then `line` is the body and `before` ends with the line that opens it."""


def read_cases(path: Path) -> list[CodeCase]:
    """Every case in COMPLETIONS_FILE (newest commit first); none where the scrape wrote none."""
    if not path.exists():
        return []
    records = (orjson.loads(line) for line in path.read_bytes().splitlines())
    return [
        CodeCase(
            r["commit"], r["split"], r["repo"], r["path"], r["before"], r["line"], r["after"],
            r.get("kind", "line"),
        )
        for r in records
    ]  # fmt: skip


def cases_of(
    cases: Sequence[CodeCase], split: str, commits: Sequence[str] | None = None, kind: str = "line"
) -> list[CodeCase]:
    """The `cases` of `split`, next lines or blocks (`kind`), of `commits` only where given."""
    wanted = set(commits) if commits is not None else None
    return [
        case
        for case in cases
        if case.split == split and case.kind == kind and (wanted is None or case.commit in wanted)
    ]


def bare_prompt(case: CodeCase, infill: bool = False) -> str:
    """The file up to the cursor as a code model was pretrained on one file; with `infill`, then the
    lines after the cursor (`infilled`)."""
    return infilled(f"<filename>{case.path}\n{_before(case)}", case, infill)


def context_prompt(case: CodeCase, chunks: Sequence[tuple[str, str]], infill: bool = False) -> str:
    """The file up to the cursor after `chunks` (path, text) of other files, in the repository format;
    with `infill`, then the lines after the cursor (`infilled`)."""
    parts = [f"<repo_name>{case.repo}"]
    parts += [f"<file_sep>{path}\n{text[:CHUNK_CHARS]}" for path, text in chunks]
    return infilled("".join(parts) + f"<file_sep>{case.path}\n{_before(case)}", case, infill)


def infilled(prompt: str, case: CodeCase, infill: bool) -> str:
    """`prompt` as the prefix the answer fills in before the file's lines after the cursor (at most
    AFTER_CHARS), the prefix before its last line break and the lines after beginning with the one that
    ends the answer's line, as training's infilled files split them; `prompt` as it is without
    `infill`, or at the end of the file."""
    if not (infill and case.after):
        return prompt
    return infill_text(prompt.removesuffix("\n"), f"\n{case.after[:AFTER_CHARS]}")


def _before(case: CodeCase) -> str:
    return case.before[-PROMPT_CHARS:]


def own_chunk(case: CodeCase, query: Sequence[str]) -> str | None:
    """The CHUNK_LINES lines of the case's own file that the prompt does not hold (of the BEFORE_LINES
    before the cursor, those before the prompt's window; the AFTER_LINES after it) sharing the most of
    `query`'s names, the first of equals; None where none shares one. A line written again in its own
    file, out of the window, is a line the model can copy (docs/experiments.md)."""
    before = "".join(case.before.splitlines(keepends=True)[-BEFORE_LINES:])
    out_of_window = before[: max(0, len(before) - PROMPT_CHARS)].splitlines()
    after = case.after.splitlines()[:AFTER_LINES]
    chunks = _chunks(out_of_window) + _chunks(after)
    wanted = set(query)
    shared = [len(wanted.intersection(name_terms(chunk))) for chunk in chunks]
    best = max(range(len(chunks)), key=shared.__getitem__, default=None)
    return chunks[best] if best is not None and shared[best] else None


def _chunks(lines: Sequence[str]) -> list[str]:
    """`lines` (without their line breaks) CHUNK_LINES at a time, each a chunk's text."""
    return [
        "\n".join(lines[start : start + CHUNK_LINES]) + "\n" for start in range(0, len(lines), CHUNK_LINES)
    ]


def body_of(text: str) -> str:
    """The body `text` begins with: its first line and the lines after it indented as deep or deeper
    (blank ones within), at most BLOCK_LINES; a line indented less ends it, as the line after a body does."""
    lines = text.split("\n")
    depth = indent_of(lines[0])
    kept: list[str] = []
    for line in lines[:BLOCK_LINES]:
        if kept and line.strip() and indent_of(line) < depth:
            break
        kept.append(line)
    return "\n".join(kept).rstrip()


def body_ended(text: str) -> bool:
    """Whether `text`, a body being written, already holds the line that ends it (one with a character
    indented less than its first line), or BLOCK_LINES lines."""
    lines = text.split("\n")
    depth = indent_of(lines[0])
    return len(lines) > BLOCK_LINES or any(line.strip() and indent_of(line) < depth for line in lines[1:])


class CodeIndex:
    """The files at the split point for completion: BM25 over their CHUNK_LINES-line chunks (the context),
    and over each line's LOOKUP_LINES predecessors (the lookup), with where each came from."""

    def __init__(self, files: Iterable[dict[str, Any]]):
        bm25s = import_bm25s()
        self.chunks: list[tuple[str, str]] = []
        self.texts: list[list[str]] = []  # each file's lines
        self.lines: list[tuple[int, int]] = []  # (file, number) of each line that follows others
        chunk_terms: list[list[str]] = []
        line_terms: list[list[str]] = []
        paths: list[str] = []
        for record in files:
            path, lines = record["path"], record["text"].splitlines()
            for text in _chunks(lines):
                self.chunks.append((path, text))
                chunk_terms.append(name_terms(text) or [""])
            for number in range(1, len(lines)):
                if lines[number].strip():
                    self.lines.append((len(self.texts), number))
                    paths.append(path)
                    before = lines[max(0, number - LOOKUP_LINES) : number]
                    line_terms.append(name_terms("\n".join(before)) or [""])
            self.texts.append(lines)
        # Each entry's file, as arrays: a query leaves out the file being edited in one comparison.
        self.chunk_paths = np.asarray([path for path, _ in self.chunks], dtype=object)
        self.line_paths = np.asarray(paths, dtype=object)
        self.chunk_index = bm25s.BM25() if chunk_terms else None
        if self.chunk_index is not None:
            self.chunk_index.index(chunk_terms, show_progress=False)
        self.line_index = bm25s.BM25() if line_terms else None
        if self.line_index is not None:
            self.line_index.index(line_terms, show_progress=False)

    def context(self, case: CodeCase, k: int = CONTEXT_CHUNKS) -> list[tuple[str, str]]:
        """The chunks of other files most like the lines before the cursor, best first, then the file's
        own chunk where one shares a name with them (`own_chunk`): `k` in all, where there are."""
        query = name_terms("".join(case.before.splitlines(keepends=True)[-QUERY_LINES:]))
        own = own_chunk(case, query)
        others = self._best(self.chunk_index, self.chunk_paths, query, case.path, k - bool(own))
        return [self.chunks[i] for i in others] + ([(case.path, own)] if own else [])

    def lookup(self, case: CodeCase, block: bool = False) -> str:
        """The line after the lines of another file most like the LOOKUP_LINES before the cursor (with
        `block`, the body that begins there: `body_of`); "" where none shares a name with them."""
        query = name_terms("".join(case.before.splitlines(keepends=True)[-LOOKUP_LINES:]))
        best = self._best(self.line_index, self.line_paths, query, case.path, 1)
        if not best:
            return ""
        file, number = self.lines[best[0]]
        lines = self.texts[file]
        return body_of("\n".join(lines[number : number + BLOCK_LINES])) if block else lines[number]

    @staticmethod
    def _best(index, paths, query: list[str], path: str, k: int) -> list[int]:
        """The `k` best-scoring entries of `index` for `query` whose `paths` are not `path`."""
        if index is None or not query:
            return []
        scores = np.where(paths == path, 0.0, index.get_scores(query))
        order = np.argsort(-scores, kind="stable")[:k]
        return [int(i) for i in order if scores[i] > 0]

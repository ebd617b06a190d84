"""The repository's own past: its commits indexed by what their diffs touch, to find the earlier
commits most like a new diff.

- `past_commits`: every kept commit of `sequences.jsonl` as (message, diff), newest first, with its
  split (the text is the scrape's, so secrets are already redacted).
- `Index`: BM25 (the `bm25s` library) over each diff's identifiers, split into their words
  (`parse_url` → `parse_url`, `parse`, `url`), its file paths' parts and its hunk headings' names:
  the strongest cheap retriever for commit messages (NNGen, Liu et al. ASE 2018; arXiv 2410.09662). A
  query names the newest commit its answers may come from (`older_than`), so a held-out commit is
  never answered from itself, from another held-out commit or from its future. It also finds the
  newest older commits to a diff's files (`newest_touching`), the selector's other candidates.
- the lookup (`pipeline.suggest.suggestion.Suggester.lookup`) every evaluation scores beside the model: the message of the most
  similar earlier commit. A second for a whole history, no model.

Saved beside the adapter (`retrieval/`): bm25s' arrays and the commits' messages, paths and version
anchors (JSON), nothing executable.
"""

from __future__ import annotations

import functools
import heapq
import re
import sys
import time
from collections.abc import Container, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import orjson

from pipeline.data.examples import prompt_content
from pipeline.suggest import versions
from pipeline.types import PastCommit
from scrapers.formats import prompt_and_response

INDEX_DIR = "retrieval"
COMMITS_FILE = "commits.json"
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]+")
_WORD = re.compile(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])|\d+")
_PATH_PART = re.compile(r"[/._\-]+")
# Commits `newest_touching` looks through: a file untouched for that long has no current wording.
RECENT_SCAN = 300


def import_bm25s() -> Any:
    """bm25s without JAX. Where JAX is installed, importing bm25s imports it and runs a JAX top-k. JAX
    then takes 75% of every GPU's memory at its first use (on an H100 training ran out of memory), and
    the data loader forks its workers from a process running JAX's threads (on an H200 JAX warned of a
    deadlock at every run). The top-k runs on numpy, so JAX is hidden while bm25s is imported: bm25s
    finds no JAX and takes its numpy path. A JAX the process imported before stays as it was."""
    hidden = {name: sys.modules.get(name) for name in ("jax", "jax.lax")}
    for name in hidden:
        sys.modules[name] = None  # type: ignore[assignment]  # `import jax.lax` raises ImportError
    try:
        import bm25s
    finally:
        for name, module in hidden.items():
            if module is None:
                del sys.modules[name]
            else:
                sys.modules[name] = module
    return bm25s


def past_commits(records: Iterable[dict[str, Any]]) -> list[PastCommit]:
    """Each commit of the sequence records once, as (message, diff), in their order (newest first); a
    commit needs a `message` or `diff` record (the formats that hold both apart)."""
    seen: dict[str, PastCommit] = {}
    for record in records:
        if record["format"] not in ("message", "diff") or record["commit"] in seen:
            continue
        prompt, response = prompt_and_response(record["format"], record["text"])
        if not prompt:
            continue
        content = prompt_content(record["format"], prompt)
        message, diff = (content, response) if record["format"] == "diff" else (response.strip(), content)
        seen[record["commit"]] = PastCommit(
            record["commit"],
            message.strip(),
            diff,
            record["split"],
            record.get("repo", ""),
            record.get("date", ""),
        )
    return list(seen.values())


def newest_first(commits: Sequence[PastCommit]) -> tuple[PastCommit, ...]:
    """The commits of several repositories, each newest first as its scrape wrote them, interleaved by
    date, so that a later position is older across repositories too (the scrape writes one repository
    after another); each repository keeps its own order, and one repository's commits are as they were."""
    runs: dict[str, list[PastCommit]] = {}
    for commit in commits:
        runs.setdefault(commit.repo, []).append(commit)
    if len(runs) < 2:
        return tuple(commits)
    return tuple(heapq.merge(*runs.values(), key=lambda commit: _moment(commit.date), reverse=True))


def _moment(date: str) -> float:
    """A scraped date as seconds since the epoch (its offset applied); 0 where it cannot be read."""
    try:
        return datetime.fromisoformat(date).timestamp()
    except ValueError:
        return 0.0


def changed_paths(diff: str) -> list[str]:
    """The files a unified diff changes (their new paths)."""
    return [line.rsplit(" b/", 1)[-1] for line in diff.splitlines() if line.startswith("diff --git ")]


def identifiers(diff: str) -> list[str]:
    """What a diff is about, as BM25 terms: the parts of its file paths, the names in its hunk headings
    and changed lines (each whole, lower-cased, and split into its words); context lines and diff
    syntax are left out: they say what is near the change, not what it is. A file's changed text is
    searched for names in one pass, and each name is split once (`_terms_of`), not once per line: on a
    long history reading the diffs is most of building the index."""
    terms: list[str] = []
    changed: list[str] = []
    for line in diff.splitlines():
        if line.startswith(("+", "-")):
            if not line.startswith(("+++", "---")):
                changed.append(line[1:])
        elif line.startswith("@@"):
            changed.append(line.rpartition("@@")[2])
        elif line.startswith("diff --git "):
            _add_names(terms, changed)
            changed = []
            terms += [part.lower() for part in _PATH_PART.split(line.rsplit(" b/", 1)[-1]) if part]
    _add_names(terms, changed)
    return terms


def name_terms(text: str) -> list[str]:
    """The names in `text` as BM25 terms, as `identifiers` reads a diff's changed lines (code: a file's
    chunk, the lines before a cursor)."""
    terms: list[str] = []
    _add_names(terms, [text])
    return terms


def _add_names(terms: list[str], lines: list[str]) -> None:
    if lines:  # a name never spans a line break, so the lines are searched as one text
        for name in _IDENTIFIER.findall("\n".join(lines)):
            terms += _terms_of(name)


@functools.lru_cache(maxsize=1 << 18)
def _terms_of(name: str) -> tuple[str, ...]:
    """A name lower-cased, then its words where it has several (`parse_url` → `parse_url`, `parse`, `url`)."""
    words = _WORD.findall(name)
    if len(words) > 1:
        return (name.lower(), *[word.lower() for word in words if len(word) > 1])
    return (name.lower(),)


@dataclass(frozen=True)
class Parsed:
    """What an index keeps of a commit's diff: its `identifiers`, its changed paths and its version
    anchors. Read once a commit, for both of a run's indexes (`parse`)."""

    terms: list[str]
    paths: list[str]
    anchors: list[list[str]]


def parse(commit: PastCommit) -> Parsed:
    return Parsed(
        identifiers(commit.diff) or [""],  # bm25s needs a term per document
        changed_paths(commit.diff),
        [list(pair) for pair in versions.anchors(commit.message, commit.diff)],
    )


def parse_all(commits: Sequence[PastCommit]) -> list[Parsed]:
    """Every commit's `parse`; the names split on the way are forgotten after (on rails/rails, 20,000
    diffs held 71,095 distinct names), so that training does not hold them."""
    parsed = [parse(commit) for commit in commits]
    _terms_of.cache_clear()
    return parsed


@dataclass(frozen=True)
class Neighbour:
    position: int
    """The commit's place in the index (0 = the newest)."""
    score: float
    message: str
    sha: str


class Index:
    """BM25 over the identifiers of each commit's diff, newest first, with the commits' messages, paths
    and version anchors (`pipeline.suggest.versions`) beside it: what the lookup and the suggestion
    system answer from."""

    def __init__(
        self,
        retriever,
        shas: list[str],
        messages: list[str],
        paths: list[list[str]],
        anchors: list[list[list[str]]],
        seconds: float,
    ):
        self.retriever = retriever
        self.shas, self.messages, self.paths, self.anchors = shas, messages, paths, anchors
        self.build_seconds = seconds

    @classmethod
    def build(cls, commits: Sequence[PastCommit], parsed: Sequence[Parsed] | None = None) -> Index:
        """The index over `commits`, from their `parse` where it was read already (its seconds then
        count the indexing alone)."""
        bm25s = import_bm25s()
        started = time.perf_counter()
        if parsed is None:
            parsed = parse_all(commits)
        retriever = bm25s.BM25()
        retriever.index([each.terms for each in parsed], show_progress=False)
        return cls(
            retriever,
            [commit.sha for commit in commits],
            [commit.message for commit in commits],
            [each.paths for each in parsed],
            [each.anchors for each in parsed],
            time.perf_counter() - started,
        )

    def __len__(self) -> int:
        return len(self.shas)

    def nearest(self, diff: str, k: int, older_than: int = -1) -> list[Neighbour]:
        """The `k` commits whose diffs are most like `diff`, best first, among those at positions after
        `older_than` (older than it: -1 allows every commit); none that shares no term with it."""
        return self.nearest_terms(identifiers(diff), k, older_than)

    def scores(self, query: list[str]):
        """Every indexed commit's BM25 score for a diff's `identifiers` (what `nearest_terms` and
        `newest_touching` both read: computed once per query, they share it)."""
        return self.retriever.get_scores(query)

    def nearest_terms(self, query: list[str], k: int, older_than: int = -1, scores=None) -> list[Neighbour]:
        """`nearest` for a diff's `identifiers` (and their `scores`, where already computed). bm25s'
        own top-k on the masked scores, as its `retrieve` does, without its thread pool and a second
        scoring: the same neighbours, for less."""
        import numpy as np

        allowed = len(self) - older_than - 1
        if allowed <= 0 or not query:
            return []
        mask = np.zeros(len(self), dtype=np.float32)
        mask[older_than + 1 :] = 1.0
        best, positions = import_bm25s().selection.topk(
            (self.scores(query) if scores is None else scores) * mask, k=min(k, allowed), sorted=True,
            backend="numpy",
        )  # fmt: skip
        return [
            Neighbour(int(position), float(score), self.messages[position], self.shas[position])
            for position, score in zip(positions, best, strict=True)
            if score > 0
        ]

    def newest_touching(
        self, paths: Sequence[str], n: int, scores, older_than: int = -1, skip: Container[int] = ()
    ) -> list[Neighbour]:
        """The `n` newest commits older than `older_than` that changed one of `paths` (among the
        RECENT_SCAN just older; none of the positions in `skip`), with their BM25 `scores` (`Index.scores`
        of the diff's identifiers)."""
        wanted = set(paths)
        found: list[Neighbour] = []
        for position in range(older_than + 1, min(len(self), older_than + 1 + RECENT_SCAN)):
            if len(found) == n:
                break
            if position in skip or not wanted.intersection(self.paths[position]):
                continue
            found.append(
                Neighbour(position, float(scores[position]), self.messages[position], self.shas[position])
            )
        return found

    def save(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.retriever.save(str(directory), show_progress=False)
        commits = {"shas": self.shas, "messages": self.messages, "paths": self.paths, "anchors": self.anchors}
        (directory / COMMITS_FILE).write_bytes(orjson.dumps(commits))

    @classmethod
    def load(cls, directory: Path) -> Index:
        retriever = import_bm25s().BM25.load(str(directory), show_progress=False, verbosity=0)
        commits = orjson.loads((directory / COMMITS_FILE).read_bytes())
        # An index saved before version anchors existed moves no numbers.
        saved_anchors = commits.get("anchors") or [[] for _ in commits["shas"]]
        return cls(retriever, commits["shas"], commits["messages"], commits["paths"], saved_anchors, 0.0)

    def to_manifest(self) -> dict[str, Any]:
        return {
            "commits": len(self),
            "terms": len(self.retriever.vocab_dict),
            "build_s": round(self.build_seconds, 3),
        }

"""The code-completion cases of the held-out commits → `completions.jsonl`: what the code scoreboard asks.

A case is a line a held-out (or validation) commit added, with the file as an editor holds it at that
moment: the lines before it and after it in the file as the commit left it. A block case is the body a
commit wrote under a line that opens one (a function's, a loop's: the lines after it indented deeper,
all added by the commit, at most BLOCK_LINES), the cursor at the end of that line. Whole commits stay on
their side of the split; the cases of a commit come from its own diff and the file it wrote, redacted as
the history is (the window the case keeps, read as the diff that adds it).
"""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, BinaryIO

import orjson

from scrapers.commit import FileChange
from scrapers.config import ScrapeConfig
from scrapers.files import is_binary, read_text
from scrapers.formats import prompt_and_response
from scrapers.git import Repository, blob_contents
from scrapers.notebooks import SUFFIX as NOTEBOOK_SUFFIX
from scrapers.parse import parse_diff
from scrapers.secrets import redact_files

COMPLETIONS_FILE = "completions.jsonl"
BEFORE_LINES = 60  # the file's lines before the cursor a case keeps (a prompt takes what fits of them)
AFTER_LINES = 20  # and after it, for a model that can fill in the middle
CASES_PER_COMMIT = 5  # at most, spread over the commit's added lines: a commit's cases are not independent
BLOCKS_PER_COMMIT = 2  # block cases, at most, spread over the bodies the commit wrote
BLOCK_LINES = 8  # the longest body asked for: "a short function body"
MIN_CHARS = 4  # an added line shorter than this without its spaces (a brace, `pass`) is not asked
MIN_BEFORE = 2  # nor one with fewer lines before it in its file
_HUNK = re.compile(r"^@@ -\d+(?:,\d+)? \+(\d+)(?:,\d+)? @@", re.MULTILINE)


@dataclass
class CasesRead:
    """How many cases the held-out and validation commits gave, and from how many commits."""

    cases: Counter = field(default_factory=Counter)
    commits: Counter = field(default_factory=Counter)
    blocks: Counter = field(default_factory=Counter)
    """Block cases, by split (counted apart from the next lines in `cases`)."""
    redacted: int = 0
    """Cases left out because a secret was redacted across their lines."""

    def add(self, other: CasesRead) -> None:
        self.cases.update(other.cases)
        self.commits.update(other.commits)
        self.blocks.update(other.blocks)
        self.redacted += other.redacted

    def to_manifest(self) -> dict[str, Any]:
        return {
            "cases": dict(self.cases), "blocks": dict(self.blocks), "commits": dict(self.commits),
            "redacted": self.redacted,
        }  # fmt: skip


def added_lines(change: FileChange) -> list[int]:
    """The 0-based line numbers, in the file after the change, of the lines it added."""
    added: list[int] = []
    line = 0
    for row in change.hunks.split("\n"):
        if match := _HUNK.match(row):
            line = int(match.group(1)) - 1
        elif row.startswith("+"):
            added.append(line)
            line += 1
        elif row.startswith(" "):
            line += 1
    return added


def file_lines(raw: bytes) -> list[str]:
    """A file's lines as a diff numbers them, each with its line break: split at LF alone (a form feed or a
    vertical tab is inside a line, where `str.splitlines` broke one and every later number was off by
    one), read as the files trained on are (`files.read_text`)."""
    pieces = read_text(raw).split("\n")
    return [piece + "\n" for piece in pieces[:-1]] + ([pieces[-1]] if pieces[-1] else [])


def write_cases(
    repo: Repository, name: str, held_out: Iterable[dict[str, Any]], config: ScrapeConfig, out: BinaryIO
) -> CasesRead:
    """Write the cases of `held_out` (sequence records of the validation and held-out commits, one per
    commit) to `out`, one JSON line each."""
    read = CasesRead()
    windows = list(_windows(repo, held_out, config))
    # Each line of the window one line of the text redacted, so that a line keeps its place.
    texts = [(window["path"], "\n".join(line.rstrip("\n") for line in window["lines"])) for window in windows]
    for window, (text, counts) in zip(windows, redact_files(texts), strict=True):
        lines = [line + "\n" for line in text.split("\n")]
        if counts and len(lines) != len(window["lines"]):
            read.redacted += 1
            continue
        at, length = window.pop("at"), window.pop("length")
        del window["lines"]
        case = {
            **window,
            "before": "".join(lines[:at]),
            "line": "".join(lines[at : at + length]).rstrip("\n"),
        }
        case["after"] = "".join(lines[at + length :])
        out.write(orjson.dumps({"repo": name, **case}) + b"\n")
        (read.blocks if case["kind"] == "block" else read.cases)[case["split"]] += 1
    read.commits.update(Counter({split: len(shas) for split, shas in _commits(windows).items()}))
    return read


def _commits(windows: list[dict[str, Any]]) -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for window in windows:
        found.setdefault(window["split"], set()).add(window["commit"])
    return found


def _windows(
    repo: Repository, held_out: Iterable[dict[str, Any]], config: ScrapeConfig
) -> Iterator[dict[str, Any]]:
    """Each chosen added line, and each chosen body, of each commit with the lines around it (`lines`;
    `at`: the place of the line or the body's first line there; `length`: its lines)."""
    for record in held_out:
        changes = [
            change
            for change in parse_diff(_diff_of(record).encode(), config.max_file_diff_bytes)
            if change.status != "D" and change.hunks and not change.path.endswith(NOTEBOOK_SUFFIX)
        ]
        names = {f"{record['commit']}:{change.path}": change for change in changes}
        contents = blob_contents(repo, list(names), config.max_file_bytes)
        eligible: list[tuple[str, list[str], int, int]] = []
        bodies: list[tuple[str, list[str], int, int]] = []
        for name, change in names.items():
            raw = contents.get(name)
            if raw is None or is_binary(raw):
                continue
            lines = file_lines(raw)
            added = added_lines(change)
            eligible += [
                (change.path, lines, number, 1)
                for number in added
                if MIN_BEFORE <= number < len(lines) and len(lines[number].strip()) >= MIN_CHARS
            ]
            written = set(added)
            for number in added:
                length = body_length(lines, number) if MIN_BEFORE <= number < len(lines) else 0
                if length and written.issuperset(range(number + 1, number + 1 + length)):
                    bodies.append((change.path, lines, number + 1, length))
        for kind, chosen in (("line", _spread(eligible, record["commit"], CASES_PER_COMMIT)),
                             ("block", _spread(bodies, record["commit"], BLOCKS_PER_COMMIT))):  # fmt: skip
            for path, lines, number, length in chosen:
                start = max(0, number - BEFORE_LINES)
                yield {
                    "commit": record["commit"],
                    "split": record["split"],
                    "kind": kind,
                    "path": path,
                    "line_number": number + 1,
                    "lines": lines[start : number + length + AFTER_LINES],
                    "at": number - start,
                    "length": length,
                }


def body_length(lines: list[str], opener: int) -> int:
    """How many lines after `lines[opener]` are its body: the lines indented deeper than it (blank ones
    within), at least one and at most BLOCK_LINES; 0 where it opens none so short."""
    indent = indent_of(lines[opener])
    window = lines[opener + 1 : opener + 2 + BLOCK_LINES]  # a longer body is not looked through
    length = 0
    for line in window:
        if line.strip() and indent_of(line) <= indent:
            break
        length += 1
    else:
        if opener + 1 + len(window) < len(lines):  # it goes on past the window: not a short body
            return 0
    while length and not lines[opener + length].strip():  # blank lines after the body are not in it
        length -= 1
    return length if 0 < length <= BLOCK_LINES and lines[opener].strip() else 0


def indent_of(line: str) -> int:
    """How deep `line` is indented: its leading spaces and tabs."""
    return len(line) - len(line.lstrip(" \t"))


def _spread(eligible: list, commit: str, most: int) -> list:
    """At most `most` of a commit's eligible lines, evenly spread from a place its hash picks."""
    if len(eligible) <= most:
        return eligible
    offset = int(hashlib.sha256(commit.encode()).hexdigest()[:8], 16) % len(eligible)
    step = len(eligible) / most
    return [eligible[(offset + int(step * index)) % len(eligible)] for index in range(most)]


def _diff_of(record: dict[str, Any]) -> str:
    """The change a sequence record holds, whatever its format."""
    prompt, response = prompt_and_response(record["format"], record["text"])
    return prompt if record["format"] == "message" else response

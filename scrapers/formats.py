"""Turn a kept commit into training text, in each of the configured formats.

- `diff`: the intent, then the change (message, then unified diff): the model
  learns to write a change for an intent.
- `message`: the change, then the message: the model learns to write commit
  messages for a diff, as commit-message-generation datasets do.
- `rich`: metadata (date, files, +/- counts), message, and the diff with more
  surrounding context (`scrape.rich_context_lines`).

git runs once, with the largest context any format needs; `trim_context`
cuts hunks down to git's usual 3 lines for the other formats.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from scrapers.commit import FileChange

DEFAULT_CONTEXT = 3  # git's own default context, used by the diff and message formats
MESSAGE_HEADING = "Commit message:"

_TRAILER = re.compile(
    r"(?i)^(signed-off-by|change-id|co-authored-by|reviewed-by|reviewed-on|acked-by|tested-by|reported-by|"
    r"suggested-by|cc|git-svn-id)\s*:"
)


def clean_message(message: str) -> str:
    """The message without trailing trailers (Signed-off-by, Change-Id, Co-authored-by, ...)."""
    lines = message.strip().splitlines()
    while lines and (not lines[-1].strip() or _TRAILER.match(lines[-1])):
        lines.pop()
    return "\n".join(lines).strip()


@dataclass(frozen=True)
class KeptCommit:
    """A commit that passed every filter: what the formats render (their texts are redacted after)."""

    sha: str
    date: str
    message: str
    files: Sequence[FileChange]
    git_context: int
    """Context lines git printed around each change."""


_QUOTED = re.compile(r'[\x00-\x1f"\\\x7f]')
"""What makes git quote a path (with `core.quotePath=false`, as the scrape reads them): a control
character, a double quote or a backslash."""
_ESCAPES = {"\a": "a", "\b": "b", "\t": "t", "\n": "n", "\v": "v", "\f": "f", "\r": "r", '"': '"', "\\": "\\"}


def quote_path(path: str) -> str:
    """A path (its `a/` or `b/` prefix included) as git writes it in a diff: C-quoted where it holds what
    `_QUOTED` names, so that a file named with a newline cannot forge a line of the diff."""
    if not _QUOTED.search(path):
        return path
    escaped = (
        f"\\{_ESCAPES[char]}" if char in _ESCAPES else f"\\{ord(char):03o}" if _QUOTED.match(char) else char
        for char in path
    )
    return f'"{"".join(escaped)}"'


def render_file(change: FileChange, context: int | None = None) -> str:
    """One file's change as `git diff` prints it, minus the `index` line (its hashes teach nothing)."""
    old = change.old_path or change.path
    lines = [f"diff --git {quote_path(f'a/{old}')} {quote_path(f'b/{change.path}')}"]
    if change.status in ("A", "D") and change.mode:
        lines.append(f"{'new' if change.status == 'A' else 'deleted'} file mode {change.mode}")
    elif change.status in ("R", "C"):
        verb = "rename" if change.status == "R" else "copy"
        lines += [f"{verb} from {quote_path(old)}", f"{verb} to {quote_path(change.path)}"]
    hunks = change.hunks if context is None else trim_context(change.hunks, context)
    if hunks:
        lines.append("--- /dev/null" if change.status == "A" else f"--- {quote_path(f'a/{old}')}")
        lines.append("+++ /dev/null" if change.status == "D" else f"+++ {quote_path(f'b/{change.path}')}")
    return "\n".join(lines) + "\n" + hunks


def render_diff(commit: KeptCommit, context: int) -> str:
    keep = None if context >= commit.git_context else context
    return "".join(render_file(change, keep) for change in commit.files)


def format_diff(commit: KeptCommit) -> str:
    return f"{commit.message}\n\n{render_diff(commit, DEFAULT_CONTEXT)}"


def format_message(commit: KeptCommit) -> str:
    return f"{render_diff(commit, DEFAULT_CONTEXT)}\n{MESSAGE_HEADING}\n{commit.message}\n"


def format_rich(commit: KeptCommit) -> str:
    added = sum(change.added for change in commit.files)
    deleted = sum(change.deleted for change in commit.files)
    header = [f"Date: {commit.date}", f"Files changed: {len(commit.files)} (+{added} -{deleted})"]
    for change in commit.files:
        name = quote_path(change.path)
        name = f"{quote_path(change.old_path)} -> {name}" if change.old_path else name
        header.append(f"  {change.status} {name} (+{change.added} -{change.deleted})")
    return "\n".join(header) + f"\n\n{commit.message}\n\n{render_diff(commit, commit.git_context)}"


DIFF_START = "\n\ndiff --git "
"""Where the change begins in the `diff` and `rich` formats (messages are cleaned, so never hold it)."""


def prompt_and_response(format_name: str, text: str) -> tuple[str, str]:
    """A sequence cut where the task's answer begins: (intent, change) for `diff` and `rich`,
    (change, message) for `message`. `prompt + response == text`; no cut found gives ("", text)."""
    if format_name == "message":
        prompt, heading, response = text.rpartition(f"\n{MESSAGE_HEADING}\n")
        return (prompt + heading, response) if heading else ("", text)
    prompt, start, response = text.partition(DIFF_START)
    return (prompt + "\n\n", start[2:] + response) if start else ("", text)


FORMATS: dict[str, Callable[[KeptCommit], str]] = {
    "diff": format_diff,
    "message": format_message,
    "rich": format_rich,
}

_HUNK_HEADER = re.compile(r"@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@(.*)")


def trim_context(hunks: str, context: int) -> str:
    """Re-cut unified-diff hunks so each change keeps at most `context` lines around it."""
    out: list[str] = []
    for header, lines in _split_hunks(hunks):
        match = _HUNK_HEADER.match(header)
        if not match:
            return hunks  # not a hunk we understand: leave the diff as git wrote it
        # The first line of each side; an empty side (`-0,0`) names the line before it.
        old_line = int(match[1]) + (match[2] == "0")
        new_line = int(match[3]) + (match[4] == "0")
        heading = match[5]
        changed = [i for i, line in enumerate(lines) if line[:1] in ("+", "-")]
        windows: list[list[int]] = []
        for i in changed:
            low, high = max(0, i - context), min(len(lines) - 1, i + context)
            if windows and low <= windows[-1][1] + 1:
                windows[-1][1] = high
            else:
                windows.append([low, high])
        position = 0
        for low, high in windows:
            for line in lines[position:low]:
                old_line += line[:1] != "+"
                new_line += line[:1] != "-"
            piece = lines[low : high + 1]
            old_count = sum(line[:1] != "+" for line in piece)
            new_count = sum(line[:1] != "-" for line in piece)
            out.append(f"@@ -{_span(old_line, old_count)} +{_span(new_line, new_count)} @@{heading}\n")
            out.extend(piece)
            old_line += old_count
            new_line += new_count
            position = high + 1
    return "".join(out)


def _split_hunks(hunks: str) -> list[tuple[str, list[str]]]:
    """(header, lines) per hunk; a `\\ No newline` marker stays attached to the line before it."""
    result: list[tuple[str, list[str]]] = []
    # At LF alone, as git ends a diff's lines: `str.splitlines` also breaks one at a form feed or U+2028.
    for line in filter(None, re.split(r"(?<=\n)", hunks)):
        if line.startswith("@@"):
            result.append((line.rstrip("\n"), []))
        elif line.startswith("\\") and result and result[-1][1]:
            result[-1][1][-1] += line
        elif result:
            result[-1][1].append(line)
    return result


def _span(start: int, count: int) -> str:
    """git's `start,count` notation: `,1` is omitted; an empty side names the line before it."""
    if count == 0:
        return f"{start - 1},0"
    return str(start) if count == 1 else f"{start},{count}"

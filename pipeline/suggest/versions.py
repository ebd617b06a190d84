"""A past message's version numbers, moved to the new diff's.

A release commit is described the same way each time ("Version 0.39.1", "release version 3.0.1"),
so the selector rightly offers an earlier one, but with that release's number. Where the number
was written in the earlier commit's diff too (`__version__ = "0.39.1"`, `Version 3.0.1` in the
changelog, `Python :: 3.12` in the classifiers), the text just before it there is an anchor: the new
diff's added lines that follow the same anchor give the number this commit writes, and it replaces
the old one in the message. Only when the anchors agree on one new number; otherwise the message
stays as it was written.

It changes few answers, and none for the worse (docs/experiments.md keeps the figures and what else
was tried: moving every candidate's numbers before the ranker chooses, moving names by the same
anchors, anchoring on removed lines, a number without an anchor).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

# A dotted number (1.2, 0.39.1, v3.0.2), not part of a longer dotted name or word.
_VERSION = re.compile(r"(?<![\w.])v?(\d+(?:\.\d+)+)(?!\w)")
ANCHOR_CHARS = 40  # the most of a line before a number that anchors it
MIN_ANCHOR_CHARS = 2  # an anchor needs this many characters besides spaces (a lone quote anchors anywhere)


def anchors(message: str, diff: str) -> list[tuple[str, str]]:
    """(number, the text before it) for each number of `message` at each place its commit's `diff` adds
    it: what `moved` looks for in a new diff."""
    numbers = sorted({match.group(1) for match in _VERSION.finditer(message)})
    lines = _added(diff) if numbers else []  # most messages name no number: the diff is not read
    found: dict[tuple[str, str], None] = {}  # in order, once each
    for number in numbers:
        exact = _exactly(number)
        for line in lines:
            for match in exact.finditer(line):
                anchor = line[: match.start()].lstrip()[-ANCHOR_CHARS:]
                if len(anchor.strip()) >= MIN_ANCHOR_CHARS:
                    found[(number, anchor)] = None
    return list(found)


def moved(message: str, its_anchors: Sequence[Sequence[str]], diff: str) -> str:
    """`message` with each of its anchored numbers replaced by the one number that `diff`'s added lines
    write after the same anchors; unchanged where they write none, several, or the same one."""
    if not its_anchors:
        return message  # most past messages name no number: the diff is not read
    lines = _added(diff)
    for number in sorted({number for number, _ in its_anchors}):
        exact = _exactly(number)
        if not exact.search(message):
            continue  # the candidate is the subject alone, and the number was in the body
        shape = r"\d+" + r"\.\d+" * number.count(".")
        written: set[str] = set()
        for anchor in (anchor for theirs, anchor in its_anchors if theirs == number):
            after = re.compile(re.escape(anchor) + f"({shape})" + r"(?!\.?\d)")
            for line in lines:
                written.update(match.group(1) for match in after.finditer(line))
        if len(written) == 1 and number not in written:
            message = exact.sub(written.pop(), message)
    return message


def _exactly(number: str) -> re.Pattern[str]:
    return re.compile(r"(?<![\d.])" + re.escape(number) + r"(?!\.?\d)")


def _added(diff: str) -> list[str]:
    return [line[1:] for line in diff.splitlines() if line.startswith("+") and not line.startswith("+++")]

"""What the person at the terminal sees while a run works: one line per event, on stderr (stdout is
kept for results), from rank 0 only under torchrun; and for a long step, how far it has come."""

from __future__ import annotations

import os
import re
import sys
import time
from collections.abc import Sequence

PLAIN_EVERY_S = 10.0  # away from a terminal (a log, CI), a progress line at most this often


def say(message: str) -> None:
    if os.environ.get("RANK", "0") == "0":
        print(message, file=sys.stderr, flush=True)


# C0 and C1 control characters: an escape (ESC, or the one-character CSI) makes a terminal move, recolour,
# retitle or write the clipboard, and a line break ends a line that should be one.
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def printable(text: str) -> str:
    """`text` as one line a terminal shows as it is, whatever a repository or a user put in it (a folder
    named with a newline, a commit message holding an escape sequence): control characters written as
    Python writes them in a string."""
    return _CONTROL.sub(_escaped, text)


# On a terminal, what `generate` writes keeps its line breaks and tabs (it is text to read) and nothing else
# that a terminal obeys: a carriage return would write over what came before it on its line.
_CONTROL_BUT_LAYOUT = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def shown(text: str) -> str:
    """`text` as standard output should carry it: on a terminal, its control characters but line breaks
    and tabs written as escapes (a past commit message's escape sequence is shown, not obeyed); into a
    pipe or a file (`| git commit -F -`), as it is."""
    if not sys.stdout.isatty():
        return text
    return _CONTROL_BUT_LAYOUT.sub(_escaped, text)


def _escaped(found: re.Match[str]) -> str:
    return repr(found.group(0))[1:-1]  # as Python writes the character in a string: \x1b, \r


def aligned(rows: Sequence[Sequence[str]], indent: str = "") -> list[str]:
    """Rows of cells as lines, each column padded to its widest cell (trailing spaces dropped)."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))] if rows else []
    return [
        indent + "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]


def clock(seconds: float) -> str:
    """1h02m, 4m05s, 37s."""
    seconds = round(seconds)
    hours, rest = divmod(seconds, 3600)
    minutes, seconds = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    return f"{minutes}m{seconds:02d}s" if minutes else f"{seconds}s"


class Progress:
    """How far a long step has come: a tqdm bar on a terminal; elsewhere a plain line every
    `plain_every_s` seconds (done, total, elapsed, time left; None: never) and one at the end if any was
    printed. With `tokens`, the tokens the units hold, where their lengths differ (prompts, read shortest
    first): the time left is reckoned from the tokens done, not the units."""

    def __init__(
        self, label: str, total: int, unit: str, plain_every_s: float | None = PLAIN_EVERY_S,
        tokens: int | None = None,
    ):  # fmt: skip
        self.label, self.total, self.unit, self.plain_every_s = label, total, unit, plain_every_s
        self.tokens = tokens
        self.done = self.tokens_done = 0
        self.started = self.last_line = time.perf_counter()
        self.speaks = os.environ.get("RANK", "0") == "0"
        self.bar = None
        if self.speaks and sys.stderr.isatty():
            from tqdm import tqdm

            # With tokens, the bar counts them (its time left is tqdm's own) and says the units beside it.
            self.bar = tqdm(
                total=tokens or total, desc=label, unit="token" if tokens else unit, file=sys.stderr,
                leave=False,
            )  # fmt: skip

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc) -> None:
        if self.bar is not None:
            self.bar.close()
        elif self.last_line > self.started:  # lines were printed: say that it ended
            say(self._line(time.perf_counter()))

    def update(self, count: int, tokens: int = 0) -> None:
        """`count` more done, holding `tokens`. 0 says the step is still at work where nothing more is
        counted (a batch's answers being written after its prompts were read): the plain line still
        comes, and once all is counted it says the step is finishing instead of a time left that has run
        out."""
        self.done += count
        self.tokens_done += tokens
        if self.bar is not None:
            if self.tokens:
                self.bar.set_postfix_str(f"{self.done:,}/{self.total:,} {self.unit}s", refresh=False)
            self.bar.update(tokens if self.tokens else count)
            return
        now = time.perf_counter()
        if (
            self.speaks
            and self.plain_every_s is not None
            and now - self.last_line >= self.plain_every_s
            and (self.done < self.total or not count)
        ):
            self.last_line = now
            say(self._line(now, finishing=self.done >= self.total))

    def _line(self, now: float, finishing: bool = False) -> str:
        elapsed = now - self.started
        share = self.done / self.total if self.total else 1.0
        said = f"{share:.0%}"
        if self.tokens:
            share = self.tokens_done / self.tokens
            said = f"{share:.0%} of their tokens"
        left = f", about {clock(elapsed / share - elapsed)} left" if 0 < share < 1 else ""
        return (
            f"{self.label}: {self.done:,}/{self.total:,} {self.unit}s ({said}) in {clock(elapsed)}"
            f"{', finishing' if finishing else left}"
        )

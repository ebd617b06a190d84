"""What the person at the terminal sees while a run works: one line per event, on stderr (stdout is
kept for results), from rank 0 only under torchrun."""

from __future__ import annotations

import os
import sys


def say(message: str) -> None:
    if os.environ.get("RANK", "0") == "0":
        print(message, file=sys.stderr, flush=True)

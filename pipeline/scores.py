"""How a score and a paired difference are written with their 95% intervals, wherever they are shown: the
console's scoreboard, the model card, the HTML report, the benchmarks."""

from __future__ import annotations

from typing import Any


def with_interval(scored: dict[str, Any], key: str, width: int = 0) -> str:
    """A score and its interval in brackets, one decimal each (no brackets where none was computed), the
    score right-aligned in `width` characters."""
    value = scored.get(key)
    if value is None:
        return "–"
    low, high = scored.get(f"{key}_ci95") or (None, None)
    interval = f" [{low:.1f}, {high:.1f}]" if low is not None else ""
    return f"{value:{width}.1f}{interval}"


def difference(versus: dict[str, Any], key: str) -> str:
    """A paired difference and its interval in brackets, signed, one decimal each."""
    low, high = versus.get(f"{key}_ci95") or (0, 0)
    return f"{versus[key]:+.1f} [{low:+.1f}, {high:+.1f}]"

"""Recording a plan's decisions: a value, where it came from, and why.

A rule names a config value by reading it, `lambda c: c.train.learning_rate`, which a type checker
follows like any attribute; the recorder learns the value's key (`train.learning_rate`, for its source
and its reason) by letting the selector read a stand-in instead of the config."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

from pipeline.config import Config, LoadedConfig
from pipeline.types import Decision

Field = Callable[[Config], Any]
"""A config value, as a selector: `lambda c: c.plan.batch_size`."""


class _Key:
    """Stands in for the config while a selector reads it, and remembers what it read."""

    def __init__(self, parts: tuple[str, ...] = ()):
        self.parts = parts

    def __getattr__(self, name: str) -> _Key:
        return _Key((*self.parts, name))


def key_of(field: Field) -> str:
    """The dotted key a selector reads: `lambda c: c.train.epochs` → `train.epochs`."""
    return ".".join(cast(_Key, field(cast(Config, _Key()))).parts)


class Decisions:
    """The decisions a plan is made of, as they are taken: each a value with its source (`planned`,
    `config` or `cli`) and its reason, in the order they were taken."""

    def __init__(self, loaded: LoadedConfig):
        self.loaded = loaded
        self.decisions: dict[str, Decision] = {}

    def planned(self, name: str, value: Any, reason: str) -> Any:
        self.decisions[name] = Decision(value, "planned", reason)
        return value

    def from_config(self, name: str, field: Field, reason: str | None = None) -> Any:
        """Record a value taken as configured."""
        value, key = self.value(field), key_of(field)
        source = self.loaded.source_of(key)
        where = f"--set {key}" if source == "cli" else f"{self.loaded.label()}: {key}"
        self.decisions[name] = Decision(value, source, reason or f"set by {where}")
        return value

    def because_of(self, name: str, value: Any, field: Field, reason: str) -> Any:
        """Record a value that a config switch (`field`) implies rather than states."""
        self.decisions[name] = Decision(value, self.loaded.source_of(key_of(field)), reason)
        return value

    def value(self, field: Field) -> Any:
        return field(self.loaded.config)

    def is_auto(self, field: Field) -> bool:
        return self.value(field) == "auto"

    def explicit(self, field: Field) -> bool:
        return self.loaded.explicit(key_of(field)) and not self.is_auto(field)

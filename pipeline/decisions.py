"""Recording a plan's decisions: a value, where it came from, and why."""

from __future__ import annotations

from typing import Any

from pipeline.config import LoadedConfig
from pipeline.types import Decision


class Decisions:
    """The decisions a plan is made of, as they are taken: each a value with its source (`planned`,
    `config` or `cli`) and its reason, in the order they were taken."""

    def __init__(self, loaded: LoadedConfig):
        self.loaded = loaded
        self.decisions: dict[str, Decision] = {}

    def planned(self, name: str, value: Any, reason: str) -> Any:
        self.decisions[name] = Decision(value, "planned", reason)
        return value

    def from_config(self, name: str, key: str, reason: str | None = None) -> Any:
        """Record a value taken as configured; `key` is its `section.field`."""
        value = self.value(key)
        source = self.loaded.source_of(key)
        where = f"--set {key}" if source == "cli" else f"{self.loaded.label()}: {key}"
        self.decisions[name] = Decision(value, source, reason or f"set by {where}")
        return value

    def because_of(self, name: str, value: Any, key: str, reason: str) -> Any:
        """Record a value that a config switch (`key`) implies rather than states."""
        self.decisions[name] = Decision(value, self.loaded.source_of(key), reason)
        return value

    def value(self, key: str) -> Any:
        section, field_name = key.split(".")
        return getattr(getattr(self.loaded.config, section), field_name)

    def is_auto(self, key: str) -> bool:
        return self.value(key) == "auto"

    def explicit(self, key: str) -> bool:
        return self.loaded.explicit(key) and not self.is_auto(key)

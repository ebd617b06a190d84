"""How a score and a paired difference are written with their 95% intervals, wherever they are shown: the
console's scoreboard, the model card, the HTML report, the benchmarks; and the systems that are scored
writing a next line, with their labels."""

from __future__ import annotations

from typing import Any

from pipeline.progress import printable

# A model that begins this share of its answers with one word, and twice as many as the commits written
# do, writes in one register, and the run says so: a fine-tuned model that learned the format before the
# repository's words begins most of its answers alike (docs/experiments.md); retrieval's follow the commits'.
ONE_REGISTER_SHARE = 1 / 3

# Who writes a next line: (answers with the adapter, prompt with retrieved context), or the lookup for code
# (None). The fine-tuned model with context answers unless another beats it on the validation commits
# beyond noise: fine-tuning and retrieved context add up in published work (docs/experiments.md). Here,
# beside their labels, not with the completion itself: the commit hook reads the default and needs nothing
# else of it.
CODE_SYSTEMS: dict[str, tuple[bool, bool] | None] = {
    "model-context": (True, True),
    "model": (True, False),
    "base-context": (False, True),
    "base": (False, False),
    "lookup": None,
}
DEFAULT_CODE_SYSTEM = "model-context"

# Each system that writes a next line (CODE_SYSTEMS) → its scores in the
# manifest's `.training_report.evaluation.tasks` (system, task) and its label, in the scoreboard's order.
CODE_LABELS = {
    "base": ("before", "code", "base model"),
    "base-context": ("before", "code_context", "base + context"),
    "model": ("after", "code", "fine-tuned"),
    "model-context": ("after", "code_context", "fine-tuned + context"),
    "lookup": ("nearest_commit", "code", "lookup for code"),
}
BLOCK_TASK = {"code": "block", "code_context": "block_context"}
"""Each next-line task's block task: the same systems asked with the same prompts, for a body."""


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


def differences(versus: dict[str, Any], key: str) -> str:
    """The paired differences in `key` and in edit similarity, as a scoreboard shows them: `key / ES`."""
    return f"{difference(versus, key)} / {difference(versus, 'edit_similarity')}"


def registers(tasks: dict[str, Any]) -> list[str]:
    """`one_register`'s line for each model, base and fine-tuned, that writes in one register
    (`tasks`: the manifest's `.evaluation.tasks`): the run's scoreboard and the report page say them."""
    found = (one_register(name, (tasks.get(name) or {}).get("message")) for name in ("before", "after"))
    return [said for said in found if said]


def one_register(name: str, scored: dict[str, Any] | None) -> str | None:
    """What a model (`name`: before or after) writes in one register, from its message scores: the
    word that begins most of its answers, where it begins at least ONE_REGISTER_SHARE of them and twice
    as many as the commits written; else None (and for scores cached before they counted openings)."""
    opening = (scored or {}).get("commonest_opening")
    if not (scored and opening):
        return None
    answers, written = opening["answers"], opening["references"]
    if answers < max(ONE_REGISTER_SHARE * scored["samples"], 2 * written):
        return None
    model = {"before": "base model", "after": "fine-tuned model"}[name]
    return (
        f'the {model} begins {answers} of its {scored["samples"]} answers with "{printable(opening["word"])}", '
        f"where {written} of the commits written do"
    )

"""Compare two manifests: what changed, by how much, grouped by section.

By default only params (what the run was told and decided, and the data it
saw) and metrics (losses, evaluation, throughput) are shown, as `dvc exp
diff` does; `--all` adds the rest (timings, hardware, outputs, ...).
Records in arrays are matched by identity (an epoch by its number, a GPU by
its index, a repository by its name), never by position; nested objects are
compared leaf by leaf, so a difference is a path, never a blob. Identifiers
(process ids, hostnames, commits) are compared as values, never subtracted.
Per-sample series (loss and learning-rate history, hardware samples) are
compared through the summaries the manifest already holds, and volatile
fields (run id, timestamps, absolute paths) are left out unless asked for.
"""

from __future__ import annotations

import fnmatch
import math
import re
from collections import Counter
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from pipeline.errors import PipelineError
from pipeline.manifest import SCHEMA_VERSION, load_manifest, manifest_file
from pipeline.progress import aligned

# Arrays of records and the field that identifies a record across two runs.
IDENTITY = {
    "training_report.training.epoch_summaries": "epoch",
    "training_report.evaluation.samples.before": "commit",
    "training_report.evaluation.samples.after": "commit",
    "training_report.hardware.summary.gpus": "index",
    "hardware.gpus": "index",
    "repositories": "path",
    "scrape.per_repository": "name",
    "outputs.adapter_files": "path",
    "training_parameters.batch_probe": "batch_size",
    "training_parameters.oom_retries": "batch_size",
    "training_report.hardware.nodes": "node",
    "distributed.nodes": "node",
}
# What `diff` shows without --all: params, then metrics (patterns over paths; records as [*]).
PARAMS = (
    "config.effective.*",
    "training_parameters.*",
    "model.name",
    "model.parameters_*",
    "model.quantization",
    "repository.head",
    "lineage.parent_*",
    "lineage.*_head",
    "lineage.commits_added",
    "dataset.*",
    "scrape.commits_*",
    "scrape.sequences",
    "scrape.split.*",
    "scrape.skipped.*",
    "retrieval.k",
    "retrieval.index.commits",
    "retrieval.selector.commits",
)
METRICS = (
    "status",
    "training_report.training.global_step",
    "training_report.training.summary.*",
    "training_report.evaluation.*",
    "training_report.throughput.tokens_per_s",
    "training_report.throughput.step_tokens_per_s",
    "training_report.throughput.samples_per_s",
    "training_report.throughput.trained_tokens",
    "lineage.forgetting.*",
)
# Within those, detail that only --all shows: reasons, cache bookkeeping, how long a measurement took.
DETAIL = (
    "training_parameters.decisions.*",
    "training_parameters.batch_probe*",
    "dataset.cache.*",
    "training_report.evaluation.cost.*",
    "training_report.evaluation.system.reason",
    "scrape.commits_per_s",
    "*.seconds",
)
# What a run measured though the plan records it: a measurement is a metric, never a param.
MEASUREMENTS = ("training_parameters.measured_tokens_per_s",)
CATEGORIES = ("params", "metrics", "other")
# Numbers that name something rather than measure it: a changed pid is a different process, not Δ +1.
IDENTIFIERS = ("*.pid", "*.hostname", "*.node", "*.rank", "*_rank", "*.port", "*.master", "*.index", "*.seed")
# Series: compared through their summaries (training.summary, hardware.summary, throughput, ...).
SERIES = (
    "training_report.training.loss_history",
    "training_report.learning_rate.history",
    "training_report.evaluation.history",
    "training_report.evaluation.samples.*",
    "training_report.hardware.samples",
    "training_report.hardware.nodes[*].samples",
)
VOLATILE = (
    "run.id",
    "run.argv",
    "run.pid",
    "run.hostname",
    "*_at",
    "*.timestamp",
    "repository.path",
    "repositories",
    "scrape.per_repository[*].path",
    "scrape.sequences_path",
    "config.source",
    "config.effective.output.*",
    "config.overrides.output.*",
    "dataset.cache.dir",
    "hardware.ram_available_gb",  # the machine's state when the run started, not a property of the run
    "outputs.*_dir",
    "outputs.*_path",
)
KINDS = ("changed", "added", "removed", "type_changed", "became_null", "became_non_null", "unchanged")


@dataclass(frozen=True)
class Change:
    path_array: tuple[Any, ...]
    kind: str
    old: Any = None
    new: Any = None

    @property
    def path(self) -> str:
        parts: list[str] = []
        for part in self.path_array:
            if isinstance(part, dict):
                ((key, value),) = part.items()
                parts[-1] += f"[{key}={value}]"
            elif isinstance(part, int):
                parts[-1] += f"[{part}]"
            else:
                parts.append(str(part))
        return ".".join(parts)

    @cached_property
    def category(self) -> str:
        """params, metrics or other (what only --all shows)."""
        path = self.pattern_path
        if _matches(path, DETAIL):
            return "other"
        if _matches(path, MEASUREMENTS):
            return "metrics"
        if _matches(path, PARAMS):
            return "params"
        return "metrics" if _matches(path, METRICS) else "other"

    @property
    def pattern_path(self) -> str:
        """The path with record identities as [*], for matching against VOLATILE and SERIES."""
        return re.sub(r"\[[^\]]*\]", "[*]", self.path)

    @property
    def section(self) -> str:
        return str(self.path_array[0])

    @property
    def delta(self) -> float | None:
        if _matches(self.pattern_path, IDENTIFIERS):
            return None
        if _number(self.old) and _number(self.new):
            return _round(self.new - self.old)
        return None

    @property
    def rel_delta(self) -> float | None:
        delta = self.delta
        if delta is None or self.old == 0:
            return None
        return _round(delta / abs(self.old))

    def to_json(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "path_array": list(self.path_array),
            "category": self.category,
            "kind": self.kind,
            "old": self.old,
            "new": self.new,
            "delta": self.delta,
            "rel_delta": self.rel_delta,
        }


def compare(before: dict[str, Any], after: dict[str, Any], include_volatile: bool = False) -> list[Change]:
    """Every leaf that differs between two manifests (and, as `unchanged`, every one that does not)."""
    changes: list[Change] = []
    _walk(before, after, (), changes, include_volatile)
    return changes


def _walk(old: Any, new: Any, path: tuple[Any, ...], changes: list[Change], include_volatile: bool) -> None:
    probe = Change(path, "unchanged")
    dotted = probe.pattern_path
    if path and not include_volatile and (_matches(dotted, VOLATILE) or _matches(dotted, SERIES)):
        return
    if isinstance(old, dict) and isinstance(new, dict):
        for key in sorted(old.keys() | new.keys()):
            if key not in new:
                changes += _leaves((*path, key), "removed", old[key])
            elif key not in old:
                changes += _leaves((*path, key), "added", new[key])
            else:
                _walk(old[key], new[key], (*path, key), changes, include_volatile)
        return
    identity = IDENTITY.get(dotted)
    if identity and isinstance(old, list) and isinstance(new, list):
        old_records = {record.get(identity): record for record in old if isinstance(record, dict)}
        new_records = {record.get(identity): record for record in new if isinstance(record, dict)}
        for key in sorted(old_records.keys() | new_records.keys(), key=str):
            element = (*path, {identity: key})
            if key not in new_records:
                changes += _leaves(element, "removed", old_records[key])
            elif key not in old_records:
                changes += _leaves(element, "added", new_records[key])
            else:
                _walk(old_records[key], new_records[key], element, changes, include_volatile)
        return
    if old is None and (_records(new) or (isinstance(new, dict) and new)):  # a section that appeared
        changes += _leaves(path, "became_non_null", new)
        return
    if _records(old) and _records(new):  # no identity: by position, still leaf by leaf
        for index in range(max(len(old), len(new))):
            if index >= len(new):
                changes += _leaves((*path, index), "removed", old[index])
            elif index >= len(old):
                changes += _leaves((*path, index), "added", new[index])
            else:
                _walk(old[index], new[index], (*path, index), changes, include_volatile)
        return
    changes.append(Change(path, _kind(old, new), old, new))


def _records(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(item, dict) for item in value)


def _leaves(path: tuple[Any, ...], kind: str, value: Any) -> list[Change]:
    """An added, removed or appearing object as one change per leaf (a path each, never a blob); an
    object that became null is one change (its leaves would all read null)."""
    if isinstance(value, dict) and value:
        return [change for key, item in value.items() for change in _leaves((*path, key), kind, item)]
    if _records(value):
        return [change for index, item in enumerate(value) for change in _leaves((*path, index), kind, item)]
    return [Change(path, kind, old=value) if kind == "removed" else Change(path, kind, new=value)]


def _kind(old: Any, new: Any) -> str:
    if old == new and type(old) is type(new):
        return "unchanged"
    if old is None:
        return "became_non_null"
    if new is None:
        return "became_null"
    if _number(old) and _number(new):
        return "changed" if old != new else "unchanged"
    if type(old) is not type(new):
        return "type_changed"
    return "changed"


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _round(value: float) -> float:
    return round(value, 10) if isinstance(value, float) else value


def _matches(path: str, patterns) -> bool:
    return any(
        fnmatch.fnmatchcase(path, pattern) or path.startswith(pattern + ".") or path.startswith(pattern + "[")
        for pattern in patterns
    )


def select(
    changes: list[Change], only: list[str], ignore: list[str], show_unchanged: bool, everything: bool = True
) -> list[Change]:
    """The changes asked for, params first, then metrics, then the rest. Without `everything` (and without
    --only, which names what it wants), params and metrics only."""
    chosen = [
        change
        for change in changes
        if (show_unchanged or change.kind != "unchanged")
        and (not only or _matches(change.path, only))
        and not _matches(change.path, ignore)
        and (everything or only or change.category != "other")
    ]
    return sorted(chosen, key=lambda change: CATEGORIES.index(change.category))


def counts(changes: list[Change]) -> dict[str, int]:
    found = Counter(change.kind for change in changes)
    return {kind: found.get(kind, 0) for kind in KINDS}


_CONDITION = re.compile(
    r"^\s*(?P<path>[^<>=\s]+)\s*(?P<op>>=|<=|>|<)\s*(?P<threshold>[+-]?\d+(?:\.\d+)?(?:e[+-]?\d+)?%?)\s*$",
    re.I,
)


@dataclass(frozen=True)
class Condition:
    """A --fail-if gate: `PATH>+5%` (relative change), `PATH>+0.1` (signed: absolute change), `PATH>0.5` (new value)."""

    text: str
    path: str
    op: str
    threshold: float
    measure: str  # "relative", "delta" or "value"

    @classmethod
    def parse(cls, text: str) -> Condition:
        match = _CONDITION.match(text)
        if not match:
            raise PipelineError(
                f"--fail-if {text!r}: expected PATH, an operator (> < >= <=) and a threshold, "
                "e.g. 'training_report.training.summary.last>+5%'"
            )
        raw = match["threshold"]
        if raw.endswith("%"):
            return cls(text, match["path"], match["op"], float(raw[:-1]) / 100, "relative")
        return cls(text, match["path"], match["op"], float(raw), "delta" if raw[0] in "+-" else "value")

    def tripped(self, before: dict[str, Any], after: dict[str, Any]) -> str | None:
        """Why the gate trips, or None."""
        old, new = _lookup(before, self.path), _lookup(after, self.path)
        if not _number(new) or (self.measure != "value" and not _number(old)):
            raise PipelineError(
                f"--fail-if {self.text!r}: {self.path} is not a number in both manifests ({old!r} → {new!r})"
            )
        if self.measure == "value":
            measured = new
        elif self.measure == "delta":
            measured = new - old
        elif old == 0:
            raise PipelineError(
                f"--fail-if {self.text!r}: {self.path} was 0, so a relative change is undefined"
            )
        else:
            measured = (new - old) / abs(old)
        holds = {
            ">": measured > self.threshold,
            "<": measured < self.threshold,
            ">=": measured >= self.threshold,
            "<=": measured <= self.threshold,
        }
        if not holds[self.op]:
            return None
        shown = (
            f"{measured:+.2%}"
            if self.measure == "relative"
            else f"{measured:+g}"
            if self.measure == "delta"
            else f"{measured:g}"
        )
        return f"{self.text}: {self.path} {old!r} → {new!r} ({shown})"


def _lookup(document: dict[str, Any], path: str) -> Any:
    value: Any = document
    for key in path.split("."):
        if not isinstance(value, dict) or key not in value:
            raise PipelineError(f"--fail-if: no path {path!r} in the manifest (stopped at {key!r})")
        value = value[key]
    return value


def schema_warning(before: dict[str, Any], after: dict[str, Any]) -> str | None:

    def major(version: Any) -> str:
        return str(version).split(".")[0]

    odd = [
        f"{name} has schema {document.get('schema_version')}"
        for name, document in (("BEFORE", before), ("AFTER", after))
        if major(document.get("schema_version")) != major(SCHEMA_VERSION)
    ]
    if odd:
        return f"warning: this repotune reads manifest schema {SCHEMA_VERSION}; {', '.join(odd)}: paths may differ in meaning"
    return None


def run_diff(before_path, after_path, options) -> tuple[str, list[str], int]:
    """(report text, stderr lines, exit code): 0 identical, 1 different; with --fail-if, a gate's code
    instead: 1 a condition tripped, 0 none did, however much else differs (an error is 2 either way,
    raised)."""
    import orjson

    before, after = (load_manifest(manifest_file(Path(path))) for path in (before_path, after_path))
    conditions = [Condition.parse(text) for text in options.fail_if]
    messages = [warning] if (warning := schema_warning(before, after)) else []
    compared = compare(before, after, options.include_volatile)
    every = select(compared, options.only, options.ignore, options.unchanged)
    changes = (
        every if options.all else select(compared, options.only, options.ignore, options.unchanged, False)
    )
    differ = sum(change.kind != "unchanged" for change in every)
    if options.json:
        text = orjson.dumps(
            {"changes": [c.to_json() for c in changes], "counts": counts(changes)}, option=orjson.OPT_INDENT_2
        ).decode()
    else:
        text = render_table(changes, markdown=options.md)
        hidden = differ - sum(change.kind != "unchanged" for change in changes)
        if hidden:  # the exit code counts them: say where they are
            where = "none in params or metrics; " if text == "no differences" else ""
            text = f"{text}\n\n({where}{hidden} more outside params and metrics: --all shows them)".lstrip()
    tripped = [reason for condition in conditions if (reason := condition.tripped(before, after))]
    messages += [f"repotune: fail-if tripped: {reason}" for reason in tripped]
    if conditions:
        return text, messages, 1 if tripped else 0
    return text, messages, 1 if differ else 0


_SYSTEMS = {
    "before": "base model",
    "after": "fine-tuned",
    "nearest_commit": "lookup",
    "selector": "selector",
    "suggested": "suggestion",
}
_TASKS = {
    "message": "commit message", "code": "next line", "code_context": "next line with context",
    "block": "block", "block_context": "block with context",
}  # fmt: skip
_SCORES = {
    "chrf": "chrF",
    "edit_similarity": "edit similarity",
    "exact_match_pct": "exact match %",
    "first_word_match_pct": "first word right %",
    "subject_exact_match_pct": "subject exact %",
    "output_chars_mean": "answer length (chars)",
    "reference_chars_mean": "reference length (chars)",
    "whitespace_only": "empty answers",
    "samples": "commits scored",
}
_AGAINST = {"vs_nearest_commit": "minus the lookup's", "vs_before": "minus the base model's"}
_OPENING = {
    "word": "commonest first word of the answers",
    "answers": "answers beginning with their commonest first word",
    "references": "commits written beginning with the answers' commonest first word",
}
# What `.evaluation.system` weighs when it chooses who suggests (on the blocks older than the held-out ones).
_GAINS = {
    "lookup_gain": "the lookup's gain over the selector",
    "model_gain": "the fine-tuned model's gain over retrieval",
}
_NAMED = {
    "training_report.training.summary.first": "loss (training), first step",
    "training_report.training.summary.last": "loss (training), last step",
    "training_report.training.summary.min": "loss (training), lowest",
    "training_report.training.summary.min_step": "step of the lowest training loss",
    "training_report.training.global_step": "optimizer steps run",
    "training_report.evaluation.relative_change": "held-out loss change, fine-tuned vs base",
    "training_report.throughput.tokens_per_s": "training speed (tokens/s)",
    "training_report.throughput.step_tokens_per_s": "training speed, validations left out (tokens/s)",
    "training_report.throughput.samples_per_s": "training speed (blocks/s)",
    "training_report.throughput.trained_tokens": "tokens trained",
    "training_parameters.measured_tokens_per_s": "speed the plan rests on (tokens/s, measured)",
}


def describe(path: str) -> str:
    """What a metric is, in words: `training.summary.last` is the training loss at the last step,
    `evaluation.tasks.after.message.vs_nearest_commit.chrf` the fine-tuned model's commit-message chrF
    minus the lookup's. Empty for what has no name here (the path says it)."""
    if path in _NAMED:
        return _NAMED[path]
    parts = path.split(".")
    if parts[:2] != ["training_report", "evaluation"] or len(parts) < 4:
        return ""
    interval = parts[-1].endswith("_ci95")
    parts[-1] = parts[-1].removesuffix("_ci95")
    words = ""
    if parts[2] == "tasks" and len(parts) >= 6 and parts[3] in _SYSTEMS and parts[4] in _TASKS:
        score = _SCORES.get(parts[-1], "")
        against = _AGAINST.get(parts[5], "") if len(parts) == 7 else ""
        if score and (len(parts) == 6 or against):
            words = f"{_TASKS[parts[4]]} {score}, {_SYSTEMS[parts[3]]}" + (f" {against}" if against else "")
        elif len(parts) == 7 and parts[5] == "commonest_opening" and parts[6] in _OPENING:
            words = f"{_OPENING[parts[6]]}, {_SYSTEMS[parts[3]]}"
    elif parts[2] == "system" and len(parts) == 5 and parts[3] in _GAINS and parts[4] == "mean":
        words = f"{_GAINS[parts[3]]} in the mean of chrF and edit similarity, older commits"
    elif parts[2] == "system" and len(parts) == 6 and parts[3] == "validation" and parts[5] in _SCORES:
        chooser = "fine-tuned" if parts[4] == "model" else parts[4]  # the lookup, the selector
        words = f"commit message {_SCORES[parts[5]]}, {chooser}, older commits (choosing the system)"
    elif parts[2] in ("before", "after") and parts[-1] in ("loss", "perplexity", "loss_stderr"):
        measure = {
            "loss": "held-out loss",
            "perplexity": "held-out perplexity",
            "loss_stderr": "held-out loss stderr",
        }
        fmt = f", {parts[4]} format" if len(parts) == 6 and parts[3] == "per_format" else ""
        if len(parts) == 4 or fmt:
            words = f"{measure[parts[-1]]}, {_SYSTEMS[parts[2]]}{fmt}"
    return f"{words}, 95% interval" if words and interval else words


def render_table(changes: list[Change], markdown: bool) -> str:
    """Changes grouped by section, params before metrics before the rest: path, old, new, Δ, Δ%."""
    if not changes:
        return "no differences"
    groups: dict[tuple[str, str], list[Change]] = {}
    for change in changes:  # one pass: a manifest can have thousands of sections
        groups.setdefault((change.category, change.section), []).append(change)
    lines: list[str] = []
    for (category, section), members in groups.items():
        title = section if category == "other" else f"{section} ({category})"
        # Metrics say what they are in words first: a path like training.summary.last hides a loss.
        named = category == "metrics"
        rows = [
            (
                *((describe(change.path),) if named else ()),
                change.path.removeprefix(f"{section}.") or section,
                _show(change.old),
                _show(change.new),
                _show_delta(change),
                _show_relative(change),
                change.kind,
            )
            for change in members
        ]
        header = (*(("what",) if named else ()), "path", "old", "new", "Δ", "Δ%", "kind")
        if markdown:
            lines += [
                f"### {title}",
                "",
                "| " + " | ".join(header) + " |",
                "|" + "---|" * len(header),
            ]
            lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows]
        else:
            lines.append(f"== {title} ==")
            lines += aligned([header, *rows], indent="  ")
        lines.append("")
    return "\n".join(lines).rstrip()


def _show(value: Any, width: int = 48) -> str:
    if value is None:
        return "null"
    if isinstance(value, float):
        text = f"{value:.6g}"
    elif isinstance(value, dict | list):
        import orjson

        text = orjson.dumps(value).decode()
    else:
        text = str(value)
    text = text.replace("\n", "⏎")
    return text if len(text) <= width else text[: width - 1] + "…"


def _show_delta(change: Change) -> str:
    delta = change.delta
    return "" if delta is None else f"{delta:+.6g}"


def _show_relative(change: Change) -> str:
    relative = change.rel_delta
    if relative is None or not math.isfinite(relative):
        return ""
    return f"{relative:+.1%}"

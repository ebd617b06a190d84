"""One self-contained HTML page for a run (summary, plan, curves, evaluation, throughput, stages,
hardware, data, config), or for several runs compared (overlaid curves, one table of what differs).

Each section is a list of blocks (headings, paragraphs, tables, figures) built from the manifest here and
laid out by the Jinja2 template beside this module (templates/report.html), which escapes every value.
Plots are drawn with matplotlib (Agg, no display) and embedded as base64 PNG, so the page opens offline
and can be attached anywhere. Anything the run did not measure says so instead of drawing an empty plot.
"""

from __future__ import annotations

import base64
import io
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, select_autoescape
from markupsafe import Markup

from pipeline.errors import PipelineError
from pipeline.manifest import load_manifest, write_text_output
from pipeline.scores import BLOCK_TASK, CODE_LABELS, difference, registers, with_interval
from pipeline.use.diff import CATEGORIES, compare

TEMPLATES = Path(__file__).with_name("templates")
STYLE = (TEMPLATES / "report.css").read_text()
PAGE = Environment(
    loader=FileSystemLoader(TEMPLATES), autoescape=select_autoescape(["html"]), keep_trailing_newline=True
).get_template("report.html")

Block = dict[str, Any]
"""One piece of a page for the template: {"kind": "h1" | "h2" | "h3" | "p" | "pre" | "table" | "figure" |
"details", ...}. A table's cells are text, or {"text", "css"} (a span), {"pre": text}, {"blank": count}
(a blank answer), or a list of those."""


def render_report(manifest: dict[str, Any]) -> str:
    """What the run learned first (under a one-line title: the scoreboard against the repository's own past,
    then samples side by side), then the run's facts and how it trained, then the plan (folded) and the
    rest."""
    sections: list[list[Block]] = [
        _title(manifest),
        _scoreboard(manifest),
        _samples(manifest),
        _summary(manifest),
        _lineage(manifest),
        _training(manifest),
        _decisions(manifest),
        _throughput(manifest),
        _stages(manifest),
        _hardware(manifest),
        _epochs(manifest),
        _scrape(manifest),
        _config(manifest),
    ]
    return _page(f"repotune run {(manifest.get('run') or {}).get('id', '')}", sections)


def _page(title: str, sections: list[list[Block]]) -> str:
    # The style is this module's own file, not the manifest's: trusted, and CSS inside <style> is not
    # read as HTML (an escaped `>` would break its child selectors).
    blocks = [block for section in sections for block in section]
    return PAGE.render(title=title, style=Markup(STYLE), blocks=blocks)


def write_report(manifest_paths: list[Path], output: Path, names: list[str]) -> Path:
    """One run's page, or with several manifests the page that compares them."""

    manifests = [load_manifest(path) for path in manifest_paths]
    if len(manifests) == 1:
        return write_text_output(output, render_report(manifests[0]))
    return write_text_output(output, render_comparison(run_names(manifest_paths, names), manifests))


def _title(m: dict[str, Any]) -> list[Block]:
    """The run in one line above the scoreboard: which run, how it ended, on what, with which model."""
    said = [
        f"{(m.get('run') or {}).get('id')} · ",
        *_status(m),
        f" · {_commit(m.get('repository') or {})} · {(m.get('model') or {}).get('name')}",
        f" · {_fmt(m.get('total_execution_time_seconds'), ' s')}",
    ]
    return [_heading(1, "repotune run"), _p(said, muted=True)]


def _status(m: dict[str, Any]) -> list[Any]:
    """How the run ended, coloured, and its error where it failed."""
    status = m.get("status")
    return [{"text": status, "css": f"status-{status}"}, f" — {m['error']}" if m.get("error") else ""]


def _commit(repository: dict[str, Any]) -> str:
    """The repository and the commit it was at."""
    return f"{repository.get('path')} @ {(repository.get('head') or '')[:12]}"


def _summary(m: dict[str, Any]) -> list[Block]:
    run, params, report = (
        m.get("run") or {},
        m.get("training_parameters") or {},
        m.get("training_report") or {},
    )
    training = (report.get("training") or {}).get("summary") or {}
    evaluation = report.get("evaluation") or {}
    throughput = report.get("throughput") or {}
    repository = m.get("repository") or {}
    model = m.get("model") or {}
    rows = [
        (
            "status",
            _status(m),
        ),
        ("command", " ".join(["repotune", *(run.get("argv") or [])])),
        ("started / finished", f"{run.get('started_at')} / {run.get('finished_at')}"),
        ("total time", _fmt(m.get("total_execution_time_seconds"), " s")),
        (
            "repository",
            f"{_commit(repository)} ({repository.get('branch')})",
        ),
        ("model", f"{model.get('name')} — {model.get('note') or 'pretrained'}"),
        (
            "device",
            f"{params.get('device')} · {params.get('precision')} · micro-batch {params.get('batch_size')} × "
            f"{params.get('gradient_accumulation_steps')} accumulation",
        ),
        (
            "steps",
            f"{(report.get('training') or {}).get('global_step')} of {params.get('total_steps')} (warmup "
            f"{params.get('warmup_steps')})",
        ),
        (
            "training loss",
            f"{_fmt(training.get('first'))} → {_fmt(training.get('last'))} (min {_fmt(training.get('min'))} at "
            f"step {training.get('min_step')})",
        ),
        ("held-out loss", _before_after(evaluation)),
        ("throughput", _throughput_line(throughput)),
    ]
    return [_heading(2, "The run"), _table(("", ""), rows)]


def _lineage(m: dict[str, Any]) -> list[Block]:
    """An update's parent, what it added, and what it kept of the parent's held-out commits (else nothing)."""
    lineage = m.get("lineage")
    if not lineage:
        return []
    forgetting = lineage.get("forgetting") or {}
    was, now = (forgetting.get(when) or {} for when in ("before", "after"))
    rows = [
        ("continues", lineage.get("parent_manifest")),
        ("parent's sha256", lineage.get("parent_sha256")),
        ("HEAD", f"{(lineage.get('old_head') or '')[:12]} → {(lineage.get('new_head') or '')[:12]}"),
        ("commits added", len(lineage.get("commits_added") or [])),
        (
            "parent's held-out loss",
            f"{_fmt(was.get('loss'))} → {_fmt(now.get('loss'))} ({_fmt(forgetting.get('relative_change'))} relative: "
            "a rise is forgetting)",
        ),
    ]
    return [_heading(2, "Lineage (an update)"), _table(("", ""), rows)]


def _decisions(m: dict[str, Any]) -> list[Block]:
    """The plan, folded: every decision with its source and reason, in the order the CLI prints them."""
    params = m.get("training_parameters") or {}
    decisions = params.get("decisions") or {}
    if not decisions:
        return [_heading(2, "Plan"), _p("not planned", muted=True)]
    order = [name for name in params.get("decision_order") or [] if name in decisions]  # as the CLI prints
    order += [name for name in decisions if name not in order]
    rows = [
        (
            name,
            _fmt(decisions[name].get("value")),
            decisions[name].get("source"),
            decisions[name].get("reason"),
        )
        for name in order
    ]
    table = _table(("parameter", "value", "source", "reason"), rows, css="plan")
    return [
        {
            "kind": "details",
            "summary": f"Plan ({len(rows)} decisions, each with its reason)",
            "blocks": [table],
        }
    ]


def _training(m: dict[str, Any]) -> list[Block]:
    report = m.get("training_report") or {}
    losses = (report.get("training") or {}).get("loss_history") or []
    rates = (report.get("learning_rate") or {}).get("history") or []
    if not losses:
        return [_heading(2, "Training"), _p("no training steps recorded", muted=True)]
    norms = [(e["step"], e["grad_norm"]) for e in losses if e.get("grad_norm") is not None]

    def draw(plt):
        figure, (loss, norm, rate) = plt.subplots(1, 3, figsize=(13, 3.6))
        loss.plot([e["step"] for e in losses], [e["loss"] for e in losses], label="training loss")
        if validation := validation_curve(m):
            loss.plot(*zip(*validation, strict=True), "s-", label="validation loss")
        if held_out := held_out_curve(m):
            loss.plot(*zip(*held_out, strict=True), "o--", label="held-out loss (before, after)")
        loss.set_xlabel("optimizer step")
        loss.set_ylabel("loss")
        loss.legend()
        if norms:
            norm.plot(*zip(*norms, strict=True), color="tab:green")
        norm.set_xlabel("optimizer step")
        norm.set_ylabel("gradient norm (before clipping)")
        rate.plot([e["step"] for e in rates], [e["learning_rate"] for e in rates], color="tab:orange")
        rate.set_xlabel("optimizer step")
        rate.set_ylabel("learning rate")
        return figure

    return [_heading(2, "Training"), _figure(draw, "loss, gradient-norm and learning-rate curves")]


def held_out_curve(m: dict[str, Any]) -> list[tuple[int, float]]:
    """Held-out loss by step: before training at step 0, after it at the last."""
    report = m.get("training_report") or {}
    evaluation = report.get("evaluation") or {}
    points = []
    if (evaluation.get("before") or {}).get("loss") is not None:
        points.append((0, evaluation["before"]["loss"]))
    last = (report.get("training") or {}).get("global_step")
    if (evaluation.get("after") or {}).get("loss") is not None and last:
        points.append((last, evaluation["after"]["loss"]))
    return points


def validation_curve(m: dict[str, Any]) -> list[tuple[int, float]]:
    """Validation loss during training (what chose the checkpoint kept)."""
    evaluation = (m.get("training_report") or {}).get("evaluation") or {}
    return [(e["step"], e["loss"]) for e in evaluation.get("history") or [] if e.get("loss") is not None]


SYSTEM_LABELS = {
    "before": "base model",
    "after": "fine-tuned model",
    "nearest_commit": "lookup (most similar past commit)",
    "selector": "selector (retrieval without the model)",
    "suggested": "suggested",
}


def _scoreboard(m: dict[str, Any]) -> list[Block]:
    """The held-out commits' scores: each system's commit messages beside the lookup's (paired
    differences with 95% intervals), the next-line code task before and after, and held-out loss."""
    evaluation = (m.get("training_report") or {}).get("evaluation") or {}
    if not evaluation.get("before") and not evaluation.get("after"):
        return [_heading(2, "What it learned"), _p(evaluation.get("note") or "not measured", muted=True)]
    title = "What it learned (held-out commits: the newest, never trained on or retrieved from)"
    return [
        _heading(2, title),
        *_message_scores(evaluation),
        *_code_scores(evaluation),
        *_code_scores(evaluation, blocks=True),
        *_held_out_loss(evaluation),
    ]


def _message_scores(evaluation: dict[str, Any]) -> list[Block]:
    """Each system's commit messages beside the lookup's."""
    tasks, system = evaluation.get("tasks") or {}, evaluation.get("system") or {}
    rows, count = [], None
    for name, label in SYSTEM_LABELS.items():
        scored = (tasks.get(name) or {}).get("message")
        if not scored:
            continue
        if name == "suggested":
            label = f"suggested: {system.get('name')} (what generate and the hook offer)"
        versus, count = scored.get("vs_nearest_commit") or {}, count or scored.get("samples")
        rows.append(
            (
                label,
                with_interval(scored, "chrf"),
                with_interval(scored, "edit_similarity"),
                _signed(versus, "chrf"),
                _signed(versus, "edit_similarity"),
                _fmt(scored.get("subject_exact_match_pct")),
                f"{_fmt(scored.get('output_chars_mean'))} ({_fmt(scored.get('reference_chars_mean'))})",
            )
        )
    if not rows:
        return []
    header = ("system", "chrF [95%]", "edit similarity [95%]", "chrF vs lookup", "ES vs lookup",
              "subject exact %", "chars (git's)")  # fmt: skip
    parts = [
        _heading(3, f"Commit message from its diff ({count} commits)"),
        _table(header, rows, css="scores"),
    ]
    if system:
        parts.append(_p(f"suggestion system: {system.get('reason')}", muted=True))
    return parts + [_p(said, muted=True) for said in registers(tasks)]


def _code_scores(evaluation: dict[str, Any], blocks: bool = False) -> list[Block]:
    """The next line at a cursor (with `blocks`, the body under a line that opens one): every system, a
    model's gain over the base model given the same prompt, and who writes next lines at use, with why."""
    tasks, rows = evaluation.get("tasks") or {}, []
    chosen = {} if blocks else evaluation.get("code_system") or {}
    for name, (system, task, label) in CODE_LABELS.items():
        scored = (tasks.get(system) or {}).get(BLOCK_TASK[task] if blocks else task)
        if scored:
            versus = scored.get("vs_before") or {}
            rows.append(
                (
                    label + (" (chosen)" if chosen.get("name") == name else ""),
                    with_interval(scored, "exact_match_pct"),
                    with_interval(scored, "edit_similarity"),
                    _signed(versus, "exact_match_pct"),
                    _signed(versus, "edit_similarity"),
                )
            )
    if not rows:
        return []
    header = ("system", "exact match % [95%]", "edit similarity [95%]", "exact vs base", "ES vs base")
    title = (
        "A block: the body under a line that opens one (the file through that line given; resampled by commit)"
        if blocks
        else "Next line at a cursor (the file before it given; resampled by commit)"
    )
    said = [_p(chosen["reason"], muted=True)] if chosen else []
    return [_heading(3, title), _table(header, rows, css="scores"), *said]


def _held_out_loss(evaluation: dict[str, Any]) -> list[Block]:
    """Held-out loss and perplexity before and after, per format, and what the evaluation cost."""
    before, after = evaluation.get("before") or {}, evaluation.get("after") or {}
    rows = [("held-out loss", _fmt(before.get("loss")), _fmt(after.get("loss")))]
    rows.append(("± standard error", _fmt(before.get("loss_stderr")), _fmt(after.get("loss_stderr"))))
    rows.append(("perplexity", _fmt(before.get("perplexity")), _fmt(after.get("perplexity"))))
    for name, scored in (before.get("per_format") or {}).items():
        later = (after.get("per_format") or {}).get(name) or {}
        rows.append((f"  {name} perplexity", _fmt(scored.get("perplexity")), _fmt(later.get("perplexity"))))
    parts = [_heading(3, "Held-out loss"), _table(("", "before training", "after training"), rows)]
    held = evaluation.get("held_out_commits") or {}
    if held.get("note"):
        parts.append(_p(held["note"], muted=True))
    cost = evaluation.get("cost") or {}
    if cost:
        share = cost.get("share_of_run_pct")
        parts.append(
            _p(
                f"evaluation cost: base model {_fmt(cost.get('before_s'), ' s')}"
                + (" (cached)" if cost.get("before_cached") else "")
                + f", fine-tuned {_fmt(cost.get('after_s'), ' s')}, retrieval {_fmt(cost.get('retrieval_s'), ' s')}"
                + (f"; {share}% of the run" if share is not None else ""),
                muted=True,
            )
        )
    return parts


def _signed(versus: dict[str, Any], key: str) -> dict[str, str] | str:
    """A paired difference with its interval, green when the interval is above 0, red below."""
    if key not in versus:
        return ""
    low, high = versus[f"{key}_ci95"]
    css = "better" if low > 0 else "worse" if high < 0 else ""
    return {"text": difference(versus, key), "css": css}


def _samples(m: dict[str, Any]) -> list[Block]:
    """Held-out commits side by side: what git has, the lookup, the suggestion, the fine-tuned model."""
    evaluation = (m.get("training_report") or {}).get("evaluation") or {}
    samples = evaluation.get("samples") or {}
    columns = [("lookup", "nearest_commit"), ("suggested", "suggested"), ("fine-tuned model", "after"),
               ("base model", "before")]  # fmt: skip
    by_commit = {name: {(s["task"], s["commit"]): s for s in samples.get(name) or []} for _, name in columns}
    asked = [s for s in samples.get("after") or samples.get("before") or []]
    if not asked:
        return []
    parts = [
        _heading(2, "Samples"),
        _p("the first held-out commits; evaluation.jsonl beside the manifest has every one", muted=True),
    ]
    for sample in asked:
        key = (sample["task"], sample["commit"])
        what = (
            "its commit message, from its diff"
            if sample["task"] == "message"
            else "the next line of its change"
        )
        shown = [(label, found) for label, name in columns if (found := by_commit[name].get(key)) is not None]
        prompt = sample["prompt"][-300:] if sample["task"] == "code" else sample["prompt"][:300]
        parts += [
            _heading(3, f"{sample['commit'][:12]}: {what}"),
            {"kind": "pre", "text": prompt},
            _table(
                ["what git has", *[label for label, _ in shown]],
                [[{"pre": sample["reference"]}, *[_output(found) for _, found in shown]]],
                css="samples",
            ),
        ]
    return parts


def _output(sample: dict[str, Any]) -> dict[str, Any]:
    """A generation; a blank one says so instead of rendering as empty space."""
    if not sample["output"].strip():
        return {"blank": len(sample["output"])}
    return {"pre": sample["output"]}


def _throughput_line(throughput: dict[str, Any]) -> str:
    if throughput.get("tokens_per_s") is None:
        return "not measured: training did not finish"
    line = f"{_fmt(throughput['tokens_per_s'])} tokens/s"
    if throughput.get("bottleneck"):
        line += f" — {throughput['bottleneck']}: {throughput.get('suggestion')}"
    return line


def _throughput(m: dict[str, Any]) -> list[Block]:
    throughput = (m.get("training_report") or {}).get("throughput") or {}
    if throughput.get("tokens_per_s") is None:
        return [_heading(2, "Throughput"), _p(_throughput_line(throughput), muted=True)]
    step, wait = throughput.get("step_time_s") or {}, throughput.get("data_wait_s") or {}
    rows = [
        ("tokens per second", _fmt(throughput.get("tokens_per_s"))),
        ("blocks per second", _fmt(throughput.get("samples_per_s"))),
        ("tokens trained (carrying a loss)", _fmt(throughput.get("trained_tokens"))),
        ("tokens processed (not padding)", _fmt(throughput.get("processed_tokens"))),
        ("step time, s (mean / p95 / max)", " / ".join(_fmt(step.get(k)) for k in ("mean", "p95", "max"))),
        ("waiting for data, s per step (mean / max)", " / ".join(_fmt(wait.get(k)) for k in ("mean", "max"))),
        ("share of step time waiting for data", _fmt(throughput.get("data_wait_share_pct"), " %")),
        ("hardware monitor's cost", _fmt(throughput.get("monitor_overhead_pct"), " %")),
        ("bottleneck", _fmt(throughput.get("bottleneck"))),
        ("what to change", _fmt(throughput.get("suggestion"))),
    ]
    return [_heading(2, "Throughput"), _table(("", ""), rows)]


def _stages(m: dict[str, Any]) -> list[Block]:
    timings = m.get("timings") or {}
    if not timings:
        return [_heading(2, "Stages"), _p("no stage timed", muted=True)]
    total = m.get("total_execution_time_seconds") or sum(timings.values())
    rows = [
        (name.removesuffix("_s"), _fmt(seconds, " s"), f"{seconds / total:.0%}" if total else "—")
        for name, seconds in sorted(timings.items(), key=lambda item: -item[1])
    ]
    return [
        _heading(2, "Stages"),
        _p(f"{_fmt(total, ' s')} in all"),
        _table(("stage", "time", "share"), rows),
    ]


def _config(m: dict[str, Any]) -> list[Block]:
    config = m.get("config") or {}
    overrides = config.get("overrides") or {}
    source = config.get("source") or "the shipped training_config.yaml"
    if not overrides:
        return [_heading(2, "Config"), _p(f"{source}, nothing overridden")]
    rows = sorted((key, _fmt(value)) for key, value in overrides.items())
    return [
        _heading(2, "Config"),
        _p(f"{source}, with these overrides (--set and flags)"),
        _table(("key", "value"), rows),
    ]


def _hardware(m: dict[str, Any]) -> list[Block]:
    hardware = (m.get("training_report") or {}).get("hardware") or {}
    samples = hardware.get("samples") or []
    if not samples:
        return [_heading(2, "Hardware"), _p("no samples", muted=True)]
    gpu_indexes = sorted({gpu["index"] for sample in samples for gpu in sample["gpus"]})

    def draw(plt):
        rows = 2 + len(gpu_indexes)
        figure, axes = plt.subplots(rows, 1, figsize=(11, 2.2 * rows), sharex=True)
        times = [s["t_s"] for s in samples]
        axes[0].plot(times, [s["cpu_pct"] for s in samples])
        axes[0].set_ylabel("CPU %")
        axes[1].plot(times, [s["ram_used_gb"] for s in samples], label="RAM used")
        axes[1].plot(times, [s["process_rss_gb"] for s in samples], label="process RSS")
        axes[1].set_ylabel("GB")
        axes[1].legend()
        for axis, index in zip(axes[2:], gpu_indexes, strict=True):
            readings = [next((g for g in s["gpus"] if g["index"] == index), {}) for s in samples]
            axis.plot(times, [r.get("utilization_pct") for r in readings], label="utilisation %")
            axis.plot(times, [r.get("temperature_c") for r in readings], label="temperature °C")
            memory = axis.twinx()
            memory.plot(
                times, [r.get("memory_used_gb") for r in readings], color="tab:red", label="memory GB"
            )
            memory.set_ylabel("GB")
            axis.set_ylabel(f"GPU {index}")
            axis.legend(loc="upper left")
        axes[-1].set_xlabel("seconds into training")
        return figure

    interval = hardware.get("collection_interval_seconds")
    note = [_p(hardware["gpu_note"], muted=True)] if hardware.get("gpu_note") else []
    return [
        _heading(2, f"Hardware (a sample every {_fmt(interval)} s)"),
        *note,
        _figure(draw, "hardware utilisation over time"),
    ]


def _epochs(m: dict[str, Any]) -> list[Block]:
    epochs = ((m.get("training_report") or {}).get("training") or {}).get("epoch_summaries") or []
    if not epochs:
        return [_heading(2, "Epochs"), _p("no epoch summaries", muted=True)]
    columns = ("epoch", "end_step", "loss_mean", "loss_min", "loss_max", "duration_s", "tokens_per_s")
    return [_heading(2, "Epochs"), _table(columns, [tuple(_fmt(e.get(c)) for c in columns) for e in epochs])]


def _scrape(m: dict[str, Any]) -> list[Block]:
    scrape = m.get("scrape") or {}
    if scrape.get("commits_seen") is None:
        return [_heading(2, "Data"), _p("not scraped", muted=True)]
    counts = [
        (name, _fmt(scrape.get(name)))
        for name in ("commits_seen", "commits_kept", "files_seen", "files_kept", "sequences", "duration_s")
    ]
    skipped = scrape.get("skipped") or {}
    parts = [_heading(2, "Data"), _table(("", ""), counts)]
    if skipped:

        def draw(plt):
            figure, axis = plt.subplots(figsize=(8, 0.4 * len(skipped) + 1))
            axis.barh(list(skipped), list(skipped.values()))
            axis.set_xlabel("commits skipped")
            return figure

        parts += [
            _table(("skipped because", "commits"), sorted(skipped.items())),
            _figure(draw, "commits skipped by reason"),
        ]
    files_skipped = scrape.get("files_skipped") or {}
    if files_skipped:
        parts.append(_table(("files left out because", "files"), sorted(files_skipped.items())))
    redactions = scrape.get("redactions") or {}
    parts.append(
        _table(("secrets redacted (rule)", "count"), sorted(redactions.items()))
        if redactions
        else _p("no secret found to redact")
    )
    cache = (m.get("dataset") or {}).get("cache") or {}
    if cache:
        state = "hit: reused" if cache.get("hit") else "miss: tokenized"
        parts.append(_p(f"token cache {cache.get('key')} ({state} in {_fmt(cache.get('seconds'), ' s')})"))
    return parts


def _heading(level: int, text: str) -> Block:
    return {"kind": f"h{level}", "text": text}


def _p(text: Any, muted: bool = False) -> Block:
    return {"kind": "p", "text": text, "muted": muted}


def _table(header, rows, css: str | None = None) -> Block:
    """A table; a header of empty names is none: a list of facts, whose names never wrap."""
    facts = not any(header)
    rows = [list(row) for row in rows]
    return {"kind": "table", "header": list(header), "rows": rows, "css": css or ("facts" if facts else None)}


def _figure(draw, alt: str) -> Block:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure = draw(plt)
    figure.tight_layout()
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=100)
    plt.close(figure)
    return {"kind": "figure", "alt": alt, "png": base64.b64encode(buffer.getvalue()).decode()}


def _before_after(evaluation: dict[str, Any]) -> str:
    before, after = evaluation.get("before"), evaluation.get("after")
    if not before or not after:
        return evaluation.get("note") or "not measured"
    change = evaluation.get("relative_change")
    shown = f" ({change:+.1%})" if change is not None else ""
    return f"{_fmt(before['loss'])} → {_fmt(after['loss'])}{shown}"


def _fmt(value: Any, unit: str = "") -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:.4g}{unit}"
    if isinstance(value, list):
        return ", ".join(map(str, value)) or "none"
    return f"{value}{unit}"


def run_names(paths: list[Path], names: list[str]) -> list[str]:
    """What each run is called on a comparison page: its --name, else its output directory's name (made
    unique with its position when two share one)."""
    if names and len(names) != len(paths):
        raise PipelineError(f"--name: give one per manifest ({len(paths)}), or none; got {len(names)}")
    chosen = names or [path.resolve().parent.name for path in paths]
    taken = {name for name in chosen if chosen.count(name) > 1}
    return [f"{name} ({index})" if name in taken else name for index, name in enumerate(chosen, 1)]


def render_comparison(names: list[str], manifests: list[dict[str, Any]]) -> str:
    """One page for several runs: a row each, overlaid training and held-out curves, and what differs
    between them (params first, then metrics, then the rest)."""
    return _page(
        f"repotune: {' vs '.join(names)}",
        [
            [_heading(1, "repotune: runs compared")],
            _runs_table(names, manifests),
            _messages_compared(names, manifests),
            _overlaid_curves(names, manifests),
            _differences(names, manifests),
        ],
    )


def _runs_table(names: list[str], manifests: list[dict[str, Any]]) -> list[Block]:
    rows = []
    for name, m in zip(names, manifests, strict=True):
        report = m.get("training_report") or {}
        summary = (report.get("training") or {}).get("summary") or {}
        rows.append(
            (
                name,
                m.get("status"),
                (m.get("model") or {}).get("name"),
                (report.get("training") or {}).get("global_step"),
                f"{_fmt(summary.get('first'))} → {_fmt(summary.get('last'))}",
                _before_after(report.get("evaluation") or {}),
                _fmt((report.get("throughput") or {}).get("tokens_per_s")),
                _fmt(m.get("total_execution_time_seconds"), " s"),
            )
        )
    header = ("run", "status", "model", "steps", "training loss", "held-out loss", "tokens/s", "total time")
    return [_heading(2, "Runs"), _table(header, rows)]


def _messages_compared(names: list[str], manifests: list[dict[str, Any]]) -> list[Block]:
    """Each run's commit messages on its held-out commits: the suggestion (and the system that made it)
    and its paired difference from the lookup, beside the fine-tuned model's and the lookup's scores."""
    rows = []
    for name, m in zip(names, manifests, strict=True):
        evaluation = (m.get("training_report") or {}).get("evaluation") or {}
        tasks = evaluation.get("tasks") or {}
        shown = ("suggested", "after", "nearest_commit")
        scored = {system: (tasks.get(system) or {}).get("message") or {} for system in shown}
        if not scored["suggested"]:
            continue
        both = {
            system: f"{_fmt(scored[system].get('chrf'))} / {_fmt(scored[system].get('edit_similarity'))}"
            for system in shown
        }
        versus = scored["suggested"].get("vs_nearest_commit") or {}
        rows.append(
            (
                name,
                (evaluation.get("system") or {}).get("name"),
                scored["suggested"].get("samples"),
                both["suggested"],
                _signed(versus, "chrf"),
                _signed(versus, "edit_similarity"),
                both["after"],
                both["nearest_commit"],
            )
        )
    if not rows:
        return []
    header = ("run", "suggested by", "commits", "suggested chrF / ES", "chrF vs lookup [95%]",
              "ES vs lookup [95%]", "fine-tuned chrF / ES", "lookup chrF / ES")  # fmt: skip
    return [
        _heading(2, "Commit messages"),
        _table(header, rows, css="scores"),
        _p(
            "each run on its own held-out commits: runs on the same repository and head compare directly, and "
            "a difference between them within the intervals is noise",
            muted=True,
        ),
    ]


ABSENT = "(absent)"


def _newer(change) -> str:
    return ABSENT if change.kind == "removed" else _fmt(change.new)


def _overlaid_curves(names: list[str], manifests: list[dict[str, Any]]) -> list[Block]:
    histories = [
        ((m.get("training_report") or {}).get("training") or {}).get("loss_history") or [] for m in manifests
    ]
    if not any(histories):
        return [_heading(2, "Curves"), _p("no run recorded a training step", muted=True)]

    def draw(plt):
        figure, (training, held_out) = plt.subplots(1, 2, figsize=(13, 4))
        for index, (name, m, losses) in enumerate(zip(names, manifests, histories, strict=True)):
            color = f"C{index % 10}"
            if losses:
                training.plot(
                    [e["step"] for e in losses], [e["loss"] for e in losses], color=color, label=name
                )
            if points := held_out_curve(m):
                held_out.plot(*zip(*points, strict=True), "o-", color=color, label=name)
        for axis, label in ((training, "training loss"), (held_out, "held-out loss")):
            axis.set_xlabel("optimizer step")
            axis.set_ylabel(label)
            axis.legend()
        return figure

    return [_heading(2, "Curves"), _figure(draw, "training and held-out loss of every run, overlaid")]


def _differences(names: list[str], manifests: list[dict[str, Any]]) -> list[Block]:
    """Every path whose value differs between the runs, a column per run; params and metrics as `diff`
    shows them by default, the rest below."""

    first, *others = manifests
    pairs = [{change.path: change for change in compare(first, other)} for other in others]
    differing = {path for pair in pairs for path, change in pair.items() if change.kind != "unchanged"}
    if not differing:
        return [_heading(2, "What differs"), _p("nothing: the runs agree on every compared value")]
    parts = [_heading(2, "What differs")]
    for category in CATEGORIES:
        ordered = []
        for pair in pairs:
            for path, change in pair.items():
                if path in differing and change.category == category and path not in ordered:
                    ordered.append(path)
        if not ordered:
            continue
        rows = []
        for path in ordered:
            known = next(pair[path] for pair in pairs if path in pair)
            base = ABSENT if known.kind == "added" else _fmt(known.old)
            values = [base] + [_newer(pair[path]) if path in pair else base for pair in pairs]
            rows.append((path, *values))
        title = {"params": "Params", "metrics": "Metrics", "other": "Everything else"}[category]
        parts += [_heading(3, title), _table(("path", *names), rows, css="paths")]
    return parts

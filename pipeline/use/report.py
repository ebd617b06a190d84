"""One self-contained HTML page for a run (summary, plan, curves, evaluation, throughput, stages,
hardware, data, config), or for several runs compared (overlaid curves, one table of what differs).

Plots are drawn with matplotlib (Agg, no display) and embedded as base64 PNG,
so the page opens offline and can be attached anywhere. Anything the run did
not measure says so instead of drawing an empty plot.
"""

from __future__ import annotations

import base64
import html
import io
from pathlib import Path
from typing import Any

from pipeline.errors import PipelineError
from pipeline.manifest import load_manifest, write_text_output
from pipeline.scores import BLOCK_TASK, CODE_LABELS, difference, registers, with_interval
from pipeline.use.diff import CATEGORIES, compare

STYLE = """
body { font-family: system-ui, sans-serif; margin: 2rem auto; max-width: 1100px; color: #1d2330; }
h1 { margin-bottom: 0.2rem; } h2 { border-bottom: 1px solid #d0d5de; padding-bottom: 0.2rem; margin-top: 2rem; }
table { border-collapse: collapse; margin: 0.5rem 0; font-size: 0.9rem; }
th, td { border: 1px solid #d0d5de; padding: 0.25rem 0.5rem; text-align: left; vertical-align: top;
         overflow-wrap: anywhere; }
th { background: #f2f4f8; } .muted { color: #6b7385; } img { max-width: 100%; }
pre { background: #f6f8fa; padding: 0.5rem; font-size: 0.8rem; white-space: pre-wrap; overflow-wrap: anywhere; margin: 0;
      max-height: 24em; overflow-y: auto; }
table.samples { table-layout: fixed; width: 100%; } table.samples td, table.samples th { width: 25%; }
table.plan td:nth-child(1), table.plan td:nth-child(3) { white-space: nowrap; overflow-wrap: normal; }
table.plan td:nth-child(2) { max-width: 14em; } table.plan td:nth-child(4) { width: 60%; }
table.scores td { white-space: nowrap; overflow-wrap: normal; } .better { color: #1a7f37; } .worse { color: #cf222e; }
table.scores td:first-child { white-space: normal; min-width: 10em; } table.scores th { overflow-wrap: normal; }
details > summary { cursor: pointer; font-size: 1.5em; font-weight: bold; margin-top: 2rem; }
.status-completed { color: #1a7f37; } .status-failed, .status-interrupted { color: #cf222e; }
"""


def render_report(manifest: dict[str, Any]) -> str:
    """What the run learned first (the scoreboard against the repository's own past, then samples side by
    side), then how it trained, then the plan (folded) and the rest."""
    sections = [
        _summary(manifest),
        _scoreboard(manifest),
        _samples(manifest),
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


def _page(title: str, sections: list[str]) -> str:
    return (
        f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{_e(title)}</title>'
        f"<style>{STYLE}</style></head><body>\n" + "\n".join(sections) + "\n</body></html>\n"
    )


def write_report(manifest_paths: list[Path], output: Path, names: list[str]) -> Path:
    """One run's page, or with several manifests the page that compares them."""

    manifests = [load_manifest(path) for path in manifest_paths]
    if len(manifests) == 1:
        return write_text_output(output, render_report(manifests[0]))
    return write_text_output(output, render_comparison(run_names(manifest_paths, names), manifests))


def _summary(m: dict[str, Any]) -> str:
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
            f'<span class="status-{_e(m.get("status"))}">{_e(m.get("status"))}</span>'
            + (f" — {_e(m.get('error'))}" if m.get("error") else ""),
        ),
        ("command", _e(" ".join(["repotune", *(run.get("argv") or [])]))),
        ("started / finished", f"{_e(run.get('started_at'))} / {_e(run.get('finished_at'))}"),
        ("total time", _e(_fmt(m.get("total_execution_time_seconds"), " s"))),
        (
            "repository",
            f"{_e(repository.get('path'))} @ {_e((repository.get('head') or '')[:12])} ({_e(repository.get('branch'))})",
        ),
        ("model", _e(f"{model.get('name')} — {model.get('note') or 'pretrained'}")),
        (
            "device",
            _e(
                f"{params.get('device')} · {params.get('precision')} · micro-batch {params.get('batch_size')} × {params.get('gradient_accumulation_steps')} accumulation"
            ),
        ),
        (
            "steps",
            _e(
                f"{(report.get('training') or {}).get('global_step')} of {params.get('total_steps')} (warmup {params.get('warmup_steps')})"
            ),
        ),
        (
            "training loss",
            _e(
                f"{_fmt(training.get('first'))} → {_fmt(training.get('last'))} (min {_fmt(training.get('min'))} at step {training.get('min_step')})"
            ),
        ),
        ("held-out loss", _e(_before_after(evaluation))),
        ("throughput", _e(_throughput_line(throughput))),
    ]
    return f'<h1>{_e("repotune run")}</h1><p class="muted">{_e(run.get("id"))}</p>' + _table(
        ("", ""), rows, escape=False
    )


def _lineage(m: dict[str, Any]) -> str:
    """An update's parent, what it added, and what it kept of the parent's held-out commits (else nothing)."""
    lineage = m.get("lineage")
    if not lineage:
        return ""
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
    return "<h2>Lineage (an update)</h2>" + _table(("", ""), rows)


def _decisions(m: dict[str, Any]) -> str:
    """The plan, folded: every decision with its source and reason, in the order the CLI prints them."""
    params = m.get("training_parameters") or {}
    decisions = params.get("decisions") or {}
    if not decisions:
        return '<h2>Plan</h2><p class="muted">not planned</p>'
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
    return (
        f"<details><summary>Plan ({len(rows)} decisions, each with its reason)</summary>"
        + _table(("parameter", "value", "source", "reason"), rows, css="plan")
        + "</details>"
    )


def _training(m: dict[str, Any]) -> str:
    report = m.get("training_report") or {}
    losses = (report.get("training") or {}).get("loss_history") or []
    rates = (report.get("learning_rate") or {}).get("history") or []
    if not losses:
        return '<h2>Training</h2><p class="muted">no training steps recorded</p>'
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

    return "<h2>Training</h2>" + _figure(draw, "loss, gradient-norm and learning-rate curves")


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


def _scoreboard(m: dict[str, Any]) -> str:
    """The held-out commits' scores: each system's commit messages beside the lookup's (paired
    differences with 95% intervals), the next-line code task before and after, and held-out loss."""
    evaluation = (m.get("training_report") or {}).get("evaluation") or {}
    if not evaluation.get("before") and not evaluation.get("after"):
        return f'<h2>What it learned</h2><p class="muted">{_e(evaluation.get("note") or "not measured")}</p>'
    parts = ["<h2>What it learned (held-out commits: the newest, never trained on or retrieved from)</h2>"]
    parts += _message_scores(evaluation) + _code_scores(evaluation) + _code_scores(evaluation, blocks=True)
    parts += _held_out_loss(evaluation)
    return "\n".join(parts)


def _message_scores(evaluation: dict[str, Any]) -> list[str]:
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
                _e(label),
                _e(with_interval(scored, "chrf")),
                _e(with_interval(scored, "edit_similarity")),
                _signed(versus, "chrf"),
                _signed(versus, "edit_similarity"),
                _e(_fmt(scored.get("subject_exact_match_pct"))),
                _e(f"{_fmt(scored.get('output_chars_mean'))} ({_fmt(scored.get('reference_chars_mean'))})"),
            )
        )
    if not rows:
        return []
    header = ("system", "chrF [95%]", "edit similarity [95%]", "chrF vs lookup", "ES vs lookup",
              "subject exact %", "chars (git's)")  # fmt: skip
    parts = [
        f"<h3>Commit message from its diff ({count} commits)</h3>",
        _table(header, rows, escape=False, css="scores"),
    ]
    if system:
        parts.append(f'<p class="muted">suggestion system: {_e(system.get("reason"))}</p>')

    return parts + [f'<p class="muted">{_e(said)}</p>' for said in registers(tasks)]


def _code_scores(evaluation: dict[str, Any], blocks: bool = False) -> list[str]:
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
                    _e(label + (" (chosen)" if chosen.get("name") == name else "")),
                    _e(with_interval(scored, "exact_match_pct")),
                    _e(with_interval(scored, "edit_similarity")),
                    _signed(versus, "exact_match_pct"),
                    _signed(versus, "edit_similarity"),
                )
            )
    if not rows:
        return []
    header = ("system", "exact match % [95%]", "edit similarity [95%]", "exact vs base", "ES vs base")
    said = [f'<p class="muted">{_e(chosen["reason"])}</p>'] if chosen else []
    title = (
        "A block: the body under a line that opens one (the file through that line given; resampled by commit)"
        if blocks
        else "Next line at a cursor (the file before it given; resampled by commit)"
    )
    return [f"<h3>{title}</h3>", _table(header, rows, escape=False, css="scores"), *said]


def _held_out_loss(evaluation: dict[str, Any]) -> list[str]:
    """Held-out loss and perplexity before and after, per format, and what the evaluation cost."""
    before, after = evaluation.get("before") or {}, evaluation.get("after") or {}
    rows = [("held-out loss", _fmt(before.get("loss")), _fmt(after.get("loss")))]
    rows.append(("± standard error", _fmt(before.get("loss_stderr")), _fmt(after.get("loss_stderr"))))
    rows.append(("perplexity", _fmt(before.get("perplexity")), _fmt(after.get("perplexity"))))
    for name, scored in (before.get("per_format") or {}).items():
        later = (after.get("per_format") or {}).get(name) or {}
        rows.append((f"  {name} perplexity", _fmt(scored.get("perplexity")), _fmt(later.get("perplexity"))))
    parts = ["<h3>Held-out loss</h3>" + _table(("", "before training", "after training"), rows)]
    held = evaluation.get("held_out_commits") or {}
    if held.get("note"):
        parts.append(f'<p class="muted">{_e(held["note"])}</p>')
    cost = evaluation.get("cost") or {}
    if cost:
        parts.append(
            f'<p class="muted">evaluation cost: base model {_fmt(cost.get("before_s"), " s")}'
            + (" (cached)" if cost.get("before_cached") else "")
            + f", fine-tuned {_fmt(cost.get('after_s'), ' s')}, retrieval {_fmt(cost.get('retrieval_s'), ' s')}"
            + (
                f"; {cost['share_of_run_pct']}% of the run"
                if cost.get("share_of_run_pct") is not None
                else ""
            )
            + "</p>"
        )
    return parts


def _signed(versus: dict[str, Any], key: str) -> str:
    """A paired difference with its interval, green when the interval is above 0, red below."""
    if key not in versus:
        return ""
    low, high = versus[f"{key}_ci95"]
    css = "better" if low > 0 else "worse" if high < 0 else ""
    return f'<span class="{css}">{difference(versus, key)}</span>'


def _samples(m: dict[str, Any]) -> str:
    """Held-out commits side by side: what git has, the lookup, the suggestion, the fine-tuned model."""
    evaluation = (m.get("training_report") or {}).get("evaluation") or {}
    samples = evaluation.get("samples") or {}
    columns = [("what git has", None), ("lookup", "nearest_commit"), ("suggested", "suggested"),
               ("fine-tuned model", "after"), ("base model", "before")]  # fmt: skip
    by_commit = {
        name: {(s["task"], s["commit"]): s for s in samples.get(name) or []} for _, name in columns if name
    }
    asked = [s for s in samples.get("after") or samples.get("before") or []]
    if not asked:
        return ""
    parts = [
        '<h2>Samples</h2><p class="muted">the first held-out commits; evaluation.jsonl beside the manifest has every one</p>'
    ]
    for sample in asked:
        key = (sample["task"], sample["commit"])
        what = (
            "its commit message, from its diff"
            if sample["task"] == "message"
            else "the next line of its change"
        )
        shown = [
            (label, found)
            for label, name in columns
            if name and (found := by_commit[name].get(key)) is not None
        ]
        header = "".join(
            f"<th>{_e(label)}</th>" for label in ["what git has", *[label for label, _ in shown]]
        )
        cells = f"<td><pre>{_e(sample['reference'])}</pre></td>" + "".join(
            _output_cell(found) for _, found in shown
        )
        parts.append(
            f"<h3>{_e(sample['commit'][:12])}: {_e(what)}</h3><pre>{_e(sample['prompt'][-300:] if sample['task'] == 'code' else sample['prompt'][:300])}</pre>"
            f'<table class="samples"><tr>{header}</tr><tr>{cells}</tr></table>'
        )
    return "\n".join(parts)


def _output_cell(sample: dict[str, Any]) -> str:
    return f"<td>{_output(sample)}</td>"


def _output(sample: dict[str, Any]) -> str:
    """A generation; a blank one says so instead of rendering as empty space."""
    if not sample["output"].strip():
        return f'<p class="muted">(blank: {len(sample["output"])} whitespace characters)</p>'
    return f"<pre>{_e(sample['output'])}</pre>"


def _throughput_line(throughput: dict[str, Any]) -> str:
    if throughput.get("tokens_per_s") is None:
        return "not measured: training did not finish"
    line = f"{_fmt(throughput['tokens_per_s'])} tokens/s"
    if throughput.get("bottleneck"):
        line += f" — {throughput['bottleneck']}: {throughput.get('suggestion')}"
    return line


def _throughput(m: dict[str, Any]) -> str:
    throughput = (m.get("training_report") or {}).get("throughput") or {}
    if throughput.get("tokens_per_s") is None:
        return f'<h2>Throughput</h2><p class="muted">{_e(_throughput_line(throughput))}</p>'
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
    return "<h2>Throughput</h2>" + _table(("", ""), rows)


def _stages(m: dict[str, Any]) -> str:
    timings = m.get("timings") or {}
    if not timings:
        return '<h2>Stages</h2><p class="muted">no stage timed</p>'
    total = m.get("total_execution_time_seconds") or sum(timings.values())
    rows = [
        (name.removesuffix("_s"), _fmt(seconds, " s"), f"{seconds / total:.0%}" if total else "—")
        for name, seconds in sorted(timings.items(), key=lambda item: -item[1])
    ]
    return f"<h2>Stages</h2><p>{_e(_fmt(total, ' s'))} in all</p>" + _table(("stage", "time", "share"), rows)


def _config(m: dict[str, Any]) -> str:
    config = m.get("config") or {}
    overrides = config.get("overrides") or {}
    source = _e(config.get("source") or "the shipped training_config.yaml")
    if not overrides:
        return f"<h2>Config</h2><p>{source}, nothing overridden</p>"
    rows = sorted((key, _fmt(value)) for key, value in overrides.items())
    return f"<h2>Config</h2><p>{source}, with these overrides (--set and flags)</p>" + _table(
        ("key", "value"), rows
    )


def _hardware(m: dict[str, Any]) -> str:
    hardware = (m.get("training_report") or {}).get("hardware") or {}
    samples = hardware.get("samples") or []
    if not samples:
        return '<h2>Hardware</h2><p class="muted">no samples</p>'
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
    note = f'<p class="muted">{_e(hardware.get("gpu_note"))}</p>' if hardware.get("gpu_note") else ""
    return f"<h2>Hardware (a sample every {_e(_fmt(interval))} s)</h2>{note}" + _figure(
        draw, "hardware utilisation over time"
    )


def _epochs(m: dict[str, Any]) -> str:
    epochs = ((m.get("training_report") or {}).get("training") or {}).get("epoch_summaries") or []
    if not epochs:
        return '<h2>Epochs</h2><p class="muted">no epoch summaries</p>'
    columns = ("epoch", "end_step", "loss_mean", "loss_min", "loss_max", "duration_s", "tokens_per_s")
    return "<h2>Epochs</h2>" + _table(columns, [tuple(_fmt(e.get(c)) for c in columns) for e in epochs])


def _scrape(m: dict[str, Any]) -> str:
    scrape = m.get("scrape") or {}
    if scrape.get("commits_seen") is None:
        return '<h2>Data</h2><p class="muted">not scraped</p>'
    counts = [
        (name, _fmt(scrape.get(name)))
        for name in ("commits_seen", "commits_kept", "files_seen", "files_kept", "sequences", "duration_s")
    ]
    skipped = scrape.get("skipped") or {}
    parts = ["<h2>Data</h2>", _table(("", ""), counts)]
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
        else "<p>no secret found to redact</p>"
    )
    cache = (m.get("dataset") or {}).get("cache") or {}
    if cache:
        state = "hit: reused" if cache.get("hit") else "miss: tokenized"
        parts.append(
            f"<p>token cache {_e(cache.get('key'))} ({_e(state)} in {_e(_fmt(cache.get('seconds'), ' s'))})</p>"
        )
    return "\n".join(parts)


def _figure(draw, alt: str) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure = draw(plt)
    figure.tight_layout()
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=100)
    plt.close(figure)
    data = base64.b64encode(buffer.getvalue()).decode()
    return f'<img alt="{_e(alt)}" src="data:image/png;base64,{data}">'


def _table(header, rows, escape: bool = True, css: str | None = None) -> str:
    cell = _e if escape else str
    headings = "".join(f"<th>{_e(h)}</th>" for h in header)
    head = f"<tr>{headings}</tr>" if any(header) else ""  # none: a list of facts
    body = "".join("<tr>" + "".join(f"<td>{cell(value)}</td>" for value in row) + "</tr>" for row in rows)
    attribute = f' class="{css}"' if css else ""
    return f"<table{attribute}>{head}{body}</table>"


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


def _e(value: Any) -> str:
    return html.escape("" if value is None else str(value))


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
            "<h1>repotune: runs compared</h1>",
            _runs_table(names, manifests),
            _messages_compared(names, manifests),
            _overlaid_curves(names, manifests),
            _differences(names, manifests),
        ],
    )


def _runs_table(names: list[str], manifests: list[dict[str, Any]]) -> str:
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
    return "<h2>Runs</h2>" + _table(header, rows)


def _messages_compared(names: list[str], manifests: list[dict[str, Any]]) -> str:
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
                _e(name),
                _e((evaluation.get("system") or {}).get("name")),
                _e(scored["suggested"].get("samples")),
                _e(both["suggested"]),
                _signed(versus, "chrf"),
                _signed(versus, "edit_similarity"),
                _e(both["after"]),
                _e(both["nearest_commit"]),
            )
        )
    if not rows:
        return ""
    header = ("run", "suggested by", "commits", "suggested chrF / ES", "chrF vs lookup [95%]",
              "ES vs lookup [95%]", "fine-tuned chrF / ES", "lookup chrF / ES")  # fmt: skip
    return (
        "<h2>Commit messages</h2>"
        + _table(header, rows, escape=False, css="scores")
        + '<p class="muted">each run on its own held-out commits: runs on the same repository and head compare'
        " directly, and a difference between them within the intervals is noise</p>"
    )


ABSENT = "(absent)"


def _newer(change) -> str:
    return ABSENT if change.kind == "removed" else _fmt(change.new)


def _overlaid_curves(names: list[str], manifests: list[dict[str, Any]]) -> str:
    histories = [
        ((m.get("training_report") or {}).get("training") or {}).get("loss_history") or [] for m in manifests
    ]
    if not any(histories):
        return '<h2>Curves</h2><p class="muted">no run recorded a training step</p>'

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

    return "<h2>Curves</h2>" + _figure(draw, "training and held-out loss of every run, overlaid")


def _differences(names: list[str], manifests: list[dict[str, Any]]) -> str:
    """Every path whose value differs between the runs, a column per run; params and metrics as `diff`
    shows them by default, the rest below."""

    first, *others = manifests
    pairs = [{change.path: change for change in compare(first, other)} for other in others]
    differing = {path for pair in pairs for path, change in pair.items() if change.kind != "unchanged"}
    if not differing:
        return "<h2>What differs</h2><p>nothing: the runs agree on every compared value</p>"
    parts = ["<h2>What differs</h2>"]
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
        parts += [f"<h3>{title}</h3>", _table(("path", *names), rows)]
    return "\n".join(parts)

"""One self-contained HTML page for a run: summary, decisions, curves, evaluation, hardware, scrape.

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

STYLE = """
body { font-family: system-ui, sans-serif; margin: 2rem auto; max-width: 1100px; color: #1d2330; }
h1 { margin-bottom: 0.2rem; } h2 { border-bottom: 1px solid #d0d5de; padding-bottom: 0.2rem; margin-top: 2rem; }
table { border-collapse: collapse; margin: 0.5rem 0; font-size: 0.9rem; }
th, td { border: 1px solid #d0d5de; padding: 0.25rem 0.5rem; text-align: left; vertical-align: top; }
th { background: #f2f4f8; } .muted { color: #6b7385; } img { max-width: 100%; }
pre { background: #f6f8fa; padding: 0.5rem; font-size: 0.8rem; white-space: pre-wrap; overflow-wrap: anywhere; margin: 0; }
table.samples { table-layout: fixed; width: 100%; } table.samples td, table.samples th { width: 33%; }
.status-completed { color: #1a7f37; } .status-failed, .status-interrupted { color: #cf222e; }
"""


def render_report(manifest: dict[str, Any]) -> str:
    sections = [
        _summary(manifest),
        _decisions(manifest),
        _training(manifest),
        _evaluation(manifest),
        _hardware(manifest),
        _epochs(manifest),
        _scrape(manifest),
    ]
    run = manifest.get("run") or {}
    title = f"repotune run {run.get('id', '')}"
    return (
        f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{_e(title)}</title>'
        f"<style>{STYLE}</style></head><body>\n" + "\n".join(sections) + "\n</body></html>\n"
    )


def write_report(manifest_path: Path, output: Path) -> Path:
    from pipeline.manifest import load_manifest, write_text_output

    return write_text_output(output, render_report(load_manifest(manifest_path)))


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
        ("command", _e(" ".join(["run_pipeline.py", *(run.get("argv") or [])]))),
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
        (
            "throughput",
            _e(
                f"{_fmt(throughput.get('tokens_per_s'))} tokens/s — {throughput.get('bottleneck')}: {throughput.get('suggestion')}"
            ),
        ),
    ]
    return f'<h1>{_e("repotune run")}</h1><p class="muted">{_e(run.get("id"))}</p>' + _table(
        ("", ""), rows, escape=False
    )


def _decisions(m: dict[str, Any]) -> str:
    decisions = (m.get("training_parameters") or {}).get("decisions") or {}
    if not decisions:
        return '<h2>Plan</h2><p class="muted">not planned</p>'
    rows = [(name, _fmt(d.get("value")), d.get("source"), d.get("reason")) for name, d in decisions.items()]
    return "<h2>Plan</h2>" + _table(("parameter", "value", "source", "reason"), rows)


def _training(m: dict[str, Any]) -> str:
    report = m.get("training_report") or {}
    losses = (report.get("training") or {}).get("loss_history") or []
    rates = (report.get("learning_rate") or {}).get("history") or []
    evaluations = (report.get("evaluation") or {}).get("history") or []
    if not losses:
        return '<h2>Training</h2><p class="muted">no training steps recorded</p>'

    def draw(plt):
        figure, (left, right) = plt.subplots(1, 2, figsize=(11, 3.6))
        left.plot([e["step"] for e in losses], [e["loss"] for e in losses], label="training loss")
        if evaluations:
            left.plot(
                [e["step"] for e in evaluations],
                [e["loss"] for e in evaluations],
                "o-",
                label="held-out loss",
            )
        left.set_xlabel("optimizer step")
        left.set_ylabel("loss")
        left.legend()
        right.plot([e["step"] for e in rates], [e["learning_rate"] for e in rates], color="tab:orange")
        right.set_xlabel("optimizer step")
        right.set_ylabel("learning rate")
        return figure

    return "<h2>Training</h2>" + _figure(draw, "loss and learning-rate curves")


TASK_METRICS = {
    "message": (
        "commit message from diff",
        ["chrf", "edit_similarity", "subject_exact_match_pct", "first_word_match_pct", "output_chars_mean",
         "reference_chars_mean", "whitespace_only"],
    ),
    "diff": ("change from message", ["chrf", "edit_similarity", "output_chars_mean", "whitespace_only"]),
}  # fmt: skip


def _evaluation(m: dict[str, Any]) -> str:
    evaluation = (m.get("training_report") or {}).get("evaluation") or {}
    if not evaluation.get("before") and not evaluation.get("after"):
        return f'<h2>Evaluation</h2><p class="muted">{_e(evaluation.get("note") or "not measured")}</p>'
    before, after = evaluation.get("before") or {}, evaluation.get("after") or {}
    rows = [("held-out loss", _fmt(before.get("loss")), _fmt(after.get("loss")))]
    rows.append(("± standard error", _fmt(before.get("loss_stderr")), _fmt(after.get("loss_stderr"))))
    rows.append(("perplexity", _fmt(before.get("perplexity")), _fmt(after.get("perplexity"))))
    for name, scored in (before.get("per_format") or {}).items():
        later = (after.get("per_format") or {}).get(name) or {}
        rows.append((f"  {name} perplexity", _fmt(scored.get("perplexity")), _fmt(later.get("perplexity"))))
    tasks = evaluation.get("tasks") or {}
    was, now = tasks.get("before") or {}, tasks.get("after") or {}
    for task, (label, metrics) in TASK_METRICS.items():
        if not (was.get(task) or now.get(task)):
            continue
        for metric in metrics:
            rows.append(
                (
                    f"{label}: {metric}",
                    _fmt((was.get(task) or {}).get(metric)),
                    _fmt((now.get(task) or {}).get(metric)),
                )
            )
    parts = [
        "<h2>Evaluation (held-out commits, never trained on)</h2>",
        _table(("", "before training", "after training"), rows),
        f"<p>relative change of the held-out loss: {_e(_fmt(evaluation.get('relative_change')))}; "
        f"{_e(_fmt(after.get('tokens') or before.get('tokens')))} tokens scored</p>",
    ]
    samples = evaluation.get("samples") or {}
    for was_sample, now_sample in zip(samples.get("before") or [], samples.get("after") or [], strict=False):
        asked = "its commit message, from its diff" if was_sample.get("task") == "message" else "its change"
        parts.append(
            f"<h3>{_e(was_sample['commit'][:12])}: {_e(asked)}</h3><pre>{_e(was_sample['prompt'][:300])}</pre>"
            f'<table class="samples"><tr><th>before training</th><th>after training</th><th>what git has</th></tr><tr>'
            f"<td>{_output(was_sample)}</td><td>{_output(now_sample)}</td>"
            f"<td><pre>{_e(was_sample['reference'])}</pre></td></tr></table>"
        )
    return "\n".join(parts)


def _output(sample: dict[str, Any]) -> str:
    """A generation; a blank one says so instead of rendering as empty space."""
    if not sample["output"].strip():
        return f'<p class="muted">(blank: {len(sample["output"])} whitespace characters)</p>'
    return f"<pre>{_e(sample['output'])}</pre>"


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
        return '<h2>Scrape</h2><p class="muted">not scraped</p>'
    counts = [
        (name, _fmt(scrape.get(name)))
        for name in ("commits_seen", "commits_kept", "files_seen", "files_kept", "sequences", "duration_s")
    ]
    skipped = scrape.get("skipped") or {}
    parts = ["<h2>Scrape</h2>", _table(("", ""), counts)]
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
    redactions = scrape.get("redactions") or {}
    if redactions:
        parts.append(_table(("secrets redacted (rule)", "count"), sorted(redactions.items())))
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


def _table(header, rows, escape: bool = True) -> str:
    cell = _e if escape else str
    head = "".join(f"<th>{_e(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{cell(value)}</td>" for value in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _before_after(evaluation: dict[str, Any]) -> str:
    before, after = evaluation.get("before"), evaluation.get("after")
    if not before or not after:
        return evaluation.get("note") or "not measured"
    return (
        f"{_fmt(before['loss'])} → {_fmt(after['loss'])} ({_fmt(evaluation.get('relative_change'))} relative)"
    )


def _fmt(value: Any, unit: str = "") -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:.4g}{unit}"
    if isinstance(value, list):
        return ", ".join(map(str, value)) or "—"
    return f"{value}{unit}"


def _e(value: Any) -> str:
    return html.escape("" if value is None else str(value))

"""`monitor`: watch this machine (and one process) with the pipeline's own sampler, standalone.

The report is a manifest (command `monitor`, status `monitored`) whose
`training_report.hardware` holds the samples, summary and assessment, laid
out exactly like a training run's, so the same jq queries, `diff` and
`report` work on it.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

import psutil

from pipeline.errors import PipelineError
from pipeline.hardware import detect_hardware
from pipeline.manifest import conform, mark_finished, new_manifest, write_json
from pipeline.progress import say
from pipeline.train.monitor import GPU_METRICS, HardwareMonitor, import_nvml

SAMPLES_AT_LEAST = 10  # a short --duration gets its interval fitted to this many samples


def fitted_interval(configured: float, duration_s: float | None) -> float:
    """The configured interval, shortened so a short watch still takes SAMPLES_AT_LEAST samples."""
    return min(configured, duration_s / SAMPLES_AT_LEAST) if duration_s else configured


def watch(
    duration_s: float | None, interval_s: float, pid: int | None, output: Path, argv: list[str]
) -> dict[str, Any]:
    """Sample until `duration_s` passes, the followed process exits, or Ctrl-C; write the report."""
    try:
        process = psutil.Process(pid) if pid else None
    except psutil.NoSuchProcess:
        raise PipelineError(f"--pid {pid}: no such process") from None
    if not output.parent.is_dir() or not os.access(output.parent, os.W_OK):  # before sampling, not after
        raise PipelineError(f"--output {output}: cannot write there (no such directory, or not writable)")
    document = new_manifest("monitor", argv)
    document["hardware"] = detect_hardware().to_manifest()
    live = sys.stderr.isatty()
    monitor = HardwareMonitor(
        interval_s, import_nvml(), process=process, on_sample=_print_sample if live else None
    )
    deadline = time.monotonic() + duration_s if duration_s else None
    until = f"for {duration_s:g} s" if duration_s else "until Ctrl-C"
    say(f"watching every {interval_s:g} s {until}{f' (or until pid {pid} exits)' if pid else ''}")
    with monitor:
        try:
            while (deadline is None or time.monotonic() < deadline) and (
                process is None or monitor.process_alive()
            ):
                time.sleep(min(0.05, interval_s))
        except KeyboardInterrupt:
            pass  # Ctrl-C is the usual way to end an open-ended watch: the report is still written
    document["training_report"] = {"hardware": monitor.report()}
    mark_finished(document, "monitored")
    write_json(output, conform(document))
    return document


def _print_sample(sample: dict[str, Any]) -> None:
    parts = [
        f"{sample['t_s']:8.1f} s",
        f"cpu {sample['cpu_pct']:5.1f}%",
        f"ram {sample['ram_used_gb']:.1f}/{sample['ram_total_gb']:.1f} GB",
    ]
    if sample["process_cpu_pct"] is not None:
        parts.append(f"process {sample['process_cpu_pct']:.0f}% {sample['process_rss_gb']:.2f} GB")
    for gpu in sample["gpus"]:
        parts.append(
            f"gpu{gpu['index']} {_value(gpu['utilization_pct'], '%')} {_value(gpu['memory_used_gb'], '')}/"
            f"{_value(gpu['memory_total_gb'], ' GB')} {_value(gpu['temperature_c'], ' °C')} {_value(gpu['power_w'], ' W')}"
        )
    print("  ".join(parts), file=sys.stderr, flush=True)


def _value(value, unit: str) -> str:
    return "—" if value is None else f"{value:.0f}{unit}"


def format_summary(document: dict[str, Any]) -> str:
    """The summary table (mean / p95 / min / max per metric) and the assessment, for the terminal."""
    hardware = document["training_report"]["hardware"]
    summary = hardware["summary"]
    rows: list[tuple[str, ...]] = [("metric", "mean", "p95", "min", "max")]
    for metric in ("cpu_pct", "ram_used_gb", "process_cpu_pct", "process_rss_gb"):
        rows.append((metric, *(_cell(summary[metric][stat]) for stat in ("mean", "p95", "min", "max"))))
    for gpu in summary["gpus"]:
        for metric in GPU_METRICS:
            rows.append(
                (
                    f"gpu{gpu['index']}.{metric}",
                    *(_cell(gpu[metric][stat]) for stat in ("mean", "p95", "min", "max")),
                )
            )
    widths = [max(len(row[i]) for row in rows) for i in range(5)]
    table = [
        "  ".join(cell.ljust(widths[i]) if i == 0 else cell.rjust(widths[i]) for i, cell in enumerate(row))
        for row in rows
    ]
    samples = f"{hardware['sample_count']} samples every {hardware['collection_interval_seconds']:g} s"
    return "\n".join([samples, *table, "", *(f"- {finding}" for finding in hardware["assessment"])])


def _cell(value) -> str:
    return "—" if value is None else f"{value:g}"

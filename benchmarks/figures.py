#!/usr/bin/env python3
"""The README's and docs' measured figures, generated from the benchmarks' own results files: each block of a page
between `<!-- figure: NAME -->` and `<!-- /figure -->` is what FIGURES[NAME] makes of
benchmarks/results/, so a benchmark run again updates the page, and the suite fails where a page and its
results disagree.

    python benchmarks/figures.py           # write every block from the results
    python benchmarks/figures.py --check   # exit 1 naming each block that differs (tests run it)
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # it imports pipeline, installed or not (as the other benchmarks)

from benchmarks.measured import RESULTS  # noqa: E402  (after the path it is found on)
from pipeline.evaluate import report  # noqa: E402  (after the path it is found on)
from pipeline.scores import CODE_LABELS, difference, differences, with_interval  # noqa: E402  (after the path it is found on)

DOCS = ROOT / "docs"
BLOCK = re.compile(r"(<!-- figure: (\S+) -->\n)(.*?)(<!-- /figure -->)", re.S)


def results(name: str) -> dict[str, Any]:
    import orjson

    path = RESULTS / f"{name}.json"
    try:
        return orjson.loads(path.read_bytes())
    except FileNotFoundError:
        raise SystemExit(f"{path}: no such results file (run the benchmark that writes it)") from None


def _budget(name: str, budget: str = "10m") -> dict[str, Any]:
    return results(name)["budgets"][budget]


def _pair(scored: dict[str, Any], *keys: str) -> str:
    return " / ".join(f"{scored[key]:.1f}" for key in keys)


def _speed(run: dict[str, Any]) -> str:
    """How fast a run trained: runs compared in one table may have been measured on other machines."""
    return f"{run['tokens_per_s']:.0f}" + (f" ({run['precision']})" if run.get("precision") else "")


def _provenance(*runs: dict[str, Any]) -> str:
    commits = sorted(
        {
            run["repotune"][:7] + (" with changes not committed" if run.get("uncommitted") else "")
            for run in runs
        }
    )  # results written before the changes were recorded say nothing of them
    machine = {", ".join(run["gpus"]) or f"{run['cores']} CPU cores" for run in runs}
    return f"repotune {', '.join(commits)} on {', '.join(sorted(machine))}"


MESSAGE_SYSTEMS = {
    "before": "base",
    "after": "fine-tuned",
    "nearest_commit": "lookup",
    "selector": "selector",
    "suggested": "suggested",
}


def code_scoreboard(name: str) -> str:
    """The next-line scoreboard of one repository's default 10-minute run (learning-NAME-default)."""
    run = _budget(f"learning-{name}-default")
    tasks = run["tasks"]
    rows = [
        "| system | exact match % | edit similarity | − the base model, same prompt (EM / ES) |",
        "|---|---|---|---|",
    ]
    for system, task, label in CODE_LABELS.values():
        scored = tasks[system][task]
        versus = _versus(tasks, system, task)
        rows.append(
            f"| {label} | {with_interval(scored, 'exact_match_pct')} | "
            f"{with_interval(scored, 'edit_similarity')} | {versus} |"
        )
    lines = tasks["after"]["code"]
    return "\n".join(rows) + (
        f"\n\n{lines['samples']} next lines from {lines['commits']} held-out commits; {run['steps']} steps "
        f"in {run['train_s']:.0f} s ({run['tokens_per_s']:.0f} tokens/s), the run {run['run_s'] / 60:.1f} "
        f"minutes; {_provenance(run)}.{_recall(run)}\n"
    )


def _recall(run: dict[str, Any]) -> str:
    """How many of the lines had been written before the split point, how many of those the run trained
    on, and how many exact matches were such lines (results written before bench_learning counted them
    say nothing of it)."""
    recall = run.get("written_before")
    if not recall:
        return ""
    base, tuned = recall["matched"]["base"], recall["matched"]["fine_tuned"]
    read = "trained" in recall
    return (
        f" {recall['written_before']} of the {recall['lines']} lines had been written before the split point, "
        "in its files or the training history"
        + (f", {recall['trained']} of them in what the run trained on" if read else "")
        + f"; exact matches with context: base + context {base[0]} ({base[1]} of them such lines"
        + (f", {base[2]} trained on" if read else "")
        + f"), fine-tuned + context {tuned[0]} ({tuned[1]}"
        + (f", {tuned[2]}" if read else "")
        + ")."
    )


def _versus(tasks: dict[str, Any], system: str, task: str) -> str:
    """A fine-tuned model against the base model given the same prompt (the manifest's `vs_before`): with
    context, that is base + context."""
    versus = tasks[system][task].get("vs_before") if system == "after" else None
    return differences(versus, "exact_match_pct") if versus else ""


def message_scoreboard(name: str) -> str:
    """The commit-message scoreboard of one repository's default 10-minute run."""
    run = _budget(f"learning-{name}-default")
    tasks = run["tasks"]
    rows = ["| system | chrF | edit similarity | − lookup (chrF / ES) |", "|---|---|---|---|"]
    for system, label in MESSAGE_SYSTEMS.items():
        scored = (tasks.get(system) or {}).get("message")
        if not scored:
            continue
        versus = scored.get("vs_nearest_commit")
        shown = differences(versus, "chrf") if versus else ""
        chosen = f" (chose {run['system']})" if system == "suggested" else ""
        rows.append(
            f"| {label}{chosen} | {with_interval(scored, 'chrf')} | "
            f"{with_interval(scored, 'edit_similarity')} | {shown} |"
        )
    return (
        "\n".join(rows)
        + f"\n\n{tasks['after']['message']['samples']} held-out commits; {_provenance(run)}.\n"
    )


ABLATION = {
    "default": "history and files (`train.files_share` 0.5, the default)",
    "files": "files alone (1)",
    "history": "history alone (0)",
}


def ablation(name: str) -> str:
    """What each part of training adds on one repository: the default 10-minute run trained on history and
    files, on files alone and on history alone (learning-NAME-LABEL), the same held-out lines."""
    runs = {label: _budget(f"learning-{name}-{label}") for label in ABLATION}
    rows = [
        "| trained on | sequences / files | steps | tokens a second | held-out loss | fine-tuned − base (EM / ES) | "
        "fine-tuned + context − base + context | messages, fine-tuned chrF / ES |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for label, text in ABLATION.items():
        run, tasks = runs[label], runs[label]["tasks"]
        before, after = run["loss"]
        alone, context = tasks["after"]["code"]["vs_before"], tasks["after"]["code_context"]["vs_before"]
        rows.append(
            f"| {text} | {run['train_sequences']} / {run['train_files'] or 0} | {run['steps']} | {_speed(run)} | "
            f"{before:.3f} → {after:.3f} | {_signed(alone)} | {_signed(context)} | "
            f"{_pair(tasks['after']['message'], 'chrf', 'edit_similarity')} |"
        )
    tasks = runs["default"]["tasks"]
    return "\n".join(rows) + (
        f"\n\nOn the same {tasks['after']['code']['samples']} held-out lines, in the default run: base "
        f"{_pair(tasks['before']['code'], 'exact_match_pct', 'edit_similarity')}, base + context "
        f"{_pair(tasks['before']['code_context'], 'exact_match_pct', 'edit_similarity')}, lookup for code "
        f"{_pair(tasks['nearest_commit']['code'], 'exact_match_pct', 'edit_similarity')} (exact match % / "
        f"edit similarity); each row's differences are against the base model of its own run (versions "
        f"can ask it otherwise); {_provenance(*runs.values())}.\n"
    )


def budgets(name: str) -> str:
    """What a longer budget buys on one repository: the default command with each time budget
    (learning-NAME-default), the same held-out lines and commits."""
    found = results(f"learning-{name}-default")["budgets"]
    order = sorted(found, key=lambda budget: float(budget.rstrip("m")))
    runs = [found[budget] for budget in order]
    rows = [
        "| | "
        + " | ".join(f"{budget[:-1]} minutes" if budget.endswith("m") else budget for budget in order)
        + " |",
        "|---|" + "---|" * len(order),
    ]

    def row(label: str, cell: Callable[[dict[str, Any]], str]) -> None:
        rows.append(f"| {label} | " + " | ".join(cell(run) for run in runs) + " |")

    row(
        "trained (steps; sequences / files)",
        lambda r: f"{r['steps']}; {r['train_sequences']} / {r['train_files'] or 0}",
    )
    row("tokens a second (precision)", _speed)
    row("held-out loss", lambda r: f"{r['loss'][0]:.3f} → {r['loss'][1]:.3f}")
    row(
        "fine-tuned + context, next line EM % / ES",
        lambda r: _pair(r["tasks"]["after"]["code_context"], "exact_match_pct", "edit_similarity"),
    )
    row(
        "base + context, in the same run",
        lambda r: _pair(r["tasks"]["before"]["code_context"], "exact_match_pct", "edit_similarity"),
    )
    row("− base + context", lambda r: _signed(r["tasks"]["after"]["code_context"]["vs_before"]))
    row("fine-tuned alone − base", lambda r: _signed(r["tasks"]["after"]["code"]["vs_before"]))
    row(
        "messages, fine-tuned chrF / ES",
        lambda r: _pair(r["tasks"]["after"]["message"], "chrf", "edit_similarity"),
    )
    row(
        "messages, suggested chrF / ES",
        lambda r: _pair(r["tasks"]["suggested"]["message"], "chrf", "edit_similarity"),
    )
    row("the run, minutes", lambda r: f"{r['run_s'] / 60:.1f}")
    base = runs[0]["tasks"]
    return "\n".join(rows) + (
        f"\n\nBase model {_pair(base['before']['code'], 'exact_match_pct', 'edit_similarity')} (in the "
        f"{order[0]} run), lookup for code {_pair(base['nearest_commit']['code'], 'exact_match_pct', 'edit_similarity')} "
        f"on the same {base['after']['code']['samples']} lines; each column's differences are against the base "
        f"model of its own run; {_provenance(*runs)}.\n"
    )


def _signed(versus: dict[str, Any]) -> str:
    return f"{versus['exact_match_pct']:+.1f} / {difference(versus, 'edit_similarity')}"


def printed(name: str) -> str:
    """What one repository's default 10-minute run prints of its scoreboard (the run's own lines, the
    systems a user meets: the fine-tuned model, the lookup and the suggestion; base + context beside the
    models that complete code), then its first held-out samples as the run prints them."""
    run = _budget(f"learning-{name}-default")
    evaluation = _evaluation(run)
    chosen = {"name": run["code_system"], "reason": run["code_system_reason"]}
    messages = ("commit message", "  fine-tuned", "  lookup", "  suggested")
    code = (
        "next line",
        "  base + context",
        "  fine-tuned + context",
        "  lookup for code",
        "  next lines come",
    )
    lines = [line for line in report.message_scoreboard(evaluation) if line.startswith(messages)]
    lines += [line for line in report.code_scoreboard(run["tasks"], chosen) if line.startswith(code)]
    lines += ["", *report.sample_lines(run["samples"])]
    return "\n".join(f"    {line}".rstrip() for line in lines) + f"\n\n({_provenance(run)}.)\n"


def _evaluation(run: dict[str, Any]) -> dict[str, Any]:
    """A results file's run as the scoreboard's printer reads a manifest's evaluation: its tasks and the
    message system it chose."""
    return {"tasks": run["tasks"], "system": {"name": run["system"], "reason": run["system_reason"]}}


PRINTED_WIDTH = 160  # a scoreboard line's characters a page shows whole


def printed_messages(name: str) -> str:
    """The whole commit-message scoreboard one repository's default 10-minute run prints, every system's
    line, a reason longer than a page's width cut where its figures begin."""
    run = _budget(f"learning-{name}-default")
    lines = report.message_scoreboard(_evaluation(run))
    cut = [
        line if len(line) <= PRINTED_WIDTH else line[: line.rindex(" (", 0, PRINTED_WIDTH)] + " (…)"
        for line in lines
    ]
    return "\n".join(f"    {line}" for line in cut) + f"\n\n({_provenance(run)}.)\n"


def serve(name: str) -> str:
    """How fast `serve` answered an editor (bench_serve's results for one run's adapter), in words."""
    run = results(f"serve-{name}")
    alone, together, kept, evicted = (
        run["one_client"],
        run["clients"],
        run["typing_kept"],
        run["typing_evicted"],
    )
    memory, goal, adapter = run["memory"], run["goal_s"], run["adapter"]
    indented, turns, window = run["indented"], run["typing_by_turns"], run["typing_in_window"]
    verdicts = [
        f"{'met' if timed['line_p50_s'] <= goal else 'not met'} {where} (p50 {timed['line_p50_s']:.2f} s)"
        for where, timed in (
            ("while typing in a file", kept),
            ("for a file the server has not read", alone),
        )
    ]
    return _prose(
        f"How fast, measured by `benchmarks/bench_serve.py --adapter OUTPUT_DIR` (the adapter of a "
        f"{adapter['budget']} run on {name}, {adapter['model']} in {run['adapter']['precision']}, the "
        f"next line of {run['files']} files of "
        f"the split point cut to at most {run['context_tokens']:,} tokens (a shorter file before its last "
        f"line), {run['tokens_mean']:.0f} on average, streamed to the line break; {_provenance(run)}): a "
        f"complete next line p50 {alone['line_p50_s']:.2f} s, p95 {alone['line_p95_s']:.2f} s warm, "
        f"{alone['blank']} of "
        f"{alone['requests']} lines blank (the baseline in the same run, `generate --task code` as a fresh "
        f"process: {run['baseline']['p50_s']:.1f} s); the same cursor after the next line's indentation (as "
        f"an editor indents a new line) p50 {indented['line_p50_s']:.2f} s, {indented['blank']} of "
        f"{indented['requests']} blank; "
        + "".join(
            f"the same cursor with at most {cut['context_tokens']:,} tokens before it "
            f"({cut['tokens_mean']:.0f} on average) p50 {cut['line_p50_s']:.2f} s, p95 "
            f"{cut['line_p95_s']:.2f} s; "
            for cut in run["shorter"]
        )
        + f"{together['clients']} clients at once, {together['failed']} of "
        f"{together['requests'] + together['failed']} requests failed, each waiting its turn (p50 "
        f"{together['line_p50_s']:.2f} s); an editor typing in a file, the cursor a line further each "
        f"request ({kept['files']} files one after another, {kept['requests']} requests), p50 "
        f"{kept['line_p50_s']:.2f} s with the last request's cache kept and "
        f"{evicted['line_p50_s']:.2f} s with it evicted "
        f"({evicted['line_p50_s'] / kept['line_p50_s']:.1f}×), and typing in two files by turns p50 "
        f"{turns['line_p50_s']:.2f} s (each request finds its file's cache among those kept), but p50 "
        f"{window['line_p50_s']:.2f} s typing with only the lines within {window['context_tokens']:,} tokens "
        f"before the cursor sent (as Continue cuts them from the top: each request begins where the last did "
        f"not); resident memory {memory['before_mb']:,.0f} → "
        f"{memory['after_mb']:,.0f} MB over {memory['requests']:,} requests. The goal, p50 ≤ {goal} s to a "
        f"complete next line: {'; '.join(verdicts)}."
    )


SERVED_BY = {
    "serve": "`serve` (transformers, {precision}, the prompt healed)",
    "raw": "llama-server, f16 GGUF, as an editor asks",
    "line_break_left": "llama-server, the last line break left for the model",
}


def serve_llama(name: str) -> str:
    """The same editor typing through `serve` and through llama.cpp's server serving the exported GGUF
    (bench_serve --llama-server), each line scored against the file's own next line."""
    run = results(f"serve-{name}")
    found = run["llama_server"]
    rows = [
        "| served by | complete line p50 / p95 s | blank | exact match % | edit similarity | − serve (EM / ES) |",
        "|---|---|---|---|---|---|",
    ]
    for key, label in SERVED_BY.items():
        timed, scores = found[key], found[key]["scores"]
        versus = found.get(f"{key}_minus_serve")
        gain = differences(versus, "exact_match_pct") if versus else ""
        rows.append(
            f"| {label.format(precision=run['adapter']['precision'])} | {timed['line_p50_s']:.2f} / "
            f"{timed['line_p95_s']:.2f} | {timed['blank']} of "
            f"{timed['requests']} | {with_interval(scores, 'exact_match_pct')} | "
            f"{with_interval(scores, 'edit_similarity')} | {gain} |"
        )
    return "\n".join(rows) + (
        f"\n\n{found['serve']['requests']} cursors: the next {found['serve']['requests'] // found['files']} "
        f"lines of each of {found['files']} files of {name}'s split point, typed in order (each server keeps "
        f"what the last request read); intervals resampled by file; the adapter of a "
        f"{run['adapter']['budget']} run; {_provenance(run)}.\n"
    )


def hook_through_serve(name: str) -> str:
    """The commit hook where the model writes: asking a running `serve` against loading the model per
    commit (bench_hook --model-writes)."""
    run = results(f"hook-{name}-model")
    hooked, through = run["timed"]["git commit, hook"], run["timed"]["git commit, hook asking serve"]
    return _prose(
        f"Measured on {name}'s {run['commits']} newest commits with the model writing "
        f"(`benchmarks/bench_hook.py --model-writes`; {_provenance(run)}): `git commit` with the hook p50 "
        f"{through['p50_s']:.2f} s / p95 {through['p95_s']:.2f} s asking a running `serve`, against "
        f"{hooked['p50_s']:.2f} s / {hooked['p95_s']:.2f} s loading the model per commit "
        f"({hooked['p50_s'] / through['p50_s']:.1f}×)."
    )


def hook_cold(name: str) -> str:
    """What the commit hook adds to `git commit`, cold, with the run's own suggestion system (bench_hook)."""
    run = results(f"hook-{name}")
    timed, cold = run["timed"], run["cold"]
    met = timed["git commit, hook"]["p50_s"] <= run["goal_s"]
    return _prose(
        f"On {name} ({_provenance(run)}; the run's suggestion system, the {run['system']}), {run['commits']} "
        f"commits replayed cold: `git commit` takes {timed['git commit, hook']['p50_s']:.2f} s p50 / "
        f"{timed['git commit, hook']['p95_s']:.2f} s p95 with the hook against "
        f"{timed['git commit, no hook']['p50_s']:.2f} s without it (the interpreter {cold['interpreter']:.2f} s, "
        f"imports {cold['imports']:.2f} s, loading the index and the selector "
        f"{cold['load index and selector']:.2f} s, answering {cold['answer']:.2f} s); the goal, at most "
        f"{run['goal_s']:g} s p50, is {'met' if met else 'not met'}."
    )


def scrape_speed(name: str) -> str:
    """The full scrape against raw `git log -p` on the same range (bench_scrape), in words."""
    run = results(f"scrape-{name}")
    git = sorted(run["seconds"]["raw git log -p"])
    ratios = run["ratios"]
    return _prose(
        f"On {name} ({run['commits']:,} commits; {_provenance(run)}), {run['rounds']} rounds: the full scrape (the "
        f"history, and the files at the split point, redacted and written) took "
        f"{statistics.median(ratios):.2f}× raw git's time (the median of the rounds' ratios, "
        f"{ratios[0]:.2f} to {ratios[-1]:.2f}; git alone {git[0]:.1f} to {git[-1]:.1f} s)."
    )


def tokenize_ahead(*names: str) -> str:
    """A first run's tokenizing, the whole history against what the budget trains (bench_tokenize)."""
    run = results("tokenize")

    def one(name: str) -> str:
        repo = run["repositories"][name]
        estimated, real = repo["estimated"], repo["real"]
        return (
            f"{name}'s {repo['sequences']:,} training sequences {repo['whole_s']:.1f} s whole, "
            f"{repo['ahead_s']:.1f} s ahead ({repo['whole_s'] / repo['ahead_s']:.1f}×; the newest "
            f"{repo['tokenized']:,}), its estimated tokens {estimated['tokens'] / real['tokens'] - 1:+.2%} of the "
            f"real count ({estimated['tokens']:,} against {real['tokens']:,}; p95 length {estimated['p95']:,} "
            f"against {real['p95']:,})"
        )

    return _prose(
        f"`benchmarks/bench_tokenize.py REPO` times both on one scrape (`--budget {run['budget']}`; "
        f"{_provenance(run)}): " + "; ".join(one(name) for name in names) + "."
    )


def busy_cpu(name: str) -> str:
    """Training beside a process that keeps one core busy, threads planned against every core (bench_busy_cpu)."""
    run = results(f"busy-cpu-{name}")
    runs = run["runs"]
    alone, planned = runs.pop("alone"), runs.pop("one core busy")
    (every,) = runs.values()  # "one core busy, N threads": every usable core a thread

    def steps(one: dict[str, Any]) -> str:
        return f"{one['steps']} of {one['planned_steps']} planned steps ran"

    return _prose(
        f"`python benchmarks/bench_busy_cpu.py REPO` measures it ({name}, {run['model']}, {run['commits']} "
        f"commits, a {run['budget_s']} s budget; {_provenance(run)}): alone {alone['tokens_per_s']:.0f} tokens/s; "
        f"with a process spinning on one core {planned['tokens_per_s']:.0f} tokens/s "
        f"({planned['tokens_per_s'] / alone['tokens_per_s']:.2f}×, {steps(planned)}), where computing on every "
        f"core as torch does by default gives {every['tokens_per_s']:.0f} "
        f"({every['tokens_per_s'] / alone['tokens_per_s']:.2f}×, {steps(every)})."
    )


def cpu_peer(name: str) -> str:
    """The training stage against the plain torch + peft loop, on the same model and sequences (bench_cpu)."""
    run = results(f"cpu-peer-{name}")
    return _prose(
        f"On {name} ({_provenance(run)}), smollm2-135m: the training stage {run['tokens_per_s']:.1f} tokens/s "
        f"({run['precision']}, micro-batch {run['batch_size']} × {run['sequence_length']}; "
        f"{run['processed_tokens']:,} tokens in {run['train_runtime_s']:.0f} s of a {run['budget_s']}-s "
        f"budget) against the plain loop's {run['peer_tokens_per_s']:.1f} over {run['seconds']:.0f} s (fp32, "
        f"batch 1 × 512): "
        f"**{run['tokens_per_s'] / run['peer_tokens_per_s']:.2f}×**."
    )


def redaction() -> str:
    """How often redaction fires on real histories, and what a long line costs it (bench_redaction)."""
    run = results("redaction")
    repos = run["repositories"]
    changed = sum(repo["changed_lines"] for repo in repos)
    redacted = sum(repo["redacted_lines"] for repo in repos)
    each = ", ".join(
        f"{repo['name'].split('/')[-1]} {repo['redacted_lines'] / max(repo['changed_lines'], 1) * 10_000:.2f}"
        for repo in repos
    )
    long = run["long_line"]
    slowest = long["slowest"]
    return _prose(
        f"On {', '.join(repo['name'] for repo in repos)} ({changed:,} changed lines; {_provenance(run)}): "
        f"{redacted / changed * 10_000:.2f} redacted lines per 10,000 ({each}). {run['judged_lines']} distinct "
        f"lines were redacted by a value's name or place (the others by a provider's form, certain by shape). "
        f"A {long['characters']:,}-character line made of one rule's hint again and again takes "
        f"{long['mean_s'] * 1000:.0f} ms on average and {slowest['seconds']:.2f} s at most (`{slowest['hint']}` "
        f"in {slowest['path']})."
    )


def _prose(text: str) -> str:
    """A paragraph wrapped as the pages are."""
    return textwrap.fill(text, 78, break_on_hyphens=False, break_long_words=False) + "\n"


FIGURES: dict[str, Callable[[], str]] = {
    "readme-flask": lambda: printed("flask"),
    "printed-messages-flask": lambda: printed_messages("flask"),
    "code-flask": lambda: code_scoreboard("flask"),
    "messages-flask": lambda: message_scoreboard("flask"),
    "code-requests": lambda: code_scoreboard("requests"),
    "messages-requests": lambda: message_scoreboard("requests"),
    "code-express": lambda: code_scoreboard("express"),
    "messages-express": lambda: message_scoreboard("express"),
    "code-cobra": lambda: code_scoreboard("cobra"),
    "messages-cobra": lambda: message_scoreboard("cobra"),
    "code-cjson": lambda: code_scoreboard("cjson"),
    "messages-cjson": lambda: message_scoreboard("cjson"),
    "ablation-flask": lambda: ablation("flask"),
    "budgets-flask": lambda: budgets("flask"),
    "budgets-requests": lambda: budgets("requests"),
    "budgets-express": lambda: budgets("express"),
    "budgets-cobra": lambda: budgets("cobra"),
    "serve-flask": lambda: serve("flask"),
    "serve-llama-flask": lambda: serve_llama("flask"),
    "hook-flask-model": lambda: hook_through_serve("flask"),
    "hook-requests": lambda: hook_cold("requests"),
    "scrape-flask": lambda: scrape_speed("flask"),
    "tokenize-pytest-flask": lambda: tokenize_ahead("pytest", "flask"),
    "busy-cpu-requests": lambda: busy_cpu("requests"),
    "redaction": redaction,
    "cpu-peer-requests": lambda: cpu_peer("requests"),
}


def pages() -> list[Path]:
    """The pages figures are generated into: the README and the manual."""
    return [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]


def rendered(text: str) -> tuple[str, list[str]]:
    """`text` with every figure block generated again, and the names of those that changed."""
    changed: list[str] = []

    def fill(found: re.Match[str]) -> str:
        name = found.group(2)
        if name not in FIGURES:
            raise SystemExit(f"<!-- figure: {name} -->: no such figure (benchmarks/figures.py FIGURES)")
        body = FIGURES[name]()
        if body != found.group(3):
            changed.append(name)
        return found.group(1) + body + found.group(4)

    return BLOCK.sub(fill, text), changed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="write nothing: exit 1 where a page differs")
    args = parser.parse_args()
    stale = []
    for page in pages():
        text = page.read_text()
        new, changed = rendered(text)
        stale += [f"{page.relative_to(ROOT)}: {name}" for name in changed]
        if changed and not args.check:
            page.write_text(new)
    for line in stale:
        print(f"{'differs from its results' if args.check else 'generated'}: {line}")
    return 1 if stale and args.check else 0


if __name__ == "__main__":
    sys.exit(main())

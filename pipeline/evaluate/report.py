"""What the evaluation says: the manifest's `training_report.evaluation`, every answer in
evaluation.jsonl, and the scoreboard a run prints."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import orjson

from pipeline.evaluate.evaluation import SHOWN_CHARS
from pipeline.evaluate.metrics import CODE_TASKS, TASKS, paired_difference
from pipeline.progress import printable
from pipeline.scores import BLOCK_TASK, CODE_LABELS, differences, registers, with_interval
from pipeline.types import Evaluation, Scores, TaskPrompt

SHOWN_SAMPLES = 12  # samples per task and system in the manifest (evaluation.jsonl has every one)


# Below this many commits a bootstrap resamples little more than the scores themselves: the note says so.
FEWEST_FOR_AN_INTERVAL = 10


def held_out_note(available: int, asked: int, scrape: dict[str, Any]) -> dict[str, Any]:
    """How many held-out commits the tasks scored, and why fewer than `eval.samples` when they did."""
    scored = min(available, asked)
    kept = int(scrape.get("commits_kept") or 0)
    note = None
    if asked and scored < asked:
        note = (
            f"scored {_commits(scored, 'held-out commit')}, not {asked}: the history kept {_commits(kept)} and at most "
            "scrape.holdout_max_share of them are held out, so that it still trains on most of itself; "
            + (
                "intervals are wider accordingly"
                if scored >= FEWEST_FOR_AN_INTERVAL
                else "an interval over so few is not to be trusted: a bootstrap resamples only the scores there are"
            )
            if scored
            else f"no held-out commits to score: the history kept {_commits(kept)} (20 are needed)"
        )
    return {"asked": asked, "available": available, "scored": scored, "note": note}


def _commits(count: int, what: str = "commit") -> str:
    return f"{count} {what}{'' if count == 1 else 's'}"


def relative_change(before: dict[str, Any] | None, after: dict[str, Any] | None) -> float | None:
    """(after − before) / before of two held-out losses; None when either was not measured."""
    if not (before and after and before["loss"] and after["loss"] is not None):
        return None
    return round((after["loss"] - before["loss"]) / before["loss"], 6)


def _references(prompts: Sequence[TaskPrompt], task: str) -> list[str]:
    return [p.reference for p in prompts if p.task == task]


def _compared(evaluation: Evaluation, scores: Scores | None) -> dict[str, Any] | None:
    """A system's task metrics, each with its paired difference to the baseline it must beat: the
    lookup for messages; for code, the base model given the same prompt, and the lookup for code."""
    if scores is None or scores.tasks is None:
        return None
    prompts, result = evaluation.prompts, dict[str, Any]()
    lookup = evaluation.nearest_commit.outputs if evaluation.nearest_commit else {}
    base = evaluation.before.outputs
    for task, metrics in scores.tasks.items():
        if metrics is None:
            result[task] = None
            continue
        metrics = dict(metrics)
        ours, references = scores.outputs.get(task) or [], _references(prompts, task)
        commits = [p.commit for p in prompts if p.task == task] if task in CODE_TASKS else None
        if lookup.get(task) is not None and scores is not evaluation.nearest_commit:
            metrics["vs_nearest_commit"] = paired_difference(task, lookup[task], ours, references, commits)
        baseline = scores is evaluation.before or scores is evaluation.nearest_commit
        if task in CODE_TASKS and base.get(task) is not None and not baseline:
            metrics["vs_before"] = paired_difference(task, base[task], ours, references, commits)
        result[task] = metrics
    return result


def _samples(prompts: Sequence[TaskPrompt], scores: Scores | None) -> list[dict[str, Any]]:
    """The first SHOWN_SAMPLES answers of each task, for the manifest."""
    if scores is None:
        return []
    shown = []
    for task in TASKS:
        asked = [p for p in prompts if p.task == task]
        for prompt, output in list(zip(asked, scores.outputs.get(task) or [], strict=False))[:SHOWN_SAMPLES]:
            shown.append(
                {
                    "task": task,
                    "commit": prompt.commit,
                    "prompt": prompt.given,
                    "reference": prompt.reference[:SHOWN_CHARS],
                    "output": output,
                    "whitespace_only": not output.strip(),
                }
            )
    return shown


def evaluation_report(evaluation: Evaluation) -> dict[str, Any]:
    """The manifest's `training_report.evaluation`."""
    before, after = evaluation.before, evaluation.after or Scores(None, None)
    systems = {
        "before": evaluation.before,
        "after": evaluation.after,
        "nearest_commit": evaluation.nearest_commit,
        "selector": evaluation.selector,
        "suggested": evaluation.suggested,
    }
    return {
        "before": before.loss,
        "after": after.loss,
        "relative_change": relative_change(before.loss, after.loss),
        "history": evaluation.history,
        "tasks": {name: _compared(evaluation, scores) for name, scores in systems.items()},
        "samples": {name: _samples(evaluation.prompts, scores) for name, scores in systems.items()},
        "system": evaluation.system,
        "code_system": evaluation.code_system,
        "held_out_commits": evaluation.held_out_commits,
        "cost": {
            "before_s": round(before.seconds, 3),
            "before_cached": before.cached,
            "after_s": round(after.seconds, 3),
            "retrieval_s": round(
                sum(s.seconds for s in (evaluation.nearest_commit, evaluation.selector) if s), 3
            ),
            "validation_s": round(evaluation.model_validation.seconds, 3)
            if evaluation.model_validation
            else None,
        },
        "note": None
        if before.loss
        else "no held-out commits: fewer than 20 were kept, or scrape.eval_commits is 0",
    }


def answer_rows(evaluation: Evaluation) -> list[dict[str, Any]]:
    """Every held-out question with what git has and what each system answered (None: a system that was
    not asked), as evaluation.jsonl holds them."""
    columns = {
        "base": evaluation.before,
        "fine_tuned": evaluation.after,
        "nearest_commit": evaluation.nearest_commit,
        "selector": evaluation.selector,
        "suggested": evaluation.suggested,
    }
    position = dict.fromkeys(TASKS, 0)
    rows = []
    for prompt in evaluation.prompts:
        row: dict[str, Any] = {
            "task": prompt.task,
            "commit": prompt.commit,
            "given": prompt.given,
            "reference": prompt.reference,
        }
        for name, scores in columns.items():
            answers = scores.outputs.get(prompt.task) if scores else None
            row[name] = answers[position[prompt.task]] if answers else None
        position[prompt.task] += 1
        rows.append(row)
    return rows


def write_answers(path: Path, rows: list[dict[str, Any]]) -> Path:
    """Every held-out question with what git has and what each system answered (`answer_rows`), as
    evaluation.jsonl."""
    lines = [orjson.dumps(row) for row in rows]
    staging = path.with_name(path.name + ".partial")
    staging.write_bytes(b"\n".join(lines) + b"\n" if lines else b"")
    staging.replace(path)
    return path


def first_samples(rows: Iterable[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The first held-out commit message and the first next line asked with context, by task, as
    evaluation.jsonl has them: the first, not the best."""
    firsts: dict[str, dict[str, Any]] = {}
    for row in rows:
        if row["task"] in ("message", "code_context"):
            firsts.setdefault(row["task"], row)
    return firsts


def sample_lines(firsts: dict[str, dict[str, Any]]) -> list[str]:
    """`first_samples` in words: what git has and what each system a user meets wrote, each answer's
    first line."""
    lines = []
    message, line = firsts.get("message"), firsts.get("code_context")
    if message:
        lines += [f"the first held-out commit ({message['commit'][:12]}), its message:"]
        lines += _answers(
            message, ("reference", "git has"), ("suggested", "suggested"), ("fine_tuned", "fine-tuned")
        )
    if line:
        whose = (
            "it"
            if message and message["commit"] == line["commit"]
            else f"a held-out commit ({line['commit'][:12]})"
        )
        lines += [f"the first line {whose} added, given the file before it and the retrieved chunks:"]
        lines += _answers(
            line, ("reference", "git has"), ("fine_tuned", "fine-tuned + context"), ("base", "base + context"),
            ("nearest_commit", "lookup for code"),
        )  # fmt: skip
    return lines


def _answers(row: dict[str, Any], *systems: tuple[str, str]) -> list[str]:
    """Each system's answer, its first line that is not blank, as a terminal shows it as it is (the
    repository wrote the reference and taught the answers: an escape sequence in a commit message is
    printed, not obeyed); a blank answer said so, a system not asked left out."""
    return [
        f"  {label:<22}{_first_line(text)}" for key, label in systems if (text := row.get(key)) is not None
    ]


def _first_line(text: str) -> str:
    line = next((line for line in text.splitlines() if line.strip()), None)
    return printable(line.expandtabs(4)) if line is not None else "(blank)"


def format_evaluation(result: Evaluation, rows: list[dict[str, Any]]) -> list[str]:
    """Lines for the end of a run: held-out loss (per format), then each task as a scoreboard: base,
    fine-tuned, the lookup and the suggestion system, with intervals; then the first held-out samples
    (of `rows`, its `answer_rows`)."""
    evaluation = evaluation_report(result)
    lines = []
    before, after = evaluation.get("before"), evaluation.get("after")
    if before and after and before["loss"] is not None and after["loss"] is not None:
        lines.append(
            f"held-out loss {before['loss']:.4f} → {after['loss']:.4f} "
            f"({after['loss'] / before['loss'] - 1:+.1%}; ± {after['loss_stderr'] or 0:.4f}, "
            f"{after['tokens']} tokens)"
        )
        for name, was in before["per_format"].items():
            now = after["per_format"].get(name) or {}
            if was["perplexity"] and now.get("perplexity"):
                lines.append(
                    f"  {name:<8} perplexity {was['perplexity']:.2f} → {now['perplexity']:.2f} "
                    f"({now['perplexity'] / was['perplexity'] - 1:+.1%})"
                )
    tasks = evaluation["tasks"]
    lines += message_scoreboard(evaluation)
    code = code_scoreboard(tasks, evaluation.get("code_system"))
    if not code and (tasks.get("after") or {}).get("message"):
        code = [
            "next line: nothing to score (the held-out commits added no line of text past a file's second, "
            "notebooks aside); the model trained on the files and history the manifest counts"
        ]
    lines += code + code_scoreboard(tasks, blocks=True)
    held = evaluation.get("held_out_commits") or {}
    if held.get("note"):
        lines.append(held["note"])
    samples = sample_lines(first_samples(rows))
    return lines + (["", *samples] if samples else [])


def code_scoreboard(
    tasks: dict[str, Any], chosen: dict[str, Any] | None = None, blocks: bool = False
) -> list[str]:
    """The next-line tasks (with `blocks`, the block tasks) as a scoreboard (`tasks`: the manifest's
    `.evaluation.tasks`): every system's exact match and edit similarity with intervals, a model's gain
    over the base model given the same prompt, and over the lookup for code; the system `chosen` to write
    next lines at use marked, and why."""
    scored = {
        name: ((tasks.get(key) or {}).get(BLOCK_TASK[task] if blocks else task), key, label)
        for name, (key, task, label) in CODE_LABELS.items()
    }
    present = [metrics for metrics, _, _ in scored.values() if metrics]
    if not present:
        return []
    first = present[0]
    asked = (
        f"block: the body under a line that opens one, at {first['samples']} bodies {first.get('commits', '?')} "
        "held-out commits wrote"
        if blocks
        else f"next line at {first['samples']} lines {first.get('commits', '?')} held-out commits added"
    )
    lines = [f"{asked} (exact match %, edit similarity [95% interval, resampled by commit]):"]
    for name, (metrics, system, label) in scored.items():
        if not metrics:
            continue
        label += " (chosen)" if chosen and chosen["name"] == name and not blocks else ""
        line = f"  {label:<29} EM {with_interval(metrics, 'exact_match_pct', 5)}  ES {with_interval(metrics, 'edit_similarity', 5)}"
        for key, against in (("vs_before", "base"), ("vs_nearest_commit", "lookup")):
            if system == "after" and metrics.get(key):
                versus = metrics[key]
                line += f"  vs {against} {differences(versus, 'exact_match_pct')}"
        lines.append(line)
    if chosen and not blocks:
        lines.append(f"  next lines come from the {CODE_LABELS[chosen['name']][2]}: {chosen['reason']}")
    return lines


def message_scoreboard(evaluation: dict[str, Any]) -> list[str]:
    """The commit-message task as a scoreboard (`evaluation`: the manifest's): every system's scores
    with intervals and the gain over the lookup, who suggests and why, and a model writing in one
    register."""
    tasks = evaluation["tasks"]
    labels = {
        "before": "base model",
        "after": "fine-tuned",
        "nearest_commit": "lookup",
        "selector": "selector",
        "suggested": "suggested",
    }
    messages = {name: (tasks.get(name) or {}).get("message") for name in labels}
    if not any(messages.values()):
        return []
    count = next(m["samples"] for m in messages.values() if m)
    system = (evaluation.get("system") or {}).get("name")
    lines = [f"commit message from diff ({count} held-out commits; chrF, edit similarity [95% interval]):"]
    for name, label in labels.items():
        scored = messages[name]
        if not scored:
            continue
        if name == "suggested":
            label = f"suggested ({system})"
        line = f"  {label:<24} chrF {with_interval(scored, 'chrf', 5)}  ES {with_interval(scored, 'edit_similarity', 5)}"
        versus = scored.get("vs_nearest_commit")
        if versus:
            line += f"  vs lookup {differences(versus, 'chrf')}"
        lines.append(line)
    if system:
        lines.append(f"  suggestions come from the {system}: {evaluation['system']['reason']}")
    return lines + [f"  {said}" for said in registers(tasks)]

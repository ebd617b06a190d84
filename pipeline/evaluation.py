"""Did the model learn the repository? Held-out loss per format and task metrics, before and after.

The held-out split is the newest commits, never trained on. Two tasks are
scored on the same commits with the same prompts before and after training,
with greedy (deterministic) decoding:

- `message`: the model is given the commit's diff and writes its message.
  Scored as the field scores commit-message generation: corpus chrF
  (sacrebleu's `CHRF()` defaults, as Long Code Arena), exact match of the
  subject line and of its first word, and edit similarity (normalised
  character Levenshtein, 0–100, rapidfuzz), with output lengths beside them
  so that a "gain" that is only a shorter output is visible.
- `diff`: the model is given the commit message and writes the change.
  Scored by chrF and edit similarity against the start of git's real diff
  (as many characters as the model could have written).

Held-out loss is computed over the packed held-out blocks in batches,
token-weighted, per format, with the standard error over blocks.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from pipeline.config import EvalConfig
from pipeline.examples import answer_prefix, prompt_content, render_prompt
from pipeline.types import Evaluation, Plan, Prepared, Scores, TextStyle
from scrapers.formats import prompt_and_response

TASKS = ("message", "diff")
SHOWN_CHARS = 600  # a sample's prompt and reference as the manifest shows them


@dataclass(frozen=True)
class TaskPrompt:
    task: str
    """`message` (diff → message) or `diff` (message → change)."""
    commit: str
    text: str
    """What the model continues: the prompt rendered in the training style."""
    given: str
    """The prompt's content, for people (the message, or the start of the diff)."""
    reference: str
    """What git has: the full message, or the diff."""


def task_prompts(
    records: Iterable[dict[str, Any]], tokenizer, style: TextStyle, commits: int, prompt_tokens: int
) -> list[TaskPrompt]:
    """Both tasks' prompts for the newest `commits` held-out commits, rendered as in training (a
    diff given as a prompt cut to `prompt_tokens`)."""
    pairs: dict[str, tuple[str, str]] = {}
    for record in records:
        if record["split"] != "eval" or record["format"] not in TASKS or record["commit"] in pairs:
            continue
        prompt, response = prompt_and_response(record["format"], record["text"])
        if not prompt:
            continue
        content = prompt_content(record["format"], prompt)
        message, diff = (content, response) if record["format"] == "diff" else (response.strip(), content)
        pairs[record["commit"]] = (message, diff)
        if len(pairs) == commits:
            break
    prompts = []
    for commit, (message, diff) in pairs.items():
        prompts.append(
            TaskPrompt(
                "message",
                commit,
                render_prompt(tokenizer, style, "message", diff, prompt_tokens),
                diff[:SHOWN_CHARS],
                message,
            )
        )
        prompts.append(
            TaskPrompt("diff", commit, render_prompt(tokenizer, style, "diff", message), message, diff)
        )
    return prompts


def generate_batched(
    model, tokenizer, prompts: Sequence[str], max_new_tokens: int, precision: str, batch_size: int = 16
) -> list[str]:
    """Greedy continuations of `prompts`, batched with left padding and the KV cache."""
    import torch

    from pipeline.model import autocast

    device = next(model.parameters()).device
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))  # similar lengths pad less
    outputs: list[str] = [""] * len(prompts)
    side = tokenizer.padding_side
    tokenizer.padding_side = "left"
    was_training = model.training
    model.eval()
    try:
        for start in range(0, len(order), batch_size):
            chosen = order[start : start + batch_size]
            batch = tokenizer(
                [prompts[i] for i in chosen], return_tensors="pt", padding=True, add_special_tokens=False
            ).to(device)
            with torch.no_grad(), autocast(device.type, precision):
                generated = model.generate(
                    **batch,
                    max_new_tokens=max_new_tokens,
                    do_sample=False,
                    pad_token_id=tokenizer.pad_token_id,
                    eos_token_id=tokenizer.eos_token_id,
                )
            for row, index in enumerate(chosen):
                new = generated[row, batch["input_ids"].shape[1] :]
                outputs[index] = tokenizer.decode(new, skip_special_tokens=True)
    finally:
        tokenizer.padding_side = side
        model.train(was_training)
    return outputs


def score_tasks(prompts: Sequence[TaskPrompt], outputs: Sequence[str], seconds: float) -> dict[str, Any]:
    """Each task's metrics over its samples (None for a task with no samples)."""
    from rapidfuzz.distance import Levenshtein
    from sacrebleu.metrics import CHRF

    scores: dict[str, Any] = {}
    for task in TASKS:
        pairs = [(o, p.reference) for p, o in zip(prompts, outputs, strict=True) if p.task == task]
        if not pairs:
            scores[task] = None
            continue
        produced = [o.strip() for o, _ in pairs]
        # A diff is compared with as much of git's diff as the model could have written.
        wanted = [r.strip() if task == "message" else r[: max(1, len(o))] for o, r in pairs]
        result = {
            "samples": len(pairs),
            "chrf": round(CHRF().corpus_score(produced, [wanted]).score, 2),
            "edit_similarity": round(
                100
                * sum(Levenshtein.normalized_similarity(o, r) for o, r in zip(produced, wanted, strict=True))
                / len(pairs),
                2,
            ),
            "whitespace_only": sum(not o.strip() for o, _ in pairs),
            "output_chars_mean": round(sum(len(o) for o in produced) / len(pairs), 1),
            "reference_chars_mean": round(sum(len(r) for r in wanted) / len(pairs), 1),
        }
        if task == "message":
            subjects = [(_subject(o), _subject(r)) for o, r in zip(produced, wanted, strict=True)]
            result["subject_exact_match_pct"] = _pct(sum(o == r for o, r in subjects), len(pairs))
            result["first_word_match_pct"] = _pct(
                sum(_first_word(o) == _first_word(r) for o, r in subjects), len(pairs)
            )
        scores[task] = result
    scores["seconds"] = round(seconds, 3)
    return scores


def _subject(text: str) -> str:
    return text.strip().split("\n", 1)[0].strip()


def _first_word(text: str) -> str:
    return (text.split() or [""])[0].lower()


def _pct(count: int, total: int) -> float:
    return round(100 * count / total, 1)


def run_tasks(
    model, tokenizer, style: TextStyle, prompts: Sequence[TaskPrompt], tokens: dict[str, int], precision: str
):
    """Generate every prompt's answer (each task with its own length) and score them;
    returns (scores, samples)."""
    started = time.perf_counter()
    outputs: list[str] = [""] * len(prompts)
    for task in TASKS:
        indexes = [i for i, p in enumerate(prompts) if p.task == task]
        answers = generate_batched(
            model, tokenizer, [prompts[i].text for i in indexes], tokens[task], precision
        )
        for index, answer in zip(indexes, answers, strict=True):
            outputs[index] = answer_prefix(style, task) + answer  # the part of the answer the prompt gave
    scores = score_tasks(prompts, outputs, time.perf_counter() - started)
    samples = [
        {
            "task": p.task,
            "commit": p.commit,
            "prompt": p.given,
            "reference": p.reference[:SHOWN_CHARS],
            "output": output,
            "whitespace_only": not output.strip(),
        }
        for p, output in zip(prompts, outputs, strict=True)
    ]
    return scores, samples


def held_out_loss(model, splits: dict[str, Any], batch_size: int, precision: str) -> dict[str, Any] | None:
    """Token-weighted held-out loss over every format's blocks (and per format), with the standard
    error of the mean over blocks; None without held-out data."""
    import torch

    from pipeline.model import autocast
    from pipeline.trainer import answer_logits

    if not splits:
        return None
    started = time.perf_counter()
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    per_format: dict[str, Any] = {}
    block_losses: list[float] = []
    total_loss = total_tokens = 0.0
    try:
        for name, dataset in splits.items():
            loss_sum = tokens = 0.0
            for start in range(0, len(dataset), batch_size):
                rows = [dataset[i] for i in range(start, min(len(dataset), start + batch_size))]
                batch = {key: torch.stack([row[key] for row in rows]).to(device) for key in rows[0]}
                with torch.no_grad(), autocast(device.type, precision):
                    logits, targets, _ = answer_logits(model, batch)
                losses = torch.nn.functional.cross_entropy(logits.float(), targets, reduction="none")
                block = batch["labels"][:, 1:].ne(-100).nonzero()[:, 0]  # the block of each learned token
                counts = torch.bincount(block, minlength=len(rows))
                sums = torch.zeros(len(rows), device=losses.device).index_add_(0, block, losses)
                block_losses += (sums[counts > 0] / counts[counts > 0]).tolist()
                loss_sum += float(losses.sum())
                tokens += len(targets)
            loss = loss_sum / tokens if tokens else None
            per_format[name] = {
                "loss": _round(loss),
                "perplexity": perplexity(loss),
                "blocks": len(dataset),
                "tokens": int(tokens),
            }
            total_loss += loss_sum
            total_tokens += tokens
    finally:
        model.train(was_training)
    loss = total_loss / total_tokens if total_tokens else None
    return {
        "loss": _round(loss),
        "perplexity": perplexity(loss),
        "loss_stderr": _round(_stderr(block_losses)),
        "blocks": sum(len(dataset) for dataset in splits.values()),
        "tokens": int(total_tokens),
        "per_format": per_format,
        "seconds": round(time.perf_counter() - started, 3),
    }


def _stderr(values: list[float]) -> float | None:
    if len(values) < 2:
        return None
    mean = sum(values) / len(values)
    variance = sum((v - mean) ** 2 for v in values) / (len(values) - 1)
    return math.sqrt(variance / len(values))


def _round(value: float | None) -> float | None:
    return None if value is None or not math.isfinite(value) else round(value, 6)


def perplexity(loss: float | None) -> float | None:
    if loss is None or not math.isfinite(loss) or loss > 700:  # exp() overflows a double past ~709
        return None
    return round(math.exp(loss), 4)


def evaluate(
    model,
    held_out: dict[str, Any],
    prompts: list[TaskPrompt],
    plan: Plan,
    prepared: Prepared,
    config: EvalConfig,
) -> Scores:
    """Held-out loss on every rank (the same on each); the task metrics where there are prompts (rank 0)."""
    loss = held_out_loss(model, held_out, plan.batch_size, plan.precision)
    if not prompts:
        return Scores(loss, None, [])
    tokens = {"message": config.message_tokens, "diff": config.diff_tokens}
    tasks, samples = run_tasks(model, prepared.tokenizer, prepared.style, prompts, tokens, plan.precision)
    return Scores(loss, tasks, samples)


def relative_change(before: dict[str, Any] | None, after: dict[str, Any] | None) -> float | None:
    """(after − before) / before of two held-out losses; None when either was not measured."""
    if not (before and after and before["loss"] and after["loss"] is not None):
        return None
    return round((after["loss"] - before["loss"]) / before["loss"], 6)


def evaluation_report(evaluation: Evaluation) -> dict[str, Any]:
    """The manifest's `training_report.evaluation`."""
    before, after = evaluation.before, evaluation.after or Scores(None, None, [])
    return {
        "before": before.loss,
        "after": after.loss,
        "relative_change": relative_change(before.loss, after.loss),
        "history": evaluation.history,
        "tasks": {"before": before.tasks, "after": after.tasks},
        "samples": {"before": before.samples, "after": after.samples},
        "note": None
        if before.loss
        else "no held-out commits: fewer than 20 were kept, or scrape.eval_fraction is 0",
    }


def format_evaluation(result: Evaluation) -> list[str]:
    """Lines for the end of a run: held-out loss (per format) and each task's scores, before → after."""
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
    tasks = evaluation.get("tasks") or {}
    was, now = tasks.get("before") or {}, tasks.get("after") or {}
    for task, label in (("message", "commit message from diff"), ("diff", "change from message")):
        if not (was.get(task) and now.get(task)):
            continue
        a, b = was[task], now[task]
        line = f"{label} ({b['samples']} held-out commits): chrF {a['chrf']:.1f} → {b['chrf']:.1f}, "
        line += f"edit similarity {a['edit_similarity']:.1f} → {b['edit_similarity']:.1f}"
        if task == "message":
            line += (
                f", subject exact {a['subject_exact_match_pct']:.0f}% → {b['subject_exact_match_pct']:.0f}%"
            )
        if b["whitespace_only"]:
            line += f"; {b['whitespace_only']} blank outputs"
        lines.append(line)
    return lines

"""Did the model learn the repository, and is it worth more than the repository's own past?

The held-out commits are the newest, never trained on and never retrieved from. Every system answers
the same questions about them, greedy (deterministic) where a model writes:

- `message`: a commit's diff is given, its message is asked. Scored as the field scores commit-message
  generation: corpus chrF (sacrebleu's `CHRF()` defaults, as Long Code Arena) and edit similarity
  (normalised character Levenshtein, 0–100, rapidfuzz: what tracks how much people edit a suggestion),
  exact match of the subject line and of its first word, with output lengths beside them so that a
  "gain" that is only a shorter output shows. Answered by the base model (`before`), the fine-tuned
  model (`after`), the lookup (`nearest_commit`: the message of the most similar earlier commit) and
  the suggestion system the run chose (`suggested`).
- `code` and `code_context`: the next line at lines the asked commits added (`scrapers.completions`: a
  few a commit, the file as an editor holds it then), every model prompted as code models are
  pretrained, alone (`code`) and after chunks of other files retrieved from the files at the split point
  (`code_context`), with the line break healed (`pipeline.suggest.completion`); the lookup for code
  (the line after the most similar lines elsewhere) beside them. Exact match and edit similarity of
  the line, spaces at its ends ignored, as completion is scored.

Each score has a 95% bootstrap interval resampled by commit (`*_ci95`: a commit's lines are not
independent), and each system's message scores the paired difference to the lookup
(`vs_nearest_commit`), the fine-tuned model's code its difference to the base model given the same
prompt (`vs_before`): a gain inside its interval is noise.

Held-out loss is computed over the packed held-out blocks in batches, token-weighted, per format,
with the standard error over blocks. The base model's scores are cached per model and held-out set
(`~/.cache/repotune/evaluations/`): a second run on the same commits pays only for the fine-tuned one.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import re
import time
from collections import Counter
from collections.abc import Sequence
from contextlib import suppress
from dataclasses import replace
from pathlib import Path
from typing import Any

import orjson

from pipeline.builtin import cache_home
from pipeline.config import EvalConfig, RetrievalConfig
from pipeline.data.examples import render_prompt
from pipeline.progress import Progress, say
from pipeline.scores import CODE_LABELS, difference, registers, with_interval
from pipeline.suggest.completion import (
    DEFAULT_CODE_SYSTEM,
    LINE_TOKENS,
    CodeCase,
    CodeIndex,
    bare_prompt,
    context_prompt,
)
from pipeline.suggest.decoding import base_only, generate_batched, merged
from pipeline.suggest.suggestion import backtest
from pipeline.types import (
    Evaluation,
    ModelFacts,
    Past,
    PastCommit,
    PastScores,
    Plan,
    Prepared,
    Scores,
    TaskPrompt,
    TextStyle,
)

TASKS = ("message", "code", "code_context")
CODE_TASKS = ("code", "code_context")
# As the progress lines count them.
TASK_NAMES = {"message": "commit messages", "code": "next lines", "code_context": "next lines with context"}
SHOWN_CHARS = 600  # a sample's prompt and reference as the manifest shows them
# Validation commits below which the systems that write a next line are not compared: an interval
# resampled from a handful of commits is narrow by chance (one commit gives a single point).
CODE_CHOICE_COMMITS = 10
SHOWN_SAMPLES = 12  # samples per task and system in the manifest (evaluation.jsonl has every one)
BOOTSTRAP_RESAMPLES = 1000
# Below this many commits a bootstrap resamples little more than the scores themselves: the note says so.
FEWEST_FOR_AN_INTERVAL = 10
EVALUATION_FILE = "evaluation.jsonl"
# Bump when prompts, generation, the loss or scoring change: cached base-model scores are then not reused.
EVALUATION_FORMAT = (
    8  # 8: the code tasks are the file's next line, prompted as code models are pretrained, never blank
)


def task_prompts(
    commits: Sequence[PastCommit],
    tokenizer,
    style: TextStyle,
    count: int,
    prompt_tokens: int | None,
    cases: Sequence[CodeCase] = (),
    index: CodeIndex | None = None,
) -> tuple[TaskPrompt, ...]:
    """The tasks' questions about the newest `count` of `commits` (held-out commits, newest first): each
    one's message rendered as in training (a diff given as a prompt is cut to `prompt_tokens`; None:
    whole); the next line of `cases` (theirs), alone and, given an `index` of the files at the split
    point, after the chunks it retrieves."""
    prompts = []
    for commit in commits[:count]:
        prompts.append(
            TaskPrompt(
                "message",
                commit.sha,
                render_prompt(tokenizer, style, "message", commit.diff, prompt_tokens),
                commit.diff[:SHOWN_CHARS],
                commit.message,
                commit.diff,
            )
        )
    given = [f"{case.path}\n{case.before[-SHOWN_CHARS:]}" for case in cases]
    prompts += [
        TaskPrompt("code", c.commit, bare_prompt(c), g, c.line) for c, g in zip(cases, given, strict=True)
    ]
    if index is not None:
        prompts += [
            TaskPrompt("code_context", c.commit, context_prompt(c, index.context(c)), g, c.line)
            for c, g in zip(cases, given, strict=True)
        ]
    return tuple(prompts)


def _chrf_statistics(outputs: Sequence[str], references: Sequence[str]):
    """sacrebleu's chrF statistics per sample: corpus chrF of any resample is the score of their sum."""
    import numpy as np
    from sacrebleu.metrics import CHRF

    metric = CHRF()
    return metric, np.asarray(metric._extract_corpus_statistics(list(outputs), [list(references)]))


def edit_similarities(outputs: Sequence[str], references: Sequence[str]):
    """Each output's normalised character Levenshtein similarity to its reference, 0–100."""
    import numpy as np
    from rapidfuzz.distance import Levenshtein

    return np.asarray(
        [100 * Levenshtein.normalized_similarity(o, r) for o, r in zip(outputs, references, strict=True)]
    )


def _resamples(count: int):
    """The same BOOTSTRAP_RESAMPLES resamples of `count` samples for every score of a run."""
    import numpy as np

    return np.random.default_rng(0).integers(0, count, size=(BOOTSTRAP_RESAMPLES, count))


def _resampled_means(values, commits: Sequence[str]):
    """`values`' mean in each of BOOTSTRAP_RESAMPLES resamples of their commits (a commit drawn k times
    counts each of its values k times): the interval of a mean over cases that share commits."""
    import numpy as np

    names = list(dict.fromkeys(commits))
    of_case = np.asarray([names.index(commit) for commit in commits]) if names else np.zeros(0, dtype=int)
    drawn = _resamples(len(names))
    weights = np.stack([np.bincount(row, minlength=len(names)) for row in drawn])[:, of_case]
    return (weights @ np.asarray(values, dtype=float)) / np.maximum(weights.sum(axis=1), 1)


def _interval(values) -> list[float]:
    import numpy as np

    low, high = np.percentile(values, [2.5, 97.5])
    return [round(float(low), 2), round(float(high), 2)]


def score_messages(
    outputs: Sequence[str], references: Sequence[str], commits: Sequence[str] = ()
) -> dict[str, Any]:
    """The message task's metrics over its samples (one a commit), with 95% bootstrap intervals."""
    produced = [o.strip() for o in outputs]
    wanted = [r.strip() for r in references]
    metric, statistics = _chrf_statistics(produced, wanted)
    similarity = edit_similarities(produced, wanted)
    resamples = _resamples(len(wanted))
    subjects = [(_subject(o), _subject(r)) for o, r in zip(produced, wanted, strict=True)]
    return {
        "samples": len(wanted),
        "chrf": _chrf(metric, statistics),
        "chrf_ci95": _interval([_chrf(metric, statistics[rows]) for rows in resamples]),
        "edit_similarity": round(float(similarity.mean()), 2),
        "edit_similarity_ci95": _interval(similarity[resamples].mean(axis=1)),
        "subject_exact_match_pct": _pct(sum(o == r for o, r in subjects), len(wanted)),
        "first_word_match_pct": _pct(sum(_first_word(o) == _first_word(r) for o, r in subjects), len(wanted)),
        "commonest_opening": _commonest_opening(produced, wanted),
        "whitespace_only": sum(not o for o in produced),
        "output_chars_mean": round(sum(len(o) for o in produced) / len(wanted), 1),
        "reference_chars_mean": round(sum(len(r) for r in wanted) / len(wanted), 1),
    }


def score_code(outputs: Sequence[str], references: Sequence[str], commits: Sequence[str]) -> dict[str, Any]:
    """A code task's metrics (exact match and edit similarity of the line, spaces at its ends ignored),
    with 95% bootstrap intervals resampled by commit."""
    import numpy as np

    produced = [o.strip() for o in outputs]
    wanted = [r.strip() for r in references]
    exact = 100 * np.asarray([o == r for o, r in zip(produced, wanted, strict=True)], dtype=float)
    similarity = edit_similarities(produced, wanted)
    return {
        "samples": len(wanted),
        "commits": len(set(commits)),
        "exact_match_pct": round(float(exact.mean()), 2),
        "exact_match_pct_ci95": _interval(_resampled_means(exact, commits)),
        "edit_similarity": round(float(similarity.mean()), 2),
        "edit_similarity_ci95": _interval(_resampled_means(similarity, commits)),
        "whitespace_only": sum(not o for o in produced),
        "output_chars_mean": round(sum(len(o) for o in produced) / len(wanted), 1),
        "reference_chars_mean": round(sum(len(r) for r in wanted) / len(wanted), 1),
    }


def paired_difference(
    task: str,
    baseline: Sequence[str],
    system: Sequence[str],
    references: Sequence[str],
    commits: Sequence[str] | None = None,
) -> dict[str, Any]:
    """`system` − `baseline` on the same samples, with 95% paired bootstrap intervals: chrF and edit
    similarity for messages, exact match and edit similarity for code (resampled by `commits` where
    given: a commit's lines are not independent)."""
    result: dict[str, Any] = {}
    for key, (point, resampled) in _paired_resampled(task, baseline, system, references, commits).items():
        result[key], result[f"{key}_ci95"] = round(point, 2), _interval(resampled)
    return result


def mean_gain(
    baseline: Sequence[str], system: Sequence[str], references: Sequence[str], commits: Sequence[str] = ()
) -> dict[str, Any]:
    """`system` − `baseline` in the mean of the task's two scores (what a system is chosen by), with its
    95% paired bootstrap interval: chrF and edit similarity of commit messages, or with `commits` (a code
    task's, resampled by commit) exact match and edit similarity."""
    task = "code" if commits else "message"
    (first, firsts), (second, seconds) = _paired_resampled(
        task, baseline, system, references, commits or None
    ).values()
    return {"mean": round((first + second) / 2, 2), "mean_ci95": _interval((firsts + seconds) / 2)}


def _paired_resampled(
    task: str,
    baseline: Sequence[str],
    system: Sequence[str],
    references: Sequence[str],
    commits: Sequence[str] | None = None,
) -> dict[str, tuple[float, Any]]:
    """Each metric's paired difference, and its value in each of the run's bootstrap resamples (of
    `commits` where given, else of the samples)."""
    import numpy as np

    wanted = [r.strip() for r in references]
    ours, theirs = [o.strip() for o in system], [o.strip() for o in baseline]
    resamples = _resamples(len(wanted))

    def resampled(values):
        return _resampled_means(values, commits) if commits else values[resamples].mean(axis=1)

    similarity = edit_similarities(ours, wanted) - edit_similarities(theirs, wanted)
    result = {"edit_similarity": (float(similarity.mean()), resampled(similarity))}
    if task == "message":
        metric, mine = _chrf_statistics(ours, wanted)
        _, other = _chrf_statistics(theirs, wanted)
        result["chrf"] = (
            _chrf(metric, mine) - _chrf(metric, other),
            np.asarray([_chrf(metric, mine[rows]) - _chrf(metric, other[rows]) for rows in resamples]),
        )
    else:
        exact = 100 * (
            np.asarray([o == r for o, r in zip(ours, wanted, strict=True)], dtype=float)
            - np.asarray([o == r for o, r in zip(theirs, wanted, strict=True)], dtype=float)
        )
        result["exact_match_pct"] = (float(exact.mean()), resampled(exact))
    return result


def _chrf(metric, statistics) -> float:
    return round(float(metric._compute_score_from_stats(list(statistics.sum(axis=0))).score), 2)


def _subject(text: str) -> str:
    return text.strip().split("\n", 1)[0].strip()


def _first_word(text: str) -> str:
    return (text.split() or [""])[0].lower()


def _opening(text: str) -> str:
    """A message's first word as a register shows in it: lower case, a conventional commit's scope and
    colon left off ("refactor(cli): …" and "Refactor …" open alike)."""
    return re.split(r"[(:!]", _first_word(_subject(text)), maxsplit=1)[0]


def _commonest_opening(outputs: Sequence[str], references: Sequence[str]) -> dict[str, Any]:
    """The word that begins most of the answers, how many it begins, and how many commits written it
    begins: a model that writes in one register shows here before its scores explain it."""
    word, count = (Counter(_opening(o) for o in outputs if o).most_common(1) or [("", 0)])[0]
    return {"word": word, "answers": count, "references": sum(_opening(r) == word for r in references)}


def _pct(count: int, total: int) -> float:
    return round(100 * count / total, 1)


SCORERS = {"message": score_messages, "code": score_code, "code_context": score_code}


def score_outputs(prompts: Sequence[TaskPrompt], outputs: dict[str, list[str]]) -> dict[str, Any]:
    """Each task's metrics (None for a task with no answers)."""
    scored = {}
    for task in TASKS:
        references = [p.reference for p in prompts if p.task == task]
        commits = [p.commit for p in prompts if p.task == task]
        answers = outputs.get(task)
        scored[task] = (
            SCORERS[task](answers, references, commits) if references and answers is not None else None
        )
    return scored


def answer_tasks(
    model, tokenizer, prompts: Sequence[TaskPrompt], config: EvalConfig, precision: str, who: str
) -> dict[str, list[str]]:
    """A model's answers to every prompt, by task, in the prompts' order; how far it has come is shown
    as `who` answering (minutes on a CPU)."""
    tokens = {"message": config.message_tokens, "code": LINE_TOKENS, "code_context": LINE_TOKENS}
    outputs = {}
    with Progress(f"{who} answering", len(prompts), "question") as progress:
        for task in TASKS:
            asked = [p.text for p in prompts if p.task == task]
            if asked:
                outputs[task] = generate_batched(
                    model, tokenizer, asked, tokens[task], precision, progress=progress.update,
                    cut_loops=task == "message", next_line=task in CODE_TASKS,
                )  # fmt: skip
    return outputs


def evaluate(
    model,
    held_out: dict[str, Any],
    prompts: Sequence[TaskPrompt],
    plan: Plan,
    prepared: Prepared,
    config: EvalConfig,
    who: str,
) -> Scores:
    """Held-out loss on every rank (the same on each); the tasks where there are prompts (rank 0). `who`
    names the model in the lines that say what it is doing ("the base model")."""
    # heavy: torch, which scoring answers (benchmarks, reports) needs none of
    from pipeline.train.loss import held_out_loss

    started = time.perf_counter()
    counts = Counter(p.task for p in prompts)
    asked = ", ".join(f"{counts[task]} {TASK_NAMES[task]}" for task in TASKS if counts[task])
    if parts := (["held-out loss"] if held_out else []) + ([asked] if asked else []):
        say(f"scoring {who}: " + ", then ".join(parts))
    with merged(model, plan.quantization):
        loss = held_out_loss(model, held_out, plan.batch_size, plan.precision)
        if loss is not None and loss["loss"] is not None:
            say(
                f"  held-out loss {loss['loss']:.4f} over {loss['tokens']:,} tokens ({loss['seconds']:.0f} s)"
            )
        if not prompts:
            return Scores(loss, None, {}, time.perf_counter() - started)
        outputs = answer_tasks(model, prepared.tokenizer, prompts, config, plan.precision, who)
    return Scores(loss, score_outputs(prompts, outputs), outputs, time.perf_counter() - started)


def base_scores_key(
    prepared: Prepared,
    plan: Plan,
    config: EvalConfig,
    held_out: dict[str, Any],
    prompts: Sequence[TaskPrompt],
) -> str:
    """What the base model's scores depend on: the model, the held-out blocks' tokens, the questions,
    how they are answered and scored (EVALUATION_FORMAT, the answers' length), the precision. Not
    the token cache's key: it names the tool's commit, and a new version of repotune that scores the
    same tokens the same way would pay for the base model's answers again, the longest part of a
    short run's evaluation."""
    payload = {
        "format": EVALUATION_FORMAT,
        "model": prepared.facts.name,
        "source": prepared.facts.source,
        "held_out": {name: blocks.digest() for name, blocks in sorted(held_out.items())},
        "libraries": [importlib.metadata.version(name) for name in ("torch", "transformers", "peft")],
        "prompts": [[p.task, p.commit, p.text] for p in prompts],
        "eval": [config.message_tokens, plan.precision],  # the blocks' count and shape are in their digest
    }
    return hashlib.sha256(orjson.dumps(payload, option=orjson.OPT_SORT_KEYS)).hexdigest()[:24]


def evaluate_base(
    model, held_out, prompts, plan: Plan, prepared: Prepared, config: EvalConfig, cache: Path | None
) -> Scores:
    """`evaluate` for the base model, read from `cache` (a directory) when the same base model has
    answered the same questions there before; None for `cache` evaluates (a random base, an adapter
    being continued)."""
    path = cache / f"{base_scores_key(prepared, plan, config, held_out, prompts)}.json" if cache else None
    if path is not None and path.exists():
        try:
            saved = orjson.loads(path.read_bytes())
            say(f"scoring the base model: read from {path} (the same model, questions and held-out blocks)")
            return Scores(
                saved["loss"],
                saved["tasks"],
                saved["outputs"],
                0.0,
                cached=True,
                scored_in_s=saved.get("seconds"),
            )
        except (OSError, ValueError, KeyError):
            pass  # unreadable: evaluate again, and write it anew
    scores = evaluate(model, held_out, prompts, plan, prepared, config, "the base model")
    if path is not None:
        keep_base_scores(path, scores)
    return scores


def keep_base_scores(path: Path, scores: Scores) -> None:
    """The base model's scores written whole to `path` for the next run; where the cache cannot be
    written (a read-only home, a full disk), a line says so: it costs the next run time, not this run."""
    staging = path.with_suffix(f".{time.time_ns()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        staging.write_bytes(
            orjson.dumps(
                {
                    "loss": scores.loss,
                    "tasks": scores.tasks,
                    "outputs": scores.outputs,
                    "seconds": scores.seconds,
                }
            )
        )
        staging.replace(path)
    except OSError as err:
        with suppress(OSError):  # nothing was written where the folder could not be made
            staging.unlink()
        say(f"the base model's scores are not kept for the next run: {path.parent}: {err.strerror or err}")


def validation_answers(
    model, past: Past, prepared: Prepared, plan: Plan, config: EvalConfig, prompt_tokens: int
) -> Scores:
    """The fine-tuned model's commit messages for the validation commits (asked as the held-out ones
    are), so that the suggestion system can be the model where it validates best."""
    started = time.perf_counter()
    asked = task_prompts(
        past.split("valid"), prepared.tokenizer, prepared.style, len(past.commits), prompt_tokens
    )
    messages = [p for p in asked if p.task == "message"]
    with merged(model, plan.quantization):
        who = "the fine-tuned model (validation commits)"
        outputs = answer_tasks(model, prepared.tokenizer, messages, config, plan.precision, who)
    return Scores(None, None, outputs, time.perf_counter() - started)


def choose_code_system(
    model, evaluation: Evaluation, prepared: Prepared, plan: Plan, config: EvalConfig
) -> Evaluation:
    """Who writes a next line at use: the fine-tuned model with retrieved context (alone where the run
    has no files to retrieve from), unless another of `completion.CODE_SYSTEMS` beats it on the validation commits'
    next lines (`evaluation.code_checks`, answered here) by more than the 95% interval of its gain in the
    mean of exact match and edit similarity, resampled by commit; where the plan has no model answer the
    validation commits, it stands unvalidated. `evaluation` with it (`code_system`)."""
    return replace(evaluation, code_system=_code_system(model, evaluation, prepared, plan, config))


def _code_system(
    model, evaluation: Evaluation, prepared: Prepared, plan: Plan, config: EvalConfig
) -> dict[str, Any]:
    checks = evaluation.code_checks
    default = DEFAULT_CODE_SYSTEM if any(p.task == "code_context" for p in checks) else "model"
    unchosen = {
        "name": default,
        "validation": {},
        "validation_lines": 0,
        "validation_commits": 0,
        "gain": None,
    }
    what = CODE_LABELS[default][2] + (
        " (fine-tuning and retrieval add up)" if default == DEFAULT_CODE_SYSTEM else ""
    )
    if not plan.validate_model:
        return {
            **unchosen,
            "reason": f"not validated (eval.validate_model is off, the plan says why): the {what}",
        }
    commits = len({p.commit for p in checks})
    if commits < CODE_CHOICE_COMMITS:
        reason = f"{commits} validation commits added lines to complete, too few to tell systems apart"
        return {**unchosen, "validation_commits": commits, "reason": f"{reason}: the {what}"}
    started = time.perf_counter()
    answers = _answer_checks(model, checks, prepared, plan, config)
    if evaluation.code_checks_lookup:
        answers["lookup"] = evaluation.code_checks_lookup
    chosen = _code_winner(answers, [p for p in checks if p.task == "code"], default)
    say(f"chose who writes a next line in {time.perf_counter() - started:.0f} s: {chosen['name']}")
    return chosen


def _answer_checks(
    model, checks: Sequence[TaskPrompt], prepared: Prepared, plan: Plan, config: EvalConfig
) -> dict[str, list[str]]:
    """The models' next lines for the validation commits: fine-tuned and base, with context and without
    (where the prompts carry it)."""
    tuned = "the fine-tuned model (validation lines)"
    with merged(model, plan.quantization):
        answers = answer_tasks(model, prepared.tokenizer, checks, config, plan.precision, tuned)
    with base_only(model):
        base = answer_tasks(model, prepared.tokenizer, checks, config, plan.precision, "the base model (validation lines)")  # fmt: skip
    named = {
        "model-context": answers.get("code_context"), "model": answers.get("code"),
        "base-context": base.get("code_context"), "base": base.get("code"),
    }  # fmt: skip
    return {name: outputs for name, outputs in named.items() if outputs}


def _code_winner(answers: dict[str, list[str]], asked: Sequence[TaskPrompt], default: str) -> dict[str, Any]:
    """`default`, or the system whose gain over it in the mean of exact match and edit similarity on
    `asked` (the validation lines) is highest among those whose 95% interval is above zero."""
    references, commits = [p.reference for p in asked], [p.commit for p in asked]
    validation = {}
    for name, outputs in answers.items():
        scored = score_code(outputs, references, commits)
        validation[name] = {key: scored[key] for key in ("exact_match_pct", "edit_similarity")}
    gains = {
        name: mean_gain(answers[default], outputs, references, commits)
        for name, outputs in answers.items()
        if name != default
    }
    beating = [name for name, gain in gains.items() if gain["mean_ci95"][0] > 0]
    best = max(beating, key=lambda name: gains[name]["mean"], default=None)
    closest = best or max(gains, key=lambda name: gains[name]["mean"], default=None)
    said = f"on {len(asked)} next lines of {len(set(commits))} validation commits"
    reason = (
        f"{best} beats {default} {said} beyond noise"
        if best
        else f"nothing beats {default} {said} beyond noise"
    )
    if closest:
        low, high = gains[closest]["mean_ci95"]
        reason += (
            f" ({closest} {gains[closest]['mean']:+.1f} [{low:+.1f}, {high:+.1f}] in the mean of EM and ES)"
        )
    return {
        "name": best or default, "reason": reason, "validation": validation, "validation_lines": len(asked),
        "validation_commits": len(set(commits)), "gain": gains[closest] if closest else None,
    }  # fmt: skip


def score_past(
    past: Past,
    prompts: Sequence[TaskPrompt],
    after: Scores | None,
    config: RetrievalConfig,
    seed: int,
    model_answers: Scores | None = None,
) -> PastScores:
    """The lookup's, the selector's and the suggestion system's messages for the held-out commits, and
    the system, chosen on the validation commits and the blocks of commits just older (`backtest`: each
    answered from commits older than all of it, never from a held-out one); the fine-tuned model, when
    it answered the validation commits (`model_answers`), against the best retrieval system there."""
    started = time.perf_counter()
    suggester = past.suggester
    asked = [p for p in prompts if p.task == "message"]
    places = past.older_than()
    lookup = [suggester.lookup(p.diff, places.get(p.commit, -1)) for p in asked]
    nearest = Scores(
        None, score_outputs(prompts, {"message": lookup}), {"message": lookup}, time.perf_counter() - started
    )
    selected = None
    if suggester.selector is not None:  # scored whichever system suggests: retrieval without the model
        started = time.perf_counter()
        picked = [suggester.select(p.diff, places.get(p.commit, -1)) for p in asked]
        selected = Scores(
            None,
            score_outputs(prompts, {"message": picked}),
            {"message": picked},
            time.perf_counter() - started,
        )
    system, chosen = _choose_system(past, config, seed, model_answers)
    outputs = {
        "lookup": lookup,
        "selector": selected.outputs["message"] if selected else lookup,
        "model": list((after.outputs if after else {}).get("message") or []),
    }[system]
    suggested = Scores(None, score_outputs(prompts, {"message": outputs}), {"message": outputs})
    return PastScores(nearest, selected, suggested, chosen)


def _choose_system(
    past: Past, config: RetrievalConfig, seed: int, model_answers: Scores | None
) -> tuple[str, dict[str, Any]]:
    """The system a run suggests with, and the scores that chose it: as configured, or the retrieval
    system (`_retrieval_system`: the selector, unless the lookup beats it beyond noise on the validation
    block and the blocks older than it), then the fine-tuned model instead where it beats that system
    on the validation commits (the only ones it answered) by more than the 95% interval of its gain."""

    blocks = backtest(past, config, seed) if config.system == "auto" else []
    both = [block for block in blocks if "selector" in block] or blocks
    means: dict[str, dict[str, float]] = {}
    for name in ("lookup", "selector"):
        scored = [score_messages(block[name], block["references"]) for block in both if name in block]
        if scored:
            means[name] = {
                key: round(sum(s[key] for s in scored) / len(scored), 2)
                for key in ("chrf", "edit_similarity")
            }
    facts = {
        "validation_commits": sum(block["commits"] for block in both),
        "blocks": len(both),
        "validation": means,
        "lookup_gain": None,
        "model_gain": None,
    }
    if config.system != "auto":
        return config.system, {"name": config.system, "reason": "set by retrieval.system", **facts}
    if not means:
        reason = "no validation commits to choose on (a short history): the lookup, which needs no choice"
        return "lookup", {"name": "lookup", "reason": reason, **facts}
    best, facts["lookup_gain"], reason = _retrieval_system(both, means)
    if model_answers and model_answers.outputs.get("message") and blocks:
        verdict, means["model"], facts["model_gain"], said = _model_against(
            blocks[0], best, model_answers.outputs["message"]
        )
        reason += said
        best = "model" if verdict else best
    return best, {"name": best, "reason": reason, **facts}


def _retrieval_system(
    blocks: list[dict[str, Any]], means: dict[str, dict[str, float]]
) -> tuple[str, dict[str, Any] | None, str]:
    """The selector, unless the lookup beats it on the older commits (`blocks`, pooled) by more than the
    95% interval of the lookup's gain in the mean of chrF and edit similarity; the lookup where no
    selector was learned. The gain (None without a selector) and what to say.

    A default, not the better mean: held out, the selector scored above the lookup in that mean on every
    repository measured, and where the two tie on the older commits the better mean there is a coin's
    toss that once chose the lookup where the selector was clearly better held out (docs/evaluation.md
    keeps the figures)."""
    listed = ", ".join(
        f"{n} chrF {means[n]['chrf']:.1f} / ES {means[n]['edit_similarity']:.1f}" for n in means
    )
    over = (
        f"over {len(blocks)} blocks of {blocks[0]['commits']} commits older than the held-out ones ({listed})"
    )
    if "selector" not in means:
        return "lookup", None, f"no selector (too few older commits to learn one): the lookup, {over}"
    pooled = lambda key: [answer for block in blocks for answer in block[key]]  # noqa: E731
    gain = mean_gain(pooled("selector"), pooled("lookup"), pooled("references"))
    low, high = gain["mean_ci95"]
    verdict = (
        "the lookup beats the selector"
        if low > 0
        else "the selector beats the lookup"
        if high < 0
        else "the lookup does not beat the selector"
    )
    reason = f"{verdict} beyond noise {over}: the lookup's gain in their mean {gain['mean']:+.1f} [{low:+.1f}, {high:+.1f}]"
    return "lookup" if low > 0 else "selector", gain, reason


def _model_against(
    block: dict[str, Any], retrieval: str, answers: list[str]
) -> tuple[bool, dict[str, float], dict[str, Any], str]:
    """Whether the fine-tuned model beats the `retrieval` system on the validation commits (`block`), its
    scores there, its gain in the mean of chrF and edit similarity with the interval, and what to say.
    Only a gain clear of its interval counts: on a validation block of a hundred commits a model that
    merely ties can come out ahead, and fine-tunes that did so lost to the selector on the held-out
    commits (docs/evaluation.md)."""
    theirs = block.get(retrieval) or block["lookup"]
    model = score_messages(answers, block["references"])
    other = score_messages(theirs, block["references"])
    gain = mean_gain(theirs, answers, block["references"])
    low, high = gain["mean_ci95"]
    verdict = low > 0
    unclear = ", within its 95% interval: a gain must clear it" if gain["mean"] > 0 and not verdict else ""
    said = (
        f"; on the validation commits the fine-tuned model (chrF {model['chrf']:.1f} / ES "
        f"{model['edit_similarity']:.1f}) {'beats' if verdict else 'does not beat'} the {retrieval} (chrF "
        f"{other['chrf']:.1f} / ES {other['edit_similarity']:.1f}): {gain['mean']:+.1f} "
        f"[{low:+.1f}, {high:+.1f}] in their mean{unclear}"
    )
    return verdict, {key: model[key] for key in ("chrf", "edit_similarity")}, gain, said


def base_scores_cache(config: EvalConfig, facts: ModelFacts, continuing: bool) -> Path | None:
    """Where the base model's scores are kept between runs; None when they cannot be reused: turned off,
    a random base (each run's is its own), or an update (its "before" is the adapter it continues)."""

    if not config.cache_base_scores or facts.random_init or continuing:
        return None
    return cache_home() / "evaluations"


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


def write_answers(path: Path, evaluation: Evaluation) -> Path:
    """Every held-out question with what git has and what each system answered (evaluation.jsonl)."""
    columns = {
        "base": evaluation.before,
        "fine_tuned": evaluation.after,
        "nearest_commit": evaluation.nearest_commit,
        "selector": evaluation.selector,
        "suggested": evaluation.suggested,
    }
    position = dict.fromkeys(TASKS, 0)
    lines = []
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
        lines.append(orjson.dumps(row))
    staging = path.with_name(path.name + ".partial")
    staging.write_bytes(b"\n".join(lines) + b"\n" if lines else b"")
    staging.replace(path)
    return path


def format_evaluation(result: Evaluation) -> list[str]:
    """Lines for the end of a run: held-out loss (per format), then each task as a scoreboard: base,
    fine-tuned, the lookup and the suggestion system, with intervals."""
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
    lines += _message_scoreboard(evaluation)
    code = code_scoreboard(tasks, evaluation.get("code_system"))
    if not code and (tasks.get("after") or {}).get("message"):
        code = [
            "next line: nothing to score (the held-out commits added no line of text past a file's second, "
            "notebooks aside); the model trained on the files and history the manifest counts"
        ]
    lines += code
    held = evaluation.get("held_out_commits") or {}
    if held.get("note"):
        lines.append(held["note"])
    return lines


def code_scoreboard(tasks: dict[str, Any], chosen: dict[str, Any] | None = None) -> list[str]:
    """The next-line tasks as a scoreboard (`tasks`: the manifest's `.evaluation.tasks`): every system's
    exact match and edit similarity with intervals, a model's gain over the base model given the same
    prompt, and over the lookup for code; the system `chosen` to write next lines at use marked, and why."""
    scored = {
        name: ((tasks.get(key) or {}).get(task), key, label)
        for name, (key, task, label) in CODE_LABELS.items()
    }
    present = [metrics for metrics, _, _ in scored.values() if metrics]
    if not present:
        return []
    first = present[0]
    lines = [
        f"next line at {first['samples']} lines {first.get('commits', '?')} held-out commits added (exact match %, "
        "edit similarity [95% interval, resampled by commit]):"
    ]
    for name, (metrics, system, label) in scored.items():
        if not metrics:
            continue
        label += " (chosen)" if chosen and chosen["name"] == name else ""
        line = f"  {label:<29} EM {with_interval(metrics, 'exact_match_pct', 5)}  ES {with_interval(metrics, 'edit_similarity', 5)}"
        for key, against in (("vs_before", "base"), ("vs_nearest_commit", "lookup")):
            if system == "after" and metrics.get(key):
                versus = metrics[key]
                line += f"  vs {against} {difference(versus, 'exact_match_pct')} / {difference(versus, 'edit_similarity')}"
        lines.append(line)
    if chosen:
        lines.append(f"  next lines come from the {CODE_LABELS[chosen['name']][2]}: {chosen['reason']}")
    return lines


def _message_scoreboard(evaluation: dict[str, Any]) -> list[str]:
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
            line += f"  vs lookup {difference(versus, 'chrf')} / {difference(versus, 'edit_similarity')}"
        lines.append(line)
    if system:
        lines.append(f"  suggestions come from the {system}: {evaluation['system']['reason']}")
    return lines + [f"  {said}" for said in registers(tasks)]

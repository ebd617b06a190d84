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
import time
from collections import Counter
from collections.abc import Sequence
from contextlib import suppress
from dataclasses import replace
from pathlib import Path
from typing import Any

import orjson

from pipeline.base_models import infills
from pipeline.builtin import cache_home
from pipeline.config import EvalConfig, RetrievalConfig
from pipeline.data.examples import render_prompt
from pipeline.evaluate.metrics import (
    BLOCK_TASKS,
    LINE_TASKS,
    SCORERS,
    TASKS,
    mean_gain,
    score_code,
    score_messages,
)
from pipeline.progress import Progress, say
from pipeline.scores import CODE_LABELS, DEFAULT_CODE_SYSTEM
from pipeline.suggest.completion import (
    BLOCK_TOKENS,
    LINE_TOKENS,
    CodeCase,
    CodeIndex,
    bare_prompt,
    context_prompt,
)
from pipeline.suggest.decoding import base_only, generate_batched, merged, tokens_read
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

# As the progress lines count them.
TASK_NAMES = {
    "message": "commit messages", "code": "next lines", "code_context": "next lines with context",
    "block": "blocks", "block_context": "blocks with context",
}  # fmt: skip
SHOWN_CHARS = 600  # a sample's prompt and reference as the manifest shows them
# Validation commits below which the systems that write a next line are not compared: an interval
# resampled from a handful of commits is narrow by chance (one commit gives a single point).
CODE_CHOICE_COMMITS = 10
# Bump when prompts, generation, the loss or scoring change: cached base-model scores are then not reused.
# 14: lines ending in CR LF are read as ending in LF; 13: a next line's context ends with its own file's chunk.
EVALUATION_FORMAT = 14


def task_prompts(
    commits: Sequence[PastCommit],
    tokenizer,
    style: TextStyle,
    count: int,
    prompt_tokens: int | None,
    cases: Sequence[CodeCase] = (),
    index: CodeIndex | None = None,
    blocks: Sequence[CodeCase] = (),
) -> tuple[TaskPrompt, ...]:
    """The tasks' questions about the newest `count` of `commits` (held-out commits, newest first): each
    one's message rendered as in training (a diff given as a prompt is cut to `prompt_tokens`; None:
    whole); the next line of `cases` and the body of `blocks` (theirs), alone and, given an `index` of
    the files at the split point, after the chunks it retrieves; where the tokenizer infills, with the
    lines after the cursor too."""
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
    infill = bool(cases or blocks) and infills(tokenizer)
    for (bare, contextual), asked in ((LINE_TASKS, cases), (BLOCK_TASKS, blocks)):
        given = [f"{case.path}\n{case.before[-SHOWN_CHARS:]}" for case in asked]
        prompts += [
            TaskPrompt(bare, c.commit, bare_prompt(c, infill), g, c.line)
            for c, g in zip(asked, given, strict=True)
        ]
        if index is not None:
            prompts += [
                TaskPrompt(contextual, c.commit, context_prompt(c, index.context(c), infill), g, c.line)
                for c, g in zip(asked, given, strict=True)
            ]
    return tuple(prompts)


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
    as `who` answering (minutes on a CPU). Tasks answered alike (the next line with and without context;
    a block so too) are decoded together: a step of a few more rows costs little more than one."""
    alike = ((("message",), config.message_tokens), (LINE_TASKS, LINE_TOKENS), (BLOCK_TASKS, BLOCK_TOKENS))
    asked = {task: [p.text for p in prompts if p.task == task] for task in TASKS}
    groups = [
        (
            tasks,
            max_tokens,
            [text for task in tasks for text in asked[task]],
            tasks == LINE_TASKS,
            tasks == BLOCK_TASKS,
        )
        for tasks, max_tokens in alike
    ]
    # The time left reckoned from tokens, not questions: the prompts are read shortest first, so the
    # questions counted early on made the time left a fraction of what it was.
    tokens = sum(tokens_read(tokenizer, together, line or block) for _, _, together, line, block in groups)
    outputs = {}
    with Progress(f"{who} answering", len(prompts), "question", tokens=tokens) as progress:
        for tasks, max_tokens, together, line, block in groups:
            answers = generate_batched(
                model, tokenizer, together, max_tokens, precision, progress=progress.update,
                cut_loops=tasks == ("message",), next_line=line, block=block,
            )  # fmt: skip
            for task in tasks:
                if asked[task]:
                    outputs[task], answers = answers[: len(asked[task])], answers[len(asked[task]) :]
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
    kept = kept_base_scores(path)
    if kept is not None:
        say(f"scoring the base model: read from {path} (the same model, questions and held-out blocks)")
        return kept
    scores = evaluate(model, held_out, prompts, plan, prepared, config, "the base model")
    if path is not None:
        return replace(scores, kept=keep_base_scores(path, scores))
    return scores


def kept_base_scores(path: Path | None) -> Scores | None:
    """What `keep_base_scores` wrote to `path`, as cached scores; None where nothing readable is there
    (the base model then answers again, and its answers are written anew)."""
    if path is None or not path.exists():
        return None
    try:
        saved = orjson.loads(path.read_bytes())
        return Scores(
            saved["loss"],
            saved["tasks"],
            saved["outputs"],
            0.0,
            cached=True,
            scored_in_s=saved.get("seconds"),
        )
    except (OSError, ValueError, KeyError):
        return None


def keep_base_scores(path: Path, scores: Scores) -> bool:
    """The base model's scores written whole to `path` for the next run (True); where the cache cannot be
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
        return False
    return True


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
    has no files to retrieve from), unless another of `scores.CODE_SYSTEMS` beats it on the validation commits'
    next lines (`evaluation.code_checks`, answered here) by more than the 95% interval of its gain in the
    mean of exact match and edit similarity, resampled by commit; where the plan has no model answer the
    validation commits, it stands unvalidated. `evaluation` with it (`code_system`)."""
    return replace(evaluation, code_system=_code_system(model, evaluation, prepared, plan, config))


def _code_system(
    model, evaluation: Evaluation, prepared: Prepared, plan: Plan, config: EvalConfig
) -> dict[str, Any]:
    checks = evaluation.code_checks
    retrieves = any(p.task == "code_context" for p in (*evaluation.prompts, *checks))  # the run has files
    default = DEFAULT_CODE_SYSTEM if retrieves else "model"
    unchosen = {
        "name": default,
        "validation": {},
        "validation_lines": 0,
        "validation_commits": 0,
        "gain": None,
    }
    what = f"the default, {CODE_LABELS[default][2]}" + (
        " (fine-tuning and retrieval add up)" if retrieves else " (no files to retrieve context from)"
    )
    if not plan.validate_model:
        return {
            **unchosen,
            "reason": f"not validated (eval.validate_model is off; the plan says why): {what}",
        }
    commits = len({p.commit for p in checks})
    if commits < CODE_CHOICE_COMMITS:
        reason = f"{commits} validation commits added lines to complete, too few to tell systems apart"
        return {**unchosen, "validation_commits": commits, "reason": f"{reason}: {what}"}
    started = time.perf_counter()
    answers = _answer_checks(model, checks, prepared, plan, config, evaluation.base_cache)
    if evaluation.code_checks_lookup:
        answers["lookup"] = evaluation.code_checks_lookup
    chosen = _code_winner(answers, [p for p in checks if p.task == "code"], default)
    say(f"chose who writes a next line in {time.perf_counter() - started:.0f} s: {chosen['name']}")
    return chosen


def _answer_checks(
    model,
    checks: Sequence[TaskPrompt],
    prepared: Prepared,
    plan: Plan,
    config: EvalConfig,
    cache: Path | None,
) -> dict[str, list[str]]:
    """The models' next lines for the validation commits: fine-tuned and base, with context and without
    (where the prompts carry it); the base model's kept in `cache` as its held-out scores are."""
    tuned = "the fine-tuned model (validation lines)"
    with merged(model, plan.quantization):
        answers = answer_tasks(model, prepared.tokenizer, checks, config, plan.precision, tuned)
    base = base_answers(model, checks, prepared, plan, config, cache)
    named = {
        "model-context": answers.get("code_context"), "model": answers.get("code"),
        "base-context": base.get("code_context"), "base": base.get("code"),
    }  # fmt: skip
    return {name: outputs for name, outputs in named.items() if outputs}


def base_answers(
    model,
    checks: Sequence[TaskPrompt],
    prepared: Prepared,
    plan: Plan,
    config: EvalConfig,
    cache: Path | None,
) -> dict[str, list[str]]:
    """The base model's answers to `checks`, read from `cache` where the same base model answered the same
    questions before (each run of a repository asks its validation lines again, and they are the base
    model's whatever the training), else answered and kept there (None: answered, not kept)."""
    path = cache / f"{base_scores_key(prepared, plan, config, {}, checks)}.json" if cache else None
    kept = kept_base_scores(path)
    if kept is not None:
        say(f"the base model (validation lines): read from {path} (the same model and questions)")
        return kept.outputs
    started = time.perf_counter()
    with base_only(model):
        outputs = answer_tasks(model, prepared.tokenizer, checks, config, plan.precision, "the base model (validation lines)")  # fmt: skip
    if path is not None:
        keep_base_scores(path, Scores(None, None, outputs, time.perf_counter() - started))
    return outputs


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
    toss that once chose the lookup where the selector was clearly better held out (docs/experiments.md
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
    commits (docs/experiments.md)."""
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

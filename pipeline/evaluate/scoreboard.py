"""The evaluation a run does, in two calls that each return the `Evaluation` so far.

`before_training` scores the base model (an update: the adapter it continues) on the held-out commits;
`after_training` scores the fine-tuned model on the same ones, beside what the repository's past offers
(the lookup, the selector and the system the run chooses, `pipeline.suggest`), says the scoreboard and
writes every answer. A new scored system is added here and in `pipeline.suggest`: the recipes take the
`Evaluation` as it comes, and the record writes it as `evaluation_report` shapes it.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from pipeline.config import Config, LoadedConfig
from pipeline.data.dataset import held_out_blocks
from pipeline.data.sources import completions_path, read_files
from pipeline.evaluate.evaluation import (
    base_scores_cache,
    choose_code_system,
    evaluate,
    evaluate_base,
    score_outputs,
    score_past,
    task_prompts,
    validation_answers,
)
from pipeline.evaluate.metrics import BLOCK_TASKS, LINE_TASKS
from pipeline.evaluate.report import answer_rows, format_evaluation, held_out_note, write_answers
from pipeline.manifest import EVALUATION_FILE
from pipeline.progress import say
from pipeline.suggest.completion import CodeCase, CodeIndex, cases_of, read_cases
from pipeline.types import Data, Evaluation, Loaded, Past, Step, TaskPrompt, TrainOutcome


def before_training(
    step: Step, model: Loaded, data: Data, past: Past | None, loaded: LoadedConfig
) -> Evaluation:
    """The base model's held-out loss and its answers to the held-out commits' questions (none without
    `past`: ranks that do not write ask none), read from an earlier run's where the same model answered
    the same questions on the same blocks."""
    config, prepared = loaded.config, data.prepared
    prompts: tuple[TaskPrompt, ...] = ()
    checks: tuple[TaskPrompt, ...] = ()
    lookup: list[str] = []
    block_lookup: list[str] = []
    checks_lookup: list[str] = []
    if past:
        commits = past.split("eval")[: data.plan.eval_samples]
        every = read_cases(completions_path(data.scraped))
        asked = [commit.sha for commit in commits]
        cases = spread(cases_of(every, "eval", asked), data.plan.code_cases)
        blocks = spread(cases_of(every, "eval", asked, "block"), data.plan.block_cases)
        files = read_files(data.scraped)
        index = CodeIndex(files) if files else None
        prompts = task_prompts(
            commits, prepared.tokenizer, prepared.style, len(commits), config.train.max_prompt_tokens, cases, index,
            blocks,
        )  # fmt: skip
        lookup = [index.lookup(case) for case in cases] if index else []
        block_lookup = [index.lookup(case, block=True) for case in blocks] if index else []
        if data.plan.validate_model:  # who writes a next line is chosen on these
            valid = [commit.sha for commit in past.split("valid")]
            checked = spread(cases_of(every, "valid", valid), data.plan.code_cases)
            checks = task_prompts([], prepared.tokenizer, prepared.style, 0, 0, checked, index)
            checks_lookup = [index.lookup(case) for case in checked] if index else []
    held_out = held_out_blocks(data.packed, data.plan.eval_blocks)
    cache = base_scores_cache(config.eval, data.prepared.facts, loaded.continues is not None)
    before = step(
        "evaluate_before", evaluate_base, model.model, held_out, prompts, data.plan, data.prepared, config.eval,
        cache,
    )  # fmt: skip
    return Evaluation(
        before, None, [], prompts, held_out=held_out, code_lookup=lookup, block_lookup=block_lookup,
        code_checks=checks, code_checks_lookup=checks_lookup, base_cache=cache,
    )  # fmt: skip


def spread(cases: list[CodeCase], most: int) -> list[CodeCase]:
    """At most `most` of `cases`, as many commits as they can cover: each commit's first case, newest commit
    first, then each one's second, and so on (a commit's lines are not independent: more commits, narrower
    intervals), in their order."""
    rank: dict[str, int] = {}
    ranked = []
    for place, case in enumerate(cases):
        rank[case.commit] = rank.get(case.commit, -1) + 1
        ranked.append((rank[case.commit], place))
    chosen = sorted(place for _, place in sorted(ranked)[:most])
    return [cases[place] for place in chosen]


def after_training(
    step: Step, model: Loaded, data: Data, outcome: TrainOutcome, past: Past | None, evaluation: Evaluation,
    config: Config, output_dir: Path | None,
) -> Evaluation:  # fmt: skip
    """`evaluation` with the fine-tuned model's loss and answers on the same questions, and (with `past`)
    the past's systems beside it and the one the run chooses; the scoreboard said, and every answer
    written to `output_dir`'s EVALUATION_FILE (None: a rank that writes nothing)."""
    after = step(
        "evaluate_after", evaluate, model.model, evaluation.held_out, evaluation.prompts, outcome.plan,
        data.prepared, config.eval, "the fine-tuned model",
    )  # fmt: skip
    evaluation = replace(evaluation, after=after, history=outcome.evaluations)
    if past:
        evaluation = against_the_past(step, model, data, outcome, past, evaluation, config)
    rows = answer_rows(evaluation)
    for line in format_evaluation(evaluation, rows):
        say(line)
    if output_dir is not None:
        write_answers(output_dir / EVALUATION_FILE, rows)
    return evaluation


def against_the_past(
    step: Step, model: Loaded, data: Data, outcome: TrainOutcome, past: Past, evaluation: Evaluation,
    config: Config,
) -> Evaluation:  # fmt: skip
    """The fine-tuned model's answers to the validation commits (where the plan asks), the lookup's and the
    selector's scores beside it, and the system the run chooses, with the scores that chose it."""
    answers = None
    if data.plan.validate_model:
        answers = step(
            "evaluate_validation", validation_answers, model.model, past, data.prepared, outcome.plan,
            config.eval, config.train.max_prompt_tokens,
        )  # fmt: skip
    scored = step(
        "evaluate_past", score_past, past, evaluation.prompts, evaluation.after, config.retrieval,
        outcome.plan.seed, answers,
    )  # fmt: skip
    evaluation = step(
        "evaluate_code_validation", choose_code_system, model.model, evaluation, data.prepared, outcome.plan,
        config.eval,
    )  # fmt: skip
    note = held_out_note(len(past.split("eval")), data.plan.eval_samples, data.scraped.summary)
    nearest = scored.nearest_commit
    if (
        evaluation.code_lookup or evaluation.block_lookup
    ):  # it answers with context and without: it reads no prompt
        lines, bodies = evaluation.code_lookup, evaluation.block_lookup
        outputs = {
            **nearest.outputs,
            **dict.fromkeys(LINE_TASKS, lines),
            **dict.fromkeys(BLOCK_TASKS, bodies),
        }
        outputs = {task: answers for task, answers in outputs.items() if answers}
        nearest = replace(nearest, outputs=outputs, tasks=score_outputs(evaluation.prompts, outputs))
    return replace(
        evaluation, nearest_commit=nearest, selector=scored.selector, suggested=scored.suggested,
        system=scored.system, held_out_commits=note, model_validation=answers,
    )  # fmt: skip

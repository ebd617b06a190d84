"""The adapter's model card (`adapter/README.md`), written from the run's manifest.

It follows the Hub's conventions for peft adapters: YAML metadata (`base_model` as a hub id, never a
local path; `base_model_relation: adapter`, `library_name: peft`, `pipeline_tag`, tags, and a
`model-index` with the held-out scores of the fine-tuned model, the base model and the lookup), then
what it was trained on, how, what it scored, how to load it and its limits. Nothing in it names a
local path: a card travels with the adapter.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from pipeline.base_models import TINY
from pipeline.builtin import BUILTIN_MODELS
from pipeline.scores import difference, with_interval

TAGS = ["repotune", "peft", "lora", "commit-message-generation", "code"]
SYSTEM_NAMES = {
    "before": "base model",
    "after": "fine-tuned model",
    "nearest_commit": "lookup (nearest past commit)",
    "selector": "selector (retrieval, no model)",
    "suggested": "suggested (the run's system)",
}
_REMOTE = re.compile(r"^(?:https?|ssh|git)://[^\s]+$|^[\w.-]+@[\w.-]+:[^\s]+$")


def base_model_id(name: str) -> str | None:
    """The Hub id of the base model, or None where it has none (`tiny`, a local directory)."""

    if name in BUILTIN_MODELS:
        return BUILTIN_MODELS[name].hub_id
    if name == TINY or Path(name).expanduser().exists() or name.startswith(("/", ".", "~")):
        return None
    return name if re.fullmatch(r"[\w.-]+/[\w.-]+", name) else None


def model_card(manifest: dict[str, Any]) -> str:
    """The card's text: metadata, then the body."""
    from huggingface_hub import ModelCardData

    model = manifest.get("model") or {}
    base = base_model_id(model.get("name", ""))
    names = [repo.get("name", "?") for repo in (manifest.get("scrape") or {}).get("per_repository", [])]
    data = ModelCardData(
        base_model=base,
        library_name="peft",
        pipeline_tag="text-generation",
        tags=TAGS,
        model_name=f"repotune-{'-'.join(names) or 'adapter'}",
        eval_results=_eval_results(manifest, names) or None,
        base_model_relation="adapter" if base else None,
    )
    return f"---\n{data.to_yaml()}\n---\n\n" + "\n".join(_body(manifest, names, base)) + "\n"


def _eval_results(manifest: dict[str, Any], names: list[str]) -> list:
    from huggingface_hub import EvalResult

    evaluation = (manifest.get("training_report") or {}).get("evaluation") or {}
    tasks, scored = evaluation.get("tasks") or {}, (evaluation.get("held_out_commits") or {}).get("scored")
    results = []
    for system in ("after", "before", "nearest_commit", "suggested"):
        message = (tasks.get(system) or {}).get("message")
        if not message:
            continue
        for metric, label in (("chrf", "chrF"), ("edit_similarity", "edit similarity")):
            results.append(
                EvalResult(
                    task_type="text-generation",
                    task_name="Commit message generation",
                    dataset_type="git-history",
                    dataset_name=f"{', '.join(names)}: {scored or message['samples']} newest commits, held out",
                    metric_type=metric,
                    metric_name=f"{label}, {SYSTEM_NAMES[system]}",
                    metric_value=message[metric],
                )
            )
    return results


def _body(manifest: dict[str, Any], names: list[str], base: str | None) -> list[str]:
    model = manifest.get("model") or {}
    params = manifest.get("training_parameters") or {}
    lora = ((manifest.get("config") or {}).get("effective") or {}).get("lora") or {}
    described = (
        base
        or (model.get("source") or {}).get("description")
        or ("a randomly initialised tiny model" if model.get("random_init") else "a local model")
    )
    targets = lora.get("target_modules", "?")
    targets = "all linear layers" if targets == "all-linear" else _listed(targets)
    lines = [
        f"# {', '.join(names) or 'repository'}: a repotune adapter",
        "",
        f"A LoRA adapter (rank {lora.get('r', '?')}, alpha {lora.get('alpha', '?')}, on "
        f"{targets}) for {described}, trained by "
        "repotune on a git repository's own history: it writes commit messages "
        "for diffs, and changes for commit messages, in the repository's style.",
    ]
    if (model.get("source") or {}).get("file", "").endswith(".gguf"):
        lines += [
            "",
            f"The base weights are the built-in copy that `{model['source'].get('package')}` ships: "
            f"{model['source'].get('file')}, a 4-bit (Q4_1) GGUF dequantized to fp32. The adapter was "
            "trained against those weights; on the Hub's full-precision weights it answers a little "
            "differently.",
        ]
    lines += ["", *_data(manifest, params), "", *_training(params, manifest), "", *_evaluation(manifest)]
    lines += ["", *_use(base, params), "", *_limits(manifest, params)]
    return lines


def _data(manifest: dict[str, Any], params: dict[str, Any]) -> list[str]:
    scrape = manifest.get("scrape") or {}
    dataset = manifest.get("dataset") or {}
    rows = []
    for repo, described in zip(
        scrape.get("per_repository", []), manifest.get("repositories") or [], strict=False
    ):
        remote = described.get("remote_url") or ""
        where = f" ({remote})" if _REMOTE.match(remote) else ""
        rows.append(f"| repository | {repo.get('name')}{where} at {str(repo.get('head', ''))[:12]} |")
        rows.append(
            f"| split by time | {repo.get('train_commits')} training, {repo.get('valid_commits')} validation, "
            f"{repo.get('eval_commits')} newest held out (never trained on) |"
        )
    config = ((manifest.get("config") or {}).get("effective") or {}).get("scrape") or {}
    if config:
        bounds = ", ".join(
            f"{key} {config[key]}" for key in ("rev", "since", "until", "max_commits") if config.get(key)
        )
        rows.append(f"| revisions | {bounds or 'HEAD'} |")
    skipped = ", ".join(f"{key} {value}" for key, value in sorted((scrape.get("skipped") or {}).items()))
    rows.append(
        f"| commits | {scrape.get('commits_seen')} read, {scrape.get('commits_kept')} kept"
        f"{f' (left out: {skipped})' if skipped else ''} |"
    )
    redactions = scrape.get("redactions") or {}
    rows.append(
        f"| secrets removed | {sum(redactions.values())}"
        f"{' (' + ', '.join(f'{k} {v}' for k, v in sorted(redactions.items())) + ')' if redactions else ''} |"
    )
    left = dataset.get("left_out")
    trained = f"{params.get('train_sequences')} of {dataset.get('train_sequences')} training sequences"
    if left:
        trained += (
            f" (the newest; the {left.get('sequences')} older ones left out by the {left.get('reason')})"
        )
    if dataset.get("files_sequences"):
        at = ", ".join(str(commit)[:12] for commit in ((scrape.get("files") or {}).get("at") or {}).values())
        trained += (
            f", and {params.get('train_files')} of the {dataset['files_sequences']} files as they stood at {at} "
            "(before every held-out commit; the most recently changed first)"
        )
    rows.append(f"| trained on | {trained} |")
    lineage = manifest.get("lineage")
    if lineage:
        added = lineage.get("commits_added") or []
        rows.append(
            f"| continued | an earlier adapter (trained up to {str(lineage.get('old_head'))[:12]}), on the "
            f"{len(added)} commits made since |"
        )
    return ["## Data", "", "| | |", "|---|---|", *rows]


def _training(params: dict[str, Any], manifest: dict[str, Any]) -> list[str]:
    training = (manifest.get("training_report") or {}).get("training") or {}
    kept = training.get("kept") or {}
    rows = [
        f"| device | {params.get('device')} × {params.get('world_size')}, {params.get('precision')} |",
        f"| steps | {training.get('global_step')} of {params.get('total_steps')} planned, "
        f"{round(training.get('train_runtime_s') or 0)} s |",
        f"| batch | {params.get('effective_batch_size')} (micro-batch {params.get('batch_size')} × "
        f"accumulation {params.get('gradient_accumulation_steps')}) |",
        f"| learning rate | {params.get('learning_rate')}, {params.get('lr_scheduler')}, "
        f"{params.get('warmup_steps')} warmup steps |",
        f"| sequence length | {params.get('sequence_length')} tokens, {params.get('style')} style, loss on "
        f"{params.get('loss_on')} |",
    ]
    if kept:
        stopped = kept.get("stopped_early")
        which = (
            f"the best: validation loss {kept['validation_loss']:.4f}, where the last step, "
            f"{kept['last_step']}, had {kept['last_validation_loss']:.4f}"
            if kept.get("kept") == "best"
            else f"the last, and the best: validation loss {kept['validation_loss']:.4f}"
        )
        rows.append(
            f"| weights kept | step {kept.get('step')} ({which}){'; stopped early: ' + stopped['reason'] if stopped else ''} |"
        )
    return [
        "## Training",
        "",
        "Every parameter was planned for the machine by repotune, each with its reason (in the run's "
        "MANIFEST.json, `.training_parameters.decisions`).",
        "",
        "| | |",
        "|---|---|",
        *rows,
    ]


def _evaluation(manifest: dict[str, Any]) -> list[str]:
    evaluation = (manifest.get("training_report") or {}).get("evaluation") or {}
    tasks = evaluation.get("tasks") or {}
    rows = []
    for system, label in SYSTEM_NAMES.items():
        message = (tasks.get(system) or {}).get("message")
        if message:
            rows.append(
                f"| {label} | {with_interval(message, 'chrf')} | {with_interval(message, 'edit_similarity')} "
                f"| {_difference(message.get('vs_nearest_commit'))} |"
            )
    if not rows:
        return [
            "## Evaluation",
            "",
            "No held-out commits were scored (a history too short to hold some out).",
        ]
    scored = (evaluation.get("held_out_commits") or {}).get("scored")
    lines = [
        "## Evaluation",
        "",
        f"Commit message from its diff on the {scored} newest commits, held out (never trained on, never "
        "retrieved from), with 95% bootstrap intervals; the last column is the paired difference to the "
        "lookup (the message of the most similar earlier commit, no model) in chrF / edit similarity.",
        "",
        "| system | chrF | edit similarity | vs lookup |",
        "|---|---|---|---|",
        *rows,
    ]
    chosen = evaluation.get("system") or {}
    if chosen:
        lines += ["", f"Suggestions come from the **{chosen.get('name')}**: {chosen.get('reason')}."]
    before, after = evaluation.get("before") or {}, evaluation.get("after") or {}
    if before.get("perplexity") and after.get("perplexity"):
        lines += [
            "",
            f"Held-out perplexity {before['perplexity']:.2f} → {after['perplexity']:.2f}.",
        ]
    return lines


def _use(base: str | None, params: dict[str, Any]) -> list[str]:
    loading = (
        [
            "```python",
            "from peft import PeftModel",
            "from transformers import AutoModelForCausalLM, AutoTokenizer",
            "",
            f'base = AutoModelForCausalLM.from_pretrained("{base}")',
            'model = PeftModel.from_pretrained(base, "adapter")  # this folder',
            'tokenizer = AutoTokenizer.from_pretrained("adapter")',
            "```",
        ]
        if base
        else ["Its base has no Hub id (a random or local model): load it with repotune, as below."]
    )
    return [
        "## Use",
        "",
        *loading,
        "",
        "With repotune (the repository's past, in `retrieval/`, answers where the run chose it):",
        "",
        "```sh",
        "git diff --cached --no-ext-diff | repotune generate --adapter adapter --task message --prompt -",
        "repotune export --adapter adapter --output model.gguf   # llama.cpp, Ollama",
        "repotune hook install --repo . --adapter adapter        # suggestions in git commit",
        "```",
    ]


def _limits(manifest: dict[str, Any], params: dict[str, Any]) -> list[str]:
    budget = params.get("time_budget_s")
    lines = [
        "## Limits",
        "",
        "- It knows the repository up to the commit it was trained at; `repotune update` "
        "continues it on newer commits.",
        "- Secrets were removed by pattern (keys, tokens, passwords in URLs and assignments) before "
        "training; a secret in a form no pattern knows may remain.",
        "- The training data is the repository's code and messages: their license applies to what the "
        "model reproduces.",
    ]
    if budget:
        lines.append(
            f"- Trained for at most {round(budget / 60)} minutes: on the newest commits that fit, not the "
            "whole history (a longer budget or a GPU trains more of it)."
        )
    tasks = ((manifest.get("training_report") or {}).get("evaluation") or {}).get("tasks") or {}
    versus = ((tasks.get("after") or {}).get("message") or {}).get("vs_nearest_commit")
    if versus:
        lines.append(
            f"- The fine-tuned model's own messages against the lookup: {_difference(versus)} "
            "(chrF / edit similarity); a difference whose interval holds 0 is noise."
        )
    return lines


def _difference(versus: dict[str, Any] | None) -> str:
    if not versus:
        return "–"
    parts = []
    for metric in ("chrf", "edit_similarity"):
        if versus.get(metric) is not None:
            parts.append(difference(versus, metric))
    return " / ".join(parts) or "–"


def _listed(value: Any) -> str:
    return ", ".join(value) if isinstance(value, list) else str(value)

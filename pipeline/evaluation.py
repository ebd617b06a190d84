"""Did the model learn the repository? Held-out loss before and after, and sample generations.

The held-out split is the newest commits, never trained on. Each sample
prompts the model with a held-out commit's message (as the `diff` format
writes it) and records the start of the diff it writes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pipeline.dataset import read_sequences
from pipeline.trainer import perplexity

DIFF_START = "\n\ndiff --git "


def evaluate_loss(trainer, dataset) -> dict[str, Any] | None:
    """Mean loss and perplexity on the held-out blocks, or None without held-out data."""
    if dataset is None or len(dataset) == 0:
        return None
    loss = trainer.evaluate(dataset)["eval_loss"]
    return {"loss": round(loss, 6), "perplexity": perplexity(loss), "blocks": len(dataset)}


def generation_prompts(sequences_path: Path, count: int) -> list[dict[str, str]]:
    """Up to `count` held-out commits: their message as a prompt, and what git actually changed."""
    prompts = []
    for record in read_sequences(sequences_path):
        if record["split"] != "eval" or record["format"] != "diff" or DIFF_START not in record["text"]:
            continue
        message, _, diff = record["text"].partition(DIFF_START)
        prompts.append(
            {"commit": record["commit"], "prompt": message + "\n\n", "reference": "diff --git " + diff[:400]}
        )
        if len(prompts) == count:
            break
    return prompts


def sample_generations(
    model, tokenizer, prompts: list[dict[str, str]], max_new_tokens: int
) -> list[dict[str, str]]:
    """Each prompt with the model's greedy continuation."""
    from pipeline.model import continue_text

    was_training = model.training
    model.eval()
    samples = [
        {**prompt, "output": continue_text(model, tokenizer, prompt["prompt"], max_new_tokens)}
        for prompt in prompts
    ]
    model.train(was_training)
    return samples


def evaluation_report(
    before, after, samples_before, samples_after, history, note: str | None
) -> dict[str, Any]:
    change = None
    if before and after and before["loss"]:
        change = round((after["loss"] - before["loss"]) / before["loss"], 6)
    return {
        "before": before,
        "after": after,
        "relative_change": change,
        "history": history,
        "samples": {"before": samples_before, "after": samples_after},
        "note": note,
    }

"""The loss maths every stage that scores a model shares: training (`per_answer_loss` on the answers'
logits), the held-out evaluation (`held_out_loss`) and the speed probe. Only positions whose label is
learned get vocabulary-wide logits: most of a chat block is prompt."""

from __future__ import annotations

import math
import statistics
import time
from typing import Any

import torch

from pipeline.train.model import causal_lm, scoring


def sequence_ids(position_ids):
    """For each target position (1 onwards) of packed blocks, which sequence of the micro-batch it
    belongs to: a new one wherever the position ids restart."""
    starts = position_ids.eq(0)
    starts[:, 0] = True
    return starts.flatten().cumsum(0).view_as(position_ids)[:, 1:] - 1


def answer_logits(model, inputs):
    """Logits only where a label is learned, with their targets and sequence ids: the decoder's
    hidden states at those positions through the output layer. Most of a chat block is prompt, whose
    logits (vocabulary-wide, in fp32 for the loss) nothing uses."""
    causal = causal_lm(model)
    hidden = causal.get_decoder()(
        input_ids=inputs["input_ids"], position_ids=inputs["position_ids"]
    ).last_hidden_state
    target = inputs["labels"][:, 1:]
    learned = target.ne(-100)
    logits = causal.get_output_embeddings()(hidden[:, :-1][learned])
    return logits, target[learned], sequence_ids(inputs["position_ids"])[learned]


def per_answer_loss(logits, targets, sequences):
    """Cross-entropy averaged over each packed sequence's learned tokens, then over sequences: every
    answer counts once, so a 20-token commit message weighs as much as a 700-token change.
    `logits` [N, vocabulary], `targets` and `sequences` [N]: the learned positions only."""
    if not len(targets):
        return logits.sum() * 0.0  # nothing to learn in this micro-batch (a prompt cut across blocks)
    losses = torch.nn.functional.cross_entropy(logits.float(), targets, reduction="none")
    tokens = torch.zeros(int(sequences.max()) + 1, device=logits.device).index_add_(
        0, sequences, torch.ones_like(losses)
    )
    sums = torch.zeros_like(tokens).index_add_(0, sequences, losses)
    answered = tokens > 0
    return (sums[answered] / tokens[answered]).mean()


def held_out_loss(model, splits: dict[str, Any], batch_size: int, precision: str) -> dict[str, Any] | None:
    """Token-weighted held-out loss over every format's blocks (and per format), with the standard
    error of the mean over blocks; None without held-out data."""
    if not splits:
        return None
    started = time.perf_counter()
    device = next(model.parameters()).device
    per_format: dict[str, Any] = {}
    block_losses: list[float] = []
    total_loss = total_tokens = 0.0
    with scoring(model, precision):
        for name, dataset in splits.items():
            loss_sum = tokens = 0.0
            for start in range(0, len(dataset), batch_size):
                rows = [dataset[i] for i in range(start, min(len(dataset), start + batch_size))]
                batch = {key: torch.stack([row[key] for row in rows]).to(device) for key in rows[0]}
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
                "loss": rounded(loss),
                "perplexity": perplexity(loss),
                "blocks": len(dataset),
                "tokens": int(tokens),
            }
            total_loss += loss_sum
            total_tokens += tokens
    loss = total_loss / total_tokens if total_tokens else None
    return {
        "loss": rounded(loss),
        "perplexity": perplexity(loss),
        "loss_stderr": rounded(_stderr(block_losses)),
        "blocks": sum(len(dataset) for dataset in splits.values()),
        "tokens": int(total_tokens),
        "per_format": per_format,
        "seconds": round(time.perf_counter() - started, 3),
    }


def _stderr(values: list[float]) -> float | None:
    return statistics.stdev(values) / math.sqrt(len(values)) if len(values) >= 2 else None


def rounded(value: float | None) -> float | None:
    """A loss as the manifest keeps it: 6 decimals, None when not finite."""
    return None if value is None or not math.isfinite(value) else round(value, 6)


def perplexity(loss: float | None) -> float | None:
    """exp(loss), None where it is not a number a manifest can hold."""
    if loss is None or not math.isfinite(loss) or loss > 700:  # exp() overflows a double past ~709
        return None
    return round(math.exp(loss), 4)

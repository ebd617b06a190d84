"""Attention over packed blocks on a CPU: causal attention once per packed sequence.

For restarting position ids (and no mask) transformers builds a block-diagonal boolean mask and
hands it to SDPA. With a mask, PyTorch's CPU kernel scores every query of the block against every
key (1024² per head and layer) and then throws most of them away. `segments` instead attends within
each packed sequence: the same result (every token attends to the earlier tokens of its own sequence,
and to nothing else), with the work of the sequences alone and no mask to build.

Within a sequence, PyTorch's fused CPU kernel is slow for short ones, so up to `COMPOSED_MAX` tokens
the attention is composed of two matmuls and a softmax, which is faster there; longer sequences take
the fused kernel, which wins beyond it (docs/development.md, measurements). While generating, a new token attends over the KV cache
with two matmuls (`_next_token`); a padded prompt goes to transformers' own SDPA.

Importing this module registers the implementation under `SEGMENTS` with transformers.
"""

from __future__ import annotations

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import repeat_kv, sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

SEGMENTS = "segments"
COMPOSED_MAX = 512  # longest sequence attended with matmuls; the fused kernel is faster above ~768
_FUTURE: dict[tuple, torch.Tensor] = {}  # per device and dtype: -inf above the diagonal, 0 elsewhere


def segments_attention(
    module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None, position_ids=None, **kwargs
):
    """`query` [batch, heads, tokens, dim], `key`/`value` [batch, kv heads, tokens, dim]; returns the
    attention output as [batch, tokens, heads, dim], as transformers' attention functions do."""
    scale = query.shape[-1] ** -0.5 if scaling is None else scaling
    if query.shape[2] == 1 and not dropout:
        return _next_token(query, key, value, attention_mask, scale), None
    if attention_mask is not None or position_ids is None or query.shape[2] != key.shape[2]:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    groups = query.shape[1] // key.shape[1]
    key, value = repeat_kv(key, groups), repeat_kv(value, groups)
    rows = []
    # unbind and split (not indexing) so the backward pass concatenates gradients instead of zero-filling
    for q, k, v, positions in zip(
        query.unbind(0), key.unbind(0), value.unbind(0), position_ids.expand(query.shape[0], -1), strict=True
    ):
        lengths = _lengths(positions)
        pieces = [
            _causal(*parts, scale, dropout)
            for parts in zip(q.split(lengths, 1), k.split(lengths, 1), v.split(lengths, 1), strict=True)
        ]
        rows.append(torch.cat(pieces, dim=1))
    return torch.stack(rows).transpose(1, 2).contiguous(), None


def _next_token(query, key, value, mask, scale: float):
    """One new token's attention over the KV cache while generating (`mask` [batch, 1, 1, keys], True
    where it may attend; None when nothing is padded). transformers' SDPA call for it costs twice these
    two matmuls when nothing is padded (docs/experiments.md, the decoding). Each group of query heads shares its key head as one batched
    matrix, without copies of the cache."""
    batch, heads, _, dim = query.shape
    grouped = query.reshape(batch, key.shape[1], heads // key.shape[1], dim)
    scores = torch.matmul(grouped, key.transpose(-1, -2)) * scale
    if mask is not None:
        # the lowest finite score, not -inf: a row that masks every key must not give NaN
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(value.dtype)
    return torch.matmul(weights, value).view(batch, 1, heads, dim)


def _lengths(positions: torch.Tensor) -> list[int]:
    """The packed sequences' lengths: a new one wherever the position ids restart at 0."""
    starts = (positions == 0).nonzero().flatten().tolist()
    if not starts or starts[0] != 0:
        starts.insert(0, 0)
    ends = [*starts[1:], len(positions)]
    return [end - start for start, end in zip(starts, ends, strict=True)]


def _causal(query, key, value, scale: float, dropout: float):
    """Causal attention within one sequence: [heads, tokens, dim] each."""
    length = query.shape[1]
    if length > COMPOSED_MAX or dropout:
        return torch.nn.functional.scaled_dot_product_attention(
            query[None], key[None], value[None], dropout_p=dropout, is_causal=True, scale=scale
        )[0]
    future = _FUTURE.get((query.device, query.dtype))
    if future is None or len(future) < length:
        future = _FUTURE[(query.device, query.dtype)] = torch.zeros(
            COMPOSED_MAX, COMPOSED_MAX, dtype=query.dtype, device=query.device
        ).masked_fill(
            torch.ones(COMPOSED_MAX, COMPOSED_MAX, dtype=torch.bool, device=query.device).triu(1),
            float("-inf"),
        )
    # Scaled scores with the future masked in one call; the softmax in the scores' dtype (its sums are
    # accumulated in fp32 either way), as fused attention kernels keep the weights for the second matmul.
    scores = torch.baddbmm(future[:length, :length], query, key.transpose(-1, -2), alpha=scale)
    return torch.matmul(torch.softmax(scores, dim=-1), value)


def segments_mask(*args, attention_mask=None, **kwargs):
    """No mask for packed blocks (the attention finds the sequences from the position ids); SDPA's
    mask whenever a padding mask is given (generation)."""
    if attention_mask is None:
        return None
    return sdpa_mask(*args, attention_mask=attention_mask, **kwargs)


AttentionInterface.register(SEGMENTS, segments_attention)
AttentionMaskInterface.register(SEGMENTS, segments_mask)

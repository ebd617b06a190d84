"""Attention over packed blocks: PyTorch's causal SDPA kernel once per packed sequence.

For restarting position ids (and no mask) transformers builds a block-diagonal boolean mask and
hands it to SDPA. With a mask, PyTorch's CPU kernel scores every query of the block against every
key (1024² per head and layer) and then throws most of them away. `sdpa_segments` instead calls the
causal kernel on each packed sequence: the same result (every token attends to the earlier tokens
of its own sequence, and to nothing else), with the work of the sequences alone, and no mask to
build. Anything else (a KV cache, a padding mask: generation) goes to transformers' own SDPA.

Importing this module registers the implementation under `SEGMENTS` with transformers.
"""

from __future__ import annotations

import itertools

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import repeat_kv, sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

SEGMENTS = "sdpa_segments"


def segments_attention(
    module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None, position_ids=None, **kwargs
):
    """`query` [batch, heads, tokens, dim], `key`/`value` [batch, kv heads, tokens, dim]; returns the
    attention output as [batch, tokens, heads, dim], as transformers' attention functions do."""
    if attention_mask is not None or position_ids is None or query.shape[2] != key.shape[2]:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    groups = query.shape[1] // key.shape[1]
    key, value = repeat_kv(key, groups), repeat_kv(value, groups)
    position_ids = position_ids.expand(query.shape[0], -1)
    rows = []
    for row in range(query.shape[0]):
        starts = [*(position_ids[row] == 0).nonzero().flatten().tolist(), query.shape[2]]
        if starts[0] != 0:
            starts.insert(0, 0)
        pieces = [
            torch.nn.functional.scaled_dot_product_attention(
                query[row : row + 1, :, start:end],
                key[row : row + 1, :, start:end],
                value[row : row + 1, :, start:end],
                dropout_p=dropout,  # the model passes 0 outside training
                is_causal=True,
                scale=scaling,
            )
            for start, end in itertools.pairwise(starts)
        ]
        rows.append(torch.cat(pieces, dim=2))
    return torch.cat(rows).transpose(1, 2).contiguous(), None


def segments_mask(*args, attention_mask=None, **kwargs):
    """No mask for packed blocks (the attention finds the sequences from the position ids); SDPA's
    mask whenever a padding mask is given (generation)."""
    if attention_mask is None:
        return None
    return sdpa_mask(*args, attention_mask=attention_mask, **kwargs)


AttentionInterface.register(SEGMENTS, segments_attention)
AttentionMaskInterface.register(SEGMENTS, segments_mask)

"""Packing: no token lost, none attends across sequences, and the planner's count is exact."""

from __future__ import annotations

import itertools
from collections import Counter

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.data.dataset import pack_arrays
from pipeline.data.packing import IGNORE_INDEX, count_blocks, layout
from pipeline.types import DataStats


def pack(token_lists, block_size, pad_id=0, truncate_at=None):
    """The real packer, fed an Arrow split as the token cache stores it."""
    import pyarrow as pa

    arrays, real_tokens = pack_arrays(pa.table({"input_ids": token_lists}), block_size, pad_id, truncate_at)
    return {name: array.tolist() for name, array in arrays.items()}, real_tokens


def segments_of(packed) -> list[tuple[int, ...]]:
    """The packed sequences (or pieces) as the position ids delimit them, sorted; padding left out."""
    segments = []
    for ids, positions in zip(packed["input_ids"], packed["position_ids"], strict=True):
        for token, position in zip(ids, positions, strict=True):
            if position == 0:
                segments.append([])
            segments[-1].append(token)
    return sorted(tuple(s) for s in segments if any(s))


sequences = st.lists(st.lists(st.integers(1, 99), min_size=1, max_size=300), min_size=1, max_size=60)


@settings(max_examples=200, deadline=None)
@given(token_lists=sequences, block_size=st.sampled_from([8, 16, 64, 128]))
def test_every_token_lands_once_and_positions_restart_per_sequence(token_lists, block_size):
    packed, real_tokens = pack(token_lists, block_size)
    assert len(packed["input_ids"]) == count_blocks(Counter(len(t) for t in token_lists), block_size)
    assert all(len(block) == block_size for block in packed["input_ids"])
    assert real_tokens == sum(len(t) for t in token_lists)
    # The segments rebuilt from the position ids must be exactly the sequences' pieces.
    pieces = sorted(tuple(t[i : i + block_size]) for t in token_lists for i in range(0, len(t), block_size))
    assert segments_of(packed) == pieces
    # The first token of every segment is never a training target (it would be predicted from another sequence).
    for positions, labels in zip(packed["position_ids"], packed["labels"], strict=True):
        assert all(
            label == IGNORE_INDEX for position, label in zip(positions, labels, strict=True) if position == 0
        )


@settings(max_examples=100, deadline=None)
@given(token_lists=sequences, block_size=st.sampled_from([8, 16, 64]), share=st.sampled_from([1, 2, 4]))
def test_truncation_keeps_each_sequence_start_once_and_the_planner_counts_it(token_lists, block_size, share):
    cut_at = block_size // share
    packed, real_tokens = pack(token_lists, block_size, truncate_at=cut_at)
    cut = [t[:cut_at] for t in token_lists]
    stats = DataStats.from_lengths(len(t) for t in token_lists).truncated(cut_at)
    assert len(packed["input_ids"]) == count_blocks(stats.length_counts, block_size)
    assert real_tokens == sum(len(t) for t in cut) == stats.tokens
    assert segments_of(packed) == sorted(tuple(t) for t in cut)


def test_best_fit_fills_blocks():
    packed, real_tokens = pack([[1] * 60, [2] * 4, [3] * 30, [4] * 34], block_size=64)
    assert len(packed["input_ids"]) == 2
    assert real_tokens == 2 * 64  # no padding at all


def tiny_model(attention: str, **config):
    """A two-layer Llama built as training builds it, attending with `attention`."""
    from transformers import LlamaConfig

    from pipeline.train.model import build_model

    shape = LlamaConfig(
        vocab_size=50,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        **config,
    )
    return build_model("tiny", shape, seed=0, attn_implementation=attention)


@pytest.mark.parametrize("attention", ["sdpa", "eager", "segments", "segments, fused kernel"])
def test_no_attention_across_packed_sequences(attention, monkeypatch):
    """The same sequence gives the same logits alone or packed after another one, with the model built
    and called as training builds and calls it (no `use_cache` argument: the Trainer passes none)."""
    if attention == "segments, fused kernel":  # sequences longer than COMPOSED_MAX
        attention = "segments"
        monkeypatch.setattr("pipeline.train.attention.COMPOSED_MAX", 4)

    model = tiny_model(attention, num_key_value_heads=2).eval()
    first, second, third = [5, 6, 7, 8, 9], [11, 12, 13], [21, 22, 23, 24, 25, 26, 27]
    packed, _ = pack([first, second, third], block_size=8)
    ids, positions = torch.tensor(packed["input_ids"]), torch.tensor(packed["position_ids"])
    with torch.no_grad():
        together = model(input_ids=ids, position_ids=positions).logits
        for row, block in enumerate(packed["position_ids"]):
            starts = [i for i, position in enumerate(block) if position == 0] + [len(block)]
            for start, end in itertools.pairwise(starts):
                alone = model(input_ids=ids[row : row + 1, start:end]).logits[0]
                assert torch.allclose(together[row, start:end], alone, atol=1e-5)
        leaked = model(input_ids=ids).logits  # plain causal attention over each whole block
    assert not torch.allclose(leaked, together, atol=1e-3)


@pytest.mark.parametrize("composed_max", [512, 4])
def test_segments_attention_trains_as_sdpa_does(composed_max, monkeypatch):
    """Same loss and same gradients as transformers' SDPA with its packed-sequence mask."""
    monkeypatch.setattr("pipeline.train.attention.COMPOSED_MAX", composed_max)
    packed, _ = pack([[5, 6, 7, 8, 9], [11, 12, 13], [21, 22, 23, 24, 25, 26, 27]], block_size=8)
    batch = {name: torch.tensor(values) for name, values in packed.items()}
    gradients = []
    for attention in ("sdpa", "segments"):
        model = tiny_model(attention)
        model(**batch).loss.backward()
        gradients.append({name: p.grad for name, p in model.named_parameters()})
    for name, expected in gradients[0].items():
        assert torch.allclose(gradients[1][name], expected, atol=1e-5), name


@pytest.mark.parametrize("padded", [True, False])
def test_segments_attention_generates_as_sdpa_does(padded):
    """Generation (a padded prompt, then one token at a time over the KV cache, key heads shared by two
    query heads each) gives the same scores with `segments` as with transformers' SDPA."""
    prompts = torch.tensor([[0, 0, 5, 6, 7], [11, 12, 13, 14, 15]] if padded else [[5, 6, 7], [11, 12, 13]])
    scores = []
    for attention in ("sdpa", "segments"):
        model = tiny_model(attention, num_key_value_heads=2, pad_token_id=0)
        model.config.use_cache = True
        with torch.no_grad():
            generated = model.eval().generate(
                input_ids=prompts,
                attention_mask=(prompts != 0).long(),
                max_new_tokens=6,
                do_sample=False,
                output_scores=True,
                return_dict_in_generate=True,
            )
        scores.append(torch.stack(generated.scores))
    assert torch.allclose(scores[1], scores[0], atol=1e-5)


def best_fit_decreasing_one_by_one(sizes: list[int], block_size: int) -> int:
    """The textbook algorithm, one segment at a time: the reference the bulk layout must equal."""
    rooms: list[int] = []
    for size in sorted(sizes, reverse=True):
        fitting = [i for i, room in enumerate(rooms) if room >= size]
        if fitting:
            best = min(fitting, key=lambda i: rooms[i])
            rooms[best] -= size
        else:
            rooms.append(block_size - size)
    return len(rooms)


@settings(max_examples=300, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 64), min_size=1, max_size=120), block_size=st.sampled_from([64, 100, 128])
)
def test_bulk_layout_equals_one_by_one_best_fit(sizes, block_size):
    sizes = [min(size, block_size) for size in sizes]
    placed = layout(Counter(sizes), block_size)
    assert placed.blocks == best_fit_decreasing_one_by_one(sizes, block_size)
    filled = Counter()
    for blocks, size, per_block in placed.groups:
        for block in blocks:
            filled[block] += size * per_block
    assert set(filled) == set(range(placed.blocks))
    assert all(total <= block_size for total in filled.values())


def test_a_million_sequences_are_counted_in_well_under_a_second():
    import time

    started = time.perf_counter()
    # 3000 tokens = 2 full blocks + 952; the 17-token sequences all fit in those 952-token rooms.
    assert count_blocks({1024: 400_000, 3000: 300_000, 17: 300_000}, 1024) == 400_000 + 300_000 * 2 + 300_000
    assert time.perf_counter() - started < 5  # generous: a regression guard, not a benchmark

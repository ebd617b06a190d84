"""Pack tokenized sequences into fixed-length blocks without cross-sequence attention.

Each sequence (its tokens plus EOS) becomes one or more segments of at most
`block_size` tokens; segments are placed into blocks best-fit-decreasing.
Inside a block, position ids restart at 0 for every segment; transformers
turns restarting position ids (with no attention mask) into a block-diagonal
causal mask for SDPA and eager attention and into varlen kernels for
flash-attention, so no token attends to another sequence. The first label of
each segment is masked so no token is predicted from another sequence.

Pure Python and deterministic: the planner calls `count_blocks` on token
lengths to compute exact step counts; the dataset stage calls `pack_blocks`.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass

IGNORE_INDEX = -100  # label value the loss skips


def segment_lengths(lengths: Sequence[int], block_size: int) -> list[int]:
    """Split every sequence length (EOS included) into pieces of at most block_size tokens."""
    pieces = []
    for length in lengths:
        full, rest = divmod(length, block_size)
        pieces.extend([block_size] * full)
        if rest:
            pieces.append(rest)
    return pieces


def layout(pieces: Sequence[int], block_size: int) -> list[list[int]]:
    """Assign piece indices to blocks, best fit decreasing; returns the pieces of each block."""
    order = sorted(range(len(pieces)), key=lambda i: (-pieces[i], i))
    blocks: list[list[int]] = []
    # Open blocks grouped by remaining capacity; `capacities` is the sorted set of keys
    # with at least one block, so each placement is a bisect, not a scan over blocks.
    open_by_capacity: dict[int, list[int]] = {}
    capacities: list[int] = []
    for index in order:
        size = pieces[index]
        slot = bisect.bisect_left(capacities, size)
        if slot < len(capacities):
            capacity = capacities[slot]
            block = open_by_capacity[capacity].pop()
            if not open_by_capacity[capacity]:
                del open_by_capacity[capacity]
                capacities.pop(slot)
        else:
            capacity = block_size
            block = len(blocks)
            blocks.append([])
        blocks[block].append(index)
        remaining = capacity - size
        if remaining:
            if remaining not in open_by_capacity:
                open_by_capacity[remaining] = []
                bisect.insort(capacities, remaining)
            open_by_capacity[remaining].append(block)
    return blocks


def count_blocks(lengths: Sequence[int], block_size: int) -> int:
    """How many blocks `pack_blocks` will make from sequences of these lengths (EOS included)."""
    return len(layout(segment_lengths(lengths, block_size), block_size))


@dataclass(frozen=True)
class PackedBlocks:
    input_ids: list[list[int]]
    position_ids: list[list[int]]
    labels: list[list[int]]
    real_tokens: int
    """Tokens from sequences (padding excluded)."""

    @property
    def efficiency(self) -> float:
        """Real tokens over token slots (1.0 means no padding)."""
        slots = sum(len(block) for block in self.input_ids)
        return self.real_tokens / slots if slots else 0.0


def pack_blocks(sequences: Sequence[Sequence[int]], block_size: int, pad_id: int) -> PackedBlocks:
    """Pack token sequences (EOS already appended) into blocks of exactly block_size tokens."""
    pieces: list[Sequence[int]] = []
    for tokens in sequences:
        pieces.extend(tokens[start : start + block_size] for start in range(0, len(tokens), block_size))
    input_ids, position_ids, labels = [], [], []
    for block in layout([len(piece) for piece in pieces], block_size):
        ids: list[int] = []
        positions: list[int] = []
        targets: list[int] = []
        for index in block:
            piece = list(pieces[index])
            ids += piece
            positions += range(len(piece))
            targets += [IGNORE_INDEX, *piece[1:]]
        padding = block_size - len(ids)
        ids += [pad_id] * padding
        positions += range(padding)
        targets += [IGNORE_INDEX] * padding
        input_ids.append(ids)
        position_ids.append(positions)
        labels.append(targets)
    return PackedBlocks(input_ids, position_ids, labels, real_tokens=sum(len(piece) for piece in pieces))

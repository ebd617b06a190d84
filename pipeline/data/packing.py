"""How tokenized sequences are laid out in fixed-length blocks, without cross-sequence attention.

Each sequence (its tokens plus EOS) becomes one or more segments of at most
`block_size` tokens; segments are placed into blocks best-fit-decreasing.
Inside a block, position ids restart at 0 for every segment; transformers
turns restarting position ids (with no attention mask) into a block-diagonal
causal mask for SDPA and eager attention and into varlen kernels for
flash-attention, so no token attends to another sequence. The first label of
each segment is masked so no token is predicted from another sequence.

The layout works on a histogram of segment sizes and fills whole classes of
blocks at once (see `layout`), so the planner counts blocks for exact step
counts in milliseconds even for 10^6 sequences; `pipeline.data.dataset` places the
real segments with the same layout.
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

IGNORE_INDEX = -100  # label value the loss skips


def segment_counts(length_counts: Mapping[int, int], block_size: int) -> Counter:
    """Segment-size histogram from a sequence-length histogram (EOS included in lengths)."""
    pieces: Counter = Counter()
    for length, count in length_counts.items():
        full, rest = divmod(length, block_size)
        if full:
            pieces[block_size] += full * count
        if rest:
            pieces[rest] += count
    return pieces


@dataclass(frozen=True)
class Layout:
    blocks: int
    """How many blocks the segments fill."""
    groups: list[tuple[Sequence[int], int, int]]
    """(block ids, segment size, segments per block): each of those blocks takes that many segments of that size."""


def layout(piece_counts: Mapping[int, int], block_size: int) -> Layout:
    """Best-fit-decreasing placement of segments (a histogram of sizes) into blocks, in bulk.

    Placed one by one, a segment of size s goes to the block with the least room that still fits
    it; that block stays the best fit for the next segments of size s until its room drops below s,
    and every other block with the same room then takes the same number. So whole classes of
    blocks are filled in one step, with exactly the result of placing segments one at a time.
    """
    by_room: dict[int, list[int]] = {}  # remaining room → open blocks with that room
    rooms: list[int] = []  # the sorted keys of by_room
    groups: list[tuple[Sequence[int], int, int]] = []
    opened = 0

    def add(blocks: Sequence[int], room: int) -> None:
        if not room:
            return
        if room not in by_room:
            by_room[room] = []
            bisect.insort(rooms, room)
        by_room[room].extend(blocks)

    for size in sorted(piece_counts, reverse=True):
        left = piece_counts[size]
        while left:
            slot = bisect.bisect_left(rooms, size)
            room = rooms[slot] if slot < len(rooms) else block_size
            per_block = room // size
            full = left // per_block
            taken: Sequence[int]
            if slot < len(rooms):
                members = by_room[room]
                full = min(full, len(members))
                taken = members[len(members) - max(full, 1) :]
                del members[len(members) - len(taken) :]
                if not members:
                    del by_room[room]
                    rooms.pop(slot)
            else:  # new blocks: a range, listed only where they keep room for more (`add`)
                taken = range(opened, opened + max(full, 1))
                opened += len(taken)
            if full:
                groups.append((taken, size, per_block))
                left -= full * per_block
                add(taken, room - per_block * size)
            else:  # fewer segments left than one block takes: they share one block
                groups.append((taken, size, left))
                add(taken, room - left * size)
                left = 0
    return Layout(opened, groups)


def count_blocks(length_counts: Mapping[int, int], block_size: int) -> int:
    """How many blocks `pipeline.data.dataset.pack_arrays` makes from sequences with this length histogram."""
    return layout(segment_counts(length_counts, block_size), block_size).blocks

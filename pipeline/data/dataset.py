"""Tokenized sequences → packed training blocks, cached as arrays and read back memory-mapped.

Packing follows `pipeline.data.packing.layout` (best fit decreasing; position ids
restart per sequence so no token attends to another sequence; the first label
of every segment is masked, and so is every token the loss mask excludes: a
chat example's prompt). The blocks are built with numpy over the whole
token stream at once and stored per block size in the token cache
(`blocks-<L>/<split>_{input_ids,position_ids,labels}.npy`, int32), so a
second run with the same data and sequence length reads them directly.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from pipeline.data.examples import FILE_FORMAT
from pipeline.data.packing import IGNORE_INDEX, layout
from pipeline.data.token_cache import FILES, read_split
from pipeline.progress import say
from pipeline.types import Packed, PackedSplit, Plan, Prepared

ARRAYS = ("input_ids", "position_ids", "labels")


def block_dataset(split: PackedSplit, limit: int | None = None) -> BlockDataset:
    """A split's blocks as a torch dataset; `limit` keeps the first that many."""
    return BlockDataset(split.directory, split.split, min(split.blocks, limit or split.blocks))


def held_out_blocks(packed: Packed, limit: int | None) -> dict[str, BlockDataset]:
    """Each format's held-out blocks as a dataset, the first `limit` of them (all for None)."""
    return {name: block_dataset(split, limit) for name, split in packed.held_out.items()}


def validation_blocks(packed: Packed, limit: int | None) -> dict[str, BlockDataset]:
    """Each format's validation blocks as a dataset, the first `limit` of them (all for None)."""
    return {name: block_dataset(split, limit) for name, split in packed.validation.items()}


def packed_blocks(
    cache_directory: Path, table, split: str, block_size: int, pad_id: int, truncate_at: int | None
) -> PackedSplit:
    """A tokenized split (an Arrow table, see `pack_arrays`) packed into blocks of `block_size`, from the
    cache or built and stored there under the name `split`."""
    directory = (
        cache_directory / f"blocks-{block_size}" / (f"first-{truncate_at}" if truncate_at else "pieces")
    )
    meta_path = directory / f"{split}_meta.json"
    if meta_path.exists():
        meta = orjson.loads(meta_path.read_bytes())
        return PackedSplit(directory, split, meta["blocks"], meta["real_tokens"], block_size)
    arrays, real_tokens = pack_arrays(table, block_size, pad_id, truncate_at)
    directory.mkdir(parents=True, exist_ok=True)
    for name, array in arrays.items():
        staging = directory / f".{split}_{name}.{os.getpid()}.npy"
        np.save(staging, array)
        staging.replace(directory / f"{split}_{name}.npy")
    blocks = len(arrays["input_ids"])
    staging = directory / f".{split}_meta.{os.getpid()}.json"
    staging.write_bytes(orjson.dumps({"blocks": blocks, "real_tokens": real_tokens}))
    staging.replace(meta_path)  # written last: its presence means the arrays are complete
    return PackedSplit(directory, split, blocks, real_tokens, block_size)


def pack_arrays(
    table, block_size: int, pad_id: int, truncate_at: int | None = None
) -> tuple[dict[str, np.ndarray], int]:
    """Pack every sequence of a pyarrow table (column input_ids; loss_mask, where present, says which
    tokens carry a loss) into [blocks, block_size] int32 arrays. A sequence longer than a block is cut
    into block-sized pieces, or with `truncate_at` (at most the block size) only its first that many
    tokens are kept."""
    if table.num_rows == 0:
        empty = np.zeros((0, block_size), dtype=np.int32)
        return {name: empty for name in ARRAYS}, 0
    column = table.column("input_ids").combine_chunks()
    tokens = column.values.to_numpy(zero_copy_only=False).astype(np.int32, copy=False)
    mask = (
        table.column("loss_mask").combine_chunks().values.to_numpy(zero_copy_only=False)
        if "loss_mask" in table.column_names
        else np.ones(len(tokens), dtype=np.int8)
    )
    offsets = column.offsets.to_numpy()
    lengths = np.diff(offsets)
    if truncate_at:
        kinds = table.column("format").to_pylist() if "format" in table.column_names else []
        files = (
            np.asarray(kinds, dtype=object) == FILE_FORMAT if kinds else np.zeros(len(lengths), dtype=bool)
        )
        lengths = np.where(files, lengths, np.minimum(lengths, truncate_at))
    piece_start, piece_length = _pieces(offsets, lengths, block_size)
    piece_block, piece_offset, fill = _placement(piece_length, block_size)
    arrays = _scatter(
        tokens, mask, piece_start, piece_length, piece_block, piece_offset, fill, block_size, pad_id
    )
    return arrays, int(piece_length.sum())


def _pieces(offsets: np.ndarray, lengths: np.ndarray, block_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Every sequence cut into pieces of at most block_size tokens: each piece's first token in the
    flat token array, and its length."""
    pieces_per_sequence = -(-lengths // block_size)
    sequence_of_piece = np.repeat(np.arange(len(lengths)), pieces_per_sequence)
    first_piece = np.cumsum(pieces_per_sequence) - pieces_per_sequence
    piece_in_sequence = np.arange(len(sequence_of_piece)) - np.repeat(first_piece, pieces_per_sequence)
    piece_start = offsets[sequence_of_piece] + piece_in_sequence * block_size
    piece_length = np.minimum(block_size, lengths[sequence_of_piece] - piece_in_sequence * block_size)
    return piece_start, piece_length


def _placement(piece_length: np.ndarray, block_size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Where each piece goes, as `layout` decides (best fit by size): (each piece's block, its offset in
    that block, each block's filled tokens). Pieces of each size, in sequence order, are
    handed out to the layout's groups in turn."""
    placed = layout(Counter(piece_length.tolist()), block_size)
    order = np.argsort(-piece_length, kind="stable")
    sizes_sorted = piece_length[order]
    next_of_size = {
        int(size): int(np.searchsorted(-sizes_sorted, -size, side="left")) for size in np.unique(piece_length)
    }
    piece_block = np.empty(len(piece_length), dtype=np.int64)
    piece_offset = np.empty(len(piece_length), dtype=np.int64)
    fill = np.zeros(placed.blocks, dtype=np.int64)
    for group, size, per_block in placed.groups:
        block_ids = np.asarray(group, dtype=np.int64)
        for _ in range(per_block):
            start = next_of_size[size]
            chosen = order[start : start + len(block_ids)]
            next_of_size[size] = start + len(block_ids)
            piece_block[chosen] = block_ids
            piece_offset[chosen] = fill[block_ids]
            fill[block_ids] += size
    return piece_block, piece_offset, fill


def _scatter(
    tokens: np.ndarray,
    mask: np.ndarray,
    piece_start: np.ndarray,
    piece_length: np.ndarray,
    piece_block: np.ndarray,
    piece_offset: np.ndarray,
    fill: np.ndarray,
    block_size: int,
    pad_id: int,
) -> dict[str, np.ndarray]:
    """Every token copied to its block and offset in one vectorised pass, with its label and position."""
    blocks = len(fill)
    within = np.arange(int(piece_length.sum())) - np.repeat(
        np.cumsum(piece_length) - piece_length, piece_length
    )
    source = np.repeat(piece_start, piece_length) + within
    target = np.repeat(piece_block * block_size + piece_offset, piece_length) + within
    input_ids = np.full(blocks * block_size, pad_id, dtype=np.int32)
    labels = np.full(blocks * block_size, IGNORE_INDEX, dtype=np.int32)
    positions = np.empty(blocks * block_size, dtype=np.int32)
    input_ids[target] = tokens[source]
    # No loss on a segment's first token (never predict across sequences) nor where the mask says prompt.
    labels[target] = np.where((within == 0) | (mask[source] == 0), IGNORE_INDEX, tokens[source])
    # Padding after the last segment is a segment of its own, positions restarting at 0.
    positions[:] = np.tile(np.arange(block_size), blocks) - np.repeat(fill, block_size)
    positions[target] = within
    shape = (blocks, block_size)
    return {
        "input_ids": input_ids.reshape(shape),
        "position_ids": positions.reshape(shape),
        "labels": labels.reshape(shape),
    }


class BlockDataset:
    """Packed blocks as a torch map-style dataset over memory-mapped arrays.

    The arrays are opened lazily in each process: a dataloader worker reopens
    the files instead of receiving pickled copies of them.
    """

    def __init__(self, directory: Path, split: str, blocks: int):
        self.directory = directory
        self.split = split
        self.blocks = blocks
        self._arrays: dict[str, np.ndarray] | None = None

    def __len__(self) -> int:
        return self.blocks

    def __getitem__(self, index: int) -> dict[str, Any]:
        import torch

        arrays = self._opened()
        return {name: torch.from_numpy(arrays[name][index].astype(np.int64)) for name in ARRAYS}

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_arrays": None}

    def _opened(self) -> dict[str, np.ndarray]:
        if self._arrays is None:
            self._arrays = {
                name: np.load(self.directory / f"{self.split}_{name}.npy", mmap_mode="r") for name in ARRAYS
            }
        return self._arrays

    def digest(self) -> str:
        """sha256 of the blocks' shape, token ids, positions and labels: what scoring them depends on,
        whatever run or tool version packed them."""
        digest = hashlib.sha256()
        for array in self._opened().values():
            blocks = np.ascontiguousarray(array[: self.blocks])
            digest.update(repr(blocks.shape).encode() + blocks.tobytes())
        return digest.hexdigest()


def pack(prepared: Prepared, plan: Plan) -> Packed:
    """The training blocks, and the held-out blocks of each format (scored apart: a commit message and a
    change are different tasks), from the token cache or built into it."""
    cache, length, cut = prepared.cache, plan.sequence_length, plan.truncate_at
    pad = prepared.tokenizer.pad_token_id
    started = time.perf_counter()
    train = packed_blocks(cache.directory, training_table(cache.directory), "train", length, pad, cut)
    held_out, validation = (
        held_out_splits(cache.directory, read_split(cache.directory, split), length, pad, cut, split)
        if prepared.counts[f"{split}_tokens"]
        else {}
        for split in ("eval", "valid")
    )
    method = (
        "best-fit-decreasing blocks; position_ids restart per sequence "
        f"(block-diagonal causal attention with {plan.attention}); first label of each sequence masked"
    )
    if prepared.style.loss_on == "response":
        method += "; prompt tokens masked (loss on the answer only)"
    if cut:
        method += f"; a sequence longer than {cut} tokens keeps its first {cut}"
    else:
        method += f"; a sequence longer than {length} tokens is split into {length}-token pieces"
    # A sample's blocks are not the data's; the newest sequences' are (keep_newest takes those it trains).
    sample = prepared.estimate is not None and prepared.tokenized is None
    if not sample:  # one vectorised pass (a fraction of a second on thousands of commits): a line, no bar
        files = f" and {prepared.files.sequences:,} files" if prepared.files.sequences else ""
        say(
            f"packed {prepared.tokenized or prepared.counts['train_sequences']:,} training sequences{files} into "
            f"{train.blocks:,} blocks of {length} tokens ({train.efficiency:.1%} filled) in "
            f"{time.perf_counter() - started:.2f} s"
        )
    return Packed(train, held_out, method, validation=validation, sample=sample)


def held_out_splits(
    directory: Path, table, length: int, pad: int, cut: int | None, split: str = "eval"
) -> dict[str, PackedSplit]:
    """A held-out split's (`eval` or `valid`) blocks by format (scored apart: a commit message and a
    change are different tasks), cached in `directory`."""
    import pyarrow.compute as pc

    return {
        name: packed_blocks(
            directory,
            table.filter(pc.equal(table.column("format"), name)),
            f"{split}-{name}",
            length,
            pad,
            cut,
        )
        for name in sorted(set(table.column("format").to_pylist()))
    }


def training_table(directory: Path, history: int | None = None, files: int | None = None):
    """The newest `history` training sequences and the `files` most recently changed files (None: all), as
    one table to pack: the plan mixes the two."""
    import pyarrow as pa

    parts = [read_split(directory, "train").slice(0, history)]
    if (tokenized_files := read_split(directory, FILES)) is not None:
        parts.append(tokenized_files.slice(0, files))
    return pa.concat_tables(parts)


def keep_newest(packed: Packed, prepared: Prepared, plan: Plan) -> Packed:
    """The training blocks the plan keeps: all, or those of the newest sequences and the most recently
    changed files a time budget fits or `train.newest_sequences` keeps (packed apart and cached under their
    counts)."""
    kept, total = plan.train_sequences, prepared.stats.sequences
    kept_files, files = plan.train_files, prepared.files
    if kept >= total and kept_files >= files.sequences:
        return packed
    newest = packed_blocks(
        prepared.cache.directory,
        training_table(prepared.cache.directory, kept, kept_files),
        f"train-newest-{kept}" + (f"-files-{kept_files}" if files.sequences else ""),
        plan.sequence_length,
        prepared.tokenizer.pad_token_id,
        plan.truncate_at,
    )
    # Where a setting (train.newest_sequences) decided it, its reason says which; the planner's is the budget's.
    decided = plan.decisions["train_sequences"]
    left_out = {
        "sequences": total - kept,
        "tokens": prepared.stats.tokens - sum(prepared.stats.newest_first[:kept]),
        "files": files.sequences - kept_files,
        "file_tokens": files.tokens - sum(files.newest_first[:kept_files]),
        "reason": "time budget (train.time_budget)" if decided.source == "planned" else decided.reason,
    }
    return replace(packed, train=newest, left_out=left_out)

"""Sequences → token ids → packed training blocks."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from pipeline.packing import PackedBlocks, pack_blocks
from pipeline.planner import DataStats


def read_sequences(path: Path) -> list[dict[str, Any]]:
    with path.open("rb") as handle:
        return [orjson.loads(line) for line in handle if line.strip()]


@dataclass(frozen=True)
class TokenizedData:
    token_ids: list[list[int]]
    """One list per sequence, EOS appended."""

    def stats(self) -> DataStats:
        return DataStats.from_lengths(len(ids) for ids in self.token_ids)

    def to_manifest(self) -> dict[str, Any]:
        stats = self.stats()
        return {
            "sequences": stats.sequences,
            "tokens": stats.tokens,
            "token_length_max": max(stats.length_counts, default=None),
            "token_length_median": stats.percentile(50) if stats.sequences else None,
            "token_length_p95": stats.percentile(95) if stats.sequences else None,
        }


def tokenize(texts: Sequence[str], tokenizer) -> TokenizedData:
    """Tokenize in one batched call (the fast tokenizer parallelises in Rust) and append EOS."""
    encoded = tokenizer(list(texts), add_special_tokens=False)["input_ids"]
    eos = tokenizer.eos_token_id
    return TokenizedData(token_ids=[[*ids, eos] for ids in encoded])


def training_blocks(data: TokenizedData, block_size: int, pad_id: int) -> tuple[Any, PackedBlocks]:
    """A `datasets.Dataset` of packed blocks (input_ids, position_ids, labels) and the packing itself."""
    from datasets import Dataset

    packed = pack_blocks(data.token_ids, block_size, pad_id)
    dataset = Dataset.from_dict(
        {"input_ids": packed.input_ids, "position_ids": packed.position_ids, "labels": packed.labels}
    )
    return dataset.with_format("torch"), packed

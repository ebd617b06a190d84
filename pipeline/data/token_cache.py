"""The token cache: tokenized sequences (Arrow, via `datasets`) keyed by everything they depend on.

The key hashes the scrape's provenance (this tool's version, the
repositories at their HEADs, the range and the scrape config, so the
formats), the base model and the tokenizer recipe. A second run on
unchanged input loads the cache instead of tokenizing again; any change to
those inputs gives another key, so a stale cache is never read. Entries are
built in a temporary directory and renamed into place, so a killed build
leaves nothing a later run would trust.

Layout of one entry (`cache_dir/tokens-<key>/`):

    tokenizer/          the tokenizer (tiny's is trained on the corpus, so it is part of the cache)
    train/, valid/, eval/  Arrow datasets: input_ids, loss_mask (1 where a token carries a loss), length,
                        commit, format (see pipeline.data.examples for how a record becomes tokens)
    files/              the same for the files at the split point, most recently changed first
    blocks-<L>/         packed blocks for block size L (see pipeline.data.dataset)
    meta.json           the key's inputs and counts
"""

from __future__ import annotations

import functools
import itertools
import math
import os
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import orjson

from pipeline.base_models import (
    describe_model,
    infills,
    load_saved_tokenizer,
    model_config,
    pretrained_tokenizer,
    quiet_library_output,
    tokenizer_recipe,
    train_tiny_tokenizer,
)
from pipeline.config import LoadedConfig, ScrapeConfig
from pipeline.data.examples import (
    FILE_FORMAT,
    code_document,
    encode_batch,
    infilled_document,
    style_key,
    text_style,
)  # fmt: skip
from pipeline.data.sources import read_files, read_sequences, skipped
from pipeline.errors import OutputDirError
from pipeline.hardware import usable_cores
from pipeline.manifest import provenance_hash
from pipeline.progress import Progress, say
from pipeline.types import Data, DataStats, Prepared, Scraped, TextStyle, TokenCache
from scrapers.errors import RepositoryError
from scrapers.filters import what_keeps
from scrapers.scrape import SPLITS, ending_quietly

# Bump when the layout or the tokenization changes (6: files infilled where the tokenizer can).
CACHE_FORMAT = 6
TOKENIZE_ROWS_PER_PROCESS = 2000  # below this, extra tokenizer processes cost more than they save
TOKENIZE_CHUNK = 256  # sequences per unit of work (and of progress)
PLAN_SAMPLE = 1000  # training sequences `plan` tokenizes to estimate a larger history it has not cached
FILES = "files"  # the cache's split of the files at the split point, trained beside the history's
AHEAD_CHARS_PER_TOKEN = 4  # to choose what holds a budget's tokens: code averages about 3.2 (smollm2-135m)


def cache_stats(cache: TokenCache) -> DataStats:
    """Token-length histogram of the training split, for the planner."""
    import numpy as np

    lengths = read_split(cache.directory, "train").column("length").to_numpy()
    values, counts = np.unique(lengths, return_counts=True)
    return DataStats(dict(zip(values.tolist(), counts.tolist(), strict=True)), tuple(lengths.tolist()))


def cache_meta(cache: TokenCache) -> dict[str, Any]:
    """What building the entry counted (sequences and tokens per split) and how long it took."""
    return orjson.loads((cache.directory / "meta.json").read_bytes())


def read_split(directory: Path, name: str):
    """A split that `tokenize_sequences` saved in `directory`, as a pyarrow table; None if it has none."""
    from datasets import load_from_disk

    path = directory / name
    return load_from_disk(str(path)).data.table if path.exists() else None


def cache_key(
    scrape_provenance: str,
    model_name: str,
    tokenizer_recipe: dict[str, Any],
    style: TextStyle,
    max_tokens: tuple[int, int],
) -> str:
    payload = {
        "format": CACHE_FORMAT,
        "scrape": scrape_provenance,
        "model": model_name,
        "tokenizer": tokenizer_recipe,
        "text": style_key(style),
        "max_tokens": max_tokens,
    }
    return provenance_hash(payload)[:20]


def open_or_build(cache_root: Path, key: str, build: Callable[[Path], dict[str, Any]]) -> TokenCache:
    """The cache entry for `key`: loaded if complete, else made by `build(directory)`, which returns
    the entry's counts for meta.json, and renamed into place."""
    started = time.perf_counter()
    directory = cache_root / f"tokens-{key}"
    if (directory / "meta.json").exists():
        return TokenCache(directory, key, True, time.perf_counter() - started, _build_seconds(directory))
    # Not a dot-name: datasets skips files under hidden directories when it reads a split back.
    staging = cache_root / f"tokens-{key}.{os.getpid()}.tmp"
    try:
        cache_root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(staging, ignore_errors=True)
        counts = build(staging)
        built = {"key": key, **counts, "build_seconds": round(time.perf_counter() - started, 3)}
        (staging / "meta.json").write_bytes(orjson.dumps(built, option=orjson.OPT_INDENT_2))
        try:
            staging.rename(directory)
        except OSError:  # another process finished the same entry first: theirs is as good as ours
            if not (directory / "meta.json").exists():
                raise
    except OSError as err:  # `output.cache_dir` naming a file or a read-only folder, a full disk: one line
        raise OutputDirError(
            f"cannot write the token cache into {cache_root} ({err.strerror or err}): set output.cache_dir to a "
            "folder you can write, with room for the tokenized history (unset: the output directory's cache/)"
        ) from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return TokenCache(directory, key, False, time.perf_counter() - started, _build_seconds(directory))


def _build_seconds(directory: Path) -> float | None:
    """How long building the entry took, as its meta.json says (None for entries older than the field)."""
    return orjson.loads((directory / "meta.json").read_bytes()).get("build_seconds")


def tokenize_sequences(
    records: list[dict[str, Any]], tokenizer, style: TextStyle, max_tokens: tuple[int, int], directory: Path
) -> dict[str, int]:
    """Tokenize each split in `style` (in worker processes when it is large), with progress, and save it
    as an Arrow dataset; returns sequences and tokens per split. An empty split is not stored (datasets
    cannot read back a split saved with no rows). `max_tokens`: a chat example's longest (sequence, prompt).

    Not `datasets.map(num_proc=...)`: its progress bar is all it shows, and only on a terminal; a log or CI
    needs plain lines (see `Progress`)."""
    import datasets
    import numpy as np
    import pyarrow as pa
    from datasets import Dataset

    datasets.disable_progress_bars()  # saving is quick; the progress that matters is tokenizing's own
    counts = {f"{split}_{what}": 0 for split in (*SPLITS, FILES) for what in ("sequences", "tokens")}
    for split in (*SPLITS, FILES):
        rows = [record for record in records if record["split"] == split]
        if not rows:
            continue
        chunks = [
            (
                [r["format"] for r in rows[start : start + TOKENIZE_CHUNK]],
                [r["text"] for r in rows[start : start + TOKENIZE_CHUNK]],
            )
            for start in range(0, len(rows), TOKENIZE_CHUNK)
        ]
        processes = max(1, min(usable_cores(), len(rows) // TOKENIZE_ROWS_PER_PROCESS))
        parts = []
        with Progress(f"tokenizing {split}", len(rows), "sequence") as progress:
            for part in _encoded(chunks, (tokenizer, style, max_tokens), processes):
                parts.append(part)
                progress.update(len(part[2]))
        ids, masks, lengths = (np.concatenate([part[index] for part in parts]) for index in range(3))
        offsets = pa.array(np.concatenate([[0], np.cumsum(lengths)]), pa.int64())
        table = pa.table(
            {
                "commit": [r["commit"] for r in rows],
                "format": [r["format"] for r in rows],
                "input_ids": pa.LargeListArray.from_arrays(offsets, pa.array(ids)),
                "loss_mask": pa.LargeListArray.from_arrays(offsets, pa.array(masks)),
                "length": pa.array(lengths),
            }
        )
        Dataset(table).save_to_disk(str(directory / split))
        counts[f"{split}_sequences"] = len(rows)
        counts[f"{split}_tokens"] = int(lengths.sum())
    return counts


_ENCODER: tuple | None = None
"""(tokenizer, style, max_tokens) in a tokenizing worker process."""


def _encoded(chunks: list[tuple[list[str], list[str]]], encoder: tuple, processes: int):
    """Each chunk encoded, in order: here, or in `processes` worker processes that each get the tokenizer
    once."""
    global _ENCODER
    if processes == 1:
        _ENCODER = encoder
        yield from map(_encode_chunk, chunks)
        return
    import multiprocessing

    # fork shares the loaded tokenizer and modules; elsewhere each worker unpickles the tokenizer once.
    context = multiprocessing.get_context("fork" if sys.platform.startswith("linux") else "spawn")
    with ending_quietly(context.Pool(processes, initializer=_set_encoder, initargs=(encoder,))) as pool:
        yield from pool.imap(_encode_chunk, chunks)


def _set_encoder(encoder: tuple) -> None:
    global _ENCODER
    _ENCODER = encoder


def _encode_chunk(chunk: tuple[list[str], list[str]]):
    """(token ids int32, loss mask int8, lengths int64) of a chunk's sequences, flat: compact to send back."""
    import numpy as np

    assert _ENCODER is not None, "_encoded sets the encoder before any chunk is encoded"
    tokenizer, style, (max_tokens, max_prompt) = _ENCODER
    formats, texts = chunk
    ids, masks = encode_batch(tokenizer, style, formats, texts, max_tokens, max_prompt)
    lengths = np.fromiter((len(row) for row in ids), dtype=np.int64, count=len(ids))
    total = int(lengths.sum())
    flat_ids = np.fromiter((v for row in ids for v in row), dtype=np.int32, count=total)
    flat_masks = np.fromiter((v for row in masks for v in row), dtype=np.int8, count=total)
    return flat_ids, flat_masks, lengths


def something_to_train(scraped: Scraped, scrape: ScrapeConfig) -> None:
    """One line where the scrape left nothing to train on: the history read held no commit, or none
    survived the filters (with the setting that keeps the most of them, where one does)."""
    if not scraped.summary["commits_seen"]:
        read = {
            "rev": scrape.rev,
            "since": scrape.since,
            "until": scrape.until,
            "max_commits": scrape.max_commits,
        }
        asked = ", ".join(f"scrape.{key} {value}" for key, value in read.items() if value is not None)
        raise RepositoryError(
            f"{scraped.where}: the history read ({asked}) holds no commit; nothing to train on"
        )
    if not scraped.summary["split"]["train_sequences"]:
        keeps = what_keeps(scraped.summary["skipped"])
        raise RepositoryError(
            f"{scraped.where}: no commit survived the filters (skipped: {skipped(scraped)}); nothing to train on"
            + (f" ({keeps})" if keeps else "")
        )


def prepare(
    scraped: Scraped,
    loaded: LoadedConfig,
    cache_root: Path,
    sample: int | None = None,
    ahead: int | None = None,
) -> Prepared:
    """Tokenize the sequences into the provenance-keyed cache (or load them from it), and describe the
    model for the planner (its config only: no weights are loaded). With `sample`, a history of more
    training sequences than that which is not in the cache yet is estimated from every k-th sequence
    (`plan`: a dry run answers in seconds and pays for no tokenization that nothing uses). With `ahead`,
    a history not in the cache yet is tokenized from its newest training sequence until about that many
    tokens, the rest estimated from their characters (a time budget trains the newest; a run whose
    budget reaches further tokenizes them all)."""

    quiet_library_output()
    something_to_train(scraped, loaded.config.scrape)
    total = scraped.summary["split"]["train_sequences"]
    model_name = loaded.config.train.model
    pretrained = pretrained_tokenizer(model_name)  # loaded once: for the key, and to tokenize on a miss
    style = text_style(loaded, model_name, bool(pretrained is not None and pretrained.chat_template))
    max_tokens = (loaded.config.train.max_sequence_length, loaded.config.train.max_prompt_tokens)
    key = cache_key(
        scraped.summary["provenance_key"], model_name, tokenizer_recipe(pretrained), style, max_tokens
    )
    every, newest = 1, None
    if not (cache_root / f"tokens-{key}" / "meta.json").exists():  # else the real statistics cost nothing
        every = math.ceil(total / sample) if sample and total > sample else 1
        # (The tiny model's tokenizer is trained on every training sequence: it tokenizes them all.)
        newest = _holding(scraped.sequences_path, ahead, total) if ahead and pretrained is not None else None
        newest = _newest_held(cache_root, key, newest) if newest else None
    directory = f"{key}-every{every}" if every > 1 else f"{key}-newest{newest}" if newest else key
    build = functools.partial(_build, scraped, pretrained, style, max_tokens, every, newest)
    # The key names the data, whatever part of it is tokenized: a checkpoint's fingerprint holds it.
    cache = replace(open_or_build(cache_root, directory, build), key=key)
    tokenizer = load_saved_tokenizer(cache.directory / "tokenizer")
    config = model_config(model_name, tokenizer)
    stats, counts, estimate, tokenized = _statistics(cache, every, scraped.summary["split"])
    facts = describe_model(model_name, config, tokenizer)
    files = file_stats(cache, every)
    repository = next((r["name"] for r in scraped.summary.get("per_repository", [])), "")
    return Prepared(
        tokenizer, config, facts, cache, stats, counts, style, estimate, tokenized, files, repository
    )


def file_stats(cache: TokenCache, every: int = 1) -> DataStats:
    """Token lengths of the files tokenized, most recently changed first (each standing for the `every`
    files around it where they are a sample); none where there are none."""
    table = read_split(cache.directory, FILES)
    lengths = table.column("length").to_pylist() if table is not None else []
    return DataStats.from_lengths(length for length in lengths for _ in range(every))


def _newest_held(cache_root: Path, key: str, newest: int) -> int:
    """The most newest sequences an entry of this data already holds, if that is at least `newest` (a
    longer budget's run tokenized them): no tokenizing; else `newest`."""
    held = [
        int(entry.parent.name.rsplit("-newest", 1)[1])
        for entry in cache_root.glob(f"tokens-{key}-newest*/meta.json")
    ]
    return max([newest, *held])


def _holding(path: Path, tokens: int, total: int) -> int | None:
    """How many of the newest training sequences hold about `tokens` tokens (at AHEAD_CHARS_PER_TOKEN
    characters a token, which code rarely has: more rather than fewer); None: all `total` of them. Reads
    the sequences only that far."""
    train = (record for record in read_sequences(path) if record["split"] == "train")
    characters = itertools.accumulate(len(record["text"]) for record in train)
    wanted = tokens * AHEAD_CHARS_PER_TOKEN
    count = next((n for n, chars in enumerate(characters, 1) if chars >= wanted), total)
    return count if count < total else None


def _build(
    scraped: Scraped, pretrained, style: TextStyle, max_tokens, every: int, newest: int | None, staging: Path
) -> dict[str, Any]:
    """A cache entry in `staging` (only on a miss: a hit reads none of the sequences), from every `every`-th
    sequence of each split, or from the `newest` training sequences and the held-out splits (the older
    ones' lengths estimated from their characters); the tiny model's tokenizer is trained here on the
    training split."""

    records = list(read_sequences(scraped.sequences_path))
    if every > 1:  # every k-th of each split, newest first as they are listed
        records = [r for split in SPLITS for r in [r for r in records if r["split"] == split][::every]]
    rest: list[dict[str, Any]] = []
    if newest:  # newest first as they are listed
        train = [r for r in records if r["split"] == "train"]
        rest = train[newest:]
        records = [*train[:newest], *(r for r in records if r["split"] != "train")]
    tokenizer = (
        pretrained
        if pretrained is not None
        else train_tiny_tokenizer(record["text"] for record in records if record["split"] == "train")
    )
    tokenizer.save_pretrained(staging / "tokenizer")
    files = _file_records(
        scraped, every, newest and sum(len(r["text"]) for r in records if r["split"] == "train"),
        infills(tokenizer),
    )  # fmt: skip
    counts: dict[str, Any] = tokenize_sequences([*records, *files], tokenizer, style, max_tokens, staging)
    counts["files_infilled"] = sum(record["infilled"] for record in files)
    if rest:
        lengths = read_split(staging, "train").column("length").to_numpy()
        counts["estimated_lengths"] = _estimated_lengths(records[:newest], lengths, rest)
    return counts


def _file_records(scraped: Scraped, every: int, characters: int | None, infill: bool) -> list[dict[str, Any]]:
    """The files at the split point as records of the FILES split, most recently changed first: every
    `every`-th of them (a sample), or those within about `characters` (tokenized ahead of a time budget,
    which trains at most that much of anything); none where the scrape read none. With `infill` (the
    tokenizer has fill-in-the-middle tokens), some as infilling exercises (`infilled_document`)."""
    files, total = [], 0
    for record in read_files(scraped)[::every]:
        if characters and total >= characters:
            break
        total += len(record["text"])
        infilled = infilled_document(record["path"], record["text"]) if infill else None
        text = infilled or code_document(record["path"], record["text"])
        files.append(
            {
                "split": FILES,
                "format": FILE_FORMAT,
                "text": text,
                "commit": record["commit"],
                "infilled": bool(infilled),
            }
        )
    return files


def _estimated_lengths(tokenized: list[dict[str, Any]], lengths, rest: list[dict[str, Any]]) -> list[int]:
    """The token counts of the `rest`, read off the `tokenized` sequences' `lengths`: interpolated at their
    number of characters among those of the same format (a chat prompt's cut and the template keep counts
    far from proportional to characters), beyond the longest in proportion to it."""
    import numpy as np

    formats = np.asarray([record["format"] for record in tokenized])
    characters = np.asarray([len(record["text"]) for record in tokenized])
    estimates = np.zeros(len(rest))
    wanted = np.asarray([len(record["text"]) for record in rest])
    asked = np.asarray([record["format"] for record in rest])
    for name in set(asked.tolist()):
        same = formats == name if (formats == name).any() else np.ones(len(formats), dtype=bool)
        order = np.argsort(characters[same], kind="stable")
        xs, ys = characters[same][order], lengths[same][order]
        chars = wanted[asked == name]
        estimates[asked == name] = np.where(
            chars <= xs[-1], np.interp(chars, xs, ys), ys[-1] * chars / max(1, xs[-1])
        )
    return np.maximum(1, np.rint(estimates)).astype(int).tolist()


def _statistics(
    cache: TokenCache, every: int, split: dict[str, int]
) -> tuple[DataStats, dict[str, int], str | None, int | None]:
    """The training split's token statistics and every split's counts (scaled to the whole history when
    they come from every k-th sequence, with the older sequences' estimated lengths when only the newest
    are tokenized, and then how), one line saying where they came from, and how many training sequences
    are tokenized when not all are."""
    meta = cache_meta(cache)
    counts = {
        f"{name}_{what}": meta[f"{name}_{what}"]
        for name in (*SPLITS, FILES)
        for what in ("sequences", "tokens")
    }
    counts["files_infilled"] = meta["files_infilled"]
    stats, estimate = cache_stats(cache), None
    if "estimated_lengths" in meta:
        tokenized, rest = stats.sequences, meta["estimated_lengths"]
        stats = DataStats.from_lengths([*stats.newest_first, *rest])
        counts.update(train_sequences=stats.sequences, train_tokens=stats.tokens)
        estimate = (
            f"the newest {tokenized:,} of {stats.sequences:,} training sequences tokenized (more than a time "
            f"budget trains here), the {len(rest):,} older ones' lengths estimated from their characters; a "
            "longer budget or `prepare` tokenizes them all"
        )
        say(f"token statistics: {estimate} ({cache.seconds:.1f} s)")
        return stats, counts, estimate, tokenized
    if every > 1:
        stats, counts = _scaled(stats, counts, every, split)
        estimate = (
            f"estimated from {meta['train_sequences']:,} of {split['train_sequences']:,} training sequences "
            f"(one in every {every}), tokenized in {cache.seconds:.1f} s; `prepare` or a run tokenizes them all"
        )
        say(f"token statistics {estimate}")
    elif cache.hit and cache.build_seconds:
        say(
            f"token cache hit: {cache.directory} ({cache.seconds:.2f} s; building it took "
            f"{cache.build_seconds:.1f} s, so {cache.build_seconds - cache.seconds:.1f} s saved)"
        )
    else:
        say(f"token cache {'hit' if cache.hit else 'built'}: {cache.directory} ({cache.seconds:.2f} s)")
    return stats, counts, estimate, None


def _scaled(
    stats: DataStats, counts: dict[str, int], every: int, split: dict[str, int]
) -> tuple[DataStats, dict[str, int]]:
    """Every k-th sequence's statistics as the whole split's: each sampled length stands for the `every`
    sequences around it, in order (newest first), to the split's real count."""
    total = split["train_sequences"]
    lengths = [length for length in stats.newest_first for _ in range(every)][:total]
    scaled = {"train_sequences": total, "train_tokens": sum(lengths)}
    for name in SPLITS[1:]:  # the held-out splits: their sampled tokens scaled to their real counts
        sampled = counts[f"{name}_sequences"]
        scaled[f"{name}_sequences"] = split[f"{name}_sequences"]
        scaled[f"{name}_tokens"] = (
            round(counts[f"{name}_tokens"] * split[f"{name}_sequences"] / sampled) if sampled else 0
        )
    return DataStats.from_lengths(lengths), scaled


def cache_summary(data: Data, seconds: float) -> str:
    """What `prepare` made: the cache key and place, and the counts; `seconds`: how long it took."""
    cache, counts, packed = data.prepared.cache, data.prepared.counts, data.packed
    held_out = sum(split.blocks for split in packed.held_out.values())
    state = "found" if cache.hit else f"built in {cache.seconds:.2f} s"
    return "\n".join(
        [
            f"token cache {cache.key} ({state})",
            f"  location   {cache.directory}",
            f"  sequences  {counts['train_sequences']} train, {counts['valid_sequences']} validation, "
            f"{counts['eval_sequences']} held out",
            f"  tokens     {counts['train_tokens']} train, {counts['valid_tokens']} validation, "
            f"{counts['eval_tokens']} held out",
            f"  blocks     {packed.train.blocks} train, {held_out} held out, of {packed.train.block_size} tokens "
            f"({packed.train.efficiency:.1%} filled)",
            f"  took       {seconds:.2f} s",
        ]
    )

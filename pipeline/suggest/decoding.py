"""Greedy answers to many prompts at once, for the evaluation and `generate`.

`model.generate` prefills a whole batch in one forward, pads every prompt to the batch's longest and keeps
every row until the last one ends. The held-out commits' answers are most of what an evaluation pays (on a
CPU most of it reading the prompts; on a GPU the steps, each costing about as much for a few rows as for
hundreds, so a batch there is as large as its free memory holds), and this module instead:

- computes the prompts' common beginning (the chat template's system prompt and instruction) once, and
  copies its KV cache into each batch;
- prefills a batch a thousand tokens a forward on a CPU (a wider forward's activations leave the
  processor's caches and it runs slower a token), eight thousand on a GPU, each forward padded only to its
  own longest prompt;
- keeps room for the answers in the KV cache, so that a step writes its position in place (a plain
  cache copies itself whole to grow by one position);
- lets rows leave the batch (and its cache) when a quarter of it has ended, so a batch of all 100
  prompts pays for its longest answer's steps once, at the cost of the rows still writing;
- ends a commit message at the line break that completes a line it already wrote (`unlooped` cuts
  there): a greedy answer that starts over loops to the token limit.

The tokens are the ones `model.generate` picks (greedy, the same positions, padding masked; a message
cut where `unlooped` cuts `model.generate`'s), in less time (`benchmarks/bench_decoding.py` measures
both; docs/experiments.md keeps the figures).
"""

from __future__ import annotations

import copy
import functools
import re
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from typing import Any

from pipeline.suggest.completion import body_ended, body_of
from pipeline.train.model import causal_lm, scoring

SHARED_PREFIX_MIN = 16  # a common beginning shorter than this is not worth a copy per batch
# Tokens per prefill forward on a CPU, where longer forwards prefill fewer tokens a second
# (docs/experiments.md, the decoding).
CPU_PREFILL_TOKENS = 1024
# KV-cache tokens (rows × (longest prompt + answer)) of one batch on a CPU: a batch pays its longest
# answer's steps once, for all its rows, so the held-out commits' messages are one batch.
CPU_BATCH_TOKENS = 32768
# A GPU's step takes about as long for 16 rows as for hundreds (its time is the forward's kernel launches,
# not its arithmetic), so a batch there is as large as this share of the GPU's free memory holds in KV
# cache (what batches of 16 rows cost a GPU's run: docs/experiments.md, on a GPU).
# A quarter: joining the prefilled parts holds their caches and the joined one at once, and the rest is
# the prefill's activations and the logits.
GPU_CACHE_SHARE = 0.25
# Tokens per prefill forward on a GPU: its activations, not its speed, are what a longer one costs.
GPU_PREFILL_TOKENS = 8192
# Rows whose answers ended are taken out of a batch once they are this share of it: a row left in costs a
# step's share of compute, taking rows out a copy of the whole cache (docs/experiments.md, the decoding).
LEFT_SHARE = 0.25


@contextmanager
def merged(model, quantization: str) -> Iterator[None]:
    """The LoRA weights folded into the base weights while answering, and taken out after: the same
    function, without a second small matmul and peft's Python per adapted layer on every generated token
    (the scoreboard and `generate` both answer so, and give the same answers). A quantized base is left
    as it is: folding into 4 or 8 bits would round the adapter away. Weights already folded (`fold`)
    stay so."""
    fold = _foldable(model, quantization) and not folded(model)
    if fold:
        _fold(model)
    try:
        yield
    finally:
        if fold:
            _unfold(model)


def fold(model, quantization: str) -> None:
    """The LoRA weights folded into the base weights until something takes them out (`base_only`), for a
    process that answers request after request: `merged` then costs nothing, where folding and unfolding
    each time reads and writes every adapted weight twice."""
    if _foldable(model, quantization) and not folded(model):
        _fold(model)


def folded(model) -> bool:
    """Whether the adapter's weights are in the base weights now (peft keeps it per adapted layer)."""
    return any(getattr(layer, "merged", False) for layer in _adapted(model))


# A bf16 (or fp16) base weight's values that folding the adapter in and taking it out again (peft subtracts
# it) does not give back, by adapted layer: each fold and unfold moved them further, and a base model's
# answers drifted from the base's. `_unfold` puts them back.
_ROUNDED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _fold(model) -> None:
    """peft's merge, layer by layer; a low-precision base weight's is tried once and taken out first, to
    learn which values that round trip does not give back (merging is deterministic: the second fold's
    round trip misses the same ones)."""
    import torch

    for layer in _adapted(model):
        weight = layer.get_base_layer().weight
        if weight.dtype not in (torch.bfloat16, torch.float16):
            layer.merge()
            continue
        before = weight.detach().clone()
        layer.merge()
        layer.unmerge()
        changed = (weight != before).nonzero(as_tuple=True)
        weight.data[changed] = before[changed]
        layer.merge()
        _ROUNDED[layer] = (changed, before[changed])


def _unfold(model) -> None:
    """peft's unmerge, layer by layer, and the values folding rounded put back as they were."""
    for layer in _adapted(model):
        layer.unmerge()
        if (rounded := _ROUNDED.pop(layer, None)) is not None:
            changed, values = rounded
            layer.get_base_layer().weight.data[changed] = values


def _adapted(model) -> list:
    """The layers peft adapted (each folds and unfolds its own weights), as peft's merge finds them; none
    in a model without an adapter (peft is not imported for it)."""
    if not getattr(model, "peft_config", None):
        return []
    from peft.tuners.tuners_utils import BaseTunerLayer

    return [layer for layer in model.modules() if isinstance(layer, BaseTunerLayer)]


def _foldable(model, quantization: str) -> bool:
    return bool(
        hasattr(model, "merge_adapter") and quantization == "none" and getattr(model, "peft_config", None)
    )


@contextmanager
def base_only(model) -> Iterator[None]:
    """The base model alone while answering: the adapter taken out of the weights where it was folded in,
    and its layers skipped (peft's `disable_adapter`): the same weights the base model answered with
    before training."""
    if folded(model):
        _unfold(model)
    with model.disable_adapter() if getattr(model, "peft_config", None) else nullcontext():
        yield


def generate_batched(
    model,
    tokenizer,
    prompts: Sequence[str],
    max_new_tokens: int,
    precision: str,
    stop_at_newline: bool = False,
    progress: Callable[[int, int], None] | None = None,
    cut_loops: bool = False,
    next_line: bool = False,
    block: bool = False,
) -> list[str]:
    """Greedy continuations of `prompts` (at most `max_new_tokens` each, ending at the end-of-sequence
    token; with `stop_at_newline`, at their first line break, which is left out; with `cut_loops`, for
    commit messages, where they start over: `unlooped`; code and diffs repeat lines). With `next_line`,
    each prompt ends where a line of code does, before its line break or after it and the blank lines
    under it (a cursor on a new line), and the answer is the next line: the prompt is read without its
    line breaks, and the first tokens spell them, as the model chooses to (`line_breaks`; BPE tokenizers
    merge a line break with what follows it, the next line's indentation or another line break, so a
    prompt ending in a bare one is off their distribution: token healing), and the answer is what
    follows them up to the next; with `block`, healed so too, the answer is the body it begins, ended and
    cut where a line is indented less (`body_ended`, `body_of`).
    `progress` is told how many prompts each prefill
    forward read and their tokens (most of the time on a CPU; the common beginning's as no prompt, once:
    `tokens_read` counts them all), and (0, 0) after each step that writes the answers, for a progress
    line that keeps coming while they are written."""
    if not prompts:
        return []
    device = next(model.parameters()).device
    heals = next_line or block
    healed, encoded = _read(tokenizer, prompts, heals)
    shared = _shared_prefix(encoded)
    lengths = [len(tokens) - shared for tokens in encoded]
    joinable = _plain_attention(model)
    ends = _Ends(tokenizer, stop_at_newline or next_line, cut_loops, heals, block)
    outputs: list[str] = [""] * len(prompts)
    with scoring(model, precision):
        forward_tokens, batch_tokens = _sizes(model, device, joinable, len(prompts))
        prefix = _prefix_cache(model, encoded[0][:shared], device) if shared else None
        if shared and progress is not None:
            progress(0, shared)
        for chosen in _batches(lengths, max_new_tokens, batch_tokens):
            rows = [encoded[i][shared:] for i in chosen]
            spelled = [healed[i][1] for i in chosen]
            parts = _parts([len(row) for row in rows], forward_tokens) if joinable else None
            prefilled = _prefilled(
                model, rows, shared, prefix, tokenizer.pad_token_id, parts, max_new_tokens, progress,
                tokenizer, spelled,
            )  # fmt: skip
            answers = _greedy(model, rows, shared, prefilled, max_new_tokens, ends, progress, spelled)
            for index, answer in zip(chosen, answers, strict=True):
                text = tokenizer.decode(answer, skip_special_tokens=True)
                outputs[index] = finished(text, stop_at_newline or next_line, cut_loops, heals, block)
    return outputs


def tokens_read(tokenizer, prompts: Sequence[str], heals: bool) -> int:
    """The tokens `generate_batched` reads for `prompts` (`heals`: with `next_line` or `block`), their
    common beginning once: what answering them costs on a CPU, where the prompts' lengths differ."""
    if not prompts:
        return 0
    encoded = _read(tokenizer, prompts, heals)[1]
    shared = _shared_prefix(encoded)
    return shared + sum(len(tokens) - shared for tokens in encoded)


def _read(tokenizer, prompts: Sequence[str], heals: bool) -> tuple[list[tuple[str, int]], list[list[int]]]:
    """Each prompt as the model reads it with the line breaks its answer spells first (`healing`, where
    it `heals`), and its tokens."""
    healed = [healing(prompt) for prompt in prompts] if heals else [(prompt, 0) for prompt in prompts]
    return healed, tokenizer([read for read, _ in healed], add_special_tokens=False)["input_ids"]


def healing(prompt: str) -> tuple[str, int]:
    """A next line's `prompt` as the model reads it, without the line breaks it ends with, and how many
    its answer spells first: those, or the one that ends its last line where it ends without one. A
    prompt that ends otherwise (in `<fim_middle>`: an infilled prefix ends before its last line break,
    as training's infilled files were split) is read as it is."""
    read = prompt.rstrip("\n")
    return read, max(len(prompt) - len(read), 1)


def line_breaks(tokenizer, count: int = 1) -> list[int]:
    """The tokens a healed answer that has `count` line breaks still to spell may write: some of them
    (the tokenizer splits a blank line before a word so), or all of them and what begins the next line
    (its indentation, a word). Not one more: a completion offers a line of code, never a blank one, as
    an editor's does (and `breaking` keeps it from writing one after)."""
    kept = _LINE_BREAKS.setdefault(tokenizer, {})
    if count not in kept:
        breaks = "\n" * count
        kept[count] = [
            t
            for t, text in enumerate(token_texts(tokenizer))
            if text and (breaks.startswith(text) or (text.startswith(breaks) and "\n" not in text[count:]))
        ]
    return kept[count]


def to_spell(texts: list[str], answer: Sequence[int], count: int) -> int:
    """How many of the `count` line breaks an answer healed over are still to be spelled by `answer`'s
    tokens (`texts`: `token_texts`), which `line_breaks` keeps to line breaks until they are."""
    return max(count - sum(len(texts[token]) for token in answer), 0) if count else 0


def breaking(tokenizer) -> list[int]:
    """The tokens whose text holds a line break: what a next line's answer may not write while its line
    holds nothing but spaces. A lone line break followed by another is a blank line the tokenizer would
    have written as one token, which `line_breaks` leaves out, so the model never read it so; a blank
    line is no completion."""
    return [t for t, text in enumerate(token_texts(tokenizer)) if "\n" in text]


def healed_tokens(tokenizer, width: int, breaks: Sequence[int] = ()) -> Callable[[int, Any], list[int]]:
    """`model.generate`'s `prefix_allowed_tokens_fn` for a batch of prompts `width` tokens wide that it
    answers as `generate_batched` answers a next line or a body, each row healed over its `breaks` line
    breaks (one each where none are given): `line_breaks` until they are spelled, then none of `breaking`
    while the answer is blank."""
    texts, everything = token_texts(tokenizer), list(range(len(tokenizer)))
    unbroken = sorted(set(everything) - set(breaking(tokenizer)))

    def allowed(row: int, seen) -> list[int]:
        answer = seen[width:].tolist()
        if left := to_spell(texts, answer, breaks[row] if breaks else 1):
            return line_breaks(tokenizer, left)
        return unbroken if blank(texts, answer) else everything

    return allowed


def blank(texts: list[str], answer: Sequence[int]) -> bool:
    """Whether `answer`'s tokens (`texts`: `token_texts`) have written nothing but spaces yet."""
    return not any(texts[token].strip() for token in answer)


def token_texts(tokenizer) -> list[str]:
    """Each token's text, by its id: found once per tokenizer (it decodes the whole vocabulary), as every
    code task of an evaluation and every answer `serve` heals reads them."""
    if tokenizer not in _TEXTS:
        _TEXTS[tokenizer] = [tokenizer.decode([token]) for token in range(len(tokenizer))]
    return _TEXTS[tokenizer]


_TEXTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_LINE_BREAKS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _sizes(model, device, joinable: bool, prompts: int) -> tuple[int, int]:
    """Tokens a prefill forward reads and KV-cache tokens a batch holds, on `device`: a CPU's (and any
    other but a CUDA GPU's) fixed numbers; on a CUDA GPU, GPU_CACHE_SHARE of its free memory in this
    model's cache, a batch whose cache cannot be joined (prefilled in one forward) no more than a forward.
    A single prompt is a batch of one whatever the memory: a server's request measures nothing."""
    if device.type != "cuda":
        return CPU_PREFILL_TOKENS, CPU_BATCH_TOKENS
    if prompts == 1:
        return GPU_PREFILL_TOKENS, 0
    import torch

    free, _ = torch.cuda.mem_get_info(device)
    free += torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)  # held by torch, unused
    tokens = int(free * GPU_CACHE_SHARE) // cache_bytes_per_token(model, device)
    return GPU_PREFILL_TOKENS, tokens if joinable else min(tokens, GPU_PREFILL_TOKENS)


def cache_bytes_per_token(model, device) -> int:
    """What one token of one row takes in the model's KV cache, in the dtype it answers in: measured by a
    one-token forward, whatever the model's layers keep."""
    import torch

    cache = _empty_cache(model)
    causal_lm(model).get_decoder()(
        input_ids=torch.zeros((1, 1), dtype=torch.long, device=device), cache=cache, use_cache=True
    )
    tensors = [getattr(layer, name, None) for layer in cache.layers for name in ("keys", "values")]
    return sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor))


def _batches(lengths: Sequence[int], answer: int, tokens: int) -> list[list[int]]:
    """The prompts' indices, shortest first, in batches whose KV cache (each row as long as the batch's
    longest prompt and `answer`) holds at most `tokens`, one row at least."""
    batches: list[list[int]] = []
    for index in sorted(range(len(lengths)), key=lengths.__getitem__):
        last = batches[-1] if batches else None
        grown = (len(last) + 1) * (lengths[index] + answer) if last else 0
        if last and grown <= tokens:
            last.append(index)
        else:
            batches.append([index])
    return batches


def _shared_prefix(encoded: Sequence[Sequence[int]]) -> int:
    """How many tokens every prompt begins with (0 when under SHARED_PREFIX_MIN or a single prompt);
    each prompt keeps at least one token of its own, whose logits start its answer."""
    if len(encoded) < 2:
        return 0
    first = encoded[0]
    length = min(min(len(tokens) for tokens in encoded) - 1, *(shared_length(first, t) for t in encoded[1:]))
    return length if length >= SHARED_PREFIX_MIN else 0


def shared_length(first: Sequence[int], second: Sequence[int]) -> int:
    """How many tokens two sequences begin with alike."""
    for index, (mine, theirs) in enumerate(zip(first, second, strict=False)):
        if mine != theirs:
            return index
    return min(len(first), len(second))


def finished(
    text: str, stop_at_newline: bool, cut_loops: bool, next_line: bool = False, block: bool = False
) -> str:
    """A generated continuation as an answer: its first line with `stop_at_newline` (code), cut where it
    starts over with `cut_loops` (commit messages); with `next_line`, the line after the line break it
    begins with; with `block` too, the body that begins there (`body_of`). `model.generate`'s text,
    finished so, is what the decoder's answers are held to."""
    if next_line:
        text = text.lstrip("\n")
    if block:
        return body_of(text)
    if stop_at_newline:
        text = text.split("\n", 1)[0]
    return unlooped(text) if cut_loops else text


def unlooped(text: str) -> str:
    """`text` before the first line that repeats an earlier non-blank one, or within the first line that
    says one phrase three times running, after its first (`_phrase_loop`). A greedy answer that starts
    over has said what it had to say, and the rest is a loop until the token limit: "Update changelog",
    seven times more, from a model trained five minutes on jpadilla/pyjwt (58 of its 71 held-out answers
    looped so, and 36 to 41 of 100 of the base model's on every repository measured); "fix: fix: fix: …"
    within a line (spf13/cobra). Line by line, so that a cut never moves for what follows it: the
    decoder ends an answer at a line break where this cuts it."""
    seen: set[str] = set()
    lines = text.split("\n")
    for number, line in enumerate(lines):
        key = line.strip()
        if key in seen:
            return "\n".join(lines[:number]).rstrip()
        cut = _phrase_loop(line)
        if cut is not None:
            return "\n".join([*lines[:number], cut]).rstrip()
        if key:
            seen.add(key)
    return text


_WORDS = re.compile(r"\S+")
LOOP_PHRASE_WORDS = 8  # the longest phrase a line's loop is looked for in


def _phrase_loop(line: str) -> str | None:
    """`line` up to the end of the first phrase (1 to LOOP_PHRASE_WORDS words, one of them with a letter or
    digit) that it then says twice more right after; None where it says none so."""
    spans = [match.span() for match in _WORDS.finditer(line)]
    words = [line[start:end] for start, end in spans]
    for first in range(len(words)):
        for size in range(1, min(LOOP_PHRASE_WORDS, (len(words) - first) // 3) + 1):
            phrase = words[first : first + size]
            if phrase == words[first + size : first + 2 * size] == words[
                first + 2 * size : first + 3 * size
            ] and any(character.isalnum() for word in phrase for character in word):
                return line[: spans[first + size - 1][1]]
    return None


class _Ends:
    """Whether a generated token ends its answer (each token's text decoded once; with `cut_loops`, the
    answer's text again at each of its line breaks)."""

    def __init__(
        self,
        tokenizer,
        at_newline: bool,
        cut_loops: bool = False,
        next_line: bool = False,
        block: bool = False,
    ):
        self.tokenizer, self.at_newline, self.eos = tokenizer, at_newline, tokenizer.eos_token_id
        self.cut_loops, self.next_line, self.block = cut_loops, next_line, block
        self.newline: dict[int, bool] = {}
        # A healed answer's: each token's text, and those it may not write while its first line is blank
        # (a message's answer decodes only the tokens it writes, not the whole vocabulary: the hook waits for it).
        self.texts = token_texts(tokenizer) if next_line else []
        self.breaking = breaking(tokenizer) if next_line else []

    def kept(self, token: int) -> bool:
        """False for the end-of-sequence token, which is not part of the answer."""
        return token != self.eos

    def last(self, token: int, answer: list[int]) -> bool:
        """True when `answer` (its tokens so far, this kept one the last) ends with it: at a line break
        with `at_newline`; with `cut_loops`, at a line break that completes a line the answer already
        wrote, where `unlooped` cuts it anyway (the steps a loop would take are saved); with `block`, where
        the body it writes has ended (`body_ended`)."""
        if self.block:
            return body_ended(self.tokenizer.decode(answer, skip_special_tokens=True).lstrip("\n"))
        if not (self.at_newline or self.cut_loops):
            return False
        if self.next_line and blank(self.texts, answer[:-1]):  # spelling the healed line breaks
            return "\n" in self.texts[token].lstrip("\n")
        if token not in self.newline:
            self.newline[token] = "\n" in self.tokenizer.decode([token])
        if not self.newline[token]:
            return False
        if self.at_newline:
            return True
        complete = self.tokenizer.decode(answer, skip_special_tokens=True).rpartition("\n")[0]
        return unlooped(complete) != complete


def _prefix_cache(model, tokens: list[int], device):
    """The KV cache of the prompts' common beginning, for one row."""
    import torch

    cache = _empty_cache(model)
    causal_lm(model).get_decoder()(
        input_ids=torch.tensor([tokens], device=device), cache=cache, use_cache=True
    )
    return cache


def _greedy(
    model, rows: list[list[int]], shared: int, prefilled, max_new_tokens: int, ends: _Ends, progress,
    spelled: list[int],
):  # fmt: skip
    """The answer tokens of each row (prompts after `shared` common tokens, shortest first), decoded
    together over the KV cache `prefilled` holds with each row's first answer token, each healed over
    its `spelled` line breaks (0: not healed). A row whose answer ended stays in the batch (its tokens
    unread) until LEFT_SHARE of the batch has ended: taking rows out copies the whole cache. `progress`
    (None: nobody) is told (0, 0) after each step: still at work."""
    import torch

    device = next(model.parameters()).device
    mask = _mask(rows, shared, len(rows[-1]), device)
    cache, token = prefilled
    breaks = torch.tensor(ends.breaking, dtype=torch.long, device=device)
    last = torch.tensor([shared + len(row) - 1 for row in rows], device=device)
    answers: list[list[int]] = [[] for _ in rows]
    # The answer each row of the batch writes, None once it ended.
    writing: list[int | None] = list(range(len(rows)))
    for step in range(max_new_tokens):
        for place, (row, chosen) in enumerate(zip(writing, token.tolist(), strict=True)):  # one device sync
            if row is None:
                continue
            kept = ends.kept(chosen)
            if kept:
                answers[row].append(chosen)
            if not kept or ends.last(chosen, answers[row]) or step + 1 == max_new_tokens:
                writing[place] = None
        staying = [place for place, row in enumerate(writing) if row is not None]
        if not staying:
            break
        if len(staying) < len(writing) and len(staying) <= (1 - LEFT_SHARE) * len(writing):
            keep = torch.tensor(staying, device=device)
            cache.batch_select_indices(keep)
            mask, token, last = mask[keep], token[keep], last[keep]
            writing = [writing[place] for place in staying]
        mask = torch.cat([mask, mask.new_ones(len(writing), 1)], dim=-1)
        last = last + 1
        out = model(
            input_ids=token[:, None], attention_mask=mask, position_ids=last[:, None], cache=cache,
            use_cache=True,
        )  # fmt: skip
        logits = out.logits[:, -1]
        if len(breaks):  # a healed answer's line holds a character before a line break ends it
            left = [
                to_spell(ends.texts, answers[row], spelled[row]) if row is not None else 0 for row in writing
            ]
            unopened = [
                place
                for place, row in enumerate(writing)
                if row is not None and not left[place] and blank(ends.texts, answers[row])
            ]
            logits[torch.tensor(unopened, dtype=torch.long, device=device)[:, None], breaks] = float("-inf")
            for place, count in enumerate(left):
                if count:  # still spelling the line breaks its prompt was read without
                    logits[place] += _only(logits[place], line_breaks(ends.tokenizer, count))
        token = logits.argmax(-1)
        if progress is not None:
            progress(0, 0)
    return answers


def _mask(rows: list[list[int]], shared: int, width: int, device):
    """The attention mask of `rows` after `shared` common tokens, each left-padded to `width`."""
    import torch

    return torch.tensor(
        [[1] * shared + [0] * (width - len(row)) + [1] * len(row) for row in rows], device=device
    )


def _prefilled(
    model, rows: list[list[int]], shared: int, prefix, pad: int, parts: list[range] | None, room: int,
    progress, tokenizer=None, spelled: Sequence[int] = (),
):  # fmt: skip
    """The batch's KV cache (each row left-padded to the longest, after the `shared` tokens `prefix`
    holds) and each row's first answer token. With `parts` (every cached layer plain attention), a part's
    rows a forward, each forward padded only to its own longest row, their caches copied into one with
    `room` more positions for the answers; else (None) the batch in one forward (a sliding window's or a
    recurrent layer's cache cannot be padded after the fact). `progress` (None: nobody) is told each
    forward's rows and their tokens; a row healed over `spelled` line breaks (those given) begins spelling them
    (`line_breaks` of `tokenizer`)."""
    import torch

    device = next(model.parameters()).device
    caches, tokens = [], []
    for part in parts or [range(len(rows))]:
        chosen = [rows[i] for i in part]
        longest = len(chosen[-1])
        ids = torch.tensor([[pad] * (longest - len(row)) + row for row in chosen], device=device)
        mask = _mask(chosen, shared, longest, device)
        cache = _cache_for(model, prefix, len(chosen))
        logits = last_logits(
            model, input_ids=ids, attention_mask=mask,
            position_ids=(mask.cumsum(-1) - 1).clamp(min=0)[:, shared:], cache=cache, use_cache=True,
        )[:, -1]  # fmt: skip
        caches.append(cache)
        for place, row in enumerate(part):
            if spelled and spelled[row]:
                logits[place] += _only(logits[place], line_breaks(tokenizer, spelled[row]))
        tokens.append(logits.argmax(-1))
        if progress is not None:
            progress(len(chosen), sum(len(row) for row in chosen))
    return (_joined(caches, shared, len(rows[-1]), room) if parts else caches[0]), torch.cat(tokens)


def _only(logits, allowed: list[int]):
    """What to add to one row's `logits` so that only the `allowed` tokens can be chosen."""
    import torch

    kept = torch.full_like(logits, float("-inf"))
    kept[allowed] = 0.0
    return kept


def last_logits(model, keep: int = 1, **inputs):
    """The next-token logits at each row's last `keep` positions after a forward of `inputs`, [rows, keep,
    vocabulary]: the decoder's hidden states there, as a [rows × keep, hidden] matrix, through the output
    layer. The model's own `logits_to_keep` hands that layer a strided [rows, keep, hidden] slice, which
    torch's matmul does not fold into one matrix product when the weight does not require grad: it copied
    the whole output layer once per row, many times the product's own cost in bf16 (`serve`'s first
    forward of each answer, which reads the typed tokens and a guess at the next ones: docs/use.md)."""
    causal = causal_lm(model)
    hidden = causal.get_decoder()(**inputs).last_hidden_state[:, -keep:]
    return causal.get_output_embeddings()(hidden.reshape(-1, hidden.shape[-1])).view(*hidden.shape[:2], -1)


def _parts(lengths: list[int], tokens: int) -> list[range]:
    """Consecutive rows (shortest first) in prefill forwards of at most `tokens` tokens each (rows × the
    forward's longest), at least one row a forward."""
    parts: list[range] = []
    start = 0
    for end in range(1, len(lengths) + 1):
        if end - start > 1 and (end - start) * lengths[end - 1] > tokens:
            parts.append(range(start, end - 1))
            start = end - 1
    parts.append(range(start, len(lengths)))
    return parts


def _empty_cache(model):
    from transformers import DynamicCache

    return DynamicCache(config=model.config)


def _plain_attention(model) -> bool:
    """Whether every layer of the model's KV cache keeps all keys and values (no sliding window, no
    recurrent state): only such a cache can be padded and joined after its rows were computed apart."""
    from transformers.cache_utils import DynamicLayer

    return all(type(layer) is DynamicLayer for layer in _empty_cache(model).layers)


def _cache_for(model, prefix, rows: int):
    """A KV cache for `rows` rows: the common beginning's, copied to each row, or an empty one."""
    if prefix is None:
        return _empty_cache(model)
    cache = copy.deepcopy(prefix)
    cache.batch_repeat_interleave(rows)
    return cache


def _joined(caches: list, shared: int, width: int, room: int):
    """One KV cache of plain attention layers holding the rows of `caches` (computed apart after the same
    `shared` common positions, each as wide as its own longest row) in order, every row's own positions
    moved to end at `shared + width` (the gap after the common ones zeros, masked, as left padding would
    have put them), with `room` positions reserved after them for the answers."""
    from transformers import DynamicCache

    reserved = _reserved_layer()
    joined = DynamicCache()  # layers replicated on demand, here all given
    joined.layers = [
        reserved([cache.layers[place] for cache in caches], shared, width, room)
        for place in range(len(caches[0].layers))
    ]
    return joined


@functools.cache
def _reserved_layer():
    """DynamicLayer with room reserved for the answers (a class made on first use: transformers is
    imported only by what runs a model)."""
    from transformers.cache_utils import DynamicLayer

    class Reserved(DynamicLayer):
        """A decoding step writes its position in place, where DynamicLayer copies the whole cache to
        append it, which was a third of a step (docs/experiments.md, the decoding)."""

        def __init__(self, parts: list, shared: int, width: int, room: int):
            super().__init__()
            length = shared + width
            rows = sum(part.keys.shape[0] for part in parts)
            # Each in its own dtype, as the parts' caches keep them: under autocast the keys and the values
            # need not share one.
            self.buffers = {}
            for name in ("keys", "values"):
                first = getattr(parts[0], name)
                self.buffers[name] = first.new_zeros(rows, first.shape[1], length + room, first.shape[3])
            start = 0
            for part in parts:
                end, own = start + part.keys.shape[0], part.keys.shape[2] - shared
                for name, buffer in self.buffers.items():
                    states = getattr(part, name)
                    buffer[start:end, :, :shared] = states[:, :, :shared]
                    buffer[start:end, :, length - own : length] = states[:, :, shared:]
                start = end
            self.device, self.is_initialized = parts[0].keys.device, True
            self._show(length)

        def _show(self, length: int) -> None:
            """keys and values: the buffers' first `length` positions (views, not copies)."""
            self.keys = self.buffers["keys"][:, :, :length]
            self.values = self.buffers["values"][:, :, :length]

        def update(self, key_states, value_states, *args, **kwargs):
            length = self.keys.shape[2]
            grown = length + key_states.shape[2]
            self.buffers["keys"][:, :, length:grown] = key_states
            self.buffers["values"][:, :, length:grown] = value_states
            self._show(grown)
            return self.keys, self.values

        def batch_select_indices(self, indices) -> None:
            length = self.keys.shape[2]
            self.buffers = {name: states[indices] for name, states in self.buffers.items()}
            self._show(length)

    return Reserved

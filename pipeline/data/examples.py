"""Training examples: a sequence record → token ids and a loss mask, in the planned text style.

- `chat` (instruct models, whose tokenizer has a chat template): each format
  becomes a conversation rendered with `apply_chat_template`. `message`: the
  user gives the diff, the assistant writes the commit message; `diff` and
  `rich`: the user gives the intent, the assistant writes the change. The
  loss covers the assistant's tokens only (its closing end-of-turn token
  included, so the model learns where to stop). A change's answer starts
  with `diff --git a/` given in the prompt (`ANSWER_PREFIX`). A prompt longer than
  `max_prompt_tokens`, or too long for `max_tokens` with its answer, is cut,
  never the answer, so every example keeps its target.
- `raw` (base models and `tiny`): the scraped text as it is, then EOS; the
  loss covers every token, or with `loss_on: response` only the part after
  the prompt (the change for `diff`, the message for `message`).

- `file` (the repository's files at the split point, whatever the style): the
  file as code models are pretrained on it (`code_document`), then EOS, every
  token learned: completing the code is the model's pretraining task, not a chat.
  Where the tokenizer has fill-in-the-middle tokens, half the files (chosen by
  their text) are rearranged to fill in a span of their lines
  (`infilled_document`), as such models are pretrained and as an editor asks.

Evaluation prompts are rendered by the same functions, so the model is asked
exactly what it was trained to answer.
"""

from __future__ import annotations

import random
from typing import Any

from pipeline.base_models import FIM_TOKENS
from pipeline.config import LoadedConfig
from pipeline.decisions import Decisions
from pipeline.errors import ConfigError
from pipeline.types import TextStyle
from scrapers.formats import MESSAGE_HEADING, prompt_and_response

SYSTEM_PROMPT = (
    "You are a developer on this repository. You write its changes and its commit messages "
    "in its own style and conventions."
)
INSTRUCTIONS = {
    "message": "Write the commit message for this change.",
    "diff": "Write the change (a unified diff) for this commit message.",
    "rich": "Write the change (a unified diff) for this commit.",
}
MIN_PROMPT_TOKENS = 64  # a prompt is never cut below this, even for a very long answer
HEAD_CHARACTERS_PER_TOKEN = 4  # a first guess at the text that holds a prompt (doubled until it does)
FILE_FORMAT = "file"
ANSWER_PREFIX = {"diff": "diff --git a/", "rich": "diff --git a/"}
"""How a chat answer for a change always begins. It is given with the prompt, so the model is never
asked to choose between writing a diff and writing a message: the prompt says which."""


def code_document(path: str, text: str) -> str:
    """A file as StarCoder's and SmolLM2's pretraining saw one: the `<filename>` token, its path, its text
    (a tokenizer without the token reads it as text)."""
    return f"<filename>{path}\n{text}"


FIM_RATE = 0.5  # of the files trained on, where the tokenizer infills: StarCoder's rate
FIM_LINES = 8  # most lines of a file's span filled in: a line or a block's body, as completion asks


def infill_text(prefix: str, suffix: str, middle: str = "") -> str:
    """What a model with fill-in-the-middle tokens reads to write the text between `prefix` and `suffix`
    (prefix, suffix, middle: the order StarCoder trained), and, in training, `middle` itself."""
    return f"{FIM_TOKENS[0]}{prefix}{FIM_TOKENS[1]}{suffix}{FIM_TOKENS[2]}{middle}"


def infilled_document(path: str, text: str) -> str | None:
    """`code_document(path, text)` as a fill-in-the-middle exercise (FIM_RATE of files, chosen by their
    text, so a cache rebuilt gives the same): a span of 1 to FIM_LINES whole lines moved after the rest,
    split where completion's answers begin, before the line break in front of the span (BPE merges it
    with the next line's indentation: the prompts the scoreboard asks end there, `pipeline.suggest.
    completion`). None for the other files, and a file of one line: they are trained as they are."""
    chance = random.Random(f"{path}\0{text}")
    lines = code_document(path, text).split("\n")
    if chance.random() >= FIM_RATE or len(lines) < 3:
        return None
    start = chance.randrange(1, len(lines) - 1)  # after the <filename> line; the span never the file's end
    end = min(len(lines) - 1, start + chance.randint(1, FIM_LINES))
    prefix, middle, suffix = "\n".join(lines[:start]), "\n".join(lines[start:end]), "\n".join(lines[end:])
    return infill_text(prefix, f"\n{suffix}", f"\n{middle}")


def style_key(style: TextStyle) -> dict[str, Any]:
    """What the token cache's key must know about how texts become tokens."""
    return {
        "style": style.style,
        "loss_on": style.loss_on,
        "system": SYSTEM_PROMPT if style.style == "chat" else None,
        "instructions": INSTRUCTIONS if style.style == "chat" else None,
    }


def chat_messages(format_name: str, content: str) -> list[dict[str, str]]:
    """The system and user turns that ask for a format's answer."""
    return [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": f"{INSTRUCTIONS[format_name]}\n\n{content}"},
    ]


def prompt_content(format_name: str, prompt: str) -> str:
    """What a record's prompt part gives: the diff (for a message) or the intent (for a change)."""
    return (
        prompt.removesuffix(f"\n{MESSAGE_HEADING}\n").strip() if format_name == "message" else prompt.strip()
    )


def render_prompt(
    tokenizer, style: TextStyle, format_name: str, content: str, room: int | None = None
) -> str:
    """The text a model continues to answer `content`, as the scraped format or the chat template
    writes it; with `room`, `content` is cut from its end so that the text takes at most that many
    tokens (never fewer than MIN_PROMPT_TOKENS). `content` is read as training's prompts hold it
    (`_as_trained`): a diff piped in with more line breaks after it is asked as the scoreboard asks."""
    content = _as_trained(style, format_name, content)
    if room is None:
        return _render(tokenizer, style, format_name, content)
    room = max(MIN_PROMPT_TOKENS, room)
    content, ids = _head(tokenizer, content, room)
    text = _render(tokenizer, style, format_name, content)
    excess = len(tokenizer(text, add_special_tokens=False)["input_ids"]) - room
    if excess <= 0:
        return text
    if ids is None:
        ids = tokenizer(content, add_special_tokens=False)["input_ids"]
    return _render(tokenizer, style, format_name, tokenizer.decode(ids[: max(0, len(ids) - excess)]))


def _head(tokenizer, content: str, tokens: int) -> tuple[str, list[int] | None]:
    """The start of `content` that holds at least `tokens` tokens, and those tokens, ending where the
    pre-tokenizer starts a piece: BPE never merges across pieces, so its tokens are the first ones of the
    whole `content`, and the prompt cut from it is the same (checked on every message of three
    histories). Cutting a 30,000-token diff to 256 tokens then tokenizes a few thousand characters
    instead of all of it twice. The
    whole `content`, not tokenized here (None), where it is short or where a head cannot be known: a
    tokenizer without a pre-tokenizer, or with a normalizer (its offsets are not the text's)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or backend.normalizer is not None or backend.pre_tokenizer is None:
        return content, None
    characters = tokens * HEAD_CHARACTERS_PER_TOKEN
    while characters < len(content):
        head = content[:characters]
        pieces = backend.pre_tokenizer.pre_tokenize_str(head)
        head = head[: pieces[-1][1][0]]  # the last piece may be a word cut short: left out
        ids = tokenizer(head, add_special_tokens=False)["input_ids"]
        if len(ids) >= tokens:
            return head, ids
        characters *= 2
    return content, None


def answer_prefix(style: TextStyle, format_name: str) -> str:
    """What the prompt already says of the answer (its text belongs in front of a generated answer)."""
    return ANSWER_PREFIX.get(format_name, "") if style.style == "chat" else ""


def _render(tokenizer, style: TextStyle, format_name: str, content: str) -> str:
    if style.style == "chat":
        return tokenizer.apply_chat_template(
            chat_messages(format_name, content), tokenize=False, add_generation_prompt=True
        ) + answer_prefix(style, format_name)
    return f"{content}\n{MESSAGE_HEADING}\n" if format_name == "message" else f"{content}\n\n"


def _as_trained(style: TextStyle, format_name: str, content: str) -> str:
    """`content` as training's prompts hold it, however it ends: a chat turn's stripped (`prompt_content`),
    raw text's diff ending in the one line break of its last line, raw text's commit message stripped."""
    if style.style == "chat" or format_name != "message":
        return content.strip()
    return content.rstrip("\n") + "\n"


def encode_batch(
    tokenizer, style: TextStyle, formats: list[str], texts: list[str], max_tokens: int, max_prompt_tokens: int
) -> tuple[list[list[int]], list[list[int]]]:
    """Token ids and loss masks (1 where a token carries a loss) for a batch of records (of files, or of
    the history: the two are tokenized apart)."""
    eos = tokenizer.eos_token_id
    if formats[:1] == [FILE_FORMAT] or (style.style != "chat" and style.loss_on == "all"):
        ids = tokenizer(texts, add_special_tokens=False)["input_ids"]
        return [[*row, eos] for row in ids], [[1] * (len(row) + 1) for row in ids]
    if style.style == "chat":
        return _encode_chat(tokenizer, style, formats, texts, max_tokens, max_prompt_tokens)
    parts = [prompt_and_response(name, text) for name, text in zip(formats, texts, strict=True)]
    prompts = tokenizer([p for p, _ in parts], add_special_tokens=False)["input_ids"]
    answers = tokenizer([r for _, r in parts], add_special_tokens=False)["input_ids"]
    return (
        [[*p, *r, eos] for p, r in zip(prompts, answers, strict=True)],
        [[0] * len(p) + [1] * (len(r) + 1) for p, r in zip(prompts, answers, strict=True)],
    )


def _encode_chat(
    tokenizer, style: TextStyle, formats: list[str], texts: list[str], max_tokens: int, max_prompt_tokens: int
) -> tuple[list[list[int]], list[list[int]]]:
    ids, masks = [], []
    for name, text in zip(formats, texts, strict=True):
        prompt, response = prompt_and_response(name, text)
        content = prompt_content(name, prompt)
        messages = chat_messages(name, content)
        asked = _render(tokenizer, style, name, content)
        whole = tokenizer.apply_chat_template(
            [*messages, {"role": "assistant", "content": response.strip()}], tokenize=False
        )
        # The answer is what the whole conversation adds to the prompt: the reply (less the prefix the
        # prompt gives) and its end-of-turn.
        answer = tokenizer(whole[len(asked) :], add_special_tokens=False)["input_ids"]
        room = min(max_prompt_tokens, max_tokens - len(answer))
        asked_ids = tokenizer(render_prompt(tokenizer, style, name, content, room), add_special_tokens=False)[
            "input_ids"
        ]
        ids.append([*asked_ids, *answer])
        masks.append([0] * len(asked_ids) + [1] * len(answer))
    return ids, masks


def text_style(loaded: LoadedConfig, model_name: str, chat_template: bool) -> TextStyle:
    """How commits become tokens for this model (tokenizing needs it before the rest is planned)."""
    return style_decisions(Decisions(loaded), model_name, chat_template)


def style_decisions(p: Decisions, model_name: str, chat_template: bool) -> TextStyle:
    """How commits become training text for this model (chat or raw, what is learned, how it is
    averaged), recorded as the plan's first decisions: tokenizing needs them before the rest is planned."""
    if p.is_auto(lambda cfg: cfg.train.style):
        style = p.planned(
            "style",
            "chat" if chat_template else "raw",
            "the tokenizer has a chat template: conversations, as the instruct model was trained"
            if chat_template
            else "no chat template (a base model): the scraped text as it is",
        )
    else:
        style = p.from_config("style", lambda cfg: cfg.train.style)
        if style == "chat" and not chat_template:
            raise ConfigError(
                f"`train.style` is chat but {model_name}'s tokenizer has no chat template; "
                "set train.style=raw (or auto)"
            )
    if p.is_auto(lambda cfg: cfg.train.loss_on):
        loss_on = p.planned(
            "loss_on",
            "response" if style == "chat" else "all",
            "the assistant's answer only: the prompt is given, not learned"
            if style == "chat"
            else "every token: raw text is learned as a whole (set train.loss_on=response to learn answers only)",
        )
    else:
        loss_on = p.from_config("loss_on", lambda cfg: cfg.train.loss_on)
    if not p.is_auto(lambda cfg: cfg.train.loss_average):
        p.from_config("loss_average", lambda cfg: cfg.train.loss_average)
    elif loss_on == "response":
        p.planned(
            "loss_average",
            "answer",
            "answers differ in length by orders of magnitude: averaged per answer, a 20-token commit message "
            "weighs as much as a 700-token change instead of being drowned by it",
        )
    else:
        p.planned("loss_average", "token", "every token of raw text counts the same")
    return TextStyle(style, loss_on)

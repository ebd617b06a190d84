"""`serve`: the adapter behind an OpenAI-compatible HTTP server, for editors and tools that speak that API.

- `GET /v1/models`: the one model served, named after the repository (`--name` another).
- `POST /v1/completions`: the fine-tuned model continues `prompt` (an editor's text before the cursor);
  `suffix` is read only where the tokenizer has fill-in-the-middle tokens, else left out and said in the
  `X-Repotune-Suffix` header. With repotune's own `path` (the file's path in the repository), the answer
  is the next line as `generate --task code` writes it: the code system the run chose, context retrieved
  (the chunk most like the lines before the cursor may come from `suffix`), `suffix` read as the
  scoreboard gives the lines after the cursor.
- `POST /v1/chat/completions`: a chat with the fine-tuned model; a last message that holds a diff is
  answered by the run's suggestion system (the one the scoreboard chose: the repository's past, or the
  model), its `n` choices the next best messages.

Greedy unless `temperature` is above 0. Each answer is written here a step at a time, each step taking
with its token the ones guessed from the prompt that the model would have chosen (`Engine._written`).
Answers stream as server-sent events where `stream` asks; a client that disconnects stops its generation.
One generation runs at a time (the model is one); others wait their turn, and a request that begins as
one of the last few did (an editor's files) reads only what follows (their keys and values kept). Errors
are OpenAI's JSON error shape, one line, never a traceback: requests are read by hand for that. While it
runs, SERVE_FILE beside the adapter says where, for the commit hook. Built on FastAPI and uvicorn: the
HTTP and the event stream are theirs.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.concurrency import iterate_in_threadpool, run_in_threadpool

from pipeline.base_models import FIM_TOKENS, infills
from pipeline.data.examples import infill_text
from pipeline.errors import PipelineError, one_line
from pipeline.manifest import write_json
from pipeline.progress import say
from pipeline.suggest.completion import LINE_TOKENS
from pipeline.suggest.decoding import blank, breaking, last_logits, line_breaks, shared_length, token_texts
from pipeline.train.model import scoring
from pipeline.use.generate import LINE_START, UNREAD_BY_MODEL, Answerer, keep_folded, model_name
from pipeline.use.hook import SERVE_FILE

COMPLETION_TOKENS = 16  # OpenAI's default max_tokens for a completion
SUFFIX_HEADER = "X-Repotune-Suffix"  # says that `suffix` was not read, and why
CHAT_TOKENS = 256
# Stop strings a request may give: OpenAI's service takes 4, but editors send a local server all they
# have (Continue: its infill template's 7, and more of its own).
STOP_STRINGS = 64
# Answers whose keys and values are kept for the requests that begin as they did: an editor's few open
# files and a chat between them. Each holds memory for its prompt's and answer's tokens and CACHE_ROOM
# more (docs/use.md): a cache of fixed size, written in place, where one that grows copies itself whole
# at each token.
KEPT_CACHES = 4
CACHE_ROOM = 256
# The most tokens guessed ahead at each step of an answer (`guess`), and the longest run of its last
# tokens looked for earlier in the prompt and answer to guess them from.
GUESSED_TOKENS = 10
GUESSED_FROM = 3
INFILL_PROMPT = re.compile(
    "{}(?P<prefix>.*?){}(?P<suffix>.*){}".format(*map(re.escape, FIM_TOKENS)), re.DOTALL
)  # infill_text's format


@dataclass(frozen=True)
class Asked:
    """One generation: the prompt rendered for the model, and how to write its answer."""

    prompt: str
    max_tokens: int
    temperature: float
    top_p: float
    stop: tuple[str, ...]
    healed: str = ""
    """The end of `prompt` read back (its last line breaks, blank lines included, and the indentation
    after them): the prompt is read without it, and the answer's first tokens spell it (the first one of
    `line_breaks`), left out of the answer: token healing, as the code scoreboard asks a next line."""
    line_end: str = "\n"
    """The line break the answer is written with: a file written on Windows is read with LF, as the files
    trained on are (`scrapers.files`), and answered in its own CR LF."""


class ServeError(Exception):
    """A request the server refuses, with its HTTP status and OpenAI's error type."""

    def __init__(
        self, status: int, message: str, kind: str = "invalid_request_error", param: str | None = None
    ):
        super().__init__(message)
        self.status, self.message, self.kind, self.param = status, message, kind, param


class Engine:
    """The adapter's model, answering one request at a time, token by token."""

    def __init__(self, answerer: Answerer, name: str):
        self.answerer, self.name = answerer, name
        self.lock = threading.Lock()
        model, tokenizer = answerer.loaded
        self.model, self.tokenizer = model, tokenizer
        keep_folded(model)
        self.infills = infills(tokenizer)
        self.heals = bool(line_breaks(tokenizer))  # its tokens can spell a line break: a prompt's are healed
        self.breaking = breaking(tokenizer)  # and may not write while its line is blank
        self.texts = token_texts(tokenizer)
        self.kept: list[tuple[list[int], Any]] = []
        """The last KEPT_CACHES answers' tokens and their keys and values, the most recent last: a request
        that begins with the same tokens as one of them (an editor's next request in a file it has open)
        reads only the tokens after them."""

    @contextlib.contextmanager
    def turn(self) -> Iterator[None]:
        """One request's use of the model: alone (one generation at a time), the adapter folded into the
        base weights, where it stays for the next request (a base model's answer unfolds it)."""
        with self.lock:
            try:
                yield
            finally:
                keep_folded(self.model)

    def fits(self, asked: Asked) -> int:
        """The prompt's tokens, where they and the answer fit the model's positions (`check_length`, as
        `generate` checks them); else a 400."""
        try:
            return self.answerer.check_length(asked.prompt, asked.max_tokens, "max_tokens")
        except PipelineError as error:
            raise ServeError(400, str(error), param="max_tokens") from None

    def reusable(self, prompt: list[int], answer: int):
        """A cache for `prompt` and an `answer` of at most that many tokens, and how many tokens it holds:
        the kept one that shares the most tokens with it and has room for the rest, taken out of `kept`
        and cut to those (at least one token is left to read: generation starts from it), where they are
        at least half of its own (another file that only begins as it does, with the same imports, leaves
        it whole for its own file); else a new one (`room`)."""
        from transformers import StaticCache

        needed = len(prompt) + answer
        shared = [
            (shared_length(prompt[:-1], tokens), index)
            for index, (tokens, cache) in enumerate(self.kept)
            if cache.get_max_length() >= needed
        ]
        common, index = max(
            ((common, index) for common, index in shared if 2 * common >= len(self.kept[index][0])),
            default=(0, -1),
        )
        if not common:
            return StaticCache(config=self.model.config, max_cache_len=self.room(needed)), 0
        _, cache = self.kept.pop(index)
        if common < int(cache.get_seq_length()):
            cache.crop(common - int(cache.get_seq_length()))  # transformers 5: how many tokens to drop
        return cache, common

    def room(self, needed: int) -> int:
        """A new cache's positions: `needed` and CACHE_ROOM to twice that more, in steps of CACHE_ROOM (the
        next requests in the file, a line further each, fit), within the model's positions."""
        positions = getattr(self.model.config, "max_position_embeddings", None) or needed + CACHE_ROOM
        return max(needed, min(positions, (needed // CACHE_ROOM + 2) * CACHE_ROOM))

    def keep(self, tokens: list[int], cache) -> None:
        """Keep an answer's keys and values as the most recent, the least recent beyond KEPT_CACHES let go."""
        self.kept = [*self.kept, (tokens, cache)][-KEPT_CACHES:]

    def _chooser(self, asked: Asked, width: int) -> Callable[[list[int], Any], int]:
        """How the token after `tokens` is chosen from the model's scores for it, for `asked` read as
        `width` prompt tokens: greedy, or sampled at its temperature and top_p; where the prompt is healed,
        the first tokens only those that spell what was cut from it (its line breaks as `line_breaks`
        allows, then its indentation: `"\\n   "` then `" return"` for a cut `"\\n    "`, as the tokenizer
        splits an indented line), then none that ends the line they began while it is blank (`breaking`:
        a completion's line, as the scoreboard's answers are, is never a blank one)."""
        import torch
        from transformers import TemperatureLogitsWarper, TopPLogitsWarper

        texts, healed = self.texts, asked.healed

        def spelling(tokens: list[int], scores):
            # Spelling `healed` takes at most as many tokens as it has characters: the rest is the answer.
            written = "".join(texts[token] for token in tokens[width : width + len(healed)])
            left = healed[len(written) :]
            if not left:  # spelled: then the line it began holds a character before a line break
                if not blank(texts, tokens[width:]):
                    return scores
                unbroken = scores.clone()
                unbroken[self.breaking] = float("-inf")
                return unbroken
            # While line breaks are left to spell, only them (`line_breaks`: never one more), then the
            # indentation after them.
            spelling_from = (
                line_breaks(self.tokenizer, left.count("\n")) if "\n" in left else range(len(texts))
            )
            allowed = [
                token
                for token in spelling_from
                if texts[token].startswith(left) or (texts[token] and left.startswith(texts[token]))
            ]
            kept = scores.new_full(scores.shape, float("-inf"))
            kept[allowed] = scores[allowed]
            return kept

        sampled = asked.temperature > 0
        warpers = (
            [TemperatureLogitsWarper(asked.temperature), TopPLogitsWarper(asked.top_p)] if sampled else []
        )

        def choose(tokens: list[int], scores) -> int:
            scores = spelling(tokens, scores) if healed else scores
            if not sampled:
                return int(scores.argmax())
            read, row = torch.tensor([tokens]), scores[None]
            for warper in warpers:
                row = warper(read, row)
            return int(torch.multinomial(row.softmax(-1), 1))

        return choose

    def _written(
        self, prompt: list[int], cache, cached: int, asked: Asked, stopped: threading.Event, streamer
    ) -> list[int]:
        """`prompt` and its answer's tokens, written into `cache` (which holds its first `cached`) and put
        to `streamer` as they are chosen, until the end of sequence, `max_tokens`, a stop sequence (seen
        here, not a forward later where the reader of `streamer` sees it) or `stopped`. Each
        forward reads the last token and a guess at the next ones (`guess`: what followed the last
        tokens where they occurred before); the guessed tokens the model would have chosen anyway are
        taken with the next, and the keys and values of the rest dropped: a forward of a dozen tokens
        costs little more than one of one on a CPU, where reading the weights is most of it. The
        answer is the one a token at a time gives (within rounding, in bf16)."""
        import torch

        choose = self._chooser(asked, len(prompt))
        tokens, fed, guessed = list(prompt), cached, list[int]()
        end, written = len(prompt) + asked.max_tokens, ""  # the answer's text, its healed start included

        def stops(text: str) -> bool:  # a stop sequence in the answer written after its healed start
            return _first_stop(text[len(asked.healed) :], asked.stop) is not None

        while True:
            read = [*tokens[fed:], *guessed]
            scores = last_logits(
                self.model, len(guessed) + 1, input_ids=torch.tensor([read]), cache=cache, use_cache=True,
                cache_position=torch.arange(fed, fed + len(read)),
            )[0].float()  # fmt: skip
            new: list[int] = []
            for row, expected in zip(scores, [*guessed, None], strict=True):
                new.append(choose(tokens + new, row))
                if new[-1] != expected:
                    break
            if len(new) <= len(guessed):
                cache.crop(len(new) - len(guessed) - 1)  # the guesses not taken
            if self.tokenizer.eos_token_id in new:
                new = new[: new.index(self.tokenizer.eos_token_id) + 1]
            tokens += new
            fed = len(tokens) - 1  # the last token chosen is read with the next guess
            streamer.put(torch.tensor(new))
            written += "".join(self.texts[token] for token in new)
            if (
                len(tokens) >= end
                or new[-1] == self.tokenizer.eos_token_id
                or stopped.is_set()
                or stops(written)
            ):
                return tokens
            guessed = guess(tokens, min(GUESSED_TOKENS, end - len(tokens) - 1))
            # Guesses past a stop sequence would be read for nothing: the answer ends there.
            ahead = itertools.accumulate((self.texts[token] for token in guessed), initial=written)
            guessed = guessed[: next((n for n, text in enumerate(ahead) if stops(text)), None)]

    def stream(
        self, asked: Asked, stopped: threading.Event, told: dict[str, Any] | None = None
    ) -> Iterator[str]:
        """The answer's text as it is written, ended at a stop sequence, at `max_tokens`, at the end of
        sequence, or when `stopped` is set (the client left); `told` gets `cached_tokens`, the prompt's
        tokens whose keys and values an earlier answer left (`kept`), and where the answer ends (not
        when the client left) `completion_tokens` and `finish_reason` (`_ended`)."""
        from transformers import TextIteratorStreamer

        streamer = TextIteratorStreamer(self.tokenizer, skip_prompt=False, skip_special_tokens=True)
        read = asked.prompt.removesuffix(asked.healed)
        prompt = self.tokenizer(read, add_special_tokens=False)["input_ids"]
        failed: list[Exception] = []
        generated: list[list[int]] = []  # the answer's tokens, once generation has ended

        def write() -> None:
            with self.turn(), scoring(self.model, self.answerer.precision):
                try:
                    cache, cached = self.reusable(prompt, asked.max_tokens)
                    if told is not None:
                        told["cached_tokens"] = cached
                    tokens = self._written(prompt, cache, cached, asked, stopped, streamer)
                    self.keep(tokens[: int(cache.get_seq_length())], cache)
                    generated.append(tokens[len(prompt) :])
                except Exception as error:  # raised where the answer is read, as one line
                    failed.append(error)  # the cache it took from `kept` is let go: it may be half written
                finally:
                    streamer.end()

        worker = threading.Thread(target=write, daemon=True)
        worker.start()
        written, unread = "", asked.healed  # the prompt's own end, read back: left out
        spelled = None  # where a stop sequence cut the answer: the characters written up to its end
        try:
            for piece in streamer:
                if failed:
                    raise failed[0]
                read_back = min(len(unread), len(piece))
                piece, unread = piece[read_back:], unread[read_back:]
                written += piece
                if cut := _first_stop(written, asked.stop):
                    yield piece[: len(piece) - (len(written) - cut[0])].replace("\n", asked.line_end)
                    spelled = len(asked.healed) + cut[0] + len(cut[1])
                    break
                if piece:
                    yield piece.replace("\n", asked.line_end)
            if failed and spelled is None:
                raise failed[0]
            stopped.set()  # after a stop sequence, the generation ends at its next token
            worker.join()
            if told is not None:
                told.update(self._ended(generated, asked, spelled))
        finally:
            stopped.set()  # a client that left, or a failure: the generation ends at its next token

    def _ended(self, generated: list[list[int]], asked: Asked, spelled: int | None = None) -> dict[str, Any]:
        """Where an answer ended, as OpenAI's usage and `finish_reason` say it: the tokens generated (the
        healed start's included), up to the one that ends the stop sequence where `spelled` (the
        characters written up to there) is given; "length" where `max_tokens` ended it, else "stop"."""
        tokens = generated[0] if generated else []
        if spelled is not None:
            lengths = itertools.accumulate(len(self.texts[token]) for token in tokens)
            used = next((count for count, length in enumerate(lengths, 1) if length >= spelled), len(tokens))
            return {"completion_tokens": used, "finish_reason": "stop"}
        ran_out = len(tokens) >= asked.max_tokens and tokens[-1] != self.tokenizer.eos_token_id
        return {"completion_tokens": len(tokens), "finish_reason": "length" if ran_out else "stop"}


def guess(tokens: list[int], count: int) -> list[int]:
    """Up to `count` tokens that may come next: those that followed the longest run of the last
    GUESSED_FROM tokens (or fewer) where it last occurred before (prompt lookup: code repeats its own
    names and lines, and an answer often repeats its prompt); none where it never did."""
    if count <= 0:
        return []
    for length in range(min(GUESSED_FROM, len(tokens) - 1), 0, -1):
        last = tokens[-length:]
        for start in range(len(tokens) - length - 1, -1, -1):
            if tokens[start : start + length] == last:
                return tokens[start + length : start + length + count]
    return []


def _first_stop(written: str, stops: tuple[str, ...]) -> tuple[int, str] | None:
    """Where the first of `stops` in `written` begins, and which it is."""
    return min(((written.find(stop), stop) for stop in stops if stop in written), default=None)


def app_for(engine: Engine, stopped: Callable[[], None] = lambda: None):
    """The FastAPI application serving `engine` (requests read by hand: every refusal one line in
    OpenAI's shape); `stopped` runs at shutdown (uvicorn re-raises the signal that stopped it after)."""

    @contextlib.asynccontextmanager
    async def lifespan(app):
        yield
        stopped()

    app = FastAPI(title="repotune", docs_url=None, redoc_url=None, lifespan=lifespan)

    @app.exception_handler(ServeError)
    async def refused(request: Request, error: ServeError):
        return _error(error.status, error.message, error.kind, error.param)

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [_model(engine.name)]}

    @app.post("/v1/completions")
    async def completions(request: Request):
        body = await _body(request)
        _check_model(body, engine.name)
        prompt = _text(body.get("prompt"), "prompt")
        if "path" in body:  # repotune's own field: the next line, as the code scoreboard asks it
            return await _next_line(engine, body, prompt)
        asked, headers = _completion(engine, body, prompt)
        return await _answer(engine, asked, body, "text_completion", request, headers)

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        body = await _body(request)
        _check_model(body, engine.name)
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
            raise ServeError(400, "messages: give a list of {role, content} messages", param="messages")
        last = _content(messages[-1])
        if engine.answerer.has_past and "diff --git" in last:
            return await _commit_messages(engine, last, body)
        if not engine.tokenizer.chat_template:
            raise ServeError(
                400, "the model has no chat template (it trained on raw text): ask /v1/completions, or send a "
                "diff for its commit message", param="messages",
            )  # fmt: skip
        rendered = engine.tokenizer.apply_chat_template(
            [{"role": m.get("role", "user"), "content": _content(m)} for m in messages],
            tokenize=False, add_generation_prompt=True,
        )  # fmt: skip
        asked = _asked(body, rendered, CHAT_TOKENS, "max_completion_tokens")
        return await _answer(engine, asked, body, "chat.completion", request, {})

    return app


async def _answer(
    engine: Engine, asked: Asked, body: dict[str, Any], kind: str, request: Request, headers: dict[str, str]
):
    """The answer to `asked`, whole or as server-sent events where `body` asks to stream."""
    prompt_tokens = engine.fits(asked)
    stopped = threading.Event()
    made = _made(kind)
    if body.get("stream"):
        usage_asked = _usage_asked(body)
        return StreamingResponse(
            _events(engine, asked, stopped, made, kind, request, prompt_tokens if usage_asked else None),
            media_type="text/event-stream",
            headers=headers,
        )
    told: dict[str, Any] = {}
    try:
        text = await run_in_threadpool(lambda: "".join(engine.stream(asked, stopped, told)))
    except Exception as error:  # one line for the client and the log, never a traceback
        raise ServeError(500, _failure(error), "server_error") from None
    finish = told["finish_reason"]
    usage = _usage(prompt_tokens, told)
    if kind == "chat.completion":
        answer = _chat_response(engine.name, [text], usage, finish)
    else:
        answer = {**made, "model": engine.name, "choices": [{"text": text, "index": 0, "logprobs": None, "finish_reason": finish}], "usage": usage}  # fmt: skip
    return JSONResponse(answer, headers=headers)


async def _next_line(engine: Engine, body: dict[str, Any], before: str):
    """The line after `before` in the repository's file `body["path"]`, as `generate --task code` writes
    it: by the system the run chose, the chunks of other files its split point holds retrieved where
    that system reads them, `suffix` where the model infills, greedy, one line (streamed as one piece
    where asked)."""
    path = body["path"]
    if not isinstance(path, str) or not path:
        raise ServeError(
            400, "path: the file's path in the repository (its name says the language)", param="path"
        )
    asked = _asked(body, before, LINE_TOKENS)
    suffix = _suffix(body)

    def answer() -> tuple[str, str | None]:
        with engine.turn():
            return engine.answerer.complete(before, path, suffix, max_new_tokens=asked.max_tokens)

    try:
        text, unread = await run_in_threadpool(answer)
    except PipelineError as error:
        raise ServeError(400, str(error)) from None
    except Exception as error:  # one line for the client and the log, never a traceback
        raise ServeError(500, _failure(error), "server_error") from None
    headers = {SUFFIX_HEADER: f"ignored: {unread}"} if unread else {}
    made = {**_made("text_completion"), "model": engine.name}
    choice = {"text": text, "index": 0, "logprobs": None, "finish_reason": "stop"}
    if body.get("stream"):
        events = [_event({**made, "choices": [choice]}), b"data: [DONE]\n\n"]
        return StreamingResponse(iter(events), media_type="text/event-stream", headers=headers)
    return JSONResponse({**made, "choices": [choice]}, headers=headers)


def _completion(engine: Engine, body: dict[str, Any], prompt: str) -> tuple[Asked, dict[str, str]]:
    """A completion's generation: `suffix` infilled where the model can (else the header says it was
    not read), and a prompt that ends a line, or ends in the indentation that begins one (an editor's
    cursor on a new line, indented as it indents it), healed (`Asked.healed`): the tokenizer merges a
    line break with what follows it, so read as it came the prompt is one the model never saw code end
    with, and it answers with another line break or a space too many (a blank or misplaced suggestion).
    A prompt already in StarCoder's fill-in-the-middle format, which editors send a model they do not
    know (Continue's default template), is read as its prefix and suffix where the model has no such
    tokens: as text they are markup it never saw."""
    suffix = _suffix(body)
    line_end = "\r\n" if "\r\n" in prompt else "\n"
    prompt, suffix = prompt.replace("\r\n", "\n"), suffix.replace("\r\n", "\n")
    templated = INFILL_PROMPT.fullmatch(prompt)
    if templated and not engine.infills:
        prompt, suffix = templated["prefix"], suffix or templated["suffix"]
    headers = {}
    if suffix:
        if engine.infills:
            prompt = infill_text(prompt, suffix)
        else:
            headers = {SUFFIX_HEADER: f"ignored: {UNREAD_BY_MODEL}"}
    end = LINE_START.search(prompt)
    healed = end[0] if end and end.start() and engine.heals else ""
    asked = _asked(body, prompt, COMPLETION_TOKENS)
    stops = tuple(stop.replace("\r\n", "\n") for stop in asked.stop)  # matched in the answer as written
    return replace(asked, healed=healed, line_end=line_end, stop=stops), headers


def _suffix(body: dict[str, Any]) -> str:
    suffix = body.get("suffix")
    if suffix is not None and not isinstance(suffix, str):
        raise ServeError(400, "suffix: give the text after the cursor as a string", param="suffix")
    return suffix or ""


async def _events(
    engine: Engine,
    asked: Asked,
    stopped: threading.Event,
    made: dict[str, Any],
    kind: str,
    request: Request,
    prompt_tokens: int | None,
):
    """The answer's pieces as OpenAI's stream chunks, then `[DONE]`; a client that left stops it. With
    `prompt_tokens` (the request's `stream_options.include_usage`), a last chunk of no choices says
    the usage, as OpenAI's does."""
    chat = kind == "chat.completion"
    chunk = {**made, "object": "chat.completion.chunk" if chat else kind, "model": engine.name}
    if chat:
        yield _event({**chunk, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]})  # fmt: skip
    pieces: list[str] = []
    told: dict[str, Any] = {}
    ended = False
    try:
        async for piece in iterate_in_threadpool(engine.stream(asked, stopped, told)):
            if await request.is_disconnected():
                break
            choice = (
                {"index": 0, "delta": {"content": piece}}
                if chat
                else {"index": 0, "text": piece, "logprobs": None}
            )
            yield _event({**chunk, "choices": [{**choice, "finish_reason": None}]})
            pieces.append(piece)
        else:
            last = {"index": 0, "delta": {}} if chat else {"index": 0, "text": "", "logprobs": None}
            yield _event({**chunk, "choices": [{**last, "finish_reason": told["finish_reason"]}]})
            if prompt_tokens is not None:
                yield _event({**chunk, "choices": [], "usage": _usage(prompt_tokens, told)})
            yield b"data: [DONE]\n\n"
            ended = True
    except Exception as error:  # the status is sent: the failure goes in the stream, in one line
        yield _event(
            {"error": {"message": _failure(error), "type": "server_error", "param": None, "code": None}}
        )
        ended = True
    finally:
        stopped.set()  # a client that left: its generation ends at its next token
        if not ended:
            say(f"serve: a client left after {len(pieces)} pieces of its answer; its generation stopped")


def serve(adapter: str, host: str, port: int, name: str | None) -> None:
    """Listen on `host`:`port` (a port in use is said before the model loads), load the adapter, and
    answer until interrupted."""
    import socket

    import uvicorn

    answerer = Answerer(adapter)  # a directory that is no adapter is said at once
    few_heaps()
    try:
        listening = socket.create_server(
            (host, port), family=socket.AF_INET6 if ":" in host else socket.AF_INET
        )
    except OSError as error:
        raise PipelineError(
            f"--port {port}: cannot listen on {host}:{port} ({os.strerror(error.errno) if error.errno else error}): "
            "give another --port"
        ) from None
    if host not in ("127.0.0.1", "localhost", "::1"):
        say(f"serve: listening on {host}, not only this machine: anyone who reaches it can use the model")
    engine = Engine(answerer, name or model_name(answerer.directory))
    url = f"http://{host}:{listening.getsockname()[1]}/v1"
    # The commit hook asks a running server before it loads the model itself (`hook.served`).
    local = url.replace("://0.0.0.0:", "://127.0.0.1:").replace("://[::]:", "://[::1]:")
    told = answerer.directory / SERVE_FILE

    def forget() -> None:
        with contextlib.suppress(OSError, ValueError, KeyError):
            if orjson.loads(told.read_bytes())["pid"] == os.getpid():  # not another server's since
                told.unlink()

    config = uvicorn.Config(app_for(engine, forget), log_level="warning", access_log=False)
    write_json(told, {"url": local, "pid": os.getpid(), "name": engine.name})
    say(f"serving {engine.name} on {url} (OpenAI-compatible; Ctrl-C stops)")
    try:
        uvicorn.Server(config).run(sockets=[listening])
    finally:
        forget()


# glibc's mallopt parameter for how many heaps its allocator keeps (malloc.h's M_ARENA_MAX).
M_ARENA_MAX = -8
SERVE_HEAPS = 2


def few_heaps() -> None:
    """glibc's allocator gives new threads heaps of their own, up to eight a core, and `serve` writes each
    answer in a thread of its own: the keys and values it keeps, of many sizes, came and went in as many
    heaps, none of which gave its free memory back (docs/experiments.md). SERVE_HEAPS from now on; nothing
    where the C library is not glibc."""
    import ctypes

    # The process's own symbols hold its C library's: no search for it (find_library runs ldconfig).
    mallopt = getattr(ctypes.CDLL(None), "mallopt", None)
    if mallopt is not None:  # macOS has none; musl's does nothing
        mallopt(M_ARENA_MAX, SERVE_HEAPS)


async def _body(request) -> dict[str, Any]:
    try:
        body = orjson.loads(await request.body())
    except orjson.JSONDecodeError as error:
        raise ServeError(400, f"the request body is not JSON ({error})") from None
    if not isinstance(body, dict):
        raise ServeError(400, "the request body must be a JSON object")
    return body


def _check_model(body: dict[str, Any], name: str) -> None:
    asked = body.get("model")
    if asked not in (None, "", name):
        raise ServeError(
            404, f"model {asked!r}: this server has {name!r} (GET /v1/models)", "not_found_error", "model"
        )


def _text(value: Any, param: str) -> str:
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], str):
        value = value[0]
    if not isinstance(value, str) or not value:
        raise ServeError(400, f"{param}: give one non-empty string", param=param)
    return value


def _content(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, list):  # parts: the text ones
        content = "".join(part.get("text", "") for part in content if isinstance(part, dict))
    if not isinstance(content, str):
        raise ServeError(400, "messages: each message's content is a string", param="messages")
    return content


def _asked(body: dict[str, Any], prompt: str, default_tokens: int, tokens_key: str = "max_tokens") -> Asked:
    tokens = body.get(tokens_key, body.get("max_tokens", default_tokens))
    tokens = default_tokens if tokens is None else tokens
    if not isinstance(tokens, int) or isinstance(tokens, bool) or tokens < 1:
        raise ServeError(400, f"{tokens_key}: give a whole number of tokens, 1 or more", param=tokens_key)
    temperature = body.get("temperature")
    temperature = 0.0 if temperature is None else temperature
    if not isinstance(temperature, int | float) or not 0 <= temperature <= 2:
        raise ServeError(400, "temperature: give a number from 0 (greedy) to 2", param="temperature")
    top_p = body.get("top_p")
    top_p = 1.0 if top_p is None else top_p
    stop = body.get("stop") or ()
    stops = (stop,) if isinstance(stop, str) else tuple(stop)
    if not all(isinstance(s, str) and s for s in stops) or len(stops) > STOP_STRINGS:
        raise ServeError(400, f"stop: give up to {STOP_STRINGS} non-empty strings", param="stop")
    return Asked(prompt, tokens, float(temperature), float(top_p), stops)


async def _commit_messages(engine: Engine, diff: str, body: dict[str, Any]):
    """The chat's answer to a diff: the run's suggestion system's messages, whole or as server-sent
    events where `body` asks to stream (editors' chats, Continue's, always do, and read nothing else)."""
    found = await run_in_threadpool(_suggested, engine, diff, body)
    if body.get("stream"):
        return StreamingResponse(iter(_chat_events(engine.name, found)), media_type="text/event-stream")
    return JSONResponse(_chat_response(engine.name, found, _usage(0, {"completion_tokens": 0})))


def _suggested(engine: Engine, diff: str, body: dict[str, Any]) -> list[str]:
    """The run's suggestion system's message for `diff`, and the next best to fill `n` choices."""
    count = body.get("n") or 1
    if not isinstance(count, int) or not 1 <= count <= 10:
        raise ServeError(400, "n: give from 1 to 10 choices", param="n")
    start = diff.index("diff --git")
    try:
        with engine.turn():
            return engine.answerer.commit_messages(diff[start:], count - 1)
    except PipelineError as error:
        raise ServeError(400, str(error)) from None
    except Exception as error:  # one line for the client and the log, never a traceback
        raise ServeError(500, _failure(error), "server_error") from None


def _failure(error: Exception) -> str:
    """What a failed generation tells the client and the log, in one line."""
    said = f"the server failed to answer: {type(error).__name__}: {one_line(error)}"
    say(f"serve: {said}")
    return said


def _made(kind: str) -> dict[str, Any]:
    prefix = "chatcmpl" if kind == "chat.completion" else "cmpl"
    return {"id": f"{prefix}-{uuid.uuid4().hex}", "object": kind, "created": int(time.time())}


def _chat_response(
    name: str, answers: list[str], usage: dict[str, Any], finish: str = "stop"
) -> dict[str, Any]:
    choices = [
        {
            "index": i,
            "message": {"role": "assistant", "content": text},
            "logprobs": None,
            "finish_reason": finish,
        }
        for i, text in enumerate(answers)
    ]
    return {**_made("chat.completion"), "model": name, "choices": choices, "usage": usage}


def _usage_asked(body: dict[str, Any]) -> bool:
    """Whether a streamed answer ends with its usage (`stream_options.include_usage`)."""
    options = body.get("stream_options") or {}
    if not isinstance(options, dict) or not isinstance(options.get("include_usage", False), bool):
        raise ServeError(400, 'stream_options: give {"include_usage": true or false}', param="stream_options")
    return options.get("include_usage", False)


def _usage(prompt_tokens: int, told: dict[str, Any]) -> dict[str, Any]:
    completion = told["completion_tokens"]
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion,
        "total_tokens": prompt_tokens + completion,
        "prompt_tokens_details": {"cached_tokens": told.get("cached_tokens", 0)},
    }


def _chat_events(name: str, answers: list[str]) -> list[bytes]:
    """Whole answers as OpenAI's chat stream sends them: each choice's role and text, then its end."""
    chunk = {**_made("chat.completion"), "object": "chat.completion.chunk", "model": name}
    choices: list[dict[str, Any]] = [
        {"index": i, "delta": {"role": "assistant", "content": text}, "finish_reason": None}
        for i, text in enumerate(answers)
    ]
    choices += [{"index": i, "delta": {}, "finish_reason": "stop"} for i in range(len(answers))]
    return [*(_event({**chunk, "choices": [choice]}) for choice in choices), b"data: [DONE]\n\n"]


def _model(name: str) -> dict[str, Any]:
    return {"id": name, "object": "model", "created": int(time.time()), "owned_by": "repotune"}


def _event(payload: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(payload) + b"\n\n"


def _error(status: int, message: str, kind: str = "invalid_request_error", param: str | None = None):
    return JSONResponse(
        {"error": {"message": message, "type": kind, "param": param, "code": None}}, status_code=status
    )

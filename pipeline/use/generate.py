"""Use a trained adapter: generate from a prompt, or merge it into its base model."""

from __future__ import annotations

import functools
import re
import shlex
from pathlib import Path
from typing import Any

import orjson

from pipeline.base_models import infills, load_pretrained, load_saved_tokenizer, quiet_library_output
from pipeline.config import EvalConfig
from pipeline.data.examples import answer_prefix, render_prompt
from pipeline.errors import ModelLoadError, PipelineError, one_line
from pipeline.hardware import native_cpu_bf16
from pipeline.scores import CODE_SYSTEMS
from pipeline.suggest.completion import (
    BLOCK_TOKENS,
    LINE_TOKENS,
    CodeCase,
    CodeIndex,
    bare_prompt,
    context_prompt,
)
from pipeline.suggest.decoding import base_only, fold, generate_batched, merged
from pipeline.suggest.retrieval import INDEX_DIR
from pipeline.suggest.suggestion import Suggester, beside, saved_code_system, saved_file_filters
from pipeline.train.model import (
    ADAPTER_DIR,
    BASE_MODEL_DIR,
    CHECKPOINT_DIR,
    CODE_FILES,
    DTYPES,
    AdapterFacts,
    adapter_facts,
    newest_checkpoint,
    quantized_loading,
    unquantized_imports,
)
from scrapers.filters import as_trained


def adapter_directory(path: str | Path) -> Path:
    """An adapter directory, or a run's output directory holding one; for a run that did not finish, one
    line offering its newest checkpoint's adapter. Checked before any heavy import: it answers at once."""
    directory = Path(path).expanduser()
    if (directory / ADAPTER_DIR / "adapter_config.json").exists():
        return directory / ADAPTER_DIR
    if (directory / "adapter_config.json").exists():
        return directory
    if newest := newest_checkpoint(directory / CHECKPOINT_DIR):
        raise ModelLoadError(
            f"--adapter {path}: no adapter/ (the run did not finish), but its newest checkpoint has one: "
            f"--adapter {shlex.quote(str(newest))}"
        )
    raise ModelLoadError(
        f"--adapter {path}: no adapter_config.json there (pass a run's output directory or its adapter/)"
    )


def load_adapter(path: str | Path, dense: bool = False, precision: str = "fp32"):
    """The base model (from the adapter's config; tiny's saved base for tiny runs), loaded as it was in
    training (4 or 8 bits where it was quantized; with `dense` dequantized first; a pretrained base's
    weights in `precision`, a saved random one's as saved), with the adapter; and its tokenizer."""
    directory = adapter_directory(path)
    try:
        facts = adapter_facts(directory)
    except (OSError, ValueError) as err:  # a truncated or hand-edited repotune.json
        raise ModelLoadError(f"--adapter {path}: not a readable adapter ({one_line(err)})") from None
    with unquantized_imports(facts.quantization):
        from peft import PeftConfig, PeftModel
        from transformers import AutoModelForCausalLM

    quiet_library_output()
    try:
        recorded = PeftConfig.from_pretrained(str(directory)).base_model_name_or_path
    except (OSError, ValueError) as err:  # a truncated or hand-edited adapter_config.json
        raise ModelLoadError(f"--adapter {path}: not a readable adapter ({one_line(err)})") from None
    # A random base is saved in the run directory, beside adapter/ and checkpoints/: use that copy, wherever
    # the run directory went since (the adapter records the absolute path it had when it trained).
    run_directory = directory.parent.parent if directory.parent.name == CHECKPOINT_DIR else directory.parent
    beside = run_directory / BASE_MODEL_DIR
    random_base = (beside / "config.json").exists()
    base_name = str(beside) if random_base else recorded
    if base_name.startswith(("/", ".", "~")) and not Path(base_name).expanduser().is_dir():
        raise ModelLoadError(
            f"--adapter {path}: its base model {base_name} is gone: put it back there, or write where it "
            f"is now into {directory / 'adapter_config.json'} (base_model_name_or_path)"
        )
    # As `build_model` loads them: a pretrained base in the compute dtype, a random one in fp32 under autocast.
    weights = {} if random_base else {"dtype": DTYPES[precision]}
    base = load_pretrained(
        AutoModelForCausalLM, base_name, **weights, **quantized_loading(facts.quantization, precision, "cpu")
    )
    if dense and facts.quantization != "none":
        import transformers

        # Before any forward pass: bitsandbytes' CPU kernel repacks 4-bit weights on the first one, after
        # which they no longer dequantize to what they were. (Quietly: it notes the dtype it casts to.)
        verbosity = transformers.logging.get_verbosity()
        transformers.logging.set_verbosity_error()
        try:
            base = base.dequantize()
        finally:
            transformers.logging.set_verbosity(verbosity)
    try:
        with unquantized_imports(facts.quantization):
            model = PeftModel.from_pretrained(base, str(directory))
    except (OSError, ValueError, RuntimeError) as err:  # missing or mismatched adapter weights
        raise ModelLoadError(
            f"--adapter {path}: cannot load the adapter onto {base_name} ({one_line(err)})"
        ) from None
    return model.eval(), load_saved_tokenizer(directory)


def answering_precision(trained: str) -> str:
    """The precision a model answers in at use: the one the scoreboard answered in (`trained`), so that
    the answers are those it scored, where this machine's CPU computes it natively (bf16 with avx512_bf16
    or AMX: a token about half the memory to read); else fp32, which such a CPU computes faster than
    emulated bf16 or fp16 (and a GPU's fp16 training is answered so on any CPU)."""
    return trained if trained == "bf16" and native_cpu_bf16() else "fp32"


CONTINUATION_TOKENS = 128  # what `generate` writes by default, but for a commit message
# Why the text after the cursor was not read.
UNREAD_BY_MODEL = "the model has no fill-in-the-middle tokens"
UNREAD_BY_LOOKUP = "the lookup for code answers from the lines before the cursor"
MESSAGE_SYSTEMS = ("lookup", "selector", "model")


def generate(
    path: str | Path,
    prompt: str,
    max_new_tokens: int | None = None,
    task: str | None = None,
    system: str | None = None,
) -> str:
    """The model's greedy continuation of `prompt`; with `task`, the prompt is asked as training asked
    it (`message`: write the commit message for this diff, see `commit_messages`; `diff`: write the change
    for this message). At most `max_new_tokens` tokens: by default, for a commit message as many as the
    scoreboard let the model write (`eval.message_tokens`), else CONTINUATION_TOKENS."""
    answerer = Answerer(path)  # a missing adapter is said before the libraries load
    if task == "message":
        return answerer.commit_messages(prompt, 0, system, max_new_tokens)[0]
    if system:
        raise ModelLoadError(
            "--system chooses who writes a commit message or a next line: use it with --task message or code"
        )
    return answerer.continuation(prompt, task, max_new_tokens)


# A text's end where the cursor begins a line (after the line break that ends the last, and any blank
# lines under it); the group: the indentation an editor wrote there, if any.
LINE_START = re.compile(r"\n+([ \t]*)\Z")


def line_ended(before: str) -> tuple[str, str]:
    """`before` with its last line ended there, as the scoreboard's cases are, and the indentation an
    editor wrote on the new line before the cursor ("" where there is none)."""
    typed = LINE_START.search(before)
    indentation = typed[1] if typed else ""
    return before.removesuffix(indentation).removesuffix("\n") + "\n", indentation


def after_typed(line: str, indentation: str) -> str:
    """`line` (the next line, or a block's first line and the rest) after the `indentation` already typed
    before the cursor; a line indented less than that, with its own indentation left out (a completion
    inserts text, it cannot take typed text back)."""
    if not indentation:
        return line
    return line.removeprefix(indentation) if line.startswith(indentation) else line.lstrip(" \t")


def complete(
    path: str | Path,
    before: str,
    file_path: str,
    after: str = "",
    block: bool = False,
    max_new_tokens: int | None = None,
    system: str | None = None,
) -> tuple[str, str | None]:
    """`Answerer.complete` of the adapter at `path`."""
    return Answerer(path).complete(before, file_path, after, block, max_new_tokens, system)


def commit_messages(
    path: str | Path,
    diff: str,
    alternatives: int = 0,
    system: str | None = None,
    max_new_tokens: int | None = None,
) -> list[str]:
    """`Answerer.commit_messages` of the adapter at `path`."""
    return Answerer(path).commit_messages(diff, alternatives, system, max_new_tokens)


def answering(model):
    """A loaded adapter's weights folded into its base while it answers, as the scoreboard answers (a
    quantized base left as it is)."""
    return merged(model, _quantization(model))


def keep_folded(model) -> None:
    """A loaded adapter's weights folded into its base from now on (`decoding.fold`), where `answering`
    would fold them."""
    fold(model, _quantization(model))


def _quantization(model) -> str:
    return "none" if getattr(model.config, "quantization_config", None) is None else "quantized"


def model_name(directory: Path) -> str:
    """What the adapter at `directory` is called where a tool names models (`serve`, Ollama):
    `repotune-<repository>`, the repository it trained on (an adapter older than that record: the one its
    files came from, CODE_FILES, else the run's folder)."""
    saved = directory / CODE_FILES
    first = saved.read_bytes().split(b"\n", 1)[0] if saved.exists() else b""
    named = (
        adapter_facts(directory).repository
        or (orjson.loads(first)["repo"] if first else "")
        or directory.parent.name
    )
    return f"repotune-{file_name(named) or 'model'}"


def file_name(name: str) -> str:
    """The last part of a path or a hub id (`org/repo.git`: `repo`), lower case, in the characters every
    tool takes in a name (a model's in Ollama, a file's)."""
    base = name.rstrip("/").rsplit("/", 1)[-1].removesuffix(".git")
    return "".join(c if c.isalnum() or c in "-_." else "-" for c in base.lower()).strip("-.")


class Answerer:
    """An adapter ready to answer what `generate` and `serve` ask: its model loaded once, when a model
    first has to answer (the repository's past answers without it), its past and files read once."""

    def __init__(self, path: str | Path):
        self.path = path
        self.directory = adapter_directory(path)
        self._loaded: tuple[Any, Any] | None = None
        self._suggester: Suggester | None = None
        self._files: list[dict[str, Any]] | None = None
        self._index: CodeIndex | None = None
        self._facts: AdapterFacts | None = None

    @property
    def loaded(self) -> tuple[Any, Any]:
        """The model with its adapter, and its tokenizer, in `precision`."""
        if self._loaded is None:
            self._loaded = load_adapter(self.path, precision=self.precision)
        return self._loaded

    @functools.cached_property
    def precision(self) -> str:
        """What the model answers in (`answering_precision`), decided once: it reads the CPU's flags."""
        return answering_precision(self.facts.precision)

    @property
    def facts(self) -> AdapterFacts:
        """What the adapter records of its training (`repotune.json`), read once."""
        if self._facts is None:
            self._facts = adapter_facts(self.directory)
        return self._facts

    @property
    def suggester(self) -> Suggester:
        """The repository's past saved beside the adapter (check `has_past` first)."""
        if self._suggester is None:
            self._suggester = Suggester.load(self.directory)
        return self._suggester

    @property
    def has_past(self) -> bool:
        return (self.directory / INDEX_DIR).is_dir()

    @property
    def files(self) -> list[dict[str, Any]]:
        """The files at the run's split point (CODE_FILES), where a next line's context is retrieved."""
        if self._files is None:
            saved = self.directory / CODE_FILES
            self._files = (
                [orjson.loads(line) for line in saved.read_bytes().splitlines()] if saved.exists() else []
            )
        return self._files

    @property
    def index(self) -> CodeIndex:
        """`files` indexed for retrieval and the lookup for code, once (check `files` first)."""
        if self._index is None:
            self._index = CodeIndex(self.files)
        return self._index

    def complete(
        self,
        before: str,
        file_path: str,
        after: str = "",
        block: bool = False,
        max_new_tokens: int | None = None,
        system: str | None = None,
    ) -> tuple[str, str | None]:
        """The line written after `before` (a file's text up to the cursor, its last line ending there) in
        the repository's `file_path`, or with `block` the body under that last line, by `system` (default:
        the one the run chose, `saved_code_system`), asked as the scoreboard asks it: a model's prompt with
        the chunks of other files the run's split point holds that are most like the lines before the
        cursor (CODE_FILES beside the adapter) where the system reads them, and `after` (the text after the
        cursor) where the model infills or the system reads context (`own_chunk`); the lookup for code
        loads no model. Also why `after` was not read (None: it was, or none was given). Where `before`
        ends in the indentation an editor writes on a new line (the cursor after it), the answer is the
        line's rest after that indentation: an editor inserts it at the cursor. A file written on Windows is
        read with LF, as the files the run trained on were (`scrapers.files`), and a body given back in CR LF."""
        line_end = "\r\n" if "\r\n" in before else "\n"
        before, after = before.replace("\r\n", "\n"), after.replace("\r\n", "\n")
        answer, unread = self._complete(before, file_path, after, block, max_new_tokens, system)
        return answer.replace("\n", line_end), unread

    def _complete(
        self,
        before: str,
        file_path: str,
        after: str,
        block: bool,
        max_new_tokens: int | None,
        system: str | None,
    ) -> tuple[str, str | None]:
        if not before.strip():
            raise PipelineError(
                "--prompt is empty: give the file's text up to the cursor (`--prompt -` reads it)"
            )
        if not file_path:
            raise PipelineError(
                "--task code and block need --path: the file's path in the repository (its name says the language)"
            )
        system = system or saved_code_system(self.directory)
        if system not in CODE_SYSTEMS:
            raise PipelineError(
                f"--system {system}: with --task code or block, one of {', '.join(CODE_SYSTEMS)} (default: the "
                "run's choice)"
            )
        ended, indentation = line_ended(before)
        records = self.files
        repo = records[0]["repo"] if records else ""
        case = CodeCase("", "", repo, file_path, ended, "", after)
        asked = CODE_SYSTEMS[system]
        if asked is None:
            if not records:
                raise ModelLoadError(
                    f"--system lookup: {self.directory} has no {CODE_FILES} to look lines up in"
                )
            found = self.index.lookup(case, block)
            return after_typed(found, indentation), UNREAD_BY_LOOKUP if after else None
        tuned, context = asked
        model, tokenizer = self.loaded
        infill = infills(tokenizer)
        # With retrieved context, a chunk of it may be `after`'s (`own_chunk`): then `after` is read.
        retrieved = bool(records and context)
        prompt = (
            context_prompt(case, self.index.context(case), infill) if retrieved else bare_prompt(case, infill)
        )
        tokens = max_new_tokens or (BLOCK_TOKENS if block else LINE_TOKENS)
        with answering(model) if tuned else base_only(model):
            answer = generate_batched(
                model, tokenizer, [prompt], tokens, self.precision, next_line=not block, block=block
            )[0]
        unread = UNREAD_BY_MODEL if after and not (infill or retrieved) else None
        return after_typed(answer, indentation), unread

    def commit_messages(
        self, diff: str, alternatives: int = 0, system: str | None = None, max_new_tokens: int | None = None
    ) -> list[str]:
        """The commit message for `diff` from the system the run chose (or `system`): the repository's past
        answers without loading the model at all. Then the next best `alternatives` from the past (the
        commit hook's, beside the model's answer where the model writes)."""
        if system not in (None, *MESSAGE_SYSTEMS):
            raise PipelineError(
                f"--system {system}: with --task message, one of {', '.join(MESSAGE_SYSTEMS)}"
            )
        if not diff.strip():  # the past would answer nothing with whatever it ranks first
            raise PipelineError(
                "--prompt is empty: give the diff to write a message for (`git diff --cached --no-ext-diff | … "
                "--prompt -`; nothing staged gives nothing)"
            )
        read, found, model = self._from_past(diff, system, 1 + alternatives)
        if not model:
            return found
        answer = self.continuation(read, "message", max_new_tokens)
        return [answer, *beside(answer, found, alternatives)]

    def continuation(self, prompt: str, task: str | None, max_new_tokens: int | None) -> str:
        """The model's greedy answer to `prompt` (asked as training asked `task`, where one is given)."""
        if not prompt.strip():
            raise PipelineError(
                "--prompt is empty: give the model text to continue (or - to read it from stdin)"
            )
        model, tokenizer = self.loaded
        facts = self.facts
        given = ""
        if task:  # the prompt as training asked it, cut where training cut it
            prompt = render_prompt(tokenizer, facts.style, task, prompt.strip(), facts.prompt_tokens)
            given = answer_prefix(facts.style, task)
        message = task == "message"  # a commit message that starts over is cut there; code repeats lines
        if max_new_tokens is None:  # as many as the scoreboard let the model write
            max_new_tokens = (
                (facts.message_tokens or EvalConfig().message_tokens) if message else CONTINUATION_TOKENS
            )
        self.check_length(prompt, max_new_tokens, "--max-new-tokens")
        with answering(model):
            return (
                given
                + generate_batched(
                    model, tokenizer, [prompt], max_new_tokens, self.precision, cut_loops=message
                )[0]
            )

    def check_length(self, prompt: str, max_new_tokens: int, option: str) -> int:
        """The prompt's tokens, where they and `max_new_tokens` fit the model's positions (past them a
        model writes noise, slowly); else one line naming `option`."""
        model, tokenizer = self.loaded
        positions = getattr(model.config, "max_position_embeddings", None)
        asked = len(tokenizer(prompt, add_special_tokens=False)["input_ids"])
        if positions and asked + max_new_tokens > positions:
            raise PipelineError(
                f"{option} {max_new_tokens}: the model reads at most {positions:,} positions and the prompt "
                f"takes {asked:,}: give at most {max(positions - asked, 0):,}"
            )
        return asked

    def _from_past(self, diff: str, system: str | None, count: int) -> tuple[str, list[str], bool]:
        """`diff` read as training read commits (`as_trained`: the files the scrape kept, the adapter's
        past says which); the `count` best messages of the retrieval system (the lookup's or the
        selector's: the one chosen or asked for, else the run's); and whether the model is to answer: it
        was chosen or asked for, the adapter has no retrieval saved, or no past commit touched anything
        the diff touches."""
        if not self.has_past and system in ("lookup", "selector"):
            raise ModelLoadError(
                f"--system {system}: {self.directory} has no {INDEX_DIR}/ (it was trained before runs kept the "
                "repository's past); train again, or leave --system out"
            )
        if not self.has_past or (system == "model" and count == 1):  # the saved file filters read the diff
            return as_trained(diff, saved_file_filters(self.directory)), [], True
        suggester = self.suggester
        read = suggester.read(diff)
        model = (system or suggester.system) == "model"
        if model and count == 1:  # no alternatives asked for: the model's answer alone
            return read, [], True
        found = suggester.suggestions(read, count, None if system == "model" else system, read=True)
        return read, found, model or not found


def merge(path: str | Path, destination: str | Path) -> Path:
    """Fold the adapter into the base weights and save a standalone model (plus tokenizer); a quantized
    base is dequantized first, so the merged model holds the weights the adapter was trained against."""
    adapter_directory(path)  # a missing adapter is said before the libraries load
    model, tokenizer = load_adapter(path, dense=True)
    destination = Path(destination).expanduser()
    model.merge_and_unload().save_pretrained(destination)
    tokenizer.save_pretrained(destination)
    return destination

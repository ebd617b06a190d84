"""The base models a run can start from (the built-in ones, `tiny`, a Hub id or a local directory):
their tokenizers, their configs and what the planner needs to know about them, from configs alone. The
data, plan and train stages all read them; nothing here loads weights."""

from __future__ import annotations

import difflib
import hashlib
import os
import urllib.request
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from pipeline.builtin import BUILTIN_MODELS, builtin_directory, is_builtin, source_of
from pipeline.errors import ModelLoadError, one_line
from pipeline.types import ModelFacts

TINY = "tiny"
TINY_VOCAB_SIZE = 1024  # enough merges for code on a small corpus, few enough rows to learn in a short run
TINY_MAX_POSITIONS = 2048
EOS_TOKEN = "<|endoftext|>"
FIM_TOKENS = ("<fim_prefix>", "<fim_suffix>", "<fim_middle>")
"""Fill-in-the-middle: StarCoder's tokens, which most code models share (and tiny has, so that the suite
trains and asks infills). A model whose tokenizer has them reads the text after the cursor too."""


@dataclass(frozen=True)
class TinyShape:
    """The tiny model's dimensions: about 1M parameters, a few ms per step on a laptop CPU."""

    hidden_size: int = 128
    intermediate_size: int = 384
    num_hidden_layers: int = 4
    num_attention_heads: int = 4
    initializer_range: float = 0.05
    """Init std. The usual 0.02 bounds every logit near 0.02 × hidden_size ≈ 2.6 nats through the final
    norm, so a random model could barely sharpen its predictions; 0.05 leaves room."""


def quiet_library_output() -> None:
    """Keep stdout and the log for what matters: no save progress bars, no notice that is not ours to act on."""
    import logging
    import warnings

    import transformers

    transformers.utils.logging.disable_progress_bar()
    # peft calls a transformers helper that transformers 5 renamed.
    warnings.filterwarnings(
        "ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning
    )
    # Printed at every checkpoint rotation on filesystems with coarse timestamps; the ordering is still right.
    # On the handler: a logger's own filters never see the records its child loggers propagate to it.
    for handler in logging.getLogger("transformers").handlers:
        handler.addFilter(lambda record: "mtime may not be reliable" not in record.getMessage())


def pretrained_tokenizer(model_name: str):
    """A pretrained model's own tokenizer; None for tiny, whose tokenizer `train_tiny_tokenizer` makes
    from the corpus."""
    if model_name == TINY:
        return None
    from transformers import AutoTokenizer

    tokenizer = load_pretrained(AutoTokenizer, model_name)
    if tokenizer.eos_token is None:
        raise ModelLoadError(
            f"model '{model_name}': its tokenizer defines no end-of-sequence token to separate commits"
        )
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def tokenizer_recipe(pretrained) -> dict:
    """What the token cache's key needs to know about the tokenizer, before tokenizing anything;
    `pretrained` is what `pretrained_tokenizer` gave (None for tiny)."""
    if pretrained is None:
        import tokenizers

        # Tiny's, trained on the corpus (whose identity is in the scrape part of the key) with this recipe.
        return {
            "tiny_vocab_size": TINY_VOCAB_SIZE, "special": [EOS_TOKEN, *FIM_TOKENS],
            "tokenizers": tokenizers.__version__,
        }  # fmt: skip
    vocabulary = sorted(pretrained.get_vocab().items())
    return {
        "vocab_sha256": hashlib.sha256(repr(vocabulary).encode()).hexdigest(),
        "eos": pretrained.eos_token,
        "class": type(pretrained).__name__,
    }


def infills(tokenizer) -> bool:
    """Whether the tokenizer has fill-in-the-middle tokens (FIM_TOKENS): the text after the cursor can be
    given."""
    vocabulary = tokenizer.get_vocab()
    return all(token in vocabulary for token in FIM_TOKENS)


def load_saved_tokenizer(directory: Path):
    """A tokenizer saved with save_pretrained (the token cache keeps the one it was built with)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(directory))


def model_config(model_name: str, tokenizer):
    """The architecture config: tiny's, built here, or the pretrained model's (no weights loaded)."""
    if model_name != TINY:
        from transformers import AutoConfig

        return load_pretrained(AutoConfig, model_name)
    from transformers import LlamaConfig

    shape = TinyShape()
    return LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size,
        num_hidden_layers=shape.num_hidden_layers,
        num_attention_heads=shape.num_attention_heads,
        num_key_value_heads=shape.num_attention_heads,
        max_position_embeddings=TINY_MAX_POSITIONS,
        tie_word_embeddings=True,
        initializer_range=shape.initializer_range,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
    )


def describe_model(model_name: str, config, tokenizer) -> ModelFacts:
    """What the planner needs to know about the model, from its config on the meta device (no memory)."""
    chat_template = model_name != TINY and bool(getattr(tokenizer, "chat_template", None))
    import importlib.util

    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
    output = model.get_output_embeddings()
    linears = [
        module for module in model.modules() if isinstance(module, torch.nn.Linear) and module is not output
    ]
    return ModelFacts(
        name=model_name,
        random_init=model_name == TINY,
        source=source_of(model_name) if is_builtin(model_name) else None,
        chat_template=chat_template,
        max_positions=getattr(text_config, "max_position_embeddings", None),
        parameters=sum(parameter.numel() for parameter in model.parameters()),
        linear_parameters=sum(module.weight.numel() for module in linears),
        linear_widths=sum(module.in_features + module.out_features for module in linears),
        hidden_size=text_config.hidden_size,
        num_layers=text_config.num_hidden_layers,
        vocab_size=text_config.vocab_size,
        supports_sdpa=bool(getattr(model, "_supports_sdpa", False)),
        supports_attention_backend=bool(getattr(model, "_supports_attention_backend", False)),
        supports_flash_attention=bool(getattr(model, "_supports_flash_attn", False))
        and importlib.util.find_spec("flash_attn") is not None,
    )


def train_tiny_tokenizer(corpus: Iterable[str]):
    """Tiny's byte-level BPE tokenizer, trained on `corpus`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=TINY_VOCAB_SIZE,
        special_tokens=[EOS_TOKEN, *FIM_TOKENS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # every byte stays encodable
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus, trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token=EOS_TOKEN, pad_token=EOS_TOKEN)


def load_pretrained(cls, name: str, **kwargs):
    """Load a built-in model from its converted directory; anything else from the local cache first,
    going to the hub only when it answers, so offline fails fast."""
    if is_builtin(name):
        return cls.from_pretrained(str(builtin_directory(name)), **kwargs)
    local = Path(name).expanduser()
    if name.startswith((".", "/", "~")) and not local.is_dir():
        raise _no_such_directory(name)
    try:
        return cls.from_pretrained(str(local) if local.is_dir() else name, local_files_only=True, **kwargs)
    except (OSError, ValueError) as err:
        if local.is_dir():
            raise ModelLoadError(
                f"--model {name}: cannot load it from that directory: {_lacking(local, err)}"
            ) from None
    if not _hub_answers():
        raise _not_cached(name)
    try:
        return cls.from_pretrained(name, **kwargs)
    except (OSError, ValueError) as err:
        raise ModelLoadError(f"cannot load model '{name}': {one_line(err)}") from None


def check_available(name: str) -> None:
    """Say now, before the scrape (minutes on a long history), what `load_pretrained` would say after it
    for want of the model: a path that is no directory, or a hub id neither in the local cache nor
    reachable. A directory's contents are checked as it loads."""
    if name == TINY or is_builtin(name) or Path(name).expanduser().is_dir():
        return
    if name.startswith((".", "/", "~")):
        raise _no_such_directory(name)
    from huggingface_hub import try_to_load_from_cache

    try:
        cached = try_to_load_from_cache(name, "config.json")
    except ValueError:  # not a hub id at all (huggingface_hub's validation error is a ValueError)
        cached = None
    if not isinstance(cached, str) and not _hub_answers():
        raise _not_cached(name)


def _no_such_directory(name: str) -> ModelLoadError:
    return ModelLoadError(f"--model {name}: no such directory; pass a model directory, a hub id, or `tiny`")


def _not_cached(name: str) -> ModelLoadError:
    close = difflib.get_close_matches(name, [*BUILTIN_MODELS, TINY], n=1) if "/" not in name else []
    return ModelLoadError(
        f"model '{name}' is not in the local Hugging Face cache and the hub cannot be reached"
        + (f" (did you mean `--model {close[0]}`?)" if close else "")
        + f"; download it on a connected machine (`hf download {name}`), pass a local directory, "
        "or use a built-in model (--model smollm2-135m, or --model tiny)"
    )


def _hub_answers() -> bool:
    return os.environ.get("HF_HUB_OFFLINE") != "1" and _hub_reachable()


def _hub_reachable(timeout_s: float = 3.0) -> bool:
    from huggingface_hub import constants

    request = urllib.request.Request(constants.ENDPOINT, method="HEAD")
    try:
        urllib.request.urlopen(request, timeout=timeout_s)
    except urllib.error.HTTPError:
        return True  # it answered
    except (OSError, ValueError):
        return False
    return True


# Any one of these lets transformers build a tokenizer: tokenizer.json as it is, the others converted.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt", "tiktoken.model")


def _lacking(directory: Path, err: Exception) -> str:
    """Why a model directory does not load: the file it lacks, where that is the reason (transformers
    names none for a missing tokenizer: it lists, over four lines, the ways it tried); else its message."""
    if not (directory / "config.json").is_file():
        return "it has no config.json (a model directory is what save_pretrained or `hf download NAME --local-dir DIR` writes)"
    if not any((directory / file).is_file() for file in TOKENIZER_FILES):
        return f"it has no tokenizer ({', '.join(TOKENIZER_FILES)}): save the model's tokenizer there (save_pretrained)"
    return one_line(err)

"""Take the model home: the adapter merged into its base and written as one GGUF file (weights,
tokenizer and chat template inside) that llama.cpp and Ollama load, with an Ollama Modelfile beside it;
or (`adapter_only`) the adapter alone as llama.cpp's LoRA GGUF, a few megabytes, beside its base written
once for every repository exported to the same folder (Ollama's `FROM` + `ADAPTER`, llama.cpp's `--lora`).

The file is written with the `gguf` package's writer (the library llama.cpp's own converter uses), the
way that converter writes a Llama-architecture model: tensors under llama.cpp's names, the query and
key projections permuted into its rotary layout, norms in fp32, the byte-level BPE vocabulary and its
merges, and the run's text style. A LoRA file is written as llama.cpp's `convert_lora_to_gguf.py` writes
one: each adapted weight's `lora_a` and `lora_b` under the weight's name (the query and key updates'
`lora_b` permuted as their weights are), and the alpha llama.cpp scales them by (alpha / rank). The Modelfile makes the model a commit-message writer: its template
is the model's own chat template rendered around the prompt training used, so `git diff --cached |
ollama run NAME` asks exactly what training taught.
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.base_models import FIM_TOKENS, infills
from pipeline.data.examples import SYSTEM_PROMPT, render_prompt
from pipeline.errors import ExportError
from pipeline.suggest.suggestion import saved_file_filters
from pipeline.train.model import adapter_facts
from pipeline.use.generate import adapter_directory, file_name, load_adapter, model_name
from scrapers.filters import git_pathspecs

GGUF_TYPES = ("f16", "q8_0")
"""f16 keeps the merged weights; q8_0 halves the file for a small loss. SmolLM2's 576-wide rows are not a
multiple of 256, so the k-quants (Q4_K and friends) cannot hold it."""
# A diff piped to Ollama reaches the model as git prints it, so as plain text whatever the user's config:
# colour (`color.ui=always`) or an external diff tool (`diff.external = difft`) would print something else.
PIPED_DIFF_OPTIONS = ("--no-color", "--no-ext-diff")
MODELFILE = "Modelfile"
CODE_MODELFILE = "Modelfile.code"  # the same weights as a code completer: editors' autocomplete
PROMPT_MARK, SYSTEM_MARK = "\x00PROMPT\x00", "\x00SYSTEM\x00"
"""Placeholders rendered through the chat template, then replaced by Ollama's template variables."""


@dataclass(frozen=True)
class Exported:
    gguf: Path
    """The merged model, or the adapter alone (`base` beside it)."""
    base: Path | None
    """The base model the adapter file applies to (None: `gguf` is the merged model)."""
    base_written: bool
    """Whether `base` was written now (else an earlier export of the same base wrote it)."""
    modelfile: Path
    code_modelfile: Path
    """The same weights as a code completer's Modelfile."""
    gguf_type: str
    bytes: int
    tensors: int
    staged: str
    """The command that pipes the staged change as training read commits' (`git diff --cached -- SPECS`)."""
    name: str
    """The model's name in Ollama (`model_name`, or the one asked for)."""


def export(
    adapter: str | Path,
    output: str | Path,
    gguf_type: str = "f16",
    name: str | None = None,
    adapter_only: bool = False,
) -> Exported:
    """Merge `adapter` into its base and write `output` (a .gguf file) and a Modelfile beside it, the
    model named `name` in it (default `model_name`: the repository's); with `adapter_only`, write the
    adapter alone as `output` and its base beside it (`gguf_type`), unless an earlier export wrote that
    base there. Each file appears whole or not at all."""

    destination = Path(output).expanduser()
    if destination.suffix != ".gguf":
        raise ExportError(f"--output {output}: name the file to write, ending in .gguf (e.g. model.gguf)")
    if gguf_type not in GGUF_TYPES:
        raise ExportError(f"--type {gguf_type}: choose one of {', '.join(GGUF_TYPES)}")
    directory = adapter_directory(adapter)
    staging = _staging(destination, output)
    base, base_written = None, False
    try:
        model, tokenizer = load_adapter(adapter, dense=True)
        config = model.config
        if config.model_type != "llama":
            raise ExportError(
                f"export writes Llama-architecture models (smollm2-135m, tiny, Llama); {config.model_type} "
                "is not supported yet: `generate --merge DIR` writes a Hugging Face directory that "
                "llama.cpp's convert_hf_to_gguf.py converts"
            )
        vocabulary = _vocabulary(tokenizer, config.vocab_size)
        if adapter_only:
            tensors = _write_lora(staging, model, directory)
            base, base_written = _write_base(
                destination, model.unload(), tokenizer, vocabulary, gguf_type, adapter_facts(directory).model
            )
            weights = [f"FROM ./{base.name}", f"ADAPTER ./{destination.name}"]
        else:
            merged = model.merge_and_unload()
            tensors = _write(
                staging, merged, tokenizer, vocabulary, gguf_type, f"repotune {directory.parent.name}"
            )
            weights = [f"FROM ./{destination.name}"]
        os.replace(staging, destination)
    finally:
        staging.unlink(missing_ok=True)
    style = adapter_facts(directory).style
    staged = shlex.join(
        ["git", "diff", "--cached", *PIPED_DIFF_OPTIONS, "--", *git_pathspecs(saved_file_filters(directory))]
    )
    # Adapters share their base's folder, so each names its Modelfiles after itself.
    prefix = f"{destination.stem}." if adapter_only else ""
    modelfile, code = (
        destination.with_name(prefix + MODELFILE),
        destination.with_name(prefix + CODE_MODELFILE),
    )
    name = name or model_name(directory)
    modelfile.write_text(ollama_modelfile(weights, tokenizer, style, staged, name, modelfile.name), "utf-8")
    code.write_text(code_modelfile(weights, tokenizer, f"{name}-code", code.name), encoding="utf-8")
    size = destination.stat().st_size
    return Exported(destination, base, base_written, modelfile, code, gguf_type, size, tensors, staged, name)


def _staging(destination: Path, output: str | Path) -> Path:
    """An empty file beside `destination` to write it into, or one line on why there cannot be one (said
    before the model loads, not after)."""
    staging = destination.with_name(f".{destination.name}.{os.getpid()}.tmp")
    try:
        destination.parent.mkdir(parents=True, exist_ok=True)
        staging.touch()
    except FileExistsError:  # mkdir, where the folder named is a file
        raise ExportError(f"--output {output}: {destination.parent} is a file, not a folder") from None
    except OSError as err:
        raise ExportError(f"--output {output}: cannot write there ({err.strerror or err})") from None
    return staging


def _write_base(
    destination: Path, base, tokenizer, vocabulary: dict[str, Any], gguf_type: str, model: str
) -> tuple[Path, bool]:
    """The base model's GGUF beside `destination`, named after the `model`, its type and its weights (so
    every adapter of one base exported to a folder shares one file, and another base never takes its
    name); whether it was written now."""
    import hashlib

    digest = hashlib.blake2b(digest_size=4)
    for tensor in base.state_dict().values():
        digest.update(tensor.detach().float().numpy().tobytes())
    cleaned = file_name(model) or "base"
    path = destination.with_name(f"{cleaned}.{gguf_type}.{digest.hexdigest()}.gguf")
    if path.exists():
        return path, False
    staging = _staging(path, path)
    try:
        _write(staging, base, tokenizer, vocabulary, gguf_type, cleaned)
        os.replace(staging, path)
    finally:
        staging.unlink(missing_ok=True)
    return path, True


def _write_lora(path: Path, model, adapter: Path) -> int:
    """The adapter's low-rank updates as llama.cpp's LoRA GGUF, in fp32 (they are small); how many
    tensors. Refused in one line where the adapter also trains base weights in full (a random base's
    embeddings), which a LoRA file cannot hold."""
    import gguf
    import numpy as np

    trained_whole = model.peft_config["default"].modules_to_save
    if trained_whole:
        raise ExportError(
            f"export --adapter-only: this adapter also trains the base's {', '.join(sorted(trained_whole))} "
            "in full (its base was random), which a LoRA file cannot hold: export without --adapter-only"
        )
    config = model.config
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, config.num_hidden_layers)
    updates = []
    for module_name, module in model.named_modules():
        if "default" not in getattr(module, "lora_A", {}):
            continue
        hf_name = module_name.removeprefix("base_model.model.") + ".weight"
        name = names.get_name(hf_name, try_suffixes=(".weight",))
        if name is None:
            raise ExportError(f"export: no llama.cpp name for the adapted weight {hf_name}")
        down = module.lora_A["default"].weight.detach().float().numpy()
        # peft scales each update by its own factor (alpha / rank, or alpha / √rank with rsLoRA); llama.cpp
        # by one alpha over each update's rank: the factor goes into `lora_b`, and that alpha is the rank.
        up = module.lora_B["default"].weight.detach().float().numpy() * module.scaling["default"]
        if hf_name.endswith("q_proj.weight"):
            up = rotary_layout(up, config.num_attention_heads)
        elif hf_name.endswith("k_proj.weight"):
            up = rotary_layout(up, config.num_key_value_heads)
        updates.append((name, down, up))
    ranks = {down.shape[0] for _, down, _ in updates}
    if len(ranks) != 1:
        raise ExportError(
            f"export --adapter-only: the adapter's ranks differ ({sorted(ranks)}); one alpha cannot scale them"
        )
    writer = gguf.GGUFWriter(str(path), gguf.MODEL_ARCH_NAMES[gguf.MODEL_ARCH.LLAMA])
    writer.add_type(gguf.GGUFType.ADAPTER)
    writer.add_name(f"repotune {adapter.parent.name}")
    writer.add_string(gguf.Keys.Adapter.TYPE, "lora")
    writer.add_float32(gguf.Keys.Adapter.LORA_ALPHA, float(ranks.pop()))
    for name, down, up in updates:
        writer.add_tensor(f"{name}.lora_a", np.ascontiguousarray(down, dtype=np.float32))
        writer.add_tensor(f"{name}.lora_b", np.ascontiguousarray(up, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return 2 * len(updates)


def _write(path: Path, merged, tokenizer, vocabulary: dict[str, Any], gguf_type: str, name: str) -> int:
    import gguf

    config = merged.config
    writer = gguf.GGUFWriter(str(path), gguf.MODEL_ARCH_NAMES[gguf.MODEL_ARCH.LLAMA])
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    writer.add_type(gguf.GGUFType.MODEL)
    writer.add_name(name)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_rope_dimension_count(head_dim)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_rope_freq_base(_rope_theta(config))
    writer.add_vocab_size(config.vocab_size)
    writer.add_file_type(
        gguf.LlamaFileType.MOSTLY_F16 if gguf_type == "f16" else gguf.LlamaFileType.MOSTLY_Q8_0
    )
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt-2")
    writer.add_token_list(vocabulary["tokens"])
    writer.add_token_types(vocabulary["types"])
    writer.add_token_merges(vocabulary["merges"])
    writer.add_add_bos_token(False)  # training never added one: the chat template or the raw text is all
    writer.add_add_space_prefix(False)
    for token, add in (
        (tokenizer.bos_token_id, writer.add_bos_token_id),
        (tokenizer.eos_token_id, writer.add_eos_token_id),
        (tokenizer.unk_token_id, writer.add_unk_token_id),
        (tokenizer.pad_token_id, writer.add_pad_token_id),
    ):
        if token is not None:
            add(token)
    if tokenizer.chat_template:
        writer.add_chat_template(tokenizer.chat_template)
    count = 0
    for name, data, raw_type in _tensors(merged, gguf_type):
        writer.add_tensor(name, data, raw_dtype=raw_type)
        count += 1
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return count


def _tensors(merged, gguf_type: str):
    """(llama.cpp name, data, GGML type) for every weight, in the merged model's order; a tied output
    layer is left out (llama.cpp ties it to the embeddings itself, as transformers does)."""
    import gguf
    import numpy as np

    config = merged.config
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, config.num_hidden_layers)
    tied = getattr(config, "tie_word_embeddings", False)
    for hf_name, tensor in merged.state_dict().items():
        if tied and hf_name == "lm_head.weight":
            continue
        name = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        if name is None:
            raise ExportError(f"export: no llama.cpp name for the weight {hf_name}")
        data = tensor.detach().float().numpy()
        if hf_name.endswith("q_proj.weight"):
            data = rotary_layout(data, config.num_attention_heads)
        elif hf_name.endswith("k_proj.weight"):
            data = rotary_layout(data, config.num_key_value_heads)
        if data.ndim == 1:  # norms stay fp32, as llama.cpp expects
            yield name, data.astype(np.float32), None
        elif gguf_type == "q8_0":
            yield (
                name,
                gguf.quants.quantize(data, gguf.GGMLQuantizationType.Q8_0),
                gguf.GGMLQuantizationType.Q8_0,
            )
        else:
            yield name, data.astype(np.float16), None


def rotary_layout(weights, heads: int):
    """Hugging Face's rotary layout (halves) into llama.cpp's (interleaved pairs), per head of the
    projection (`heads`: the key projection's are the key-value heads): what llama.cpp's converter does
    and transformers' GGUF loader undoes."""
    return (
        weights.reshape(heads, 2, weights.shape[0] // heads // 2, *weights.shape[1:])
        .swapaxes(1, 2)
        .reshape(weights.shape)
    )


def _rope_theta(config) -> float:
    parameters = getattr(config, "rope_parameters", None) or {}
    kind = parameters.get("rope_type", "default")
    if kind != "default":
        raise ExportError(f"export: rope scaling `{kind}` is not written yet; only plain RoPE models export")
    theta = parameters.get("rope_theta") or getattr(config, "rope_theta", None)
    return float(theta) if theta is not None else 10000.0


def _vocabulary(tokenizer, vocab_size: int) -> dict[str, Any]:
    """Tokens in id order with their GGUF types, and the BPE merges, from the tokenizer's own
    definition; padded to the model's vocabulary size as llama.cpp's converter pads."""
    import json

    import gguf

    backend = getattr(tokenizer, "backend_tokenizer", None) or getattr(tokenizer, "_tokenizer", None)
    definition = json.loads(backend.to_str()) if backend is not None else {}
    model, pre = definition.get("model") or {}, definition.get("pre_tokenizer") or {}
    if model.get("type") != "BPE" or pre.get("type") != "ByteLevel" or not pre.get("use_regex", True):
        raise ExportError(
            "export writes byte-level BPE tokenizers (GPT-2's pre-tokenizer: smollm2-135m, tiny); this "
            f"model's is {model.get('type')} with {pre.get('type')}"
        )
    added = {token["id"]: token for token in definition.get("added_tokens", [])}
    by_id = {index: token for token, index in model["vocab"].items()}
    by_id.update({index: token["content"] for index, token in added.items()})
    size = max(vocab_size, max(by_id) + 1)
    tokens, types = [], []
    for index in range(size):
        if index not in by_id:
            tokens.append(f"[PAD{index}]")
            types.append(gguf.TokenType.UNUSED)
        elif index in added:
            tokens.append(by_id[index])
            types.append(gguf.TokenType.CONTROL if added[index]["special"] else gguf.TokenType.USER_DEFINED)
        else:
            tokens.append(by_id[index])
            types.append(gguf.TokenType.NORMAL)
    merges = [merge if isinstance(merge, str) else " ".join(merge) for merge in model.get("merges", [])]
    return {"tokens": tokens, "types": types, "merges": merges}


def code_modelfile(weights: list[str], tokenizer, name: str, file: str = CODE_MODELFILE) -> str:
    """An Ollama Modelfile that makes the GGUF beside it a code completer: the editor's text continued as
    it is (`{{ .Prompt }}`), or, where the tokenizer has fill-in-the-middle tokens, the text around the
    cursor (`{{ .Suffix }}`, Ollama's `suffix`), greedy."""
    prefix, suffix, middle = FIM_TOKENS
    if infills(tokenizer):
        template = (
            f"{{{{ if .Suffix }}}}{prefix}{{{{ .Prompt }}}}{suffix}{{{{ .Suffix }}}}{middle}"
            "{{ else }}{{ .Prompt }}{{ end }}"
        )
    else:
        template = "{{ .Prompt }}"
    stops = [tokenizer.eos_token] if tokenizer.eos_token else []
    lines = [
        "# repotune: the fine-tuned model as a code completer (an editor's autocomplete through Ollama):",
        f"#   ollama create {name} -f {file}",
        *weights,
        f'TEMPLATE """{template}"""',
        *[f'PARAMETER stop "{stop}"' for stop in stops],
        "PARAMETER temperature 0",
        "PARAMETER num_predict 64",
    ]
    return "\n".join(lines) + "\n"


def ollama_modelfile(
    weights: list[str], tokenizer, style, staged: str, name: str, file: str = MODELFILE
) -> str:
    """An Ollama Modelfile for the GGUF beside it (`weights`: its FROM, and ADAPTER for an adapter on its
    base): the commit-message prompt exactly as training asked
    it (the model's chat template rendered around it, or the raw format), greedy, stopping at the end
    of the answer; its comment pipes the staged change with `staged` (the files training read)."""

    rendered = render_prompt(tokenizer, style, "message", PROMPT_MARK)
    system = SYSTEM_PROMPT if SYSTEM_PROMPT in rendered else None
    template = rendered.replace(PROMPT_MARK, "{{ .Prompt }}")
    if system:
        template = template.replace(SYSTEM_PROMPT, "{{ .System }}")
    if '"""' in template:
        raise ExportError("export: the chat template contains triple quotes, which a Modelfile cannot hold")
    stops = [tokenizer.eos_token] if tokenizer.eos_token else []
    stops += [
        token
        for token in tokenizer.all_special_tokens
        if token in template and token not in stops and token != tokenizer.bos_token
    ]
    lines = [
        "# repotune: the fine-tuned model as a commit-message writer. Give it a diff:",
        f"#   ollama create {name} -f {file}",
        f"#   {staged} | ollama run {name}",
        *weights,
        f'TEMPLATE """{template}"""',
    ]
    if system:
        lines.append(f'SYSTEM """{system}"""')
    lines += [f'PARAMETER stop "{stop}"' for stop in stops]
    lines += ["PARAMETER temperature 0", "PARAMETER num_predict 128"]
    return "\n".join(lines) + "\n"

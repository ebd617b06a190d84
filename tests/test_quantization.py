"""QLoRA, proven on a CPU: a pretrained base loaded in 4 bits (bitsandbytes NF4 with double quantisation,
bf16 or fp32 compute), LoRA trained on top, the adapter used and merged afterwards; and the planner
choosing 4 bits from a model's config alone when its weights would not fit."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import orjson
import pytest
import torch

from pipeline.builtin import builtin_directory
from pipeline.hardware import GB
from pipeline.plan.planner import QUANTIZED_BITS
from tests.conftest import PRETRAINED, read_json, short_pretrained_run

# The built-in base cut to its first two decoder layers (its tokenizer, embeddings and chat template
# whole): a pretrained model directory as a user passes one, whose quantization, 4-bit steps, merge and
# loads take a fraction of the whole base's on a CPU (bitsandbytes quantizes every linear layer at each load).
LAYERS = 2


def weights(directory: str) -> tuple[int, int]:
    """A Llama model's linear weights (7 per layer: quantized) and its embeddings (tied to the output,
    kept dense), from its config."""
    config = json.loads((Path(directory) / "config.json").read_text())
    hidden, inner = config["hidden_size"], config["intermediate_size"]
    kv = hidden * config["num_key_value_heads"] // config["num_attention_heads"]
    per_layer = 2 * hidden * hidden + 2 * hidden * kv + 3 * hidden * inner
    return config["num_hidden_layers"] * per_layer, config["vocab_size"] * hidden


@pytest.fixture(scope="module")
def two_layer_base(tmp_path_factory) -> str:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from pipeline.base_models import load_pretrained

    directory = tmp_path_factory.mktemp("two-layer-base")
    model = load_pretrained(AutoModelForCausalLM, PRETRAINED)
    model.model.layers = model.model.layers[:LAYERS]
    model.config.num_hidden_layers = LAYERS
    model.save_pretrained(directory)
    load_pretrained(AutoTokenizer, PRETRAINED).save_pretrained(directory)
    return str(directory)


@pytest.fixture(scope="module")
def quantized_run(tmp_path_factory, two_layer_base):
    # One format and no files: a quarter of the dense run's tokens, and 4 bits train no differently on
    # either; nothing here reads a held-out answer's score (4-bit answers are slow on a CPU), only the
    # held-out loss.
    return short_pretrained_run(
        tmp_path_factory.mktemp("qlora"),
        "plan.quantization=4bit",
        "scrape.format=message",
        "scrape.files=false",
        "eval.code_cases=0",
        "eval.samples=0",
        model=two_layer_base,
    )


def test_the_base_trains_in_4_bits(quantized_run, two_layer_base):
    manifest = read_json(quantized_run / "MANIFEST.json")
    decision = manifest["training_parameters"]["decisions"]["quantization"]
    assert decision == {"value": "4bit", "source": "cli", "reason": "set by --set plan.quantization"}
    model = manifest["model"]
    assert model["quantization"] == "4bit"
    # The linear weights in NF4 (4 bits and their blocks' scales) beside the dense embeddings in the
    # compute dtype (fp32 on a CPU without bf16).
    linear, embedding = weights(two_layer_base)
    dense_bytes = 4 if manifest["training_parameters"]["precision"] == "fp32" else 2
    quantized = linear * QUANTIZED_BITS["4bit"] / 8 + embedding * dense_bytes
    assert model["weights_gb"] == pytest.approx(quantized / GB, rel=0.05)
    assert model["weights_gb"] < 0.9 * (linear + embedding) * dense_bytes / GB
    evaluation = manifest["training_report"]["evaluation"]
    assert evaluation["after"]["loss"] < evaluation["before"]["loss"]
    assert manifest["training_report"]["throughput"]["tokens_per_s"] > 0
    facts = orjson.loads((quantized_run / "adapter" / "repotune.json").read_bytes())
    assert (facts["model"], facts["quantization"]) == (two_layer_base, "4bit")


def test_generate_loads_the_adapter_on_its_4_bit_base(quantized_run, cli):
    result = cli(
        "generate", "--adapter", quantized_run, "--task", "message", "--system", "model",
        "--prompt", "def compute_3(values):",
    )  # fmt: skip
    assert result.code == 0, result.err
    assert result.out.strip()


def test_bitsandbytes_is_imported_for_a_quantized_base_alone(quantized_run):
    """peft imports bitsandbytes as it loads and as it wraps a model's layers (start-up time): a
    process that trains or loads an adapter on a dense base goes without it, and a 4-bit base loaded
    afterwards in that process still gets its 4-bit LoRA layers."""
    script = f"""
import sys
from pipeline.train.model import TRAINING_LIBRARIES, load_libraries, unquantized_imports
from pipeline.use.generate import load_adapter

load_libraries(TRAINING_LIBRARIES, "none")
from peft import LoraConfig, get_peft_model
from transformers import LlamaConfig, LlamaForCausalLM

dense = LlamaForCausalLM(LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                                     num_attention_heads=2, num_key_value_heads=2, vocab_size=256))
with unquantized_imports("none"):
    get_peft_model(dense, LoraConfig(target_modules="all-linear"))
assert "bitsandbytes" not in sys.modules
model, _ = load_adapter({str(quantized_run)!r})
layer = model.get_base_model().model.layers[0].mlp.down_proj
assert type(layer).__module__ == "peft.tuners.lora.bnb" and type(layer).__name__ == "Linear4bit", type(layer)
"""
    root = Path(__file__).resolve().parent.parent
    result = subprocess.run([sys.executable, "-c", script], cwd=root, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]


def test_merge_writes_the_dequantized_model_the_adapter_trained_on(quantized_run, cli, tmp_path):
    from transformers import AutoModelForCausalLM

    from pipeline.use.generate import load_adapter

    merged = tmp_path / "merged"
    result = cli("generate", "--adapter", quantized_run, "--merge", merged)
    assert result.code == 0, result.err
    config = json.loads((merged / "config.json").read_text())
    assert "quantization_config" not in config
    dense = AutoModelForCausalLM.from_pretrained(merged, dtype=torch.float32).eval()
    unmerged, tokenizer = load_adapter(quantized_run, dense=True)  # dequantized base + adapter
    quantized, _ = load_adapter(quantized_run)  # as trained: 4-bit base + adapter
    ids = tokenizer("def compute_3(values):\n    total = 0", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        got, exact, trained = (model(input_ids=ids).logits for model in (dense, unmerged, quantized))
    assert torch.allclose(got, exact, atol=1e-3 * exact.abs().max())  # merging changed nothing
    # Against the 4-bit model itself: bitsandbytes' CPU kernel rounds differently, near-ties may flip.
    assert (got - trained).abs().max() < 0.05 * trained.abs().max()
    assert (got.argmax(-1) == trained.argmax(-1)).float().mean() >= 0.9


def test_without_bitsandbytes_a_quantized_run_is_one_line(cli, sample_repo, tmp_path, monkeypatch, host):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "bitsandbytes" else real(name, *a)
    )
    result = cli(
        "--repo", sample_repo.path, "--output-dir", tmp_path / "out", "--model", PRETRAINED,
        "--set", "plan.quantization=4bit", "--set", "eval.samples=0",
    )  # fmt: skip
    assert result.code == 2
    assert result.err.strip().splitlines()[-1] == (
        "repotune: error: plan.quantization 4bit needs bitsandbytes: pip install 'bitsandbytes>=0.45' "
        "(or set plan.quantization=none)"
    )
    assert read_json(tmp_path / "out" / "MANIFEST.json")["status"] == "failed"


# Qwen2.5-Coder's shapes (config.json only: the planner needs no weights).
QWEN_CODER = {
    "0.5b": {"hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24, "num_attention_heads": 14,
             "num_key_value_heads": 2, "tie_word_embeddings": True},
    "3b": {"hidden_size": 2048, "intermediate_size": 11008, "num_hidden_layers": 36, "num_attention_heads": 16,
           "num_key_value_heads": 2, "tie_word_embeddings": True},
    "7b": {"hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28, "num_attention_heads": 28,
           "num_key_value_heads": 4, "tie_word_embeddings": False},
}  # fmt: skip


def config_only_model(directory, shape: dict):
    """A model directory with a config and a tokenizer but no weights."""
    directory.mkdir()
    config = {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "vocab_size": 151936,
        "max_position_embeddings": 32768,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        **shape,
    }
    (directory / "config.json").write_text(json.dumps(config))
    source = builtin_directory(PRETRAINED)
    for tokenizer_file in source.glob("*token*"):
        shutil.copy(tokenizer_file, directory)
    return directory


@pytest.mark.parametrize(
    ("size", "decided"), [("0.5b", "none"), ("3b", "4bit"), ("7b", "4bit")], ids=["0.5b", "3b", "7b"]
)
def test_plan_decides_4_bits_from_the_config_alone_on_a_6_gb_gpu(cli, sample_repo, tmp_path, size, decided):
    model = config_only_model(tmp_path / f"qwen-coder-{size}", QWEN_CODER[size])
    result = cli(
        "plan", "--repo", sample_repo.path, "--output-dir", tmp_path / "out", "--model", model,
        "--hardware-profile", "rtx2060",
    )  # fmt: skip
    assert result.code == 0, result.err
    decision = read_json(tmp_path / "out" / "MANIFEST.json")["training_parameters"]["decisions"][
        "quantization"
    ]
    assert decision["value"] == decided
    if size == "3b":
        assert decision["reason"].startswith("5.7 GB of fp16 weights need 6.4 GB to train at micro-batch 1")
        assert (
            "more than NVIDIA GeForce RTX 2060's 6 GB hold (5.4 GB usable): NF4 4-bit weights"
            in decision["reason"]
        )
        assert decision["reason"].endswith("fp16 compute (1.9 GB of weights, 2.6 GB in all)")
    if size == "7b":
        assert "still over: expect to run out of memory" in decision["reason"]

"""The whole pipeline through the CLI on a real (tiny) repository, asserting on what it writes."""

from __future__ import annotations

import math

import pytest

from tests.conftest import FAST_TRAINING, read_json


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """One real run shared by the assertions below (training is the slow part): three epochs of a step a
    commit, to show warmup, a falling loss and a summary per epoch."""
    import run_pipeline
    from tests.conftest import GitRepo, module_source

    base = tmp_path_factory.mktemp("e2e")
    repo = GitRepo(base / "repo")
    repo.commit("Add package skeleton", {"README.md": "# sample\n", "pkg/__init__.py": ""})
    for index in range(1, 12):
        repo.commit(
            f"Add compute_{index} and describe_{index}", {f"pkg/feature_{index}.py": module_source(index)}
        )
    out = base / "out"
    code = run_pipeline.main(
        [
            "--repo", str(repo.path), "--output-dir", str(out), *FAST_TRAINING, "--set", "train.epochs=3",
            "--set", "plan.batch_size=1",
        ]
    )  # fmt: skip
    assert code == 0
    return out, read_json(out / "MANIFEST.json")


def test_run_writes_a_loadable_peft_adapter(trained):
    out, manifest = trained
    assert (out / "adapter" / "adapter_config.json").is_file()
    assert (out / "adapter" / "adapter_model.safetensors").is_file()
    assert manifest["status"] == "completed"
    assert manifest["error"] is None
    files = {entry["path"] for entry in manifest["outputs"]["adapter_files"]}
    assert {"adapter/adapter_config.json", "adapter/adapter_model.safetensors"} <= files
    assert all(len(entry["sha256"]) == 64 for entry in manifest["outputs"]["adapter_files"])


def test_manifest_answers_the_users_jq_queries(trained):
    _, manifest = trained
    params = manifest["training_parameters"]
    assert params["batch_size"] == 1
    assert isinstance(params["total_steps"], int) and params["total_steps"] >= 20
    assert 0 <= params["warmup_steps"] < params["total_steps"]
    assert manifest["training_report"]["hardware"]["collection_interval_seconds"] == 0.5
    assert manifest["total_execution_time_seconds"] > 0
    epochs = manifest["training_report"]["training"]["epoch_summaries"]
    assert [summary["epoch"] for summary in epochs] == [1, 2, 3]
    assert all(summary["tokens_per_s"] > 0 for summary in epochs)


def test_learning_rate_rises_during_warmup_then_training_ends_on_plan(trained):
    _, manifest = trained
    params = manifest["training_parameters"]
    history = manifest["training_report"]["learning_rate"]["history"]
    assert [entry["step"] for entry in history] == list(range(1, params["total_steps"] + 1))
    warmup = [entry["learning_rate"] for entry in history[: params["warmup_steps"] + 1]]
    assert warmup == sorted(warmup) and warmup[0] < warmup[-1]
    assert manifest["training_report"]["training"]["global_step"] == params["total_steps"]


def test_tiny_model_loss_falls(trained):
    _, manifest = trained
    summary = manifest["training_report"]["training"]["summary"]
    assert summary["last"] < summary["first"] - 0.5
    assert manifest["model"]["random_init"] is True


def test_manifest_has_no_nan_and_records_every_stage(trained):
    out, manifest = trained
    text = (out / "MANIFEST.json").read_text()
    assert "NaN" not in text and "Infinity" not in text
    assert text.endswith("}\n")
    assert {"scrape_s", "tokenize_s", "plan_s", "pack_s", "load_model_s", "train_s", "save_s"} <= set(
        manifest["timings"]
    )
    assert manifest["repository"]["commit_count"] == 12
    assert manifest["scrape"]["commits_kept"] == 12
    assert manifest["hardware"]["usable_cores"] >= 1
    assert manifest["training_report"]["hardware"]["sample_count"] >= 2
    decision = manifest["training_parameters"]["decisions"]["batch_size"]
    assert decision == {"value": 1, "source": "cli", "reason": "set by --set plan.batch_size"}
    assert all(
        math.isfinite(entry["loss"]) for entry in manifest["training_report"]["training"]["loss_history"]
    )


def test_saved_adapter_loads_with_peft(trained):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out, _ = trained
    base = AutoModelForCausalLM.from_pretrained(out / "base_model")
    model = PeftModel.from_pretrained(base, out / "adapter")
    tokenizer = AutoTokenizer.from_pretrained(out / "adapter")
    ids = tokenizer("Add compute_3", return_tensors="pt")["input_ids"]
    assert model(input_ids=ids).logits.shape[-1] == len(tokenizer)

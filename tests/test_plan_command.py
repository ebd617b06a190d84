"""`plan`: a dry run that decides everything, says why, writes a manifest, and trains nothing."""

from __future__ import annotations

import pytest

from pipeline.hardware import PROFILES_DIR
from tests.conftest import read_json


def test_plan_prints_the_table_and_writes_a_planned_manifest(cli, sample_repo, tmp_path, cpu_only):
    out = tmp_path / "out"
    result = cli("plan", "--repo", sample_repo.path, "--output-dir", out)
    assert result.code == 0, result.err
    lines = result.out.strip().splitlines()
    assert lines[0].split() == ["parameter", "value", "source", "reason"]
    assert lines[-1] == str(out / "MANIFEST.json")
    manifest = read_json(out / "MANIFEST.json")
    names = [line.split()[0] for line in lines[1:-1]]
    assert sorted(names) == sorted(manifest["training_parameters"]["decisions"])  # the manifest sorts keys
    assert manifest["status"] == "planned"
    training = manifest["training_report"]["training"]
    assert (training["global_step"], training["loss_history"]) == (
        None,
        [],
    )  # every key present, not measured
    assert not (out / "adapter").exists() and not (out / "checkpoints").exists()
    params = manifest["training_parameters"]
    assert params["device"] == "cpu"
    assert params["batch_probe_note"] == "skipped: the probe measures GPU memory and the device is cpu"
    assert manifest["hardware"]["source"] == "detected"


@pytest.mark.parametrize("profile", sorted(p.stem for p in PROFILES_DIR.glob("*.json")))
def test_plan_for_every_shipped_profile(cli, sample_repo, tmp_path, profile):
    out = tmp_path / "out"
    result = cli("plan", "--repo", sample_repo.path, "--output-dir", out, "--hardware-profile", profile)
    assert result.code == 0, result.err
    manifest = read_json(out / "MANIFEST.json")
    assert manifest["hardware"]["source"].startswith(f"profile {profile}.json")
    params = manifest["training_parameters"]
    assert params["world_size"] == max(1, manifest["hardware"]["gpu_count"])
    assert (
        params["effective_batch_size"]
        == params["batch_size"] * params["gradient_accumulation_steps"] * params["world_size"]
    )
    assert 0 <= params["warmup_steps"] < params["total_steps"]


def test_a_second_plan_reuses_the_scrape_and_a_changed_config_does_not(cli, sample_repo, tmp_path):
    out = tmp_path / "out"
    assert cli("plan", "--repo", sample_repo.path, "--output-dir", out).code == 0
    again = cli("plan", "--repo", sample_repo.path, "--output-dir", out, "--set", "train.epochs=5")
    assert "reusing the scrape" in again.err
    manifest = read_json(out / "MANIFEST.json")
    assert manifest["scrape"]["reused"] is True and manifest["training_parameters"]["epochs"] == 5
    changed = cli("plan", "--repo", sample_repo.path, "--output-dir", out, "--set", "scrape.eval_commits=3")
    assert "reusing the scrape" not in changed.err
    sample_repo.commit("Add compute_42", {"pkg/feature_42.py": "X = 42\n"})
    moved = cli("plan", "--repo", sample_repo.path, "--output-dir", out, "--set", "scrape.eval_commits=3")
    assert "reusing the scrape" not in moved.err  # HEAD moved


def test_overrides_show_up_with_their_source(cli, sample_repo, tmp_path, host):
    out = tmp_path / "out"
    result = cli("plan", "--repo", sample_repo.path, "--output-dir", out, "--set", "plan.batch_size=2")
    assert result.code == 0
    decision = read_json(out / "MANIFEST.json")["training_parameters"]["decisions"]["batch_size"]
    assert decision == {"value": 2, "source": "cli", "reason": "set by --set plan.batch_size"}


def test_a_broken_profile_is_one_line(cli, sample_repo, tmp_path):
    bad = tmp_path / "gpu.json"
    bad.write_text('{"gpus": [{"name": "X"}]}')
    result = cli(
        "plan", "--repo", sample_repo.path, "--output-dir", tmp_path / "out", "--hardware-profile", bad
    )
    assert result.code == 2
    assert result.err.strip().splitlines()[-1] == "repotune: error: gpu.json: `gpus[0].memory_gb` is required"

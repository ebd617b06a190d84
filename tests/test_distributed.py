"""Several processes (torchrun, gloo on CPU) and several repositories."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from pipeline.record.history import kept_name
from tests.conftest import (
    FAST_TRAINING,
    WITH_FILES,
    GitRepo,
    add_features,
    module_source,
    read_json,
    simulated_gpu_host,
)

ROOT = Path(__file__).resolve().parent.parent
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]


def torchrun(*args: str, timeout: int = 240) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*TORCHRUN, str(ROOT / "run_pipeline.py"), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""},  # CPU ranks on any host
    )


def test_two_processes_train_one_adapter_with_the_planned_steps(tmp_path):
    repo = add_features(GitRepo(tmp_path / "repo"))
    out = tmp_path / "out"
    result = torchrun(
        "--repo",
        str(repo.path),
        "--output-dir",
        str(out),
        *FAST_TRAINING,
        *WITH_FILES,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().splitlines() == [
        str(out / "MANIFEST.json")
    ]  # rank 0 alone prints the result
    manifest = read_json(out / "MANIFEST.json")
    assert manifest["status"] == "completed"
    assert {key: manifest["distributed"][key] for key in ("world_size", "backend", "launcher", "nodes")} == {
        "world_size": 2,
        "backend": "gloo",
        "launcher": "torchrun",
        "nodes": 1,
    }
    params = manifest["training_parameters"]
    assert params["world_size"] == 2
    assert params["effective_batch_size"] == params["batch_size"] * params["gradient_accumulation_steps"] * 2
    per_rank = math.ceil(params["train_blocks"] / (params["batch_size"] * 2))
    assert params["total_steps"] == params["epochs"] * math.ceil(
        per_rank / params["gradient_accumulation_steps"]
    )
    assert manifest["training_report"]["training"]["global_step"] == params["total_steps"]
    assert [node["node"] for node in manifest["training_report"]["hardware"]["nodes"]] == [0]
    # One of everything: one manifest, one adapter, one scrape (no rank scraped twice).
    assert sorted(path.name for path in out.iterdir() if not path.name.startswith(".")) == [
        "MANIFEST.json", "adapter", "base_model", "cache", "checkpoints", "completions.jsonl", "evaluation.jsonl",
        "files.jsonl", "runs", "sequences.jsonl",
    ]  # fmt: skip
    assert [path.name for path in (out / "runs").iterdir()] == [f"{kept_name(manifest)}"]  # rank 0 keeps it
    assert len((out / "sequences.jsonl").read_text().splitlines()) == manifest["scrape"]["sequences"]
    assert len(list(out.rglob("adapter_model.safetensors"))) == 1 + len(
        list((out / "checkpoints").glob("checkpoint-*"))
    )


def test_a_failure_on_rank_0_ends_every_rank_with_one_line(tmp_path):
    (tmp_path / "plain").mkdir()
    result = torchrun("--repo", str(tmp_path / "plain"), "--output-dir", str(tmp_path / "out"), timeout=120)
    assert result.returncode != 0
    errors = [line for line in result.stderr.splitlines() if line.startswith("repotune:")]
    assert errors == [
        f"repotune: error: {tmp_path / 'plain'}: not a git repository (run `git init`, or pass the path of a clone)"
    ]
    assert read_json(tmp_path / "out" / "MANIFEST.json")["status"] == "failed"


def test_more_processes_than_gpus_is_one_line():
    """torchrun --nproc_per_node=2 on a one-GPU host: the second rank is told why, in one line (CUDA itself
    says "invalid device ordinal" on that rank alone, and torchrun ends the other)."""
    from pipeline.config import DistributedConfig
    from pipeline.errors import PipelineError
    from pipeline.train.distributed import Coordinator
    from pipeline.types import Launch

    launch = Launch(
        world_size=2, reason="test", rank=1, local_rank=1, local_world_size=2, launcher="torchrun"
    )
    with simulated_gpu_host("h100-80gb"), pytest.raises(PipelineError) as raised:
        Coordinator(launch, DistributedConfig()).start()
    assert str(raised.value) == (
        "2 processes on this node but 1 GPU(s): start one process per GPU (torchrun --nproc_per_node=1), "
        "or hide the GPUs (CUDA_VISIBLE_DEVICES=) to train on the CPU"
    )


def test_single_process_commands_refuse_torchrun(tmp_path, sample_repo):
    result = torchrun(
        "scrape", "--repo", str(sample_repo.path), "--output-dir", str(tmp_path / "out"), timeout=120
    )
    assert result.returncode != 0  # torchrun exits 1 when a process fails, whatever its code
    errors = [line for line in result.stderr.splitlines() if line.startswith("repotune:")]
    assert errors == [
        "repotune: error: `scrape` runs in one process: start it without torchrun / accelerate launch"
    ]


def test_repos_file_skips_a_repository_that_cannot_be_scraped(cli, tmp_path, monkeypatch):
    first, second = GitRepo(tmp_path / "alpha"), GitRepo(tmp_path / "beta")
    for index in range(1, 4):
        first.commit(f"Add compute_{index}", {f"a{index}.py": module_source(index)})
        second.commit(f"Add describe_{index}", {f"b{index}.py": module_source(index + 10)})
    listing = tmp_path / "lists" / "repos.txt"  # `../beta`: from the file's folder, wherever the command runs
    listing.parent.mkdir()
    listing.write_text(f"# our services\n{first.path}  # the first\n\n{tmp_path / 'gone'}\n../beta\n")
    out = tmp_path / "out"
    monkeypatch.chdir(first.path)
    result = cli("scrape", "--repos-file", listing, "--output-dir", out, "--set", "scrape.format=diff")
    assert result.code == 0, result.err
    scrape = read_json(out / "MANIFEST.json")["scrape"]
    assert [entry["name"] for entry in scrape["per_repository"]] == ["alpha", "beta"]
    assert [entry["commits_kept"] for entry in scrape["per_repository"]] == [3, 3]
    assert scrape["failed_repositories"] == [
        {"path": str(tmp_path / "gone"), "error": f"{tmp_path / 'gone'}: no such file or directory"}
    ]
    tags = [orjson.loads(line)["repo"] for line in (out / "sequences.jsonl").read_bytes().splitlines()]
    assert tags == ["alpha"] * 3 + ["beta"] * 3


def test_many_repositories_share_one_pool_of_workers(cli, tmp_path):
    repos = []
    for name in ("one", "two", "three"):
        repo = GitRepo(tmp_path / name)
        for index in range(1, 5):
            repo.commit(f"Add {name} {index}", {f"{name}_{index}.py": module_source(index)})
        repos.append(repo)
    out = tmp_path / "out"
    options = [arg for repo in repos for arg in ("--repo", str(repo.path))]
    assert cli("scrape", *options, "--output-dir", out, "--set", "scrape.workers=1").code == 0
    scrape = read_json(out / "MANIFEST.json")["scrape"]
    assert [entry["commits_kept"] for entry in scrape["per_repository"]] == [4, 4, 4]
    assert scrape["failed_repositories"] == []


def test_when_no_repository_can_be_scraped_every_error_is_named(cli, tmp_path):
    (tmp_path / "plain").mkdir()
    result = cli(
        "scrape", "--repo", tmp_path / "gone", "--repo", tmp_path / "plain", "--output-dir", tmp_path / "out"
    )
    assert result.code == 2
    line = result.err.strip().splitlines()[-1]
    assert "gone: no such file or directory" in line and "plain: not a git repository" in line

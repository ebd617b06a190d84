"""The standalone `monitor` and `prepare` commands."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipeline.train.monitor import assess, summarize
from tests.conftest import GitRepo, module_source, read_json
from tests.fakes import H100, RTX_2060, FakeNvml

ROOT = Path(__file__).resolve().parent.parent


def test_monitor_writes_a_manifest_shaped_report(cli, tmp_path, cpu_only):
    report = tmp_path / "r.json"
    result = cli("monitor", "--duration", "2", "--interval", "0.5", "--output", report)
    assert result.code == 0, result.err
    document = read_json(report)  # validated against the manifest schema, like every manifest
    assert (document["status"], document["run"]["command"]) == ("monitored", "monitor")
    hardware = document["training_report"]["hardware"]
    assert hardware["sample_count"] >= 3 and hardware["collection_interval_seconds"] == 0.5
    assert hardware["summary"]["cpu_pct"]["max"] >= hardware["summary"]["cpu_pct"]["min"]
    assert hardware["assessment"][0].startswith("no GPU found")
    lines = result.out.strip().splitlines()
    assert lines[0].endswith("samples every 0.5 s") and lines[1].split() == [
        "metric",
        "mean",
        "p95",
        "min",
        "max",
    ]
    assert lines[-1] == str(report)
    assert "t_s" not in result.err  # no live lines when stderr is not a terminal


def test_monitor_follows_a_process_and_stops_when_it_exits(cli, tmp_path, host):
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1.5)"])
    started = time.monotonic()
    result = cli("monitor", "--pid", sleeper.pid, "--interval", "0.2", "--output", tmp_path / "r.json")
    assert result.code == 0 and time.monotonic() - started < 30
    sleeper.wait()
    hardware = read_json(tmp_path / "r.json")["training_report"]["hardware"]
    followed = hardware["followed_process"]
    assert (followed["pid"], followed["exited"]) == (sleeper.pid, True)
    assert followed["name"].startswith("python")  # read when sampling began: the process is gone now
    assert hardware["summary"]["process_rss_gb"]["max"] > 0


def test_monitor_refuses_a_missing_process(cli, tmp_path):
    result = cli("monitor", "--pid", "999999", "--output", tmp_path / "r.json")
    assert result.code == 2 and result.err.strip() == "repotune: error: --pid 999999: no such process"


def test_ctrl_c_still_writes_the_report(tmp_path):
    report = tmp_path / "r.json"
    process = subprocess.Popen(
        [
            sys.executable,
            str(ROOT / "run_pipeline.py"),
            "monitor",
            "--interval",
            "0.2",
            "--output",
            str(report),
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert process.stderr.readline().decode().startswith("watching every 0.2 s until Ctrl-C")
    time.sleep(1)  # a few samples
    process.send_signal(signal.SIGINT)
    out, _ = process.communicate(timeout=60)
    assert process.returncode == 0
    assert read_json(report)["training_report"]["hardware"]["sample_count"] >= 2
    assert out.decode().strip().splitlines()[-1] == str(report)


def test_monitor_reads_every_gpu_through_nvml(cli, tmp_path, monkeypatch):
    """No GPU here: NVML is the seam, with a busy H100 and an RTX 2060 that waits for data."""
    waiting = {**RTX_2060, "used_gb": 5.5, "utilization_pct": 8}
    monkeypatch.setattr("pipeline.use.watch.import_nvml", lambda: FakeNvml([H100, waiting]))
    result = cli("monitor", "--duration", "1", "--interval", "0.25", "--output", tmp_path / "r.json")
    assert result.code == 0, result.err
    hardware = read_json(tmp_path / "r.json")["training_report"]["hardware"]
    assert [gpu["index"] for gpu in hardware["summary"]["gpus"]] == [0, 1]
    assert hardware["samples"][0]["gpus"][0] == {
        "index": 0, "utilization_pct": 97, "memory_used_gb": 60.0, "memory_total_gb": 80.0,
        "temperature_c": 71, "power_w": 650.0, "sm_clock_mhz": 1980,
    }  # fmt: skip
    assert "gpu1.utilization_pct" in result.out
    assert any("GPU 0: utilisation mean 97%: the GPU is the limit" in line for line in hardware["assessment"])
    assert any(
        "GPU 1: utilisation mean 8% with memory 92% used: the GPU waits for data" in line
        for line in hardware["assessment"]
    )


def gpu_summary(busy: float, used: float, total: float = 80, hottest: float = 70, cpu: float = 20) -> dict:
    sample = {
        "cpu_pct": cpu,
        "ram_used_gb": 10,
        "ram_total_gb": 64,
        "process_cpu_pct": None,
        "process_rss_gb": None,
    }
    gpu = {
        "index": 0,
        "utilization_pct": busy,
        "memory_used_gb": used,
        "memory_total_gb": total,
        "temperature_c": hottest,
        "power_w": 300,
        "sm_clock_mhz": 1900,
    }
    return summarize([{**sample, "gpus": [gpu]}])


@pytest.mark.parametrize(
    ("summary", "finding"),
    [
        (
            gpu_summary(busy=8, used=68),
            "GPU 0: utilisation mean 8% with memory 85% used: the GPU waits for data — raise dataloader workers",
        ),
        (gpu_summary(busy=5, used=2), "GPU 0: utilisation mean 5%: the GPU is idle most of the time"),
        (
            gpu_summary(busy=40, used=30, hottest=50),
            "GPU 0: temperature 50 °C at most: under real load it would run hotter; the GPU is idle most of the time",
        ),
        (gpu_summary(busy=95, used=70), "GPU 0: utilisation mean 95%: the GPU is the limit"),
        (
            gpu_summary(busy=10, used=70, cpu=98),
            "CPU mean 98% while GPU 0 waits: the input pipeline is CPU-bound",
        ),
        (
            summarize(
                [
                    {
                        "cpu_pct": 50,
                        "ram_used_gb": 62,
                        "ram_total_gb": 64,
                        "process_cpu_pct": None,
                        "process_rss_gb": None,
                        "gpus": [],
                    }
                ]
            ),
            "RAM nearly full (62.0 of 64.0 GB)",
        ),
    ],
)
def test_each_assessment(summary, finding):
    assert any(line.startswith(finding) for line in assess(summary, None)), assess(summary, None)


def test_the_manifests_jq_queries_and_diff_work_on_monitor_reports(cli, tmp_path, host):
    import jq

    for name in ("a", "b"):
        assert (
            cli("monitor", "--duration", "1", "--interval", "0.5", "--output", tmp_path / f"{name}.json").code
            == 0
        )
    document = read_json(tmp_path / "a.json")
    assert jq.compile(".training_report.hardware.collection_interval_seconds").input(document).first() == 0.5
    compared = cli("diff", tmp_path / "a.json", tmp_path / "b.json", "--only", "training_report.*")
    assert compared.code in (0, 1) and "samples" not in compared.out  # series compared through the summary
    assert cli("report", tmp_path / "a.json").code == 0
    assert "Hardware" in (tmp_path / "report.html").read_text()


def test_a_token_cache_that_cannot_be_written_is_one_line_naming_the_key(cli, tmp_path):
    """`output.cache_dir` naming a file or a read-only folder (or a disk that fills): one line with the key to
    set, and the manifest says so (it was an internal error)."""
    repo = GitRepo(tmp_path / "repo")
    for index in range(1, 9):
        repo.commit(f"Add compute_{index}", {f"m{index}.py": module_source(index)})
    (tmp_path / "a-file").write_text("")
    out = tmp_path / "out"
    result = cli(
        "prepare", "--repo", repo.path, "--output-dir", out, "--set", f"output.cache_dir={tmp_path}/a-file/x"
    )
    assert result.code == 2 and "internal error" not in result.err
    said = result.err.strip().splitlines()[-1]
    assert said == (
        f"repotune: error: cannot write the token cache into {tmp_path}/a-file/x (Not a directory): set "
        "output.cache_dir to a folder you can write, with room for the tokenized history (unset: the output "
        "directory's cache/)"
    )
    manifest = read_json(out / "MANIFEST.json")
    assert (manifest["status"], manifest["error"]) == ("failed", said.removeprefix("repotune: error: "))


def test_prepare_then_run_hits_the_token_cache(cli, tmp_path):
    repo = GitRepo(tmp_path / "repo")
    for index in range(1, 9):
        repo.commit(f"Add compute_{index}", {f"m{index}.py": module_source(index)})
    out = tmp_path / "out"
    prepared = cli("prepare", "--repo", repo.path, "--output-dir", out)
    assert prepared.code == 0, prepared.err
    lines = prepared.out.strip().splitlines()
    manifest = read_json(out / "MANIFEST.json")
    key = manifest["dataset"]["cache"]["key"]
    assert lines[0].startswith(f"token cache {key} (built in ")
    assert [line.split()[0] for line in lines[1:6]] == ["location", "sequences", "tokens", "blocks", "took"]
    assert lines[-1] == str(out / "MANIFEST.json")
    assert manifest["status"] == "prepared" and manifest["training_report"]["training"]["loss_history"] == []
    assert not (out / "adapter").exists()
    trained = cli("--repo", repo.path, "--output-dir", out, "--set", "train.epochs=1")
    assert trained.code == 0, trained.err
    assert (
        "reusing the scrape" in trained.err
        and f"token cache hit: {out / 'cache' / f'tokens-{key}'}" in trained.err
    )
    cache = read_json(out / "MANIFEST.json")["dataset"]["cache"]
    assert (cache["hit"], cache["key"]) == (True, key)

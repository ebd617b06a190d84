"""One run per output directory: a second run into a directory a live run holds stops at once, names
the holder and changes nothing there; the hold ends with its process, however it ends."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import orjson

from pipeline.record.run import LOCK_FILE
from tests.conftest import FAST_TRAINING, GitRepo, module_source, read_json

ROOT = Path(__file__).resolve().parent.parent
HOLD = (
    "import sys, time; from pathlib import Path; from pipeline.record.run import holding\n"
    "with holding(Path(sys.argv[1]), 'run'):\n"
    "    print('held', flush=True); time.sleep(120)\n"
)


def small_repo(path: Path, name: str) -> GitRepo:
    repo = GitRepo(path / name)
    for index in range(1, 13):
        repo.commit(f"Add compute_{index} to {name}", {f"{name}/feature_{index}.py": module_source(index)})
    return repo


def start_run(repo: Path, out: Path, tmp_path: Path) -> subprocess.Popen:
    command = [
        sys.executable, "run_pipeline.py", "--repo", str(repo), "--output-dir", str(out), *FAST_TRAINING,
    ]  # fmt: skip
    return subprocess.Popen(
        command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")},
    )  # fmt: skip


def contents(directory: Path) -> dict[str, int]:
    return {str(path.relative_to(directory)): path.stat().st_mtime_ns for path in directory.rglob("*")}


def test_a_held_directory_is_refused_in_one_line_and_left_as_it_was(cli, tmp_path):
    repo = small_repo(tmp_path, "alpha")
    out = tmp_path / "out"
    assert cli("scrape", "--repo", repo.path, "--output-dir", out).code == 0
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(out)], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        before = contents(out)
        refused = cli("scrape", "--repo", repo.path, "--output-dir", out)
        assert refused.code == 2 and refused.err.count("\n") == 1
        assert f"in use by another run (pid {holder.pid} on " in refused.err and "`run`" in refused.err
        assert contents(out) == before
    finally:
        holder.send_signal(signal.SIGKILL)  # a crash: the operating system drops the hold
        holder.wait()
    assert cli("scrape", "--repo", repo.path, "--output-dir", out).code == 0


def test_two_runs_started_together_into_one_directory(tmp_path):
    """One trains; the other says why it does not; the manifest, the sequences and the adapter are all
    the one run's."""
    out = tmp_path / "out"
    runs = {name: start_run(small_repo(tmp_path, name).path, out, tmp_path) for name in ("alpha", "beta")}
    finished = {name: (run.wait(timeout=300), run.stderr.read()) for name, run in runs.items()}
    codes = sorted(code for code, _ in finished.values())
    assert codes == [0, 2], finished
    winner = next(name for name, (code, _) in finished.items() if code == 0)
    loser_err = next(err for code, err in finished.values() if code == 2)
    assert "is in use by another run" in loser_err and "Traceback" not in loser_err
    manifest = read_json(out / "MANIFEST.json")
    assert manifest["status"] == "completed" and manifest["repository"]["path"].endswith(winner)
    repos = {orjson.loads(line)["repo"] for line in (out / "sequences.jsonl").read_bytes().splitlines()}
    assert repos == {winner}
    assert (out / "adapter" / "adapter_config.json").exists()


def trained(directory: Path) -> dict[str, int]:
    """`contents` but for the lock, which each command that holds the directory rewrites."""
    return {name: stamp for name, stamp in contents(directory).items() if name != LOCK_FILE}


def test_a_directory_that_holds_another_repositorys_training_is_refused_and_kept(cli, tmp_path):
    """`make run REPO=a`, then `make run REPO=b`, both into the default directory: the second had replaced
    a's adapter without a word (and a commit hook in a, suggesting with it, went on with b's messages).
    Refused in one line, nothing there changed; the same repository again, from a folder inside it or
    another clone, replaces its own run as it always has; a directory that holds no training is anyone's."""
    alpha, beta = small_repo(tmp_path, "alpha"), small_repo(tmp_path, "beta")
    out = tmp_path / "out"
    assert cli("--repo", alpha.path, "--output-dir", out, *FAST_TRAINING).code == 0
    before = trained(out)
    refused = cli("--repo", beta.path, "--output-dir", out, *FAST_TRAINING)
    assert refused.code == 2 and refused.err.count("\n") == 1
    assert refused.err == (
        f"repotune: error: {out} holds a run trained on {alpha.path}; this one reads {beta.path}: give another "
        f"--output-dir, or remove that run first (rm -r {out}) to replace it\n"
    )
    assert trained(out) == before and read_json(out / "MANIFEST.json")["status"] == "completed"
    for command in ("scrape", "plan", "prepare"):
        assert cli(command, "--repo", beta.path, "--output-dir", out).code == 2
    assert trained(out) == before
    # A run of alpha that stopped before reading the history (a model name that is not one) writes its
    # failed manifest there and leaves alpha's training, which the directory still says it holds.
    assert cli("--repo", alpha.path, "--output-dir", out, "--model", "./no-model").code == 2
    stopped = trained(out)
    assert {name: stamp for name, stamp in stopped.items() if name.startswith("adapter")} == {
        name: stamp for name, stamp in before.items() if name.startswith("adapter")
    }
    assert cli("--repo", beta.path, "--output-dir", out, *FAST_TRAINING).err == refused.err
    assert trained(out) == stopped
    assert cli("--repo", alpha.path / "alpha", "--output-dir", out, *FAST_TRAINING).code == 0
    clone = tmp_path / "clone"  # another clone of the same history (the commit trained up to is in it)
    subprocess.run(["git", "clone", "--quiet", str(alpha.path), str(clone)], check=True)
    assert cli("--repo", clone, "--output-dir", out, *FAST_TRAINING).code == 0
    scraped = tmp_path / "scraped"
    assert cli("scrape", "--repo", alpha.path, "--output-dir", scraped).code == 0
    assert cli("scrape", "--repo", beta.path, "--output-dir", scraped).code == 0

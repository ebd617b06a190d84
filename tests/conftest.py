"""Shared fixtures: tiny real git repositories with fixed dates, and a CLI runner."""

from __future__ import annotations

import gc
import math
import os
import signal
import subprocess
import sys
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import orjson
import pytest

import run_pipeline

# Fixed identity and no user/system config, so commit hashes are the same on every machine.
GIT_ENV = {
    "GIT_AUTHOR_NAME": "Ada Lovelace",
    "GIT_AUTHOR_EMAIL": "ada@example.com",
    "GIT_COMMITTER_NAME": "Ada Lovelace",
    "GIT_COMMITTER_EMAIL": "ada@example.com",
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": os.devnull,
    "HOME": "/nonexistent",
}
# How GitRepo builds its repositories: no `git maintenance run --auto` after each commit (a second git
# process each time): the suite commits thousands of times into repositories of a few commits.
BUILD_ENV = {
    **GIT_ENV,
    "GIT_CONFIG_COUNT": "1",
    "GIT_CONFIG_KEY_0": "maintenance.auto",
    "GIT_CONFIG_VALUE_0": "false",
}


FIRST_DATE = datetime(2024, 1, 1, 12, tzinfo=UTC)  # commit n is dated n - 1 days later, at noon


class GitRepo:
    """A real repository in tmp_path; each commit gets the next fixed date."""

    def __init__(self, path: Path, bare: bool = False):
        self.path = path
        self._tick = 0
        path.mkdir(parents=True, exist_ok=True)
        self.git("init", "--quiet", "--initial-branch=main", *(["--bare"] if bare else []))

    def git(self, *args: str, env: dict[str, str] | None = None) -> str:
        result = subprocess.run(
            ["git", *args],
            cwd=self.path,
            env={**os.environ, **BUILD_ENV, **(env or {})},
            capture_output=True,
            check=True,
        )
        return result.stdout.decode("utf-8", "replace").strip()

    def commit(
        self, message: str | bytes, files: dict[str, str | bytes | None], author: str | None = None
    ) -> str:
        """Write (or, for None, delete) files and commit them; returns the new commit's sha."""
        written = []
        for name, content in files.items():
            target = self.path / name
            if content is None:
                self.git("rm", "--quiet", "--", name)
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(content if isinstance(content, bytes) else content.encode())
            written.append(name)
        if written:
            self.git("add", "--", *written)
        self._tick += 1
        date = (FIRST_DATE + timedelta(days=self._tick - 1)).isoformat()
        env = {"GIT_AUTHOR_DATE": date, "GIT_COMMITTER_DATE": date}
        if author:
            name, email = author.split(" <")
            env.update(GIT_AUTHOR_NAME=name, GIT_AUTHOR_EMAIL=email.rstrip(">"))
        message_file = self.path / ".git" / "COMMIT_MSG_FOR_TEST"
        message_file.write_bytes(message if isinstance(message, bytes) else message.encode())
        self.git("commit", "--quiet", "--allow-empty", "--no-verify", "-F", str(message_file), env=env)
        return self.head()

    def head(self) -> str:
        """The checked-out commit, read from the files git just wrote where it can be (the suite makes
        thousands of commits: one git process fewer each), else asked of git."""
        head = (self.path / ".git" / "HEAD").read_text().strip()
        if not head.startswith("ref: "):
            return head  # detached
        ref = self.path / ".git" / head.removeprefix("ref: ")
        return ref.read_text().strip() if ref.is_file() else self.git("rev-parse", "HEAD")  # else packed


def module_source(index: int) -> str:
    """A small, distinct, realistic Python module."""
    return (
        f'"""Helpers for feature {index}."""\n\n\n'
        f"def compute_{index}(values):\n"
        f"    total = 0\n"
        f"    for value in values:\n"
        f"        total += value * {index}\n"
        f"    return total\n\n\n"
        f"def describe_{index}(name):\n"
        f'    return f"feature {index}: {{name}}"\n'
    )


def trained_diff(repo: GitRepo, message: str, out: Path) -> str:
    """Commit what `repo` has staged, scrape it into `out`, and give the diff training saw of it."""
    from pipeline.config import ScrapeConfig
    from pipeline.suggest.retrieval import past_commits
    from scrapers.scrape import scrape

    repo.git("commit", "--quiet", "-m", message)
    out.mkdir()
    scrape([repo.path], ScrapeConfig(), out)
    records = [orjson.loads(line) for line in (out / "sequences.jsonl").read_bytes().splitlines()]
    return next(commit for commit in past_commits(records) if commit.message == message).diff


def add_features(repo: GitRepo, indexes: range = range(1, 23)) -> GitRepo:
    """One commit `Add compute_N` per index, each adding its own module (22: enough to hold one out)."""
    for index in indexes:
        repo.commit(f"Add compute_{index}", {f"pkg/feature_{index}.py": module_source(index)})
    return repo


@pytest.fixture
def sample_repo(tmp_path: Path) -> GitRepo:
    """Twelve commits: eleven that add or change code, one binary-only."""
    repo = GitRepo(tmp_path / "sample")
    repo.commit("Add package skeleton", {"README.md": "# sample\n", "pkg/__init__.py": ""})
    for index in range(1, 10):
        repo.commit(
            f"Add compute_{index} and describe_{index}", {f"pkg/feature_{index}.py": module_source(index)}
        )
    repo.commit("Add logo", {"logo.png": b"\x89PNG\r\n\x1a\n\x00\x00binary"})
    repo.commit(
        "Scale compute_1 by two\n\nThe callers expect doubled totals.",
        {"pkg/feature_1.py": module_source(1).replace("value * 1", "value * 2")},
    )
    return repo


@dataclass
class CliResult:
    code: int
    out: str
    err: str


MODEL_FREE_COMMANDS = {"generate", "diff", "report", "monitor", "export", "hook", "serve", "runs"}


@pytest.fixture(scope="session", autouse=True)
def repotune_cache(tmp_path_factory) -> Path:
    """Converted built-in models and remembered speeds go to a cache of this session's own, so no test
    reads what another session (or the user) left, and the user's ~/.cache is not written. The session's
    workers share the converted models (each would convert the built-in one: about 15 s of a core); what
    runs remember stays each worker's own."""
    cache = tmp_path_factory.mktemp("xdg-cache")
    root = tmp_path_factory.getbasetemp()
    shared = (root.parent if os.environ.get("PYTEST_XDIST_WORKER") else root) / "converted-models"
    shared.mkdir(exist_ok=True)
    (cache / "repotune").mkdir()
    (cache / "repotune" / "models").symlink_to(shared, target_is_directory=True)
    previous = os.environ.get("XDG_CACHE_HOME")
    os.environ["XDG_CACHE_HOME"] = str(cache)
    yield cache / "repotune"
    if previous is None:
        del os.environ["XDG_CACHE_HOME"]
    else:
        os.environ["XDG_CACHE_HOME"] = previous


SIMULATED_GPU = os.environ.get("REPOTUNE_TEST_GPU")
"""A hardware profile (`h100-80gb`, or a file): with it, the whole suite sees that profile's GPUs, as on a
GPU host. `make test` does not set it: the tests whose outcome depends on the host take the `host`
fixture, which runs them once on a CPU-only host and once on a simulated H100 host."""
HOSTS = ("cpu", "h100-80gb")


@contextmanager
def simulated_gpu_host(profile: str):
    """torch.cuda reports the profile's GPUs and NVML reads them (fakes: there is no GPU here); a test
    that would launch CUDA kernels is skipped, with the reason, at the first one."""
    import bitsandbytes  # noqa: F401  (imported before CUDA is faked: its CUDA backend needs a CUDA build)
    import torch

    from pipeline.hardware import load_hardware_profile
    from tests.fakes import FakeCuda, FakeNvml

    gpus = [
        {
            "name": gpu.name,
            "memory_gb": gpu.memory_gb,
            "used_gb": 0,
            "capability": gpu.compute_capability,
            "utilization_pct": 0,
            "temperature_c": 30,
        }
        for gpu in load_hardware_profile(profile).gpus
    ]

    def needs_a_gpu(*args, **kwargs):
        pytest.skip(f"launches CUDA kernels on the simulated {gpus[0]['name']}: needs a real GPU")

    fake = FakeCuda(gpus)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(torch.cuda, "is_available", lambda: True)
        for name in ("device_count", "get_device_properties", "mem_get_info"):
            patch.setattr(torch.cuda, name, getattr(fake, name))
        patch.setattr(torch.cuda, "_lazy_init", needs_a_gpu)  # every CUDA tensor goes through it
        patch.setattr(torch.Tensor, "pin_memory", needs_a_gpu)  # pinned host memory is CUDA's too
        patch.setitem(
            sys.modules, "pynvml", FakeNvml(gpus)
        )  # what `import pynvml` gives detection and monitor
        yield


@pytest.fixture(scope="session", autouse=True)
def simulated_gpu():
    if not SIMULATED_GPU:
        yield
        return
    with simulated_gpu_host(SIMULATED_GPU):
        yield


@pytest.fixture(scope="session", autouse=True)
def quick_pace():
    """The cores' pace is timed for two hundredths of a second, not two and a half, in the many runs
    under a budget: tests check what it decides of a remembered speed, not how well it measures the day."""
    from pipeline.train import probe

    before = probe.PACE_SECONDS, probe.PACE_WARM_SECONDS
    probe.PACE_SECONDS, probe.PACE_WARM_SECONDS = 0.02, 0.0
    yield
    probe.PACE_SECONDS, probe.PACE_WARM_SECONDS = before


@pytest.fixture(scope="session", autouse=True)
def interruptible():
    """Ctrl-C reaches the runs the tests start, even when pytest itself was started in the background
    (a shell starts background jobs with SIGINT ignored, and children inherit that)."""
    signal.signal(signal.SIGINT, signal.default_int_handler)


@contextmanager
def cpu_only_host():
    """This machine as a host without GPUs sees it, whatever the host (or REPOTUNE_TEST_GPU) has: for
    tests that assert what a CPU-only machine is planned or monitored with, or that need real runs on
    any host (diff and report read their manifests)."""
    import torch

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(torch.cuda, "is_available", lambda: False)
        patch.setitem(sys.modules, "pynvml", None)  # `import pynvml` raises ImportError
        yield


@pytest.fixture(params=HOSTS)
def host(request):
    """The test once on each kind of host its outcome could depend on."""
    with cpu_only_host() if request.param == "cpu" else simulated_gpu_host(request.param):
        yield request.param


@pytest.fixture
def cpu_only():
    with cpu_only_host():
        yield


@pytest.fixture
def cli(capsys):
    """Run the CLI in-process (torch is imported once per session, not per test). Commands train the
    tiny model unless a test names another: the pretrained default has its own end-to-end test."""

    def invoke(*argv: str) -> CliResult:
        argv = tuple(str(arg) for arg in argv)
        if "--model" not in argv and (not argv or argv[0] not in MODEL_FREE_COMMANDS):
            argv = (*argv, "--model", "tiny")
        code = run_pipeline.main(list(argv))
        captured = capsys.readouterr()
        return CliResult(code, captured.out, captured.err)

    return invoke


def sequences(path: Path) -> list[dict]:
    """The records of a `sequences.jsonl`."""
    return [orjson.loads(line) for line in path.read_bytes().splitlines()]


def read_json(path: Path):
    """A JSON file; a MANIFEST.json is also validated against the shipped schema (every test does this)."""
    document = orjson.loads(path.read_bytes())
    if path.name == "MANIFEST.json":
        assert_valid_manifest(document)
    return document


def assert_valid_manifest(document) -> None:
    from pipeline.manifest import schema_problems

    problems = schema_problems(document)
    assert not problems, "MANIFEST.json does not match the schema:\n" + "\n".join(problems[:20])


@dataclass
class Made:
    """The shapes of the tensors a block's operations read (`made_tensors`)."""

    shapes: list[tuple[int, ...]]

    @property
    def most(self) -> int:
        """The most elements of any of them."""
        return max((math.prod(shape) for shape in self.shapes), default=0)


@contextmanager
def made_tensors():
    """torch's profiler around a block, keeping the shape of every tensor its operations read (views
    included; what one operation makes the next reads) in `.shapes` once the block ends, and the most
    elements of any in `.most`: a weight copied, or broadcast for a batched product, shows as a tensor of
    its size or shape."""
    from torch.profiler import ProfilerActivity, profile

    made = Made([])
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as profiled:
        yield made
    made.shapes = [
        tuple(shape)
        for event in profiled.events()
        for shape in event.input_shapes
        if shape and all(isinstance(size, int) for size in shape)  # a tensor's, not a list of them
    ]


PRETRAINED = "smollm2-135m"
PRETRAINED_MODULES = ("tests/test_pretrained_e2e.py", "tests/test_take_home.py")  # they read `pretrained_run`


def pytest_collection_finish(session):
    """The objects a worker holds once it has imported the libraries and collected the suite live until it
    ends: frozen, no full collection scans them again. Every training's start has one (accelerate's
    `free_memory`) and CPython runs its own; a run freezes what its own imports made
    (`train.model.load_libraries`), but a worker imported them while collecting (the time it saves:
    docs/experiments.md, the test suite's time)."""
    gc.collect()
    gc.freeze()


@pytest.fixture(scope="module", autouse=True)
def frozen_before_each_module():
    """What a worker's earlier modules left alive (cached tokenizers and models, the shared runs) frozen too,
    once the previous module's fixtures are gone and collected: a collection at a training's start then
    scans only what this module made. Its garbage is collected at the next module's start, as here."""
    gc.collect()
    gc.freeze()
    yield


def pytest_xdist_make_scheduler(config, log):
    """`make test`'s workers take the suite a module at a time (a module's fixtures are built once,
    not once per worker), and the modules that read `pretrained_run` together, so it is trained once. The
    other modules of the built-in model go to any worker: the first to need the model converts it (about
    15 s) while the others wait for it (pipeline/builtin.py), and the worker that trains `pretrained_run`,
    40% of the suite's work when it took them all, is no longer the last to finish."""
    from xdist.scheduler import LoadScopeScheduling

    class ByModule(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return PRETRAINED if module in PRETRAINED_MODULES else module

    return ByModule(config, log)


@pytest.fixture(scope="session")
def pretrained_run(tmp_path_factory):
    """One short run of the built-in pretrained model, shared by the modules that read or use it."""
    return short_pretrained_run(tmp_path_factory.mktemp("pretrained"))


PRETRAINED_COMMITS = 10


def short_pretrained_run(root: Path, *overrides: str, model: str = PRETRAINED) -> Path:
    """A few steps of the built-in pretrained model (or `model`) on PRETRAINED_COMMITS commits in one style, the
    newest held out; returns the output directory. `overrides`: more `--set` values."""
    repo = GitRepo(root / "repo")
    for index in range(1, PRETRAINED_COMMITS + 1):
        repo.commit(
            f"Add compute_{index} and describe_{index}", {f"pkg/feature_{index}.py": module_source(index)}
        )
    out = root / "out"
    argv = [
        "--repo", str(repo.path), "--output-dir", str(out), "--model", model, "--budget", "none",
        "--set", "scrape.format=[diff, message]",
        "--set", "train.epochs=1",
        # Blocks of 128 tokens: nothing the tests read needs longer ones, and at 256 training was most of the run.
        "--set", "train.max_sequence_length=128",
        # The history alone: the files are scraped for the next lines and their context, and trained in
        # the pretraining format in tests/test_files.py; here they were a third of the training.
        "--set", "train.files_share=0",
        "--set", "train.learning_rate=1e-3",
        # One step of the newest commits: what the tests read needs the loss to fall, not more of it.
        "--set", "train.newest_sequences=4",
        "--set", "plan.batch_size=4",
        "--set", "plan.gradient_accumulation_steps=1",
        "--set", "eval.samples=1",
        # Two of that commit's next lines, not its five: each is a prompt of each model, alone and with
        # context, before and after training.
        "--set", "eval.code_cases=2",
        "--set", "eval.max_blocks=1",
        "--set", "eval.message_tokens=16",
        "--set", "monitor.collection_interval_seconds=1",
        # fp32 on every CPU: tests hold `generate`'s answers (in the run's precision) to the scoreboard's,
        # and in bf16 a batch rounds otherwise than one prompt, which changes some greedy answers.
        "--set", "plan.precision=fp32",
        # A few steps: no activations recomputed, one validation (at the end); no blocks (tests/test_decoding.py
        # holds their answers to generate's).
        "--set", "plan.gradient_checkpointing=false",
        "--set", "train.eval_steps=100",
        "--set", "eval.block_cases=0",
        *[part for override in overrides for part in ("--set", override)],
    ]  # fmt: skip
    assert run_pipeline.main(argv) == 0
    return out


FAST_TRAINING = (
    # One epoch of the tiny model, a step for two commits, and no checkpoint (the planner's ten cost more
    # than the training): the suite trains dozens of these, and each of them cost about 7.5 s of a slow core
    # with three epochs and the checkpoints, 4.4 s without, and a fifth less with two commits a step. Tests
    # of warmup, a falling loss or epochs ask for more (`--set train.epochs=3`), tests of checkpoints and
    # resume for them. No validation during
    # training and commit messages of 8 tokens (the random model never ends one before its limit): a
    # quarter of such a run was validating and writing 48-token answers; the tests of validations and
    # of keeping the best weights ask for them.
    # The history alone, for the epochs asked and no time budget: the files at the split point (twice the
    # steps), their next lines and the cores' pace a budget measures are tested where they are the subject.
    "--model", "tiny",
    "--set", "train.time_budget=none",
    "--set", "scrape.files=false",
    "--set", "eval.code_cases=0",
    "--set", "eval.block_cases=0",
    "--set", "scrape.format=diff",
    "--set", "plan.batch_size=2",
    "--set", "plan.gradient_accumulation_steps=1",
    "--set", "train.epochs=1",
    "--set", "train.save_steps=1000",
    "--set", "train.eval_steps=1000",
    "--set", "eval.message_tokens=8",
    "--set", "train.max_sequence_length=128",
    "--set", "monitor.collection_interval_seconds=0.5",
)  # fmt: skip
WITH_FILES = ("--set", "scrape.files=true", "--set", "eval.code_cases=auto")
"""After FAST_TRAINING: the files at the split point trained on and their next lines scored, as by default
(blocks are scored where a test asks for them: each is up to 96 new tokens of each model)."""
WITH_BUDGET = ("--set", "train.time_budget=auto")
"""After FAST_TRAINING: the default time budget (the cores' pace and the training speed measured)."""

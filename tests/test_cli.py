"""The command line: help for every command, and bad input as one line with exit code 2."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import run_pipeline
from tests.conftest import FAST_TRAINING, GitRepo, read_json

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("command", [[], *([name] for name in run_pipeline.COMMANDS)])
def test_every_command_has_help(command, capsys):
    with pytest.raises(SystemExit) as exited:
        run_pipeline.main([*command, "--help"])
    assert exited.value.code == 0
    assert "usage:" in capsys.readouterr().out


def test_help_does_not_import_torch():
    probe = (
        "import sys, run_pipeline\n"
        "try:\n    run_pipeline.main(['--help'])\nexcept SystemExit:\n    pass\n"
        "print('torch' in sys.modules, 'transformers' in sys.modules)"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert result.stdout.strip().splitlines()[-1] == "False False"


def test_console_script_runs_the_same_cli():
    script = Path(sys.executable).parent / "repotune"
    result = subprocess.run([script, "--help"], capture_output=True, text=True, check=True)
    assert "scrape, plan and train" in result.stdout


def test_the_set_up_takes_a_python_recent_enough_and_says_so_where_there_is_none(tmp_path):
    """Ubuntu 22.04's python3 is 3.10: `make` takes the python3.11 installed beside it, and where there is
    none says so in one line before it makes anything (it had spent 40 s installing torch into a 3.10
    environment, then failed in the resolver, and left that environment for the next `make` to reuse)."""
    make = shutil.which("make")
    assert make is not None
    bin = tmp_path / "bin"
    bin.mkdir()
    (bin / "python3").write_text(
        '#!/bin/sh\n[ "$1" = --version ] && echo "Python 3.10.13" && exit 0\nexit 1\n'
    )
    (bin / "python3").chmod(0o755)
    (bin / "python3.11").symlink_to(sys.executable)

    def run(path: str, *argv: str) -> subprocess.CompletedProcess:
        # Not the make that runs the suite (`make test`): its MAKEFLAGS and MAKELEVEL would have this one
        # print the directories it enters.
        inherited = {
            name: value
            for name, value in os.environ.items()
            if name not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS")
        }
        environment = {**inherited, "PATH": path}
        return subprocess.run([make, *argv], cwd=ROOT, env=environment, capture_output=True, text=True)

    # (The system's folders after ours: the machine's own python3 may well be recent enough.)
    chosen = run(f"{bin}:/usr/bin:/bin", "--eval", "chosen: ; @echo $(PYTHON)", "chosen")
    assert chosen.stdout.strip() == str(bin / "python3.11")
    (bin / "python3.11").unlink()
    venv = tmp_path / "venv"
    refused = run(str(bin), "install", f"VENV={venv}")
    assert refused.returncode != 0 and not venv.exists()
    assert refused.stdout.strip() == (
        "repotune set-up: needs Python 3.11 or newer, and PATH has none (python3 is Python 3.10.13): install "
        "one (e.g. apt install python3.11) or name it: make PYTHON=/path/to/python3.11"
    )


def test_a_command_writes_the_bytecode_of_what_it_imports_where_the_environment_says_not_to(tmp_path):
    """PYTHONDONTWRITEBYTECODE (common in containers) would have every command compile torch and
    transformers anew; the CLI writes the bytecode of what it imports after it starts, as `make` does."""
    cache = tmp_path / "pycache"
    environment = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "PYTHONPYCACHEPREFIX": str(cache)}
    result = subprocess.run(
        [sys.executable, "run_pipeline.py", "diff", str(tmp_path / "a.json"), str(tmp_path / "b.json")],
        cwd=ROOT, env=environment, capture_output=True, text=True,
    )  # fmt: skip
    assert result.returncode == 2 and "repotune: error:" in result.stderr
    assert list(cache.rglob("diff.cpython-*.pyc"))  # pipeline/use/diff.py, imported by the command


def assert_one_line_error(result, code: int = 2) -> str:
    """Exactly one error line, last on stderr (progress lines may come before it), no traceback."""
    assert result.code == code
    lines = result.err.strip().splitlines()
    errors = [line for line in lines if line.startswith("repotune:")]
    assert errors == [lines[-1]], result.err
    assert lines[-1].startswith("repotune: error: ")
    assert "Traceback" not in result.err
    return lines[-1]


def test_not_a_repository(cli, tmp_path):
    (tmp_path / "plain").mkdir()
    result = cli("--repo", tmp_path / "plain", "--output-dir", tmp_path / "out")
    line = assert_one_line_error(result)
    assert "not a git repository" in line
    manifest = read_json(tmp_path / "out" / "MANIFEST.json")
    assert manifest["status"] == "failed"
    assert "not a git repository" in manifest["error"]


def test_missing_path(cli, tmp_path):
    result = cli("--repo", tmp_path / "nowhere", "--output-dir", tmp_path / "out")
    assert "no such file or directory" in assert_one_line_error(result)


def test_empty_repository(cli, tmp_path):
    GitRepo(tmp_path / "empty")
    result = cli("--repo", tmp_path / "empty", "--output-dir", tmp_path / "out")
    assert "has no commits yet" in assert_one_line_error(result)
    assert read_json(tmp_path / "out" / "MANIFEST.json")["status"] == "failed"


def test_a_path_that_is_not_utf8_is_refused_in_one_line(cli, sample_repo, tmp_path, capsys):
    """A folder named in Latin-1 (`caf\\xe9`), given on the command line or in a --repos-file: Python holds
    its byte as a lone surrogate, which the JSON manifest cannot hold, and the run ended in an internal
    error (a --repos-file, in a traceback). Now one line that names it and what to do, before anything
    is written."""
    latin = os.fsdecode(bytes(tmp_path) + b"/caf\xe9")
    listing = tmp_path / "repos.txt"
    listing.write_bytes(bytes(tmp_path) + b"/caf\xe9\n")
    for argv in (
        ("scrape", "--repo", latin, "--output-dir", tmp_path / "out"),
        ("--repo", sample_repo.path, "--output-dir", latin),
        ("scrape", "--repos-file", listing, "--output-dir", tmp_path / "out"),
    ):
        with pytest.raises(SystemExit) as ended:
            cli(*argv)
        assert ended.value.code == 2
        assert capsys.readouterr().err == (
            f"repotune: error: {tmp_path}/caf\\xe9: not UTF-8, and repotune records what it is given in "
            "JSON, which holds UTF-8 alone: rename it, or link to it from a UTF-8 name (ln -s)\n"
        )
    assert not (tmp_path / "out").exists()


def test_unwritable_output_directory(cli, sample_repo, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    result = cli("--repo", sample_repo.path, "--output-dir", blocker / "out")
    assert "cannot write to output directory" in assert_one_line_error(result)


@pytest.mark.parametrize("command", [(), ("scrape",), ("hook", "install")])
@pytest.mark.parametrize(
    "git",
    [(None, "git is not installed, or not on PATH"), ("2.25.1", "git version 2.25.1 is older than git 2.31")],
)
def test_without_a_usable_git_a_command_that_reads_a_repository_says_so(
    command, git, cli, sample_repo, tmp_path, monkeypatch
):
    version, said = git
    if version:  # an old distribution's git, which would ignore the safety settings without a word
        fake = tmp_path / "git"
        fake.write_text(f"#!/bin/sh\necho 'git version {version}'\n")
        fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    extra = ("--adapter", tmp_path) if command == ("hook", "install") else ("--output-dir", tmp_path / "out")
    result = cli(*command, "--repo", sample_repo.path, *extra)
    assert said in assert_one_line_error(result)
    assert not (tmp_path / "out").exists()
    assert not (sample_repo.path / ".git" / "hooks" / "prepare-commit-msg").exists()


def test_config_error_exits_2_without_touching_the_output(cli, sample_repo, tmp_path):
    result = cli("--repo", sample_repo.path, "--output-dir", tmp_path / "out", "--set", "train.epochs=zero")
    assert "`train.epochs` (from the command line) must be an integer" in assert_one_line_error(result)
    assert not (tmp_path / "out").exists()


def test_repository_whose_commits_are_all_filtered(cli, tmp_path):
    repo = GitRepo(tmp_path / "binary-only")
    repo.commit("Add image", {"image.png": b"\x89PNG\x00\x00"})
    result = cli("--repo", repo.path, "--output-dir", tmp_path / "out")
    line = assert_one_line_error(result)
    assert line.endswith("no commit survived the filters (skipped: no_text_changes 1); nothing to train on")


def test_a_shallow_clone_says_how_to_fetch_the_history(cli, sample_repo, tmp_path):
    clone = tmp_path / "clone"
    sample_repo.git("clone", "--quiet", "--depth", "1", f"file://{sample_repo.path}", str(clone))
    line = assert_one_line_error(cli("--repo", clone, "--output-dir", tmp_path / "out"))
    assert line.endswith(
        "nothing to train on (`git fetch --unshallow` in the clone keeps the 1 skipped as shallow_boundary)"
    )
    deeper = tmp_path / "deeper"
    sample_repo.git("clone", "--quiet", "--depth", "4", f"file://{sample_repo.path}", str(deeper))
    scraped = cli("scrape", "--repo", deeper, "--output-dir", tmp_path / "deeper-out")
    assert scraped.code == 0 and "`git fetch --unshallow` in the clone gives training the rest" in scraped.err


def test_a_range_that_holds_no_commit_says_so(cli, sample_repo, tmp_path):
    line = assert_one_line_error(
        cli("--repo", sample_repo.path, "--output-dir", tmp_path / "out", "--since", "2099-01-01")
    )
    assert line.endswith(
        "the history read (scrape.rev HEAD, scrape.since 2099-01-01) holds no commit; nothing to train on"
    )


def test_a_history_of_bots_alone_says_how_to_learn_from_it(cli, tmp_path):
    repo = GitRepo(tmp_path / "bots")
    for day in range(3):
        repo.commit(
            f"Update data {day}", {"data.txt": f"day {day}\n"}, author="github-actions[bot] <bot@example.com>"
        )
    out = tmp_path / "out"
    line = assert_one_line_error(cli("--repo", repo.path, "--output-dir", out, *FAST_TRAINING))
    assert line.endswith(
        "no commit survived the filters (skipped: bot_author 3); nothing to train on "
        "(--set scrape.bot_authors=[] keeps the 3 skipped as bot_author)"
    )
    kept = cli("--repo", repo.path, "--output-dir", out, *FAST_TRAINING, "--set", "scrape.bot_authors=[]")
    assert kept.code == 0, kept.err
    assert read_json(out / "MANIFEST.json")["scrape"]["commits_kept"] == 3


@pytest.mark.parametrize(
    ("model", "said"),
    [
        ("no-such-org/no-such-model", "`hf download no-such-org/no-such-model`"),
        ("smollm2-135", "cannot be reached (did you mean `--model smollm2-135m`?); download it"),
        ("./no-such-directory", "--model ./no-such-directory: no such directory"),
    ],
)
def test_unloadable_model_fails_fast_offline(model, said, cli, sample_repo, tmp_path, monkeypatch):
    """Said before the scrape, which takes minutes on a long history (the model was loaded after it)."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    result = cli("--repo", sample_repo.path, "--output-dir", tmp_path / "out", "--model", model)
    line = assert_one_line_error(result)
    assert said in line
    assert "scraped" not in result.err and read_json(tmp_path / "out" / "MANIFEST.json")["status"] == "failed"


@pytest.mark.parametrize(
    ("files", "lacking"),
    [
        ({}, "it has no config.json"),
        ({"config.json": '{"model_type": "llama"}'}, "it has no tokenizer (tokenizer.json,"),
    ],
)
def test_a_model_directory_that_lacks_a_file_names_it(files, lacking, cli, sample_repo, tmp_path):
    """transformers' own message for a missing tokenizer lists, over four lines, what it tried and names
    no file; its first line alone said "Couldn't instantiate the backend tokenizer from one of:"."""
    model = tmp_path / "model"
    model.mkdir()
    for name, text in files.items():
        (model / name).write_text(text)
    result = cli("--repo", sample_repo.path, "--output-dir", tmp_path / "out", "--model", model)
    line = assert_one_line_error(result)
    assert f"--model {model}: cannot load it from that directory: {lacking}" in line


def test_a_path_inside_the_work_tree_is_resolved_to_the_repository(cli, sample_repo, tmp_path):
    result = cli("scrape", "--repo", sample_repo.path / "pkg", "--output-dir", tmp_path / "out")
    assert result.code == 0
    manifest = read_json(tmp_path / "out" / "MANIFEST.json")
    assert manifest["repository"]["path"] == str(sample_repo.path.resolve())
    assert manifest["status"] == "scraped"
    assert result.out.strip() == str(tmp_path / "out" / "MANIFEST.json")


def test_internal_errors_are_one_line_too(cli, sample_repo, tmp_path, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr("pipeline.data.sources.scrape_history", broken)
    monkeypatch.delenv("REPOTUNE_DEBUG", raising=False)
    result = cli("scrape", "--repo", sample_repo.path, "--output-dir", tmp_path / "out")
    assert result.code == 1
    assert (
        result.err.strip()
        == "repotune: internal error: RuntimeError: boom (a bug; REPOTUNE_DEBUG=1 shows the traceback)"
    )
    assert read_json(tmp_path / "out" / "MANIFEST.json")["error"] == "internal error: RuntimeError: boom"


def test_git_is_never_given_our_environment_s_pager(monkeypatch, cli, sample_repo, tmp_path):
    # A hostile PAGER in the user's environment must not matter either.
    monkeypatch.setenv("GIT_PAGER", "sh -c 'touch /tmp/repotune-pager-ran'")
    monkeypatch.setitem(os.environ, "PAGER", "sh -c 'touch /tmp/repotune-pager-ran'")
    assert cli("scrape", "--repo", sample_repo.path, "--output-dir", tmp_path / "out").code == 0
    assert not Path("/tmp/repotune-pager-ran").exists()


HELP_OPTION = re.compile(r"^  (?:-\w(?: \S+)?, )?(--[a-z][a-z0-9-]*)(?: (\{[^}]+\}|[A-Z][\w.=/-]*))?", re.M)
NEEDED = {  # what each command cannot parse without (its required options and positionals)
    "update": ["--from", "x"],
    "export": ["--adapter", "x", "--output", "x.gguf"],
    "serve": ["--adapter", "x"],
    "hook": ["install", "--repo", "x"],
    "report": ["x"],
    "generate": ["--adapter", "x"],
}
SAMPLE = {"N": "7", "SECONDS": "3", "PID": "4", "PORT": "5", "SECTION.KEY=VALUE": "train.epochs=1"}


@pytest.mark.parametrize("command", list(run_pipeline.COMMANDS))
def test_every_option_a_commands_help_lists_is_one_it_reads(command, capsys, tmp_path):
    """Each option `COMMAND --help` lists parses, and reaches the command as a value of its own (`update
    --help` had listed --rev, --since, --until and --max-commits, which update then refused)."""
    from pipeline.use.cli import parse_args

    with pytest.raises(SystemExit):
        run_pipeline.main([command, "--help"])
    listed = HELP_OPTION.findall(capsys.readouterr().out)
    shared = run_pipeline.COMMANDS[command].shared_options
    needed = NEEDED.get(command, ["--repo", "x"] if shared else [])
    listing = tmp_path / "repos.txt"
    listing.write_text("x\n")
    plain = vars(parse_args([command, *needed], run_pipeline.COMMANDS))
    assert len(listed) >= 2
    for option, metavar in listed:
        if option == "--help" or option in needed:
            continue
        value = (
            metavar.strip("{}").split(",")[-1]
            if metavar.startswith("{")
            else {**SAMPLE, "FILE": str(listing)}.get(metavar, "x")
        )
        given = [option, value] if metavar else [option]
        parsed = vars(parse_args([command, *needed, *given], run_pipeline.COMMANDS))
        assert parsed != {**plain, "argv": parsed["argv"]}, f"{command} {' '.join(given)} changed nothing"

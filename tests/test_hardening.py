"""Hostile and careless input: credentials in every remote form, repository configs that must not break
or steer a scrape, any revision whatever HEAD is, bad input files and closed pipes (one line each),
oversized messages, quoted secrets, and the command line recorded as typed."""

from __future__ import annotations

import io
import multiprocessing
import os
import pty
import signal
import subprocess
import sys
import time
from contextlib import redirect_stdout
from pathlib import Path

import orjson
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from scrapers.git import describe_repository, git_failure, open_repository, strip_credentials
from scrapers.safe_git import LOCAL_GIT_ENV
from tests.conftest import FAST_TRAINING, GitRepo, add_features, module_source, read_json, sequences

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize(
    ("url", "recorded"),
    [
        ("https://user:s3cret@github.com/org/repo.git", "https://github.com/org/repo.git"),
        ("https://oauth2:glpat-abcdef@gitlab.com/x/y.git", "https://gitlab.com/x/y.git"),
        ("https://gitlab.com/x/y.git?private_token=abc123", "https://gitlab.com/x/y.git"),
        ("https://host.example/x.git#token=abc", "https://host.example/x.git"),
        ("https://user:p@ss@host.example:8443/x.git?a=b#c", "https://host.example:8443/x.git"),
        ("http://token@host.example/x.git", "http://host.example/x.git"),
        ("ssh://git:hunter2@host.example:2222/srv/x.git", "ssh://host.example:2222/srv/x.git"),
        ("ssh://git@[2001:db8::1]:22/x.git", "ssh://[2001:db8::1]:22/x.git"),
        ("git://host.example/x.git", "git://host.example/x.git"),
        ("file:///srv/git/x.git", "file:///srv/git/x.git"),
        ("file://user:pw@host/srv/x.git?token=1", "file://host/srv/x.git"),
        ("git@github.com:org/repo.git", "github.com:org/repo.git"),
        ("user:password@host.example:path/repo.git", "host.example:path/repo.git"),
        ("deploy:p@ss@host.example:repo.git?private_token=x", "host.example:repo.git"),
        ("host.example:~user/repo.git", "host.example:~user/repo.git"),
        ("/srv/git/repo.git", "/srv/git/repo.git"),
        ("../sibling/repo", "../sibling/repo"),
        # A password pasted unencoded: the user info runs to the last `@` before the host.
        ("https://user:pa?ss@host.example/x.git", "https://host.example/x.git"),
        ("https://user:pa#ss@host.example/x.git", "https://host.example/x.git"),
        ("https://user:pa/ss@host.example/x.git", "https://host.example/x.git"),
        ("https://user:p@s?s#w/o@host.example:8443/x.git", "https://host.example:8443/x.git"),
        ("https://user:pa?ss@host.example", "https://host.example"),
        ("deploy:pa/ss@host.example:repo.git", "host.example:repo.git"),
        # ... and an `@` in the path is the path's.
        ("https://registry.example/npm/@scope/pkg.git", "https://registry.example/npm/@scope/pkg.git"),
        ("https://host.example:8443/npm/@scope/pkg.git", "https://host.example:8443/npm/@scope/pkg.git"),
        ("ssh://host.example/~user/@team/x.git", "ssh://host.example/~user/@team/x.git"),
    ],
)
def test_a_remote_url_is_recorded_without_credentials_in_every_form(url, recorded):
    assert strip_credentials(url) == recorded


def test_the_recorded_remote_url_is_stripped(sample_repo):
    sample_repo.git(
        "remote", "add", "origin", "https://bob:hunter2@gitlab.com/team/sample.git?private_token=abc"
    )
    assert (
        describe_repository(open_repository(sample_repo.path)).remote_url
        == "https://gitlab.com/team/sample.git"
    )


def hostile_config(repo: GitRepo) -> None:
    """What a repository's own config may hold that once broke or steered a scrape."""
    order = repo.path / ".git" / "order.txt"
    order.write_text("pkg/*\n")  # files in another order than git's, which a prompt's cut would see
    with (repo.path / ".git" / "config").open("a") as config:
        config.write(
            '[includeIf "gitdir:/"]\n\tpath = elsewhere.inc\n'
            '[includeIf "onbranch:main"]\n\tpath = branch.inc\n'
            "[include]\n\tpath = /nonexistent/include.inc\n"
            '[weird "section"]\n\tvalue = 1\n'
            "[core]\n\tworktree = /nonexistent/worktree\n\tquotePath = true\n"
            "[diff]\n\tsubmodule = log\n\talgorithm = patience\n\tnoprefix = true\n\tinterHunkContext = 9\n"
            f"\tsrcPrefix = x/\n\tdstPrefix = y/\n\torderFile = {order}\n\tindentHeuristic = false\n"
            "\trenameLimit = 1\n"
            "[log]\n\tshowSignature = true\n\tshowRoot = false\n"
            '[remote "origin"]\n\turl = https://user:token@example.com/x.git?private_token=abc\n'
        )
    (repo.path / ".git" / "elsewhere.inc").write_text(
        '[remote "origin"]\n\turl = https://leak:leak@evil.example/\n'
    )


def test_the_repositorys_config_neither_breaks_nor_steers_the_scrape(cli, sample_repo, tmp_path):
    clean = cli(
        "scrape",
        "--repo",
        sample_repo.path,
        "--output-dir",
        tmp_path / "clean",
        "--set",
        "scrape.format=diff",
    )
    assert clean.code == 0, clean.err
    hostile_config(sample_repo)
    result = cli(
        "scrape", "--repo", sample_repo.path, "--output-dir", tmp_path / "out", "--set", "scrape.format=diff"
    )
    assert result.code == 0, result.err
    manifest = read_json(tmp_path / "out" / "MANIFEST.json")
    assert manifest["repository"]["remote_url"] == "https://example.com/x.git"  # its own file, no include
    assert manifest["repository"]["path"] == str(sample_repo.path.resolve())
    # The same sequences as before the config changed: prefixes, hunks and paths as git's defaults make them.
    texts = [
        [
            orjson.loads(line)["text"]
            for line in (tmp_path / name / "sequences.jsonl").read_bytes().splitlines()
        ]
        for name in ("clean", "out")
    ]
    assert texts[0] == texts[1]


def test_a_repository_whose_path_holds_spaces_scrapes(cli, tmp_path):
    repo = GitRepo(tmp_path / "my projects" / "the repo ü")
    for index in range(1, 4):
        repo.commit(f"Add compute_{index}", {f"pkg/feature_{index}.py": module_source(index)})
    result = cli("scrape", "--repo", repo.path, "--output-dir", tmp_path / "out")
    assert result.code == 0, result.err
    assert read_json(tmp_path / "out" / "MANIFEST.json")["repository"]["path"] == str(repo.path.resolve())


def test_a_linked_work_tree_reads_its_main_repositorys_config(cli, sample_repo, tmp_path):
    """`git worktree add`: the linked tree's git dir holds neither the config nor the shallow list."""
    sample_repo.git("remote", "add", "origin", "https://bob:hunter2@example.com/team/sample.git")
    sample_repo.git("worktree", "add", "--quiet", "--detach", str(tmp_path / "linked"), "HEAD~2")
    result = cli("scrape", "--repo", tmp_path / "linked", "--output-dir", tmp_path / "out")
    assert result.code == 0, result.err
    described = read_json(tmp_path / "out" / "MANIFEST.json")["repository"]
    assert described["remote_url"] == "https://example.com/team/sample.git"
    assert (described["path"], described["commit_count"]) == (str((tmp_path / "linked").resolve()), 10)


def test_git_variables_inherited_from_a_hook_or_an_alias_do_not_swap_the_repository(
    cli, sample_repo, tmp_path, monkeypatch
):
    other = GitRepo(tmp_path / "other")
    other.commit("Add the other module", {"other.py": module_source(1)})
    monkeypatch.setenv("GIT_DIR", str(other.path / ".git"))  # as git sets it for a hook or an alias
    monkeypatch.setenv("GIT_INDEX_FILE", str(other.path / ".git" / "index"))
    result = cli("scrape", "--repo", sample_repo.path, "--output-dir", tmp_path / "out")
    assert result.code == 0, result.err
    assert read_json(tmp_path / "out" / "MANIFEST.json")["repository"]["commit_count"] == 12


def test_every_variable_that_names_a_repository_is_forgotten():
    listed = subprocess.run(
        ["git", "rev-parse", "--local-env-vars"], capture_output=True, text=True, check=True
    )
    assert set(listed.stdout.split()) <= set(LOCAL_GIT_ENV)


def test_a_repository_of_another_user_says_the_command_that_trusts_it():
    said = (  # git 2.39's words, to a user whose repository another user owns
        "fatal: detected dubious ownership in repository at '/srv/my repo'\n"
        "To add an exception for this directory, call:\n\n"
        "\tgit config --global --add safe.directory '/srv/my repo'\n"
    )
    assert git_failure(said) == (
        "git refuses a repository owned by another user; if you trust it: "
        "git config --global --add safe.directory '/srv/my repo'"
    )


def test_any_revision_scrapes_whatever_head_points_to(cli, tmp_path):
    repo = GitRepo(tmp_path / "repo")
    for index in range(1, 4):
        repo.commit(f"Add compute_{index}", {f"pkg/feature_{index}.py": module_source(index)})
    repo.git("checkout", "--quiet", "--orphan", "unborn")  # HEAD names a branch with no commit
    no_head = cli("scrape", "--repo", repo.path, "--output-dir", tmp_path / "a")
    assert no_head.code == 2 and "no commits yet on its current branch" in no_head.err
    result = cli("scrape", "--repo", repo.path, "--output-dir", tmp_path / "b", "--rev", "main")
    assert result.code == 0, result.err
    manifest = read_json(tmp_path / "b" / "MANIFEST.json")
    assert (manifest["scrape"]["commits_seen"], manifest["repository"]["head"]) == (3, None)
    assert manifest["repository"]["branch"] == "unborn"
    missing = cli("scrape", "--repo", repo.path, "--output-dir", tmp_path / "c", "--rev", "nope")
    assert missing.code == 2
    assert missing.err.strip().endswith(
        "--rev nope: no such revision or range in this repository (`git branch -a` and `git tag` list what there is)"
    )


BAD_FILES = {
    "missing": (None, "cannot read {path}: No such file or directory"),
    "directory": ("dir", "{path} is a directory without a MANIFEST.json, not a run's output directory"),
    "empty": (b"", "{path} is empty, not a manifest (a run still writing it? try again when it ends)"),
    "truncated": (b'{"status": "runn', "{path} is not valid JSON"),
    "not utf-8": (b"\xff\xfe\x00{", "{path} is not UTF-8 text, so not a manifest"),
    "array": (b"[1, 2]", "{path} holds a JSON list, not a manifest (a JSON object)"),
    "string": (b'"MANIFEST"', "{path} holds a JSON str, not a manifest (a JSON object)"),
}


def bad_file(tmp_path: Path, kind: str) -> Path:
    content = BAD_FILES[kind][0]
    path = tmp_path / f"bad-{kind.replace(' ', '-')}.json"
    if content == "dir":
        path.mkdir()
    elif content is not None:
        path.write_bytes(content)
    return path


@pytest.mark.parametrize("kind", BAD_FILES)
@pytest.mark.parametrize("command", ["report", "diff"])
def test_a_bad_input_file_is_one_line_naming_it(cli, tmp_path, kind, command):
    path = bad_file(tmp_path, kind)
    good = tmp_path / "good.json"
    good.write_bytes(orjson.dumps({"status": "planned"}))
    result = cli("report", path) if command == "report" else cli("diff", good, path)
    assert result.code == 2, result.err
    line = result.err.strip().splitlines()[-1]
    assert line.startswith(f"repotune: error: {BAD_FILES[kind][1].format(path=path)}")
    assert "internal error" not in result.err and "Traceback" not in result.err


FULL = (
    "[enforce fail at inline_container.cc:672] . unexpected pos 15616 vs 15508"  # torch.save on a full disk
)


def disk_with(monkeypatch, free: int) -> None:
    """From now on the disk answers that `free` bytes are free: a test cannot fill one, so a write fails as
    it would on a full disk and the disk says so when asked."""
    import shutil

    usage = shutil.disk_usage(Path.cwd())._replace(total=2**40, used=2**40 - free, free=free)
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage)


@pytest.mark.parametrize("kind", ["torch", "errno", "not-full"])
def test_a_full_disk_is_one_line_naming_it_and_what_the_run_kept(cli, tmp_path, monkeypatch, kind):
    """A checkpoint's write fails on a full disk (which a test cannot fill: the disk's answers are given
    at the moment of the write). The run says so in one line, not as a bug; where even its manifest cannot
    be written, the one on disk still parses, as it stood, and no temporary file is left beside it."""
    from pipeline.record import run
    from pipeline.train.trainer import CheckpointStamp

    out = tmp_path / "out"
    failure, free = {
        "torch": (RuntimeError(FULL), 0),  # torch's writer names no errno: the disk's free space tells
        "errno": (OSError(28, os.strerror(28), str(out / "checkpoints" / "optimizer.pt")), 40 * 2**20),
        "not-full": (RuntimeError("a bug"), 40 * 2**30),
    }[kind]
    recorded = kind != "errno"  # there, the manifest cannot be written either

    def full(self, *args, **kwargs):
        disk_with(monkeypatch, free)
        if not recorded:
            monkeypatch.setattr(
                run, "write_json", lambda path, doc: (_ for _ in ()).throw(OSError(28, os.strerror(28)))
            )
        raise failure

    monkeypatch.setattr(CheckpointStamp, "on_save", full)
    repo = add_features(GitRepo(tmp_path / "repo"), range(1, 5))
    result = cli("--repo", repo.path, "--output-dir", out, *FAST_TRAINING, "--set", "train.save_steps=1")
    last = result.err.strip().splitlines()[-1]
    manifest = read_json(out / "MANIFEST.json")
    assert sorted(path.name for path in out.glob(".MANIFEST.json.*")) == []
    if kind == "not-full":
        assert result.code == 1 and last.startswith("repotune: internal error: RuntimeError: a bug")
        return
    assert result.code == 2 and "Traceback" not in result.err
    where = out / "checkpoints" if kind == "errno" else out  # the folder of the file the error names
    assert last.startswith(
        f"repotune: error: the disk holding {where} ran out of space ({free // 2**20} MB free now)"
    )
    assert f"a write failed ({type(failure).__name__}: " in last
    assert last.endswith("during train; kept: the scrape (reused by the next run on the same HEADs and config), "
        "the token cache, the converted model; free some space there, or give another --output-dir")  # fmt: skip
    if recorded:
        assert (manifest["status"], manifest["error"]) == ("failed", last.removeprefix("repotune: error: "))
    else:
        assert (
            f"could not record how the run ended in {out / 'MANIFEST.json'} (No space left on device)"
            in result.err
        )
        assert manifest["status"] == "running"  # as it stood: a later run finds its process gone


def test_a_full_disk_is_told_from_a_bug_by_its_errno_or_by_what_is_free(tmp_path, monkeypatch):
    from pipeline.errors import FULL_DISK_FREE, disk_full

    out, cache = tmp_path / "out", tmp_path / "cache"
    (out / "checkpoints").mkdir(parents=True)
    places = {"--output-dir": out}
    disk_with(monkeypatch, 10 * FULL_DISK_FREE)

    def wrapped(path: Path) -> RuntimeError:
        try:
            raise OSError(28, os.strerror(28), str(path))
        except OSError as cause:
            try:
                raise RuntimeError("saving failed") from cause
            except RuntimeError as wrapping:
                return wrapping

    named = disk_full(wrapped(out / "checkpoints" / "checkpoint-3" / "optimizer.pt"), places)
    assert named is not None and named.happened.startswith(
        f"the disk holding {out / 'checkpoints'} ran out of"
    )
    assert named.fix == "free some space there, or give another --output-dir"  # the option's folder
    elsewhere = disk_full(wrapped(cache / "repotune" / "models" / "model.safetensors"), places)
    # The cache's folder, not the output's: another output dir would not help.
    assert elsewhere is not None and elsewhere.fix == "free some space there"
    said = disk_full(RuntimeError("I/O error: Disk quota exceeded (os error 122)"), places)
    assert said is not None and said.happened.startswith(f"the disk holding {out} ")
    assert disk_full(RuntimeError("unexpected pos 704 vs 598"), places) is None  # room enough: a bug
    disk_with(monkeypatch, FULL_DISK_FREE - 1)
    assert disk_full(RuntimeError("unexpected pos 704 vs 598"), places) is not None  # torch's, on a full disk
    assert disk_full(RuntimeError("unexpected pos 704 vs 598"), {}) is None  # nowhere it writes: unknown


def test_a_command_whose_write_meets_a_full_disk_says_so_in_one_line(cli, tmp_path, monkeypatch):
    """Every command, not a run alone: `monitor`'s report here, `export`'s GGUF where gguf says "Not enough
    free space to write …" (the disk's answer given at the write, which a test cannot fill)."""
    from pipeline.use import watch

    def full(path, document):
        disk_with(monkeypatch, 0)
        raise OSError("Not enough free space to write 56623104 bytes after offset 1785376")

    monkeypatch.setattr(watch, "write_json", full)
    result = cli("monitor", "--duration", "0.2", "--output", tmp_path / "m.json")
    assert result.code == 2 and result.err.strip().splitlines()[-1] == (
        f"repotune: error: the disk holding {tmp_path} ran out of space (0 MB free now): a write failed (OSError: "
        "Not enough free space to write 56623104 bytes after offset 1785376); free some space there, or give "
        "another --output"
    )


def test_an_unwritable_output_is_one_line_naming_it(cli, tmp_path):
    manifest = tmp_path / "m.json"
    manifest.write_bytes(orjson.dumps({"status": "planned"}))
    (tmp_path / "a-file").write_text("")
    for under in (tmp_path / "a-file", tmp_path / "a-file" / "pages"):
        report = cli("report", manifest, "-o", under / "report.html")
        assert report.code == 2
        assert report.err.strip() == (
            f"repotune: error: cannot write {under / 'report.html'}: {tmp_path / 'a-file'} is a file, not a folder"
        )
    # A folder that does not exist yet is made, as --output-dir's is.
    made = cli("report", manifest, "-o", tmp_path / "pages" / "run" / "report.html")
    assert made.code == 0 and (tmp_path / "pages" / "run" / "report.html").is_file()
    watch = cli("monitor", "--duration", "1", "--output", tmp_path / "missing" / "m.json")
    assert watch.code == 2 and watch.err.strip().startswith("repotune: error: --output")
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text("{")
    broken = cli("generate", "--adapter", adapter, "--prompt", "x")
    assert broken.code == 2 and broken.err.strip().startswith(
        f"repotune: error: --adapter {adapter}: not a readable adapter"
    )
    # Said before the model loads, where it was an internal error once the GGUF was written.
    (tmp_path / "a-file").write_text("")
    exported = cli("export", "--adapter", adapter, "--output", tmp_path / "a-file" / "m.gguf")
    assert exported.code == 2
    assert (
        exported.err
        == f"repotune: error: --output {tmp_path / 'a-file' / 'm.gguf'}: {tmp_path / 'a-file'} is a file, not a folder\n"
    )
    for option in ("--duration", "--interval"):
        negative = cli("monitor", option, "-5", "--output", tmp_path / "m.json")
        assert negative.code == 2 and negative.err.startswith(f"repotune: error: {option} -5: give a number")


def test_a_closed_pipe_ends_quietly_with_exit_0(tmp_path):
    big = {f"key_{index}": index for index in range(4_000)}  # its diff, ~400 KB, fills a pipe (64 KiB)
    before, after = tmp_path / "a.json", tmp_path / "b.json"
    before.write_bytes(orjson.dumps(big))
    after.write_bytes(orjson.dumps({key: value + 1 for key, value in big.items()}))
    process = subprocess.Popen(
        [sys.executable, str(ROOT / "run_pipeline.py"), "diff", "--all", str(before), str(after)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    process.stdout.readline()
    process.stdout.close()  # as `| head -1` does
    assert process.wait(timeout=120) == 0
    assert process.stderr.read() == b""


def test_oversized_messages_and_quoted_secrets_never_reach_the_data_or_the_tokenizer(cli, tmp_path):
    repo = GitRepo(tmp_path / "repo")
    for index in range(1, 8):
        repo.commit(f"Add compute_{index}", {f"pkg/feature_{index}.py": module_source(index)})
    repo.commit("Add settings\n\n" + "generated line\n" * 1000, {"pkg/generated.py": "X = 1\n"})
    repo.commit(
        "Add the database settings", {"pkg/settings.py": 'DB_PASSWORD = "Summer2024!"\nDB_USER = "app"\n'}
    )
    repo.commit(
        "Configure the deployment", {"deploy/values.yaml": "DB_USER: app\nDB_PASSWORD: hunter2hunter\n"}
    )
    out = tmp_path / "out"
    result = cli("--repo", repo.path, "--output-dir", out, *FAST_TRAINING, "--set", "train.epochs=1")
    assert result.code == 0, result.err
    manifest = read_json(out / "MANIFEST.json")
    assert manifest["scrape"]["skipped"]["message_too_large"] == 1
    assert manifest["scrape"]["redactions"] == {"quoted_secret": 1, "unquoted_secret": 1}
    for path in out.rglob("*"):
        if path.is_file():  # the sequences, the tokenizer, the cache, the adapter, the manifest
            assert b"Summer2024" not in path.read_bytes() and b"hunter2hunter" not in path.read_bytes(), path


def test_the_recorded_command_is_what_the_user_typed(cli, sample_repo, tmp_path):
    typed = ["--repo", str(sample_repo.path), "--output-dir", str(tmp_path / "out"), "--model", "tiny"]
    cli(*typed, "--set", "scrape.max_commits=1")
    run = read_json(tmp_path / "out" / "MANIFEST.json")["run"]
    assert (run["command"], run["argv"]) == ("run", [*typed, "--set", "scrape.max_commits=1"])


def test_tokenizer_workers_stop_quietly_under_the_pipelines_signal_handlers(capfd):
    """A run raises on SIGTERM to record an interruption. Forked tokenizer workers that kept that handler
    printed a traceback each when their pool stopped them at the end of a large history's tokenizing
    (pytest-dev/pytest's 23,478 sequences), and could have kept the pool waiting for them. The handler
    ends any process but the one that installed it quietly, however early the signal comes."""
    from pipeline.data.token_cache import _encoded
    from pipeline.record.run import _signals_interrupt
    from pipeline.types import TextStyle
    from tests.test_learning_plan import CharTokenizer

    chunks = [(["diff"] * 4, [f"Fix {n}\n\n+x = {n}\n" for n in range(4)]) for _ in range(8)]
    with _signals_interrupt():
        for _ in range(10):  # each pool ends its workers with its last task, not with a signal
            parts = list(_encoded(chunks, (CharTokenizer(), TextStyle("raw", "all"), (64, 32)), 2))
            assert [len(lengths) for _, _, lengths in parts] == [4] * 8
        # A worker stopped before it has run anything (the race CI met on a busy machine) ends quietly too.
        worker = multiprocessing.get_context("fork").Process(target=_stopped_at_once)
        worker.start()
        worker.join()
    assert worker.exitcode == 128 + signal.SIGTERM
    assert "Traceback" not in capfd.readouterr().err


def _stopped_at_once() -> None:
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(5)  # the handler runs before this ends


def _write_commit(repo: GitRepo, header_extra: str, message: bytes, files: dict[bytes, bytes]) -> str:
    """A commit written as raw bytes (an `encoding` header git would not write for us, a message in any
    bytes), its files staged by their byte paths; HEAD moves to it."""
    for name, content in files.items():
        path = bytes(repo.path) + b"/" + name
        os.makedirs(os.path.dirname(path), exist_ok=True)  # a name holding `/` is a path in folders
        with open(path, "wb") as handle:
            handle.write(content)
    repo.git("add", "--all")
    tree = repo.git("write-tree")
    parents = [f"parent {repo.git('rev-parse', 'HEAD')}\n"] if repo.git("rev-list", "--all") else []
    body = (
        f"tree {tree}\n{''.join(parents)}author Ada <ada@example.com> 1704110400 +0000\n"
        f"committer Ada <ada@example.com> 1704110400 +0000\n{header_extra}\n"
    ).encode() + message
    sha = subprocess.run(
        ["git", "hash-object", "-t", "commit", "-w", "--stdin"], input=body, cwd=repo.path,
        capture_output=True, check=True,
    ).stdout.decode().strip()  # fmt: skip
    repo.git("update-ref", "HEAD", sha)
    return sha


@pytest.mark.parametrize("encoding", ["idna", "punycode", "rot13", "base64", "no-such-encoding"])
def test_a_commit_in_an_encoding_that_cannot_decode_it_is_read_as_utf8(cli, tmp_path, encoding):
    """git passes a message it cannot re-encode as it is, and the scrape falls back to UTF-8 where the
    commit's encoding is no text encoding, or one that cannot replace a bad byte (`idna`): an internal
    error before."""
    repo = GitRepo(tmp_path / "repo")
    repo.commit("Add the module", {"app.py": module_source(1)})
    _write_commit(repo, f"encoding {encoding}\n", b"Fix caf\xe9 handling\n", {b"g.py": b"name = '\xe9'\n"})
    out = tmp_path / "out"
    result = cli("scrape", "--repo", repo.path, "--output-dir", out, "--set", "scrape.format=diff")
    assert result.code == 0, result.err
    texts = [record["text"] for record in sequences(out / "sequences.jsonl")]
    assert texts[0].startswith("Fix caf\ufffd handling\n") and "+name = '\ufffd'" in texts[0]


def test_a_repository_whose_path_holds_a_newline_scrapes(cli, tmp_path):
    repo = add_features(GitRepo(tmp_path / "two\nlines"), range(1, 4))
    out = tmp_path / "out"
    result = cli("scrape", "--repo", repo.path, "--output-dir", out)
    assert result.code == 0, result.err
    assert read_json(out / "MANIFEST.json")["repository"]["path"] == str(repo.path)


def test_a_file_name_is_quoted_in_the_training_text_as_git_quotes_it(cli, tmp_path):
    """A file name holding a newline went raw into the `diff --git` line, where it could forge the header
    of a file that is not there (and the secret rules read the lines after it as that file's)."""
    repo = GitRepo(tmp_path / "repo")
    repo.commit("Add the module", {"app.py": module_source(1)})
    forged = b'x\ndiff --git a/.env b/.env\n+print(1)\n\t"\\\x01.py'
    _write_commit(repo, "", b"Add a file with a strange name\n", {forged: b"value = 1\n"})
    out = tmp_path / "out"
    assert cli("scrape", "--repo", repo.path, "--output-dir", out, "--set", "scrape.format=diff").code == 0
    text = sequences(out / "sequences.jsonl")[0]["text"]
    written_by_git = repo.git("-c", "core.quotePath=false", "log", "-1", "-p", "--format=").splitlines()
    quoted = '"a/x\\ndiff --git a/.env b/.env\\n+print(1)\\n\\t\\"\\\\\\001.py"'
    assert f"diff --git {quoted} {quoted.replace('a/', 'b/', 1)}" in written_by_git
    assert text.splitlines()[2] == f"diff --git {quoted} {quoted.replace('a/', 'b/', 1)}"
    assert text.count("\ndiff --git ") == 1 and "\n+print(1)" not in text


def _a_name(data: bytes) -> bool:
    """A name git can store as one path component."""
    return b"\0" not in data and b"/" not in data and data not in (b".", b"..") and data.lower() != b".git"


def _bytes_or_text(size: int) -> st.SearchStrategy[bytes]:
    """Any bytes, or text's UTF-8 (most of what real names hold, which random bytes seldom are)."""
    return st.one_of(
        st.binary(min_size=1, max_size=size), st.text(min_size=1, max_size=size).map(os.fsencode)
    )


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    folder=_bytes_or_text(16).filter(_a_name),
    name=_bytes_or_text(24).filter(_a_name),
    message=_bytes_or_text(300),
    encoding=st.sampled_from(["", "encoding ISO-8859-1\n", "encoding idna\n", "encoding x-unknown\n"]),
)
def test_random_bytes_as_paths_names_and_messages_scrape_or_fail_in_one_line(
    cli, capsys, tmp_path_factory, folder, name, message, encoding
):
    """Whatever bytes a repository's path, a file's name and a commit's message hold, the scrape succeeds
    or says why in one line; and a file's name never adds a line to the diff (git's quoting)."""
    assume(b"diff --git" not in message)
    parent = tmp_path_factory.mktemp("random")
    repo = GitRepo(Path(os.fsdecode(bytes(parent) + b"/" + folder)))
    repo.commit("Add the module", {"app.py": module_source(1)})
    try:
        _write_commit(repo, encoding, message, {name: b"value = 1\n"})
    except subprocess.CalledProcessError:
        assume(False)  # a name git itself refuses (`.GIT`, NTFS' forms of it)
    out = parent / "out"
    try:
        result = cli("scrape", "--repo", repo.path, "--output-dir", out, "--set", "scrape.format=diff")
        code, err = result.code, result.err
    except SystemExit as refused:  # refused before anything runs (a path that is not UTF-8)
        code, err = refused.code, capsys.readouterr().err
    if code != 0:
        assert code == 2 and err.count("\n") == 1 and err.startswith("repotune: error: "), err
        return
    for record in sequences(out / "sequences.jsonl"):
        assert sum(line.startswith("diff --git ") for line in record["text"].split("\n")) == 1


def test_a_past_message_generate_shows_on_a_terminal_is_not_obeyed_and_a_pipe_gets_it_as_written(tmp_path):
    """A commit message is the repository's text, and `generate --task message` hands a past one on: on a
    terminal (a real one, a pseudo-terminal) its escape sequences and backspaces are written as escapes,
    its line breaks and tabs kept; into a pipe it is what git has, for `git commit -F -`."""
    import run_pipeline

    repo = add_features(GitRepo(tmp_path / "repo"))
    hostile = "Fix the parser\x1b]52;c;ZWNobw==\x07\x9b2J\x08\x08Pwned\n\nBody\tline"
    repo.commit(hostile, {"pkg/parser.py": module_source(90)})
    out = tmp_path / "out"
    assert run_pipeline.main(["--repo", str(repo.path), "--output-dir", str(out), *FAST_TRAINING]) == 0
    diff = repo.git("show", "--format=", "HEAD")
    argv = ["generate", "--adapter", str(out), "--task", "message", "--system", "lookup", "--prompt", diff]
    piped = io.StringIO()
    with redirect_stdout(piped):
        assert run_pipeline.main(argv) == 0
    assert piped.getvalue() == hostile + "\n", repr(piped.getvalue())
    leader, follower = pty.openpty()
    with open(follower, "w", encoding="utf-8", closefd=True) as terminal, redirect_stdout(terminal):
        assert run_pipeline.main(argv) == 0
    said = b""
    while True:  # what the terminal holds, until it says it has no writer left (EIO)
        try:
            read = os.read(leader, 4096)
        except OSError:
            break
        if not read:
            break
        said += read
    os.close(leader)
    # (the terminal's own line discipline writes each line break as CR LF)
    assert (
        said.decode() == "Fix the parser\\x1b]52;c;ZWNobw==\\x07\\x9b2J\\x08\\x08Pwned\r\n\r\nBody\tline\r\n"
    )

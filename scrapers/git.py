"""Open a repository safely and stream its history through ONE `git log -p` process.

Safety: a scraped repository is untrusted. Its `.git/config` and
`.gitattributes` can name programs that git runs on its behalf (an external
diff, textconv filters, an fsmonitor hook that even `git status` runs, a
pager, gpg for signatures, transports for lazy fetches). Every git process we
start through GitPython gets `SAFE_GIT_CONFIG` as command-line-level config
(through GIT_CONFIG_COUNT, the environment form of `git -c`, which outranks
every config file), so none of them can run; `git log` also gets
`--no-ext-diff --no-textconv --no-color`. We never call GitPython helpers
such as `is_dirty()` that would spawn `git diff`/`git status` on the work tree.
"""

from __future__ import annotations

import os
import re
import secrets
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO
from urllib.parse import urlsplit, urlunsplit

import git

from scrapers.commit import Commit
from scrapers.errors import RepositoryError
from scrapers.parse import log_format, parse_log

SAFE_GIT_CONFIG = {
    "core.fsmonitor": "false",  # `core.fsmonitor=<program>` runs on every work-tree scan
    "core.hooksPath": os.devnull,  # no hooks from the repository
    "core.pager": "cat",
    "log.showSignature": "false",  # signature checks would run gpg.program
    "protocol.allow": "never",  # no transport at all: a partial clone must not lazily fetch
    "diff.noprefix": "false",  # the parser relies on a/ and b/ prefixes
    "diff.mnemonicPrefix": "false",
    "diff.relative": "false",
    "core.quotePath": "false",  # non-ASCII paths as UTF-8, not octal escapes
    "i18n.logOutputEncoding": "UTF-8",  # messages re-encoded from their encoding header
    "color.ui": "false",
}
SAFE_GIT_ENV = {
    "GIT_CONFIG_COUNT": str(len(SAFE_GIT_CONFIG)),
    **{f"GIT_CONFIG_KEY_{i}": key for i, key in enumerate(SAFE_GIT_CONFIG)},
    **{f"GIT_CONFIG_VALUE_{i}": value for i, value in enumerate(SAFE_GIT_CONFIG.values())},
    "GIT_PAGER": "cat",
    "GIT_TERMINAL_PROMPT": "0",
    "GIT_OPTIONAL_LOCKS": "0",  # reading must not take locks or refresh the user's index
    "GIT_EXTERNAL_DIFF": "",
    # Fully buffered output even into a pipe: by default git flushes after every commit it lists
    # or logs, and each flush wakes the reader (rev-list over 6,500 commits: 40 ms instead of 27).
    "GIT_FLUSH": "0",
}
SAFE_LOG_FLAGS = ("--no-ext-diff", "--no-textconv", "--no-color", "--no-show-signature", "--encoding=UTF-8")
_READ_SIZE = 1 << 20  # bytes per read from git's stdout


@dataclass(frozen=True)
class LogOptions:
    context_lines: int
    """Unified-diff context lines git prints (-U)."""
    merge_diffs: bool
    """Diff merges against their first parent; otherwise git prints only their header."""
    big_file_bytes: int
    """git's core.bigFileThreshold: larger files are reported as binary instead of diffed."""
    max_file_diff_bytes: int
    """The parser keeps at most this much of one file's diff."""


@dataclass(frozen=True)
class RepositoryInfo:
    path: str
    """Work-tree root, or the git directory of a bare repository."""
    head: str
    branch: str | None
    """None on a detached HEAD."""
    remote_url: str | None
    """`origin` (or the first remote) with any credentials removed."""
    bare: bool
    shallow: bool
    commit_count: int
    """Commits reachable from HEAD."""


def open_repository(path: str | Path) -> git.Repo:
    """Open the repository containing `path`, with every configured program disabled."""
    resolved = Path(path).expanduser()
    if not resolved.exists():
        raise RepositoryError(f"{path}: no such file or directory")
    try:
        repo = git.Repo(resolved, search_parent_directories=True)
    except (git.InvalidGitRepositoryError, git.NoSuchPathError):
        raise RepositoryError(
            f"{path}: not a git repository (run `git init`, or pass the path of a clone)"
        ) from None
    # GIT_DIR pins every git process to this repository, also for a bare clone without a
    # `config` file, which GitPython mistakes for a work tree rooted at its parent.
    repo.git.update_environment(**SAFE_GIT_ENV, GIT_DIR=str(Path(repo.git_dir).resolve()))
    if not repo.head.is_valid():
        raise RepositoryError(f"{path}: the repository has no commits yet; commit something first")
    return repo


def is_bare(repo: git.Repo) -> bool:
    """Bare, including a bare clone with no `config` file (GitPython then reports a work tree)."""
    return repo.bare or not (Path(repo.working_tree_dir) / ".git").exists()


def describe_repository(repo: git.Repo, commit_count: int | None = None) -> RepositoryInfo:
    """What the manifest says about the repository; pass `commit_count` when HEAD's history was listed already."""
    head = repo.head
    return RepositoryInfo(
        path=_where(repo),
        head=head.commit.hexsha,
        branch=None if head.is_detached else head.reference.name,
        remote_url=_remote_url(repo),
        bare=is_bare(repo),
        shallow=(Path(repo.git_dir) / "shallow").exists(),
        commit_count=commit_count
        if commit_count is not None
        else int(run_git(repo, "rev-list", "--count", "HEAD")),
    )


def _remote_url(repo: git.Repo) -> str | None:
    remotes = {remote.name: remote for remote in repo.remotes}
    remote = remotes.get("origin") or next(iter(remotes.values()), None)
    if remote is None:
        return None
    try:
        url = repo.config_reader().get_value(f'remote "{remote.name}"', "url")
    except Exception:  # a remote section without a url; nothing to record
        return None
    return strip_credentials(str(url))


_SCP_LIKE = re.compile(r"^[^@/:]+@(?=[^/:]+:)")


def strip_credentials(url: str) -> str:
    """`https://user:token@host/x` → `https://host/x`; `user@host:x` (ssh) keeps no user either."""
    parts = urlsplit(url)
    if parts.scheme and parts.netloc and "@" in parts.netloc:
        host = parts.netloc.rsplit("@", 1)[1]
        return urlunsplit((parts.scheme, host, parts.path, parts.query, parts.fragment))
    return _SCP_LIKE.sub("", url)


def run_git(repo: git.Repo, *args: str) -> str:
    """Run one short git command (never per commit) and return its stripped output."""
    try:
        return repo.git.execute(["git", *args]).strip()
    except git.GitCommandError as err:
        raise RepositoryError(f"{_where(repo)}: git {args[0]} failed: {git_failure(err.stderr)}") from None


def rev_list(
    repo: git.Repo, rev: str, max_count: int | None, since: str | None, until: str | None
) -> list[str]:
    """The commits to scrape, newest first, as one `git rev-list` lists them."""
    args = ["rev-list"]
    args += [f"--max-count={max_count}"] if max_count else []
    args += [f"--since={since}"] if since else []
    args += [f"--until={until}"] if until else []
    output = run_git(repo, *args, rev, "--")
    return output.split()


def shallow_boundaries(repo: git.Repo) -> frozenset[str]:
    """Commits where a shallow clone's history was cut (their parents are missing)."""
    path = Path(repo.git_dir) / "shallow"
    return frozenset(path.read_text().split()) if path.exists() else frozenset()


def blob_sizes(repo: git.Repo, blobs: list[str]) -> dict[str, int]:
    """Sizes of the given blobs (bytes) from ONE `git cat-file --batch-check` process."""
    if not blobs:
        return {}
    try:
        with _stdin_with(blobs) as stdin:
            output = repo.git.execute(["git", "cat-file", "--batch-check"], istream=stdin)
    except git.GitCommandError as err:
        raise RepositoryError(f"{_where(repo)}: git cat-file failed: {git_failure(err.stderr)}") from None
    sizes = {}
    for line in output.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[2].isdigit():
            sizes[parts[0]] = int(parts[2])
    return sizes


@contextmanager
def _stdin_with(lines: list[str]) -> Iterator[BinaryIO]:
    """A file holding `lines`, for git's standard input (a pipe could fill before git reads it).
    It may be closed once git has started: the child keeps its own descriptor."""
    with tempfile.TemporaryFile() as handle:
        handle.write("\n".join(lines).encode() + b"\n")
        handle.seek(0)
        yield handle


@contextmanager
def stream_commits(repo: git.Repo, shas: list[str], options: LogOptions) -> Iterator[Iterator[Commit]]:
    """Yield an iterator over exactly these commits, in this order, from ONE `git log -p` process.

    git's stderr is drained on a thread (rename-limit warnings can fill the
    pipe and deadlock both sides); leaving the block before the end kills git.
    """
    nonce = secrets.token_hex(12)
    command = [
        "git",
        "-c",
        f"core.bigFileThreshold={options.big_file_bytes}",  # larger files: "Binary files differ", not a diff
        "log",
        *SAFE_LOG_FLAGS,
        "-p",
        f"-U{options.context_lines}",
        "--full-index",
        "--find-renames",
        f"--diff-merges={'first-parent' if options.merge_diffs else 'off'}",
        f"--format={log_format(nonce)}",
        "--no-walk=unsorted",
        "--stdin",
    ]
    # Keep GitPython's wrapper referenced: its __del__ closes the pipes.
    with _stdin_with(shas) as stdin:
        process = repo.git.execute(command, as_process=True, istream=stdin)
    proc = process.proc
    stderr_tail: list[bytes] = []
    drainer = threading.Thread(target=_drain, args=(proc.stderr, stderr_tail), daemon=True)
    drainer.start()
    reached_end = threading.Event()

    def chunks() -> Iterator[bytes]:
        while chunk := proc.stdout.read1(_READ_SIZE):
            yield chunk
        reached_end.set()

    try:
        yield parse_log(chunks(), nonce, options.max_file_diff_bytes)
    finally:
        if not reached_end.is_set():
            proc.kill()
        proc.stdout.close()
        returncode = proc.wait()
        drainer.join()
        del process
    if reached_end.is_set() and returncode != 0:
        raise RepositoryError(f"{_where(repo)}: git log failed: {git_failure(b''.join(stderr_tail))}")


def _drain(stream, tail: list[bytes], keep: int = 64) -> None:
    for line in stream:
        tail.append(line)
        del tail[:-keep]


def _where(repo: git.Repo) -> str:
    """The repository's path for messages and the manifest: the work tree, or the git dir if bare."""
    return str(Path(repo.git_dir if is_bare(repo) else repo.working_tree_dir).resolve())


def git_failure(stderr: str | bytes | None) -> str:
    """The line of git's stderr that says what went wrong (its `fatal:`/`error:` line, not a hint)."""
    if isinstance(stderr, bytes):
        stderr = stderr.decode("utf-8", "replace")
    lines = [line.strip().removeprefix("stderr: ").strip("' ") for line in (stderr or "").splitlines()]
    lines = [line for line in lines if line]
    causes = [line for line in lines if line.startswith(("fatal:", "error:"))]
    if any("dubious ownership" in line for line in lines):
        return "git refuses a repository owned by another user; if you trust it: git config --global --add safe.directory <path>"
    return (causes or lines or ["unknown error"])[0]

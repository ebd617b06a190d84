"""Open a repository safely and stream its history through ONE `git log -p` process.

Safety: a scraped repository is untrusted. Its `.git/config` and
`.gitattributes` can name programs that git runs on its behalf (an external
diff, textconv filters, an fsmonitor hook that even `git status` runs, a
pager, gpg for signatures, transports for lazy fetches). Every git process we
start through GitPython gets `SAFE_GIT_CONFIG` (`scrapers.safe_git`) as command-line-level config
(through GIT_CONFIG_COUNT, the environment form of `git -c`, which outranks
every config file), so none of them can run; `git log` also gets
`--no-ext-diff --no-textconv --no-color`. The repository is found by git
itself and read only through git commands: GitPython's `Repo` (whose config
parser evaluates `include`/`includeIf` sections, and crashes on some) is
never used, nor its helpers such as `is_dirty()` that would spawn
`git diff`/`git status` on the work tree.
"""

from __future__ import annotations

import re
import secrets
import tempfile
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import git

from scrapers.commit import Commit
from scrapers.errors import RepositoryError
from scrapers.parse import log_format, parse_log
from scrapers.safe_git import SAFE_GIT_ENV, SAFE_LOG_FLAGS

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
    head: str | None
    """None while the branch HEAD names has no commit yet (an unborn HEAD)."""
    branch: str | None
    """None on a detached HEAD."""
    remote_url: str | None
    """`origin` (or the first remote) with any credentials removed."""
    bare: bool
    shallow: bool
    commit_count: int
    """Commits reachable from HEAD."""


@dataclass(frozen=True)
class Repository:
    """A repository opened for reading. git itself finds it (GitPython's own config parser is never used:
    it evaluates `include`/`includeIf` sections, and a repository's config must neither break nor
    steer the scrape), and every git process runs through `git` with the safe settings."""

    git_dir: Path
    """Absolute."""
    work_tree: Path | None
    """None for a bare repository."""
    git: git.Git

    @property
    def path(self) -> str:
        """The repository's path for messages and the manifest: the work tree, or the git dir if bare."""
        return str(self.work_tree or self.git_dir)

    @property
    def common_dir(self) -> Path:
        """Where the config and the shallow list are: a linked work tree's (`git worktree add`) git dir
        names the main one's in its `commondir` file, as git reads it."""
        named = self.git_dir / "commondir"
        return (self.git_dir / named.read_text().strip()).resolve() if named.is_file() else self.git_dir


def open_repository(path: str | Path) -> Repository:
    """Open the repository containing `path`, with every configured program disabled."""
    resolved = Path(path).expanduser().resolve()
    if not resolved.exists():
        raise RepositoryError(f"{path}: no such file or directory")
    start = resolved if resolved.is_dir() else resolved.parent
    work_tree = _work_tree_of(start)
    # git's own discovery still decides (a real repository, one the user's git trusts), but with the work
    # tree given: a `core.worktree` in the repository's config must neither break nor move the scrape.
    runner = git.Git(str(start))
    runner.update_environment(**SAFE_GIT_ENV, **({"GIT_WORK_TREE": str(work_tree)} if work_tree else {}))
    try:
        # One per line, the answer to the second last: the path may hold spaces and newlines.
        git_dir, bare = runner.execute(
            ["git", "rev-parse", "--absolute-git-dir", "--is-bare-repository"], strip_newline_in_stdout=False
        )[:-1].rsplit("\n", 1)
    except git.GitCommandError as err:
        failure = git_failure(err.stderr)
        if "not a git repository" in failure:
            raise RepositoryError(
                f"{path}: not a git repository (run `git init`, or pass the path of a clone)"
            ) from None
        raise RepositoryError(f"{path}: {failure}") from None
    return repository_at(Path(git_dir), None if bare == "true" else work_tree)


def _work_tree_of(start: Path) -> Path | None:
    """The work tree holding `start`, found as git finds it (the nearest directory with a `.git` in it),
    without reading any config; None inside a bare repository."""
    for directory in (start, *start.parents):
        if (directory / ".git").exists():
            return directory
        if all((directory / name).exists() for name in ("HEAD", "objects", "refs")):
            return None  # a git directory itself: a bare repository
    return None


def repository_at(git_dir: Path, work_tree: Path | None) -> Repository:
    """A repository found before (a shard's worker process reopens it this way)."""
    runner = git.Git(str(work_tree or git_dir))
    # GIT_DIR and GIT_WORK_TREE pin every git process to this repository (also a bare clone without a
    # `config` file), whatever its config says.
    pinned = {"GIT_DIR": str(git_dir), **({"GIT_WORK_TREE": str(work_tree)} if work_tree else {})}
    runner.update_environment(**SAFE_GIT_ENV, **pinned)
    return Repository(git_dir, work_tree, runner)


def head_commit(repo: Repository) -> str | None:
    """The commit HEAD points to; None while the branch it names has no commit yet."""
    try:
        return repo.git.execute(["git", "rev-parse", "--verify", "--quiet", "HEAD^{commit}"]).strip() or None
    except git.GitCommandError:
        return None


def describe_repository(repo: Repository, commit_count: int | None = None) -> RepositoryInfo:
    """What the manifest says about the repository; pass `commit_count` when HEAD's history was listed already."""
    head = head_commit(repo)
    try:
        branch = repo.git.execute(["git", "symbolic-ref", "--quiet", "--short", "HEAD"]).strip() or None
    except git.GitCommandError:  # a detached HEAD
        branch = None
    if commit_count is None:
        commit_count = int(run_git(repo, "rev-list", "--count", "HEAD")) if head else 0
    return RepositoryInfo(
        path=repo.path,
        head=head,
        branch=branch,
        remote_url=_remote_url(repo),
        bare=repo.work_tree is None,
        shallow=(repo.common_dir / "shallow").exists(),
        commit_count=commit_count,
    )


def _remote_url(repo: Repository) -> str | None:
    """`origin`'s URL (or the first remote's), from the repository's own config file, includes not
    followed, with credentials removed."""
    try:
        listed = repo.git.execute(
            [
                "git",
                "config",
                "--file",
                str(repo.common_dir / "config"),
                "--no-includes",
                "--get-regexp",
                r"^remote\..*\.url$",
            ]
        )
    except git.GitCommandError:  # no config file, or no remote with a url
        return None
    urls = dict(line.split(" ", 1) for line in listed.splitlines() if " " in line)
    url = urls.get("remote.origin.url") or next(iter(urls.values()), None)
    return strip_credentials(url) if url else None


def strip_credentials(url: str) -> str:
    """A remote URL as the manifest may record it, for every form git accepts: no user info (user,
    password or token), no query string, no fragment; host, port and path kept.

    `scheme://[user[:password]@]host[:port]/path[?query][#fragment]` (https, ssh, git, file, ...);
    scp-like `[user[:password]@]host:path`; a local path is left as it is. A password pasted unencoded
    may hold `@`, `/`, `?` or `#`: the user info runs to the last `@` before a host.
    """
    if "://" in url:
        scheme, rest = url.split("://", 1)
        return f"{scheme}://{re.split(r'[?#]', _after_user_info(rest, '/'), maxsplit=1)[0]}"
    head, _, _ = url.partition("/")
    if ":" not in head:  # a local path (no host before a colon)
        return url
    # scp-like: git passes no query or fragment here, but a token appended to the path as one must not be
    # recorded either.
    return re.split(r"[?#]", _after_user_info(url, ":"), maxsplit=1)[0]


def _after_user_info(rest: str, host_end: str) -> str:
    """`rest` (a URL after its scheme, or an scp-like one) from its host on: where there is user info, from
    after the last `@` that a host follows (then `host_end`, or the end), so that no part of a password
    holding `@`, `/`, `?` or `#` is kept."""
    first = rest.find("@")
    if first < 0:
        return rest
    # An `@` after the path began is the path's (`host/npm/@scope/pkg`), unless a colon before that `/`
    # says a password began (`user:pa/ss@host`); a port's digits say nothing of the kind.
    ahead, slash, _ = rest[:first].partition("/")
    if slash and re.fullmatch(r"[^:]*(?::\d*)?", ahead):
        return rest
    port = ":" if host_end == "/" else ""
    host = re.compile(rf"[\w.\-\[\]{port}]+(?:[{re.escape(host_end)}?#]|$)")
    ats = [at for at, char in enumerate(rest) if char == "@"]
    return rest[next((at for at in reversed(ats) if host.match(rest, at + 1)), ats[-1]) + 1 :]


def run_git(repo: Repository, *args: str) -> str:
    """Run one short git command (never per commit) and return its stripped output."""
    try:
        return repo.git.execute(["git", *args]).strip()
    except git.GitCommandError as err:
        raise RepositoryError(f"{repo.path}: git {args[0]} failed: {git_failure(err.stderr)}") from None


def holds_any(repo: Repository, shas: Iterable[str]) -> bool:
    """Whether `repo` holds one of the commits `shas`: where they are the heads a run trained up to, it is
    that run's project, this clone or another of the same history."""
    for sha in shas:
        try:
            run_git(repo, "cat-file", "-e", f"{sha}^{{commit}}")
        except RepositoryError:
            continue
        return True
    return False


def rev_list(
    repo: Repository, rev: str, max_count: int | None, since: str | None, until: str | None
) -> list[str]:
    """The commits to scrape, newest first, as one `git rev-list` lists them. Any revision the repository
    has works, whatever HEAD points to; HEAD itself needs a commit."""
    if rev == "HEAD" and head_commit(repo) is None:
        raise RepositoryError(
            f"{repo.path}: the repository has no commits yet on its current branch; commit something first, "
            "or name a branch that has commits with --rev"
        )
    args = ["rev-list"]
    args += [f"--max-count={max_count}"] if max_count else []
    args += [f"--since={since}"] if since else []
    args += [f"--until={until}"] if until else []
    try:
        return repo.git.execute(["git", *args, rev, "--"]).split()
    except git.GitCommandError as err:
        failure = git_failure(err.stderr)
        if "bad revision" in failure or "unknown revision" in failure:
            raise RepositoryError(
                f"{repo.path}: --rev {rev}: no such revision or range in this repository "
                "(`git branch -a` and `git tag` list what there is)"
            ) from None
        raise RepositoryError(f"{repo.path}: git rev-list failed: {failure}") from None


def is_ancestor(repo: Repository, older: str, newer: str) -> bool:
    """Whether `older` is in `newer`'s history (False too when the repository no longer has it)."""
    try:
        repo.git.execute(["git", "merge-base", "--is-ancestor", older, newer])
    except git.GitCommandError:  # exit 1: not an ancestor; 128: no such commit
        return False
    return True


def resolved(repo: Repository, rev: str) -> list[str]:
    """The commits a revision or range names right now (a range: both ends), so a scrape can tell
    whether what it would read changed."""
    try:
        return run_git(repo, "rev-parse", rev).split()
    except RepositoryError:
        return []


def shallow_boundaries(repo: Repository) -> frozenset[str]:
    """Commits where a shallow clone's history was cut (their parents are missing)."""
    path = repo.common_dir / "shallow"
    return frozenset(path.read_text().split()) if path.exists() else frozenset()


def missing_blobs(repo: Repository, revisions: list[str]) -> frozenset[str]:
    """The file contents a partial clone (`git clone --filter=blob:limit=…` or `blob:none`) lacks among
    what `revisions` reach; none for a full clone, found without reading its history (a partial clone's
    packs carry a .promisor mark)."""
    if not revisions or not _may_lack_objects(repo):
        return frozenset()
    with _stdin_with(revisions) as stdin:
        listed = _execute(
            repo, ["git", "rev-list", "--objects", "--no-object-names", "--missing=print", "--stdin"], stdin
        )
    return frozenset(line[1:] for line in listed.splitlines() if line.startswith("?"))


def _may_lack_objects(repo: Repository) -> bool:
    """Whether git would take a missing object for one a remote promised, and ask for it: a partial clone's
    packs carry a .promisor mark, and a config can say so alone (`extensions.partialClone`,
    `remote.<name>.promisor`: a hostile repository that deletes an object and names a remote of its own).
    Otherwise a missing object is damage, and git says so without asking anyone."""
    # git names the object directory (a linked work tree shares its main one's) relative to where it ran
    packs = (repo.work_tree or repo.git_dir) / run_git(repo, "rev-parse", "--git-path", "objects/pack")
    if any(packs.glob("*.promisor")):
        return True
    try:  # the config as git reads it, includes and all
        repo.git.execute(
            ["git", "config", "--get-regexp", r"^(extensions\.partialclone|remote\..*\.promisor)$"]
        )
    except git.GitCommandError:  # exit 1: neither is set
        return False
    return True


def lacking_content(repo: Repository, shas: list[str], merge_diffs: bool) -> frozenset[str]:
    """The commits among `shas` whose diff needs a file's content that a partial clone does not hold
    (`missing_blobs`). `git log -p` would stop at the first of them ("unable to read"), and the scrape
    never lets it fetch (GIT_ALLOW_PROTOCOL)."""
    missing = missing_blobs(repo, shas)
    if not missing:
        return frozenset()
    # Which commits' diffs name a missing blob: their raw diffs, read without renames (finding an inexact
    # rename would read the very contents that are missing) and with the merges diffed as the scrape does.
    merges = f"--diff-merges={'first-parent' if merge_diffs else 'off'}"
    command = [
        "git",
        "log",
        "--raw",
        "--no-abbrev",
        "--no-renames",
        merges,
        "--format=%H",
        "--no-walk=unsorted",
        "--stdin",
    ]
    with _stdin_with(shas) as stdin:
        logged = _execute(repo, command, stdin)
    lacking, commit = set(), ""
    for line in logged.splitlines():
        if line.startswith(":"):  # ":100644 100644 <old blob> <new blob> M\tpath"
            if missing.intersection(line.split(maxsplit=4)[2:4]):
                lacking.add(commit)
        elif line:
            commit = line
    return frozenset(lacking)


def _execute(repo: Repository, command: list[str], stdin: BinaryIO) -> str:
    try:
        return repo.git.execute(command, istream=stdin)
    except git.GitCommandError as err:
        raise RepositoryError(f"{repo.path}: git {command[1]} failed: {git_failure(err.stderr)}") from None


def blob_sizes(repo: Repository, blobs: list[str]) -> dict[str, int]:
    """Sizes of the given blobs (bytes) from ONE `git cat-file --batch-check` process."""
    if not blobs:
        return {}
    with _stdin_with(blobs) as stdin:
        output = _execute(repo, ["git", "cat-file", "--batch-check"], stdin)
    sizes = {}
    for line in output.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[2].isdigit():
            sizes[parts[0]] = int(parts[2])
    return sizes


def blob_contents(repo: Repository, blobs: list[str], max_bytes: int) -> dict[str, bytes]:
    """The given blobs' bytes, those git holds up to `max_bytes` each, from the repository's two
    persistent `git cat-file` processes (a process for each commit cost a scrape seconds)."""
    contents = {}
    for blob in blobs:
        try:
            if repo.git.get_object_header(blob)[2] <= max_bytes:
                contents[blob] = repo.git.get_object_data(blob)[3]
        except (ValueError, OSError):
            continue  # not held (a partial clone's blob): what needs it stays as git diffed it
    return contents


@contextmanager
def _stdin_with(lines: list[str]) -> Iterator[BinaryIO]:
    """A file holding `lines`, for git's standard input (a pipe could fill before git reads it).
    It may be closed once git has started: the child keeps its own descriptor."""
    with tempfile.TemporaryFile() as handle:
        handle.write("\n".join(lines).encode() + b"\n")
        handle.seek(0)
        yield handle


@contextmanager
def stream_commits(repo: Repository, shas: list[str], options: LogOptions) -> Iterator[Iterator[Commit]]:
    """Yield an iterator over exactly these commits, in this order, from ONE `git log -p` process.

    git's stderr is drained on a thread (rename-limit warnings can fill the
    pipe and deadlock both sides); leaving the block before the end kills git.
    """
    if not shas:  # given nothing on its standard input, git log would log HEAD
        yield iter(())
        return
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
        raise RepositoryError(f"{repo.path}: git log failed: {git_failure(b''.join(stderr_tail))}")


def _drain(stream, tail: list[bytes], keep: int = 64) -> None:
    for line in stream:
        tail.append(line)
        del tail[:-keep]


def git_failure(stderr: str | bytes | None) -> str:
    """The line of git's stderr that says what went wrong (its `fatal:`/`error:` line, not a hint)."""
    if isinstance(stderr, bytes):
        stderr = stderr.decode("utf-8", "replace")
    text = (stderr or "").strip()
    if text.startswith("stderr: '") and text.endswith("'"):  # how GitPython quotes a command's stderr
        text = text[len("stderr: '") : -1]
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    causes = [line for line in lines if line.startswith(("fatal:", "error:"))]
    if any("dubious ownership" in line for line in lines):
        # git's own hint names the path as git saw it, ready to paste
        told = [line for line in lines if line.startswith("git config --global --add safe.directory")]
        fix = told[0] if told else "git config --global --add safe.directory <path>"
        return f"git refuses a repository owned by another user; if you trust it: {fix}"
    return (causes or lines or ["unknown error"])[0]

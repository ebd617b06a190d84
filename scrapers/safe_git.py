"""The settings every git process the project starts runs with, whatever the repository's or the user's
config says: no program the repository configures runs, and diffs come out as the scraper parses them.
Apart from `scrapers.git` (which imports GitPython), so that the commit hook reads its staged diff with
them without importing it."""

import os
import re
import shutil
import subprocess
from typing import Any

SAFE_GIT_CONFIG = {
    "core.fsmonitor": "false",  # `core.fsmonitor=<program>` runs on every work-tree scan
    "core.hooksPath": os.devnull,  # no hooks from the repository
    "core.pager": "cat",
    "log.showSignature": "false",  # signature checks would run gpg.program
    "protocol.allow": "never",  # no transport (GIT_ALLOW_PROTOCOL below makes sure of it)
    "diff.noprefix": "false",  # the parser relies on a/ and b/ prefixes
    "diff.mnemonicPrefix": "false",
    "diff.srcPrefix": "a/",  # git 2.45 and later read these two; earlier ones ignore them
    "diff.dstPrefix": "b/",
    "diff.relative": "false",
    "core.quotePath": "false",  # non-ASCII paths as UTF-8, not octal escapes
    "i18n.logOutputEncoding": "UTF-8",  # messages re-encoded from their encoding header
    "color.ui": "false",
    # What the repository's config could otherwise change in the diffs the parser reads.
    "diff.submodule": "short",  # gitlinks as commit ids, not logs of the submodule
    "diff.algorithm": "myers",
    "diff.indentHeuristic": "true",  # false moves hunks' edges (379 lines of flask's newest 300 diffs)
    "diff.renameLimit": "1000",  # git's default; 1 reads a renamed file as deleted and added
    "diff.interHunkContext": "0",
    "diff.ignoreSubmodules": "none",
    "diff.suppressBlankEmpty": "false",
    "diff.orderFile": os.devnull,  # an order file would move which files come first, and so survive a cut
    "log.showRoot": "true",  # false would read the first commit without its diff
    "core.attributesFile": os.devnull,
    # Transports are closed by GIT_ALLOW_PROTOCOL below; these are the programs one would run, closed too in
    # case a git process ever opens one: a repository's own ssh command, password prompt and credential
    # helpers (an empty helper value empties git's list of them).
    "core.sshCommand": "false",
    "core.askPass": "",
    "credential.helper": "",
}


def _as_environment(config: dict[str, str]) -> dict[str, str]:
    """Command-line-level config (`git -c`) as the environment passes it to every git process."""
    return {
        "GIT_CONFIG_COUNT": str(len(config)),
        **{f"GIT_CONFIG_KEY_{i}": key for i, key in enumerate(config)},
        **{f"GIT_CONFIG_VALUE_{i}": value for i, value in enumerate(config.values())},
    }


SAFE_GIT_ENV = {
    **_as_environment(SAFE_GIT_CONFIG),
    "GIT_PAGER": "cat",
    "GIT_TERMINAL_PROMPT": "0",
    "GIT_OPTIONAL_LOCKS": "0",  # reading must not take locks or refresh the user's index
    "GIT_EXTERNAL_DIFF": "",
    # No transport at all, whatever any config says: `protocol.allow=never` above loses to a repository's own
    # `protocol.<name>.allow=always`, so a partial clone missing an object would fetch it through the remote
    # it names (`ext::<command>`, a local path with `remote.<name>.uploadpack=<program>`, ssh with
    # `core.sshCommand`) and run that program. An allow-list naming no protocol outranks every config.
    "GIT_ALLOW_PROTOCOL": "",
    "GIT_NO_LAZY_FETCH": "1",  # git 2.44 and later: a missing object is not even asked for
    # Fully buffered output even into a pipe: by default git flushes after every commit it lists
    # or logs, and each flush wakes the reader.
    "GIT_FLUSH": "0",
}
SAFE_LOG_FLAGS = ("--no-ext-diff", "--no-textconv", "--no-color", "--no-show-signature", "--encoding=UTF-8")
# The variables through which a process inherits a repository rather than finding it (`git rev-parse
# --local-env-vars`, git 2.39): git sets GIT_DIR and GIT_INDEX_FILE for its hooks and aliases, and with
# them in the environment `--repo PATH` would read another repository's history under PATH's name.
LOCAL_GIT_ENV = (
    "GIT_ALTERNATE_OBJECT_DIRECTORIES", "GIT_CONFIG", "GIT_CONFIG_PARAMETERS", "GIT_CONFIG_COUNT",
    "GIT_OBJECT_DIRECTORY", "GIT_DIR", "GIT_WORK_TREE", "GIT_IMPLICIT_WORK_TREE", "GIT_GRAFT_FILE",
    "GIT_INDEX_FILE", "GIT_NO_REPLACE_OBJECTS", "GIT_REPLACE_REF_BASE", "GIT_PREFIX",
    "GIT_INTERNAL_SUPER_PREFIX", "GIT_SHALLOW_FILE", "GIT_COMMON_DIR",
)  # fmt: skip


def safe_env(reading: tuple[str, ...] = ()) -> dict[str, str]:
    """This process's environment with SAFE_GIT_ENV over it: for any git process started without GitPython.
    `reading`: settings of SAFE_GIT_CONFIG the process reads as the repository has them, to say where (the
    hook's installer asks where `core.hooksPath` points); a process that runs what one names never gets it."""
    kept = {key: value for key, value in SAFE_GIT_CONFIG.items() if key not in reading}
    return {**os.environ, **SAFE_GIT_ENV, **_as_environment(kept)}


def run_safe_git(
    args: list[str], reading: tuple[str, ...] = (), **options: Any
) -> subprocess.CompletedProcess:
    """`git ARGS` with SAFE_GIT_ENV (and `subprocess.run`'s `options`): how every git process the project
    starts outside `scrapers.git` runs, whichever repository it is in (the hook's is the user's own)."""
    return subprocess.run(["git", *args], env=safe_env(reading), **options)


def forget_inherited_repository() -> None:
    """Leave the repository to `--repo`: no git variable this process inherited names one instead. Not
    for the commit hook, whose staged change is the one GIT_DIR and GIT_INDEX_FILE name."""
    for name in LOCAL_GIT_ENV:
        os.environ.pop(name, None)


# GIT_CONFIG_COUNT, through which SAFE_GIT_CONFIG reaches every git process, and `--diff-merges` came in
# git 2.31 (March 2021); an older git would ignore the first without a word.
OLDEST_GIT = (2, 31)


def git_problem() -> str | None:
    """Why the git on PATH cannot read a repository for repotune (missing, or older than OLDEST_GIT), as
    one line that says what to do; None when it can."""
    if shutil.which("git") is None:
        return (
            "git is not installed, or not on PATH: repotune reads the repository through it "
            "(install git, e.g. `apt install git`, then run this again)"
        )
    said = run_safe_git(["--version"], capture_output=True, text=True, check=False).stdout.strip()
    found = re.search(r"(\d+)\.(\d+)", said)
    if found and (int(found[1]), int(found[2])) < OLDEST_GIT:
        oldest = ".".join(map(str, OLDEST_GIT))
        return (
            f"{said} is older than git {oldest}, the oldest that repotune's safety settings reach "
            "(install a newer git, e.g. from your distribution's backports, then run this again)"
        )
    return None

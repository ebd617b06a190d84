"""The exceptions the CLI turns into one line on stderr and an exit code.

Anything else that escapes is a bug: the CLI reports it as an internal error.
"""

import errno
import os
import shutil
from pathlib import Path

from scrapers.errors import ScrapeError


class PipelineError(Exception):
    """A problem the user can fix; its message names what is wrong and how to fix it."""

    exit_code = 2


class ConfigError(PipelineError):
    """The config file or a `--set` override is invalid."""


class OutputDirError(PipelineError):
    """The output directory cannot be created or written."""


class DiskFull(OutputDirError):
    """A write failed on a full disk (or quota): `happened` says where and what is free there, `fix` what to
    do; the message is both."""

    def __init__(self, happened: str, fix: str) -> None:
        super().__init__(f"{happened}; {fix}")
        self.happened, self.fix = happened, fix


class ModelLoadError(PipelineError):
    """The base model or its tokenizer cannot be loaded."""


class ExportError(PipelineError):
    """A model that cannot be written as asked (an architecture or tokenizer GGUF cannot hold, a bad
    destination)."""


class TrainingError(PipelineError):
    """Training cannot start or cannot go on (no data, a diverged loss)."""

    exit_code = 1


class Interrupted(PipelineError):
    """One of `signals.stop_signals`. `checkpointed`: training saved a checkpoint and its message says how to resume;
    `partial` is what training did until then (recorded in the manifest)."""

    def __init__(self, message: str, signum: int, checkpointed: bool = False, partial=None):
        super().__init__(message)
        # The shell's convention: 130 for SIGINT, 143 for SIGTERM, 129 for SIGHUP.
        self.exit_code = 128 + signum
        self.checkpointed = checkpointed
        self.partial = partial


USER_ERRORS = (PipelineError, ScrapeError)
"""What the user can fix: the scraper's errors (a repository that cannot be read) and the pipeline's."""


def one_line(err: Exception) -> str:
    """An error's message on one line, as a PipelineError's should be (transformers' and peft's often run
    over several: the first alone can end in "from one of:"), at most 400 characters."""
    said = " ".join(str(err).split()) or type(err).__name__
    return said if len(said) <= 400 else said[:399] + "…"


FULL_DISK_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
FULL_DISK_FREE = 64 * 2**20
"""Bytes free under which a failed write is taken for a full disk: torch's writer says only "unexpected
pos" and gguf's "Not enough free space to write …", where safetensors and Python name the errno."""


def disk_full(err: Exception, places: dict[str, Path]) -> DiskFull | None:
    """The error for the user where `err` came of a full disk, naming the folder (the one the error names,
    or the place among `places`, option → path, that is full), what is free there and the option to change;
    None where it is something else."""
    chain: list[BaseException] = []
    cause: BaseException | None = err
    while cause is not None and cause not in chain:
        chain.append(cause)
        cause = cause.__cause__ or cause.__context__
    said = [
        cause
        for cause in chain
        if (isinstance(cause, OSError) and cause.errno in FULL_DISK_ERRNOS)
        or any(os.strerror(number) in str(cause) for number in FULL_DISK_ERRNOS)
    ]
    named = next((cause.filename for cause in said if isinstance(cause, OSError) and cause.filename), None)
    candidates: list[tuple[Path, str | None]] = [(Path(named).absolute(), None)] if named else []
    candidates += [(path.absolute(), option) for option, path in places.items()]
    for where, option in candidates:
        while not where.exists() and where != where.parent:
            where = where.parent
        try:
            free = shutil.disk_usage(where).free
        except OSError:
            continue
        if said or free < FULL_DISK_FREE:
            # Another place helps where the full one is the option's (not the cache's, say).
            option = option or next(
                (o for o, path in places.items() if where.is_relative_to(path.absolute())), None
            )
            return DiskFull(
                f"the disk holding {where} ran out of space ({free / 2**20:.0f} MB free now): a write failed "
                f"({type(err).__name__}: {one_line(err)})",
                f"free some space there{f', or give another {option}' if option else ''}",
            )
    return None

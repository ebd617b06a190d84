"""The exceptions the CLI turns into one line on stderr and an exit code.

Anything else that escapes is a bug: the CLI reports it as an internal error.
"""

from scrapers.errors import ScrapeError


class PipelineError(Exception):
    """A problem the user can fix; its message names what is wrong and how to fix it."""

    exit_code = 2


class ConfigError(PipelineError):
    """The config file or a `--set` override is invalid."""


class OutputDirError(PipelineError):
    """The output directory cannot be created or written."""


class ModelLoadError(PipelineError):
    """The base model or its tokenizer cannot be loaded."""


class ExportError(PipelineError):
    """A model that cannot be written as asked (an architecture or tokenizer GGUF cannot hold, a bad
    destination)."""


class TrainingError(PipelineError):
    """Training cannot start or cannot go on (no data, a diverged loss)."""

    exit_code = 1


class Interrupted(PipelineError):
    """SIGINT or SIGTERM. `checkpointed`: training saved a checkpoint and its message says how to resume;
    `partial` is what training did until then (recorded in the manifest)."""

    def __init__(self, message: str, signum: int, checkpointed: bool = False, partial=None):
        super().__init__(message)
        self.exit_code = 128 + signum  # the shell's convention: 130 for SIGINT, 143 for SIGTERM
        self.checkpointed = checkpointed
        self.partial = partial


USER_ERRORS = (PipelineError, ScrapeError)
"""What the user can fix: the scraper's errors (a repository that cannot be read) and the pipeline's."""


def one_line(err: Exception) -> str:
    """An error's message on one line, as a PipelineError's should be (transformers' and peft's often run
    over several: the first alone can end in "from one of:"), at most 400 characters."""
    said = " ".join(str(err).split()) or type(err).__name__
    return said if len(said) <= 400 else said[:399] + "…"

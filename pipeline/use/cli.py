"""Command-line parsing and error reporting; imports nothing heavy so `--help` is instant."""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from pipeline.config import SHIPPED_CONFIG_PATH, LoadedConfig, load_config
from pipeline.errors import USER_ERRORS, PipelineError, disk_full
from pipeline.manifest import tool_info
from pipeline.progress import printable
from pipeline.use.hook import ALTERNATIVES
from scrapers.safe_git import git_problem

DEFAULT_COMMAND = "run"
DESCRIPTION = "Fine-tune a code language model (LoRA) on a git repository's own history."


@dataclass(frozen=True)
class Command:
    handler: Callable[[argparse.Namespace], int | None]
    help: str
    options: Callable[[argparse.ArgumentParser], None] | None = None
    """Adds the command's own options."""
    shared_options: bool = True
    """Takes the shared options (--repo, --output-dir, --config, --set, ...)."""
    needs_repo: bool = True
    """--repo is required (an update takes its parent's repository by default)."""
    needs_git: bool = False
    """Reads a repository through git: where git cannot (`git_problem`), the command says so in one line."""
    chooses_commits: bool = True
    """Takes --max-commits, --rev, --since and --until (an update reads the commits since its parent)."""


def build_parser(commands: dict[str, Command]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="repotune",
        description=DESCRIPTION,
        epilog=f"`{DEFAULT_COMMAND}` is the default: `repotune --repo PATH` trains. "
        "`repotune COMMAND --help` shows a command's options. (`python run_pipeline.py …` is the same "
        "command, from a checkout.)",
    )
    parser.add_argument("--version", action=_Version, help="print repotune's version (and commit) and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, command in commands.items():
        command_parser = sub.add_parser(name, help=command.help, description=command.help)
        if command.shared_options:
            _add_common_options(command_parser, command.chooses_commits)
        if command.options:
            command.options(command_parser)
    return parser


class _Version(argparse.Action):
    """`--version`: the installed version and, from a checkout, its commit (as the manifest's `tool`)."""

    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest, nargs=0, **kwargs)

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: Any = None,
    ) -> NoReturn:
        tool = tool_info()
        commit = f" (commit {tool['git_sha'][:12]})" if tool["git_sha"] else ""
        print(f"repotune {tool['version'] or 'not installed'}{commit}")
        parser.exit()


def _add_common_options(parser: argparse.ArgumentParser, chooses_commits: bool) -> None:
    parser.add_argument(
        "--repo",
        dest="repos",
        action="append",
        default=[],
        metavar="PATH",
        help="a git repository to learn from (repeat for several; sequences are tagged by repository)",
    )
    parser.add_argument(
        "--repos-file",
        type=Path,
        metavar="FILE",
        help="a file listing repositories, one path per line (# comments)",
    )
    parser.add_argument(
        "--output-dir",
        metavar="DIR",
        help="where sequences, checkpoints, adapter and MANIFEST.json go (output.dir)",
    )
    parser.add_argument(
        "--config",
        type=Path,
        metavar="FILE",
        help=f"training config YAML (default: {SHIPPED_CONFIG_PATH.name})",
    )
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="override one config value, e.g. --set train.epochs=1 (repeatable)",
    )
    parser.add_argument(
        "--model",
        help="base model: smollm2-135m (pretrained, no download; the default), tiny (random), "
        "a Hugging Face id, or a local path",
    )
    if chooses_commits:
        parser.add_argument("--max-commits", type=int, metavar="N", help="read at most the N newest commits")
        parser.add_argument(
            "--rev", metavar="REV", help="revision or range to read, e.g. v1.0..main (default HEAD)"
        )
        parser.add_argument(
            "--since", metavar="DATE", help="only commits after this date (as git log --since)"
        )
        parser.add_argument("--until", metavar="DATE", help="only commits before this date")
    parser.add_argument(
        "--budget",
        metavar="DURATION",
        help="bound the run to this wall-clock time (training gets what scraping, loading and scoring "
        "leave), e.g. 10m, 90s, 1h, or none (train.time_budget; default: 10m on a CPU, none on a GPU)",
    )


def hardware_profile_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--hardware-profile",
        metavar="FILE",
        help="plan for a described machine instead of this one: a JSON file, or a shipped profile name "
        "(cpu-laptop, rtx2060, rtx4090, a100-80gb, h100-80gb, 8xh100)",
    )


def update_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--from",
        dest="parent",
        required=True,
        metavar="OUTPUT_DIR",
        help="the run to continue: its adapter trains on the commits made since its HEAD (--repo defaults "
        "to its repository, --output-dir to OUTPUT_DIR-update-<new HEAD>)",
    )


def resume_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--resume",
        action="store_true",
        help="continue from the newest checkpoint in the output directory (same data, batch and total steps)",
    )


def adapter_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--adapter", required=True, metavar="DIR", help="a run's output directory, or its adapter/"
    )


def generate_options(parser: argparse.ArgumentParser) -> None:
    adapter_option(parser)
    parser.add_argument(
        "--prompt",
        default="",
        help="text to continue, or with --task what to answer (a diff, or a commit message); - reads stdin",
    )
    parser.add_argument(
        "--task",
        choices=["message", "diff", "code", "block"],
        help="ask as training did: `message` writes the commit message for the diff in --prompt, "
        "`diff` writes the change for the commit message in --prompt, `code` the next line after the "
        "file's text up to the cursor in --prompt (with --path), as the code scoreboard asks it, `block` "
        "the body under the line --prompt ends with (a function's, a loop's), as the scoreboard's blocks",
    )
    parser.add_argument(
        "--path",
        default="",
        metavar="FILE",
        help="with --task code or block: the file's path in the repository (its name says the language)",
    )
    parser.add_argument(
        "--after",
        default="",
        metavar="TEXT",
        help="with --task code or block: the file's text after the cursor, read where the model has "
        "fill-in-the-middle tokens or the system reads retrieved context (said where it is not read)",
    )
    parser.add_argument(
        "--system",
        choices=["lookup", "selector", "model", "model-context", "base-context", "base"],
        help="who answers (default: the system the run chose on its validation commits). With --task "
        "message (MANIFEST.json .training_report.evaluation.system): lookup, the message of the most "
        "similar past commit; selector, the selector's choice among the similar past commits' messages and "
        "the diff's changelog entry; model, the fine-tuned model. With --task code (.code_system): "
        "model-context or base-context, the fine-tuned or the base model given chunks of other files; model "
        "or base, either without them; lookup, the line after the most similar lines elsewhere (--task block "
        "too)",
    )
    parser.add_argument(
        "--max-new-tokens",
        type=int,
        metavar="N",
        help="tokens to generate (default: as many as the scoreboard let the model write, 48 for --task "
        "message, 32 for code and 96 for block; else 128)",
    )
    parser.add_argument(
        "--alternatives",
        type=int,
        default=0,
        metavar="N",
        help="with --task message: also print the next N best messages from the repository's past, as the "
        "commit hook shows them (commented out with #: for reading, not for git commit -F)",
    )
    parser.add_argument(
        "--merge",
        metavar="DIR",
        help="instead of generating, write the base model with the adapter merged in",
    )


def export_options(parser: argparse.ArgumentParser) -> None:
    adapter_option(parser)
    parser.add_argument(
        "--output",
        required=True,
        metavar="FILE.gguf",
        help="the GGUF file to write (a Modelfile goes beside it)",
    )
    parser.add_argument(
        "--type",
        dest="gguf_type",
        choices=["f16", "q8_0"],
        default="f16",
        help="weight type: f16 (the merged weights; default) or q8_0 (half the size)",
    )
    parser.add_argument(
        "--name", metavar="NAME", help="the model's name in Ollama (default: repotune-<repository>)"
    )
    parser.add_argument(
        "--adapter-only",
        action="store_true",
        help="write the adapter alone as a LoRA GGUF (megabytes) and its base beside it, once for every "
        "adapter of that base exported to the folder (Ollama's FROM + ADAPTER, llama.cpp's --lora)",
    )


def serve_options(parser: argparse.ArgumentParser) -> None:
    adapter_option(parser)
    parser.add_argument(
        "--host",
        default="127.0.0.1",
        help="the interface to listen on (default 127.0.0.1: this machine only; another says so)",
    )
    parser.add_argument(
        "--port", type=int, default=8421, help="the port to listen on (default 8421; 0: any free one)"
    )
    parser.add_argument(
        "--name", metavar="NAME", help="the model's name in the API (default: repotune-<repository>)"
    )


def hook_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=["install", "uninstall"], help="install or remove the hook")
    parser.add_argument(
        "--repo", required=True, metavar="PATH", help="the repository whose commits get suggestions"
    )
    parser.add_argument(
        "--adapter", metavar="DIR", help="install: a run's output directory, or its adapter/ (required)"
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=5.0,
        metavar="SECONDS",
        help="install: give up on a suggestion after this long and leave the message as git had it (default 5)",
    )
    parser.add_argument(
        "--alternatives",
        type=int,
        default=ALTERNATIVES,
        metavar="N",
        help="install: show the next N best messages below the suggestion, commented out so that git drops "
        f"them unless you use one (default {ALTERNATIVES}; 0 shows none)",
    )


def diff_options(parser: argparse.ArgumentParser) -> None:
    where = parser.add_mutually_exclusive_group()  # as `runs_options`
    where.add_argument(
        "before",
        metavar="BEFORE",
        nargs="?",
        default=argparse.SUPPRESS,
        help="a run's MANIFEST.json, or its output directory (alone: the newest two runs that directory "
        "keeps that read a history; neither: those of the configured output directory, repotune-output/)",
    )
    where.add_argument(
        "--output-dir", dest="before", metavar="DIR", help="the newest two runs DIR keeps, as a run names it"
    )
    parser.add_argument("after", metavar="AFTER", nargs="?", help="the other run's, to compare with it")
    parser.add_argument(
        "--all",
        action="store_true",
        help="show every difference, not only params and metrics (timings, hardware, outputs, reasons, ...)",
    )
    parser.add_argument("--unchanged", action="store_true", help="show unchanged values too")
    parser.add_argument("--md", action="store_true", help="print Markdown tables (for a pull request)")
    parser.add_argument("--json", action="store_true", help="print {changes: [...], counts: {...}} as JSON")
    parser.add_argument(
        "--include-volatile",
        action="store_true",
        help="also compare run ids, timestamps, absolute paths and raw series",
    )
    parser.add_argument(
        "--only",
        action="append",
        default=[],
        metavar="GLOB",
        help="only paths matching, e.g. 'training_parameters.*'",
    )
    parser.add_argument(
        "--ignore", action="append", default=[], metavar="GLOB", help="leave out paths matching"
    )
    parser.add_argument(
        "--fail-if",
        action="append",
        default=[],
        metavar="COND",
        help="a gate: 'PATH>+5%%' (relative change), 'PATH>+0.1' (change), 'PATH>0.5' (new value); with it the "
        "exit code is 1 where a condition holds, 0 where none does, 2 an error (without it: 0 identical, 1 "
        "different, 2 an error)",
    )


def runs_options(parser: argparse.ArgumentParser) -> None:
    # Named as every other command names it, or given alone: one or the other (SUPPRESS keeps an absent
    # OUTPUT_DIR from writing None over --output-dir's value).
    where = parser.add_mutually_exclusive_group()
    where.add_argument(
        "output_dir",
        metavar="OUTPUT_DIR",
        nargs="?",
        default=argparse.SUPPRESS,
        help="the output directory whose runs to list (default: the configured one, repotune-output/)",
    )
    where.add_argument("--output-dir", dest="output_dir", metavar="DIR", help="the same, as a run names it")
    parser.add_argument(
        "--only-changed", action="store_true", help="only the columns whose values differ between the runs"
    )


def report_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "manifests",
        nargs="+",
        metavar="RUN",
        help="one run's MANIFEST.json (or its output directory), or several to compare",
    )
    parser.add_argument(
        "-o",
        "--output",
        metavar="FILE",
        help="where to write the page (default: report.html beside one manifest, compare.html here for several)",
    )
    parser.add_argument(
        "--name",
        dest="names",
        action="append",
        default=[],
        help="what to call each compared run, in order (default: its output directory's name)",
    )


def monitor_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--duration", type=float, metavar="SECONDS", help="stop after this long (default: until Ctrl-C)"
    )
    parser.add_argument(
        "--interval",
        type=float,
        metavar="SECONDS",
        help="seconds between samples (default: monitor.collection_interval_seconds)",
    )
    parser.add_argument(
        "--output",
        type=Path,
        default=Path("monitor.json"),
        metavar="FILE",
        help="the JSON report (default monitor.json)",
    )
    parser.add_argument(
        "--pid", type=int, metavar="PID", help="also follow this process's CPU and memory; stop when it exits"
    )


def parse_args(argv: list[str], commands: dict[str, Command]) -> argparse.Namespace:
    """Parse argv; a first argument that is an option (not -h or --version) means the default command."""
    typed = list(argv)
    if argv and argv[0].startswith("-") and argv[0] not in ("-h", "--help", "--version"):
        argv = [DEFAULT_COMMAND, *argv]
    parser = build_parser(commands)
    if not argv:
        parser.print_help(sys.stderr)
        raise SystemExit(2)
    args = parser.parse_args(argv)
    args.argv = typed  # recorded in the manifest: the command line as the user typed it
    if hasattr(args, "repos"):
        args.repos = [*args.repos, *_repos_from_file(args.repos_file)] if args.repos_file else args.repos
        if not args.repos and commands[args.command].needs_repo:
            refuse("give --repo PATH (repeatable) or --repos-file FILE")
    if problem := _not_utf8(args):
        refuse(problem)
    return args


def refuse(problem: str) -> NoReturn:
    """Stop before any work, as an error a run meets is said: one line, exit 2."""
    print(f"repotune: error: {printable(problem)}", file=sys.stderr)
    raise SystemExit(2)


def as_text(given: str) -> str:
    """An argument or stdin as UTF-8 text, as the scrape decodes the history: bytes that are not UTF-8 (a
    Latin-1 file's lines in a staged diff), which Python hands over as lone surrogates, become U+FFFD."""
    return given.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def _not_utf8(args: argparse.Namespace) -> str | None:
    """What to say of an argument that is not UTF-8 (a folder named in Latin-1: Python holds its bytes as
    lone surrogates, which a JSON manifest cannot hold, and the run ended in an internal error); None when
    each is. A prompt (or the text after the cursor) is not asked: `generate` reads one as the scrape reads
    a diff (`as_text`). (The command line as typed, `argv`, holds nothing else that a parsed value does
    not.)"""
    for name, value in vars(args).items():
        for given in value if isinstance(value, list) else [value]:
            text = str(given) if isinstance(given, str | Path) else ""
            if name not in ("prompt", "after", "argv") and as_text(text) != text:
                shown = text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
                return (
                    f"{shown}: not UTF-8, and repotune records what it is given in JSON, which holds UTF-8 "
                    "alone: rename it, or link to it from a UTF-8 name (ln -s)"
                )
    return None


def _repos_from_file(path: Path) -> list[str]:
    """The repositories a --repos-file lists, one a line. `#` begins a comment, on a line of its own or
    after a space; a relative path is read from the file's folder, wherever the command runs (the list
    is kept beside the repositories it names, and once resolved against the working directory)."""
    try:
        # A path that is not UTF-8 is read as the command line reads one, and refused as one (`_not_utf8`).
        lines = path.read_text(encoding="utf-8", errors="surrogateescape").splitlines()
    except OSError as err:
        refuse(f"--repos-file {path}: {err.strerror or err}")
    entries = (re.split(r"(?:^|\s)#", line, maxsplit=1)[0].strip() for line in lines)
    return [str(path.expanduser().parent / Path(entry).expanduser()) for entry in entries if entry]


def loaded_config(args: argparse.Namespace) -> LoadedConfig:
    """The config file, then --set overrides, then the dedicated flags (typed as given, not re-parsed)."""
    return load_config(args.config, args.overrides, command_flags(args))


def command_flags(args: argparse.Namespace) -> dict[str, Any]:
    """The dedicated flags the user gave, as `section.key` → value."""
    flags: dict[str, Any] = {
        "output.dir": args.output_dir,
        "train.model": args.model,
        "scrape.max_commits": getattr(args, "max_commits", None),  # not an update's: it reads what is new
        "scrape.rev": getattr(args, "rev", None),
        "scrape.since": getattr(args, "since", None),
        "scrape.until": getattr(args, "until", None),
        "train.time_budget": args.budget,
    }
    return {key: value for key, value in flags.items() if value is not None}


def written_places(args: argparse.Namespace) -> dict[str, Path]:
    """Where the command writes, by the option that says so (a run's default output directory is its
    record's to name: `pipeline.record.run`)."""
    return {
        option: Path(value)
        for option, value in (
            ("--output-dir", getattr(args, "output_dir", None)),
            ("--output", getattr(args, "output", None)),
            ("--merge", getattr(args, "merge", None)),
        )
        if value
    }


SILENT_RANK_GRACE_S = 2.0  # how long a silent rank waits before failing, so rank 0 is heard


def run_command(command: Command, args: argparse.Namespace) -> int:
    """Run a command; an error the user can fix becomes one line on stderr and its exit code."""
    # Under torchrun every rank fails alike; only rank 0 says so, so the user reads one line.
    speaks = os.environ.get("RANK", "0") == "0"
    try:
        # Before GitPython's own check, which fails at its import with twenty lines about its settings.
        if command.needs_git and (problem := git_problem()):
            raise PipelineError(problem)
        return command.handler(args) or 0
    except BrokenPipeError:
        # The reader went away (`... | head`): what it wanted it has. Quietly, and for good: the
        # interpreter flushes stdout again at exit, into the same closed pipe.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except USER_ERRORS as err:
        if speaks:
            print(f"repotune: error: {printable(str(err))}", file=sys.stderr)
        else:  # torchrun stops every rank once one fails: let rank 0 say why before this one does
            time.sleep(SILENT_RANK_GRACE_S)
        return err.exit_code
    except KeyboardInterrupt:
        if speaks:
            print("repotune: interrupted", file=sys.stderr)
        return 130
    except Exception as err:
        if full := disk_full(err, written_places(args)):  # export's GGUF, generate --merge, monitor's report
            if speaks:
                print(f"repotune: error: {printable(str(full))}", file=sys.stderr)
            return full.exit_code
        if os.environ.get("REPOTUNE_DEBUG"):
            traceback.print_exc()
        if speaks:
            print(
                f"repotune: internal error: {type(err).__name__}: {printable(str(err))} (a bug; REPOTUNE_DEBUG=1 "
                "shows the traceback)",
                file=sys.stderr,
            )
        return 1

"""What the take-home commands print: a trained adapter used, exported, hooked, compared, reported on, and
the machine watched. The entry point names them; the work is in the modules beside this one."""

from __future__ import annotations

import sys
from pathlib import Path
from shlex import quote

from pipeline.config import load_config
from pipeline.errors import PipelineError
from pipeline.manifest import manifest_file
from pipeline.progress import say, shown
from pipeline.record.history import newest_two, runs_table
from pipeline.use import generate as generation
from pipeline.use import hook as commit_hook
from pipeline.use.cli import as_text
from pipeline.use.diff import run_diff
from pipeline.use.export import export as write_gguf
from pipeline.use.report import write_report
from pipeline.use.watch import fitted_interval, format_summary, watch


def generate(
    adapter: str, prompt: str, task: str, system: str | None, max_new_tokens: int | None, alternatives: int,
    path: str = "", after: str = "",
) -> None:  # fmt: skip
    """A continuation of the prompt (`-`: standard input), and for a commit message the next best ones
    commented below it."""
    if alternatives and task != "message":
        raise PipelineError("--alternatives are commit messages: use it with --task message")
    commit_hook.check_alternatives(alternatives)
    if max_new_tokens is not None and max_new_tokens < 1:
        raise PipelineError(f"--max-new-tokens {max_new_tokens}: give how many tokens to write, 1 or more")
    if prompt == "-" and sys.stdin.isatty():  # nothing piped: say what it waits for
        say(
            "reading the prompt from the terminal: paste it, then Ctrl-D (or pipe it in: git diff --cached --no-ext-diff | …)"
        )
    text = as_text(sys.stdin.read() if prompt == "-" else prompt)
    if task in ("code", "block"):
        answer, unread = generation.complete(
            adapter, text, path, as_text(after), task == "block", max_new_tokens, system
        )
        if unread:
            say(f"--after not read: {unread}")
        print(shown(answer))
        return
    for option, value in (("--path", path), ("--after", after)):
        if value:
            raise PipelineError(
                f"{option} says where in a file a next line or a block is written: use it with --task code or block"
            )
    if task != "message":
        print(shown(generation.generate(adapter, text, max_new_tokens, task, system)))
        return
    answer, *more = generation.commit_messages(adapter, text, alternatives, system, max_new_tokens)
    print(shown(answer))
    if more:
        print(shown("\n" + commit_hook.commented(more, "#")), end="")


def serve(adapter: str, host: str, port: int, name: str | None) -> None:
    """The adapter behind an OpenAI-compatible server (`pipeline.use.serve`)."""
    if not 0 <= port <= 65535:
        raise PipelineError(f"--port {port}: give a port from 1 to 65535 (0: any free one)")
    # heavy: FastAPI and uvicorn, which no other command needs
    from pipeline.use.serve import serve as serving

    serving(adapter, host, port, name)


def export(
    adapter: str, output: str, gguf_type: str, name: str | None = None, adapter_only: bool = False
) -> None:
    """The GGUF file (or the adapter's, beside its base's) and its Modelfile, and the commands that use
    them."""
    exported = write_gguf(adapter, output, gguf_type, name, adapter_only)
    size = f"{exported.tensors} tensors, {exported.bytes / 1e6:.1f} MB"
    if exported.base is None:
        print(f"wrote {exported.gguf} ({exported.gguf_type}, {size}) and {exported.modelfile}")
        model = f"-m {quote(str(exported.gguf))}"
    else:
        base = "written now" if exported.base_written else "kept: an earlier export wrote this base"
        print(
            f"wrote {exported.gguf} (the adapter alone, {size}) on its base {exported.base} "
            f"({exported.gguf_type}, {exported.base.stat().st_size / 1e6:.0f} MB, {base}) and "
            f"{exported.modelfile}"
        )
        model = f"-m {quote(str(exported.base))} --lora {quote(str(exported.gguf))}"
    # Commands to paste into a shell, so quoted: a path may hold a space.
    print(
        f"  ollama: cd {quote(str(exported.gguf.parent))} && ollama create {quote(exported.name)} -f "
        f"{quote(exported.modelfile.name)}"
    )
    print(f"  llama.cpp: llama-cli {model}")
    print(
        f"  ollama, for code completion: cd {quote(str(exported.gguf.parent))} && ollama create "
        f"{quote(exported.name + '-code')} -f {quote(exported.code_modelfile.name)}"
    )
    print(
        f"  a message for the staged change, its files read as training read them: {exported.staged} | ollama run {quote(exported.name)}"
    )


def hook(action: str, repo: str, adapter: str | None, timeout: float, alternatives: int) -> None:
    """Install the commit hook (or uninstall it) and say what was done."""
    if action == "uninstall":
        print(commit_hook.uninstall(repo))
        return
    if not adapter:
        raise PipelineError("hook install: give --adapter DIR (a run's output directory, or its adapter/)")
    print(commit_hook.install(repo, adapter, timeout, alternatives))


def diff(before: str | None, after: str | None, options) -> int:
    """What changed between two runs, and its exit code (`run_diff`'s). No runs named: the newest two an
    output directory keeps (BEFORE, or the configured one)."""
    if after is None:
        before, after = (str(path) for path in newest_two(_output_dir(before)))
        say(f"comparing {before} with {after}")
    text, messages, code = run_diff(before, after, options)
    print(text)
    print("\n".join(messages), file=sys.stderr, end="\n" if messages else "")
    return code


def runs(output_dir: str | None, only_changed: bool) -> None:
    """The runs an output directory keeps (the configured one unless named), as a table."""
    print(runs_table(_output_dir(output_dir), only_changed))


def _output_dir(given: str | None) -> Path:
    """The output directory a user named, or the configured one (`output.dir`: repotune-output/)."""
    return Path(given or load_config(None).config.output.dir)


def report(manifests: list[str], output: str | None, names: list[str]) -> None:
    """One HTML page for a run (beside its manifest), or comparing several (compare.html here)."""
    found = [manifest_file(Path(path)) for path in manifests]
    default = found[0].with_name("report.html") if len(found) == 1 else Path("compare.html")
    print(write_report(found, Path(output) if output else default, names))


def monitor(
    duration: float | None, interval: float | None, pid: int | None, output: Path, argv: list[str]
) -> None:
    """Watch the machine (and a process), then its summary and advice, and where the report went."""
    for name, value in (("duration", duration), ("interval", interval)):
        if value is not None and not value > 0:
            example = {"duration": 60, "interval": 1}[name]
            raise PipelineError(
                f"--{name} {value:g}: give a number of seconds above 0 (e.g. --{name} {example})"
            )
    configured = load_config(None).config.monitor.collection_interval_seconds
    report = watch(duration, interval or fitted_interval(configured, duration), pid, output, argv)
    print(format_summary(report))
    print(output)

"""A `prepare-commit-msg` hook that suggests a message for the staged diff, and never blocks a commit.

`install` writes a small POSIX shell hook into the clone's own hooks directory (`.git/hooks`, the main
repository's for a linked work tree). Where `core.hooksPath` makes git run hooks from elsewhere (a hook
manager's folder in the work tree, such as husky's `.husky/_`, shared with everyone who clones it, or a
folder of the user's for all their repositories), that folder is left alone and `install` says which
line of it calls this hook: a hook written there would go into every repository, or be rewritten by
the manager, and husky's own would stop running once renamed (its stub finds its script by its file
name). The shell part decides whether to suggest at all:
not for `-m`/`-F`, merges, squashes, amends (`commit` source), where no editor opens (`--no-edit`: git
runs its hooks with `GIT_EDITOR=:` then, and a suggestion would be committed unread), or while a
rebase, cherry-pick or revert is under way, and not when the interpreter it was installed with is gone.
Then `suggest` (below) runs in an isolated interpreter (`python -I`: the committed repository's files
and environment variables cannot shadow a module) with a hard deadline: the kernel ends it at
`--timeout` seconds whatever it is doing (SIGALRM's default action), and the message file is only ever
replaced whole, so a timeout, a crash, a moved adapter or a broken environment leaves git's message as
it was. The hook always exits 0 after its own work, with one line on stderr at most.

The suggestion comes from the system the run chose (`adapter/retrieval/system.json`): the lookup or the
selector answer in well under a second; where the run chose the fine-tuned model, the retrieval
system's answer is written first and the model's replaces it if it comes within the deadline. Below
it, the next best messages (`--alternatives`, 2 by default), commented out so that git drops them unless
one is put in place of the first line; only where git surely drops them (its own comment character, a
`commit.cleanup` that strips comments, an editor that opens). Where the message already begins with text
(a commit template's, or what a hook run before wrote), that text stays first and the suggestion is shown
as a comment after it.

An existing hook that is not repotune's is kept and run first (`prepare-commit-msg.repotune-previous`; a
shell script as `prepare-commit-msg`, the name a hook manager such as husky 4 dispatches on); `uninstall`
puts it back.
"""

from __future__ import annotations

import gettext
import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import orjson

from pipeline.errors import PipelineError
from pipeline.manifest import MANIFEST_FILE
from pipeline.suggest.suggestion import Suggester, beside
from scrapers.errors import RepositoryError
from scrapers.safe_git import run_safe_git

SERVE_FILE = "serve.json"  # beside a served adapter while `serve` runs: where it listens, and its process

HOOK = "prepare-commit-msg"
PREVIOUS = f"{HOOK}.repotune-previous"
MARK = "# repotune prepare-commit-msg hook"
# A larger staged diff is read this far (the suggestion needs its start, not all), before the files training
# left out are dropped: a regenerated lockfile is megabytes, and package-lock.json sorts before the code.
MAX_DIFF_BYTES = 16_000_000
# The next best messages shown below the suggestion, commented out: a user who reads three and keeps the
# closest edits less (docs/use.md).
ALTERNATIVES = 2
# What git writes into the message where comments will be kept (`git commit --cleanup=verbatim` or
# `whitespace`): a `--cleanup` given to `git commit` reaches a hook in no other way. Its own words, to look
# up in its message catalog where git speaks another language: the comment character as '%c' (git 2.44 and
# before) or '%s', the second form where an empty message is allowed. The line naming the character is the
# one that differs from the notice that comments will be dropped.
KEPT_NOTICES = tuple(
    f"Please enter the commit message for your changes. Lines starting\nwith '{mark}' will be kept; you may "
    f"remove them yourself if you want to.\n{ending}"
    for mark in ("%c", "%s")
    for ending in ("An empty message aborts the commit.\n", "")
)
SCISSORS = "------------------------ >8 ------------------------"  # git's own, in every language
BODY_LINES_SHOWN = 8  # of an alternative's body; more is marked, not shown
ROOT = Path(__file__).resolve().parents[2]  # the checkout: pipeline/use/hook.py
OPTIONAL_IMPORTS = ("pandas", "sklearn", "dask", "pyarrow")
# `git diff` options that print a diff as the scraper's `git log -p` does (with SAFE_GIT_ENV, whatever the
# user's diff settings), never through the repository's external diff or textconv programs; `git show
# COMMIT` takes them too.
DIFF_OPTIONS = ("--no-color", "--no-ext-diff", "--no-textconv", "-M", "-U3")

SCRIPT = """#!/bin/sh
{mark} (`repotune hook install`; `repotune hook uninstall` removes it).
# Suggests a commit message for the staged diff. It never blocks a commit: whatever goes wrong, the
# message stays as git had it and the hook exits 0. REPOTUNE_HOOK=off skips it for one command.
python={python}
adapter={adapter}
timeout={timeout}
alternatives={alternatives}
previous="$(dirname "$0")/{previous}"
if [ -x "$previous" ]; then
    # The hook that was here first keeps its say, a shell script under the name it was called by: hook
    # managers (husky 4, yorkie) find what to run by that name, which its new one would not give.
    IFS= read -r first < "$previous" || true
    case "$first" in
        '#!/bin/sh'|'#!/usr/bin/env sh') REPOTUNE_PREVIOUS="$previous" sh -c '. "$REPOTUNE_PREVIOUS"' "$0" "$@" ;;
        '#!/bin/bash'|'#!/usr/bin/env bash') REPOTUNE_PREVIOUS="$previous" bash -c '. "$REPOTUNE_PREVIOUS"' "$0" "$@" ;;
        *) "$previous" "$@" ;;
    esac || exit $?
fi
case "$2" in message|merge|squash|commit) exit 0 ;; esac
[ "$GIT_EDITOR" = : ] && exit 0  # git's sign to its hooks that no editor opens (--no-edit): none would read it
[ "$REPOTUNE_HOOK" = off ] && exit 0
git_dir=$(git rev-parse --git-dir 2>/dev/null) || exit 0
for busy in rebase-merge rebase-apply CHERRY_PICK_HEAD REVERT_HEAD MERGE_HEAD; do
    [ -e "$git_dir/$busy" ] && exit 0
done
if [ ! -x "$python" ]; then
    echo "repotune: no suggestion: $python is gone (repotune hook install again)" >&2
    exit 0
fi
"$python" -I -c {launcher} "$1" "$adapter" "$timeout" "$alternatives" 2>/dev/null
status=$?
if [ "$status" -eq 142 ]; then
    echo "repotune: no suggestion within ${{timeout}}s; the message is as git had it" >&2
elif [ "$status" -ne 0 ]; then
    echo "repotune: no suggestion (exit $status; repotune generate --adapter $adapter --task message says why)" >&2
fi
exit 0
"""


def check_alternatives(count: int) -> None:
    """`--alternatives` as the hook and `generate` take it: 0 to 9 messages more."""

    if not 0 <= count <= 9:
        raise PipelineError(f"--alternatives {count}: give how many more messages to show, 0 to 9")


def install(repo: str | Path, adapter: str | Path, timeout: float, alternatives: int = ALTERNATIVES) -> str:
    """Write the hook into `repo`, keeping a hook that is already there (run first); what was done."""

    if not 0 < timeout <= 600:
        raise PipelineError(f"--timeout {timeout}: give the seconds a suggestion may take (e.g. 5)")
    check_alternatives(alternatives)
    from pipeline.use.generate import adapter_directory  # heavy: see `suggest`

    directory = adapter_directory(adapter).resolve()
    hooks, elsewhere, bare = hook_folders(repo)
    if bare:  # nobody commits there: a hook would never run
        raise PipelineError(
            f"--repo {repo}: a bare repository, where no commit is written: install in a clone of it"
        )
    hook, previous = hooks / HOOK, hooks / PREVIOUS
    kept = ""
    if hook.exists() and not _ours(hook):
        if previous.exists():
            raise PipelineError(
                f"{hook} is not repotune's and {previous.name} is taken: move one of them away first"
            )
        hook.rename(previous)
        kept = f"; the hook that was there runs first ({previous.name})"
    launcher = f"import sys; sys.path[:0] = [{str(ROOT)!r}]; from pipeline.use.hook import suggest; suggest(sys.argv[1:])"
    text = SCRIPT.format(
        mark=MARK,
        python=shlex.quote(sys.executable),
        adapter=shlex.quote(str(directory)),
        timeout=shlex.quote(f"{timeout:g}"),
        alternatives=alternatives,
        previous=PREVIOUS,
        launcher=shlex.quote(launcher),
    )
    hooks.mkdir(parents=True, exist_ok=True)
    staging = hooks / f".{HOOK}.repotune.tmp"
    staging.write_text(text, encoding="utf-8")
    staging.chmod(0o755)
    os.replace(staging, hook)
    shown = f", {alternatives} more below it, commented out" if alternatives else ""
    said = f"installed {hook}: suggestions from {directory} within {timeout:g} s{shown}{kept}"
    if other := _another_project(directory, repo):
        said += f"; note: {directory} learned {other}, not this repository: it suggests from that history"
    if elsewhere != hooks:
        if earlier := _take_out(elsewhere):  # an earlier version wrote into the hooks folder git runs
            said += f"; the hook an earlier install wrote there is taken out ({earlier})"
        said += (
            f". git runs hooks from {elsewhere} (core.hooksPath), which repotune leaves alone: to have "
            f"it suggest, add this line to the {HOOK} script there or to your hook manager's "
            f"(husky: .husky/{HOOK}): {_call_line(hook)}"
        )
    return said


def _another_project(adapter: Path, repo: str | Path) -> str | None:
    """The repositories `adapter`'s run learned, where `repo` holds none of their histories (a hook in
    one project with another's adapter suggests the other's messages: a slip more often than a choice);
    None where it holds one (the same clone, or another clone of it: the commit trained up to is there),
    or where the run's manifest is not beside the adapter to say."""
    from pipeline.record.history import trained_there  # heavy: the training's modules, at install only
    from scrapers.git import holds_any, open_repository  # heavy: GitPython, on every commit otherwise

    try:
        manifest = orjson.loads((adapter.parent / MANIFEST_FILE).read_bytes())
        learned = trained_there(adapter.parent, manifest)
        here = open_repository(repo)
    except (OSError, ValueError, AttributeError, TypeError, RepositoryError):
        return None
    if not learned or holds_any(here, [head for _, head in learned]):
        return None
    return ", ".join(path for path, _ in learned)


def installed_adapter(repo: str | Path) -> Path | None:
    """The adapter repotune's hook in `repo` suggests with; None where there is no such hook."""

    try:
        own, run_from, _ = hook_folders(repo)
        places = dict.fromkeys((own, run_from))  # the second: where an earlier version wrote it
    except PipelineError:
        return None
    for hook in (hooks / HOOK for hooks in places):
        if _ours(hook):
            for line in hook.read_text(encoding="utf-8", errors="replace").splitlines():
                if line.startswith("adapter="):
                    return Path(shlex.split(line.removeprefix("adapter="))[0])
    return None


def uninstall(repo: str | Path) -> str:
    """Remove repotune's hook and put back the one it set aside; what was done."""

    hooks, elsewhere, _ = hook_folders(repo)
    hook = hooks / HOOK
    if hook.exists() and not _ours(hook):
        raise PipelineError(f"{hook} is not repotune's: left as it is")
    own = _take_out(hooks)
    # Also where an earlier version wrote it: the folder core.hooksPath names, husky's stub set aside.
    earlier = _take_out(elsewhere) if elsewhere != hooks else None
    if not own and not earlier:
        return f"no repotune hook in {hooks}"
    said = "; ".join(text for text in (own, earlier) if text)
    if own and elsewhere != hooks:
        said += f" (a line that called it from {elsewhere} now does nothing; remove it when you like)"
    return said


def _take_out(hooks: Path) -> str | None:
    """Remove repotune's hook from `hooks` and put back the one it set aside; what was done (None where
    neither is there). Where repotune's hook was deleted by hand, the one it set aside goes back too:
    under its set-aside name it would never run again."""
    hook, previous = hooks / HOOK, hooks / PREVIOUS
    if not hook.exists() and previous.exists():
        previous.rename(hook)
        return f"put back {hook}, which repotune's hook had set aside (repotune's was gone already)"
    if not _ours(hook):
        return None
    hook.unlink()
    if previous.exists():
        previous.rename(hook)
        return f"removed repotune's hook; {hook} is the one that was there before"
    return f"removed {hook}"


def hook_folders(repo: str | Path) -> tuple[Path, Path, bool]:
    """The clone's own hooks directory, where repotune's hook goes (`.git/hooks`; a linked work tree's
    main repository's), the one git runs hooks from (the same, or the folder `core.hooksPath` names), and
    whether the repository is bare: one git call for all three."""

    path = Path(repo).expanduser()
    try:
        common, run_from, bare = run_safe_git(  # where git runs hooks from: the repository's hooksPath
            ["-C", str(path), "rev-parse", "--path-format=absolute", "--git-common-dir",
             "--git-path", "hooks", "--is-bare-repository"],
            reading=("core.hooksPath",), capture_output=True, text=True, check=True, timeout=30,
        ).stdout.splitlines()  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        raise PipelineError(f"--repo {repo}: not a git repository") from None
    return Path(common) / "hooks", Path(run_from), bare == "true"


def _call_line(hook: Path) -> str:
    """The line that runs repotune's hook from another hook script (a no-op where it is not installed,
    as in a teammate's clone): what to add where git runs hooks from elsewhere."""
    return f'h="$(git rev-parse --git-common-dir)/hooks/{hook.name}"; [ ! -x "$h" ] || "$h" "$@"'


def _ours(hook: Path) -> bool:
    try:
        return MARK in hook.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False


def suggest(argv: list[str]) -> None:
    """The hook's work: MESSAGE_FILE ADAPTER TIMEOUT [ALTERNATIVES] (a hook installed before there were
    alternatives passes three). Ended by the kernel at the deadline; the message file is replaced whole
    or not at all."""
    message_file, adapter, timeout = Path(argv[0]), Path(argv[1]), float(argv[2])
    count = int(argv[3]) if len(argv) > 3 else ALTERNATIVES
    signal.signal(signal.SIGALRM, signal.SIG_DFL)
    signal.setitimer(signal.ITIMER_REAL, timeout)
    # lightgbm imports pandas and scikit-learn when they are installed, most of a commit's wait where
    # they are, and needs neither to predict: hide them from this process.
    for optional in OPTIONAL_IMPORTS:
        sys.modules.setdefault(optional, None)  # type: ignore[arg-type]  # None: `import` raises ImportError
    diff = staged_diff()
    if not diff.strip():
        return

    original = message_file.read_text(encoding="utf-8", errors="replace")
    prefix = comment_prefix(original)
    template_end = _template_end(original, prefix or "#")
    if prefix is None and template_end:
        return  # a commit template's text begins the message, and a suggestion could only be typed into it
    suggester = Suggester.load(adapter)
    found = suggester.suggestions(diff, 1 + count if prefix else 1)
    if found:
        _offer(message_file, found[0], found[1:], prefix, original, template_end)
    if suggester.system == "model":
        written = served(adapter, diff, timeout)
        if written is None:
            # heavy: the model's loading code, on every commit otherwise; needed where the run chose the model
            from pipeline.use.generate import generate

            written = generate(adapter, diff, task="message", system="model")
        written = written.strip()
        if written:  # the retrieval's answers become the alternatives
            _offer(message_file, written, beside(written, found, count), prefix, original, template_end)


def served(adapter: Path, diff: str, timeout: float) -> str | None:
    """The commit message a running `serve` of `adapter` writes for `diff` (SERVE_FILE says where it
    listens), without loading the model here; None where none runs or it does not answer."""
    import urllib.request

    try:
        where = orjson.loads((adapter / SERVE_FILE).read_bytes())
        os.kill(int(where["pid"]), 0)  # it still runs
        asked = urllib.request.Request(
            f"{where['url']}/chat/completions",
            data=orjson.dumps({"messages": [{"role": "user", "content": diff}]}),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(asked, timeout=timeout) as answer:
            return str(orjson.loads(answer.read())["choices"][0]["message"]["content"])
    except (OSError, ValueError, KeyError, IndexError, TypeError):  # none runs, or it failed: load the model
        return None


def comment_prefix(original: str) -> str | None:
    """What begins a line git strips from the message (`core.commentString`, `core.commentChar`, `#`
    unset); None where a commented line might be kept: `auto` picks the character per message, a
    `commit.cleanup` (or `git commit --cleanup`, KEPT_NOTICES) other than strip keeps comments, and where
    git wrote no comment of its own into `original` above its scissors line it may keep them (it strips
    comments by default only where an editor opens)."""

    def config(key: str) -> str | None:
        found = run_safe_git(["config", "--get", key], capture_output=True, text=True, timeout=10)
        return found.stdout.rstrip("\n") if found.returncode == 0 else None

    if (config("commit.cleanup") or "default") not in ("default", "strip"):
        return None
    prefix = config("core.commentString") or config("core.commentChar") or "#"
    lines = original.splitlines()
    if prefix == "auto" or _kept(lines, prefix):  # `git commit --cleanup=verbatim` (or whitespace)
        return None
    # Above git's scissors line (`--cleanup=scissors`, `git commit -v`) only its help text, which it
    # writes where it strips comments, says they go: `--cleanup=scissors` writes none, and keeps them.
    shown = any(line.startswith(prefix) for line in _above_scissors(lines, prefix))
    return prefix if shown else None


def _above_scissors(lines: list[str], prefix: str) -> list[str]:
    """The message's lines above git's scissors line (all of them where there is none)."""
    return lines[: next((at for at, line in enumerate(lines) if line == f"{prefix} {SCISSORS}"), len(lines))]


def _template_end(original: str, prefix: str) -> int:
    """Where the text git put into the message ends, in lines (a commit template's: `commit.template`,
    `git commit -t`; what is neither blank nor a comment, above the scissors line); 0 where it put none."""
    above = _above_scissors(original.splitlines(), prefix)
    return next(
        (
            len(above) - at
            for at, line in enumerate(reversed(above))
            if line.strip() and not line.startswith(prefix)
        ),
        0,
    )


def _kept(lines: list[str], prefix: str) -> bool:
    """Whether git wrote into the message that comments will be kept (KEPT_NOTICES), in English or in the
    language it speaks here."""

    def said(notices: tuple[str, ...]) -> bool:
        marked = {
            f"{prefix} {line.replace('%c', prefix).replace('%s', prefix)}"
            for notice in notices
            for line in notice.splitlines()
            if "%c" in line or "%s" in line
        }
        return any(line in marked for line in lines)

    return said(KEPT_NOTICES) or said(tuple(map(_git_catalog().gettext, KEPT_NOTICES)))


def _git_catalog() -> gettext.NullTranslations:
    """git's message catalog for the language it speaks here (the locale variables it reads, as gettext
    does), from where git keeps it (`GIT_TEXTDOMAINDIR`, else `share/locale` beside its programs); none
    (English) where there is none."""
    folder = os.environ.get("GIT_TEXTDOMAINDIR")
    if not folder:
        programs = run_safe_git(["--exec-path"], capture_output=True, text=True, timeout=10).stdout
        found = (above / "share" / "locale" for above in Path(programs.strip()).parents)
        folder = str(next((locale for locale in found if locale.is_dir()), ""))
    return gettext.translation("git", folder or None, fallback=True)


def commented(alternatives: list[str], prefix: str | None, heading: str = "") -> str:
    """The next best messages as lines git strips, to copy in place of the suggestion (the hook's, and
    `generate --alternatives`), under `heading` where one is given; "" for none."""
    alternatives = [text for text in alternatives if text.strip()]
    if not alternatives or prefix is None:
        return ""
    heading = heading or (
        f"{len(alternatives)} more from this repository's past (to use one, put it in place of the first line)"
    )
    lines = [f"{prefix} repotune: {heading}:"]
    for number, alternative in enumerate(alternatives, 1):
        subject, *body = alternative.strip().splitlines()
        lines.append(f"{prefix} {number}. {subject}")
        lines += [f"{prefix}    {line}".rstrip() for line in body[:BODY_LINES_SHOWN]]
        if len(body) > BODY_LINES_SHOWN:
            lines.append(f"{prefix}    (and {len(body) - BODY_LINES_SHOWN} more lines)")
    return "\n".join(lines) + "\n"


def staged_diff() -> str:
    """The staged change as git prints it to the scraper (DIFF_OPTIONS and the scraper's SAFE_GIT_ENV), at
    most MAX_DIFF_BYTES of it; the suggestion reads it as training read commits
    (`scrapers.filters.as_trained`)."""
    output = run_safe_git(["diff", "--cached", *DIFF_OPTIONS], capture_output=True, check=True).stdout
    return output[:MAX_DIFF_BYTES].decode("utf-8", errors="replace")


def _offer(
    message_file: Path, suggestion: str, alternatives: list[str], prefix: str | None, original: str, end: int
) -> None:
    """The suggestion as the message's first line, its alternatives commented below it, above what git
    wrote (its comments); the file replaced whole. Where git's message begins with a commit template's
    text, that text stays first and the suggestion is shown as a comment after it, the first of the
    choices: above the template it would push the template's lines ("JIRA-: ", "Why:") into the body,
    to be committed with it, and git would no longer refuse a template left as it was. `end`: where that
    text ends, in lines (`_template_end`; 0 for none)."""
    if end:
        lines = original.splitlines(keepends=True)
        choices = commented(
            [suggestion, *alternatives], prefix, "suggestions (to use one, copy it into the message above)"
        )
        text = "".join(lines[:end]) + f"\n{choices}" + "".join(lines[end:])
    else:
        text = f"{suggestion.strip()}\n\n{commented(alternatives, prefix)}{original}"
    staging = message_file.with_name(f".{message_file.name}.repotune.tmp")
    staging.write_text(text, encoding="utf-8")
    os.replace(staging, message_file)

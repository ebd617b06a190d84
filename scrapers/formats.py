"""Turn a commit (and the files kept from it) into training text."""

from __future__ import annotations

from scrapers.commit import Commit, FileChange


def render_file(change: FileChange) -> str:
    """One file's change as `git diff` prints it, minus the `index` line (its hashes teach nothing)."""
    old = change.old_path or change.path
    lines = [f"diff --git a/{old} b/{change.path}"]
    if change.status in ("R", "C"):
        verb = "rename" if change.status == "R" else "copy"
        lines += [f"{verb} from {old}", f"{verb} to {change.path}"]
    if change.hunks:
        lines.append("--- /dev/null" if change.status == "A" else f"--- a/{old}")
        lines.append("+++ /dev/null" if change.status == "D" else f"+++ b/{change.path}")
    return "\n".join(lines) + "\n" + change.hunks


def format_diff(commit: Commit, files: list[FileChange]) -> str:
    """Intent, then change: the commit message followed by its unified diff."""
    return commit.message + "\n\n" + "".join(render_file(change) for change in files)


FORMATS = {"diff": format_diff}

"""The scraper's domain objects: one commit and the files it changed."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class FileChange:
    path: str
    """Path after the change (the old path for a deletion)."""
    old_path: str | None
    """Path before a rename or copy; None otherwise."""
    status: str
    """A added, M modified, D deleted, R renamed, C copied, T type changed."""
    hunks: str
    """The unified-diff hunks (from the first `@@`), decoded; empty for binary or mode-only changes."""
    patch_bytes: int
    """Size of this file's whole diff as git printed it (bytes), counted even past the size cap."""
    binary: bool = False
    """git reported `Binary files ... differ`."""
    submodule: bool = False
    """A gitlink (mode 160000): the 'diff' is a commit id, not content."""
    oversize: bool = False
    """The diff went past the parser's byte cap, so `hunks` holds only its beginning."""
    mode: str | None = None
    """File mode of an added or deleted file (`100644`), as git's `new file mode` line gives it."""
    blob: str | None = None
    """Blob id after the change (before it, for a deletion); tells a huge file from a binary one."""
    old_blob: str | None = None
    """Blob id before the change; None for an addition (a notebook's is read: `scrapers.notebooks`)."""

    # Counted when asked (only the rich format shows them), not for every file git prints.
    @property
    def added(self) -> int:
        """Lines added (in the kept head of an oversize diff)."""
        return self.hunks.count("\n+")

    @property
    def deleted(self) -> int:
        """Lines deleted (in the kept head of an oversize diff)."""
        return self.hunks.count("\n-")


@dataclass(frozen=True, slots=True)
class Commit:
    sha: str
    parents: tuple[str, ...]
    author_name: str
    author_email: str
    date: str
    """Author date, ISO-8601 with the author's offset, as git prints %aI."""
    message: str
    files: tuple[FileChange, ...]

    @property
    def is_merge(self) -> bool:
        return len(self.parents) > 1

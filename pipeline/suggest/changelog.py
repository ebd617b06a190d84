"""The entry a diff adds to its repository's changelog, offered to the selector as a message.

Many repositories describe a change twice in the same commit: in its message and in an entry of
CHANGES.rst or CHANGELOG.md ("all teardown callbacks are called despite errors", and "All teardown
callbacks are called, even if any raise an error. :pr:`5928`"). The past cannot offer that entry: it
is new. So the selector is also offered the first entry the diff adds to a changelog, as a message:
its first sentence, without the reStructuredText roles (:pr:`5928`, :user:`name`) and issue numbers
(#123) that name a pull request or a person, not the change (a role that names code, :class:`Flask`,
stays as its text). A changelog is one file (CHANGES.rst, CHANGELOG.md, HISTORY.md) or one file per
change: a towncrier news fragment (changelog.d/1606.change.md, CHANGES/13509.bugfix.rst) or a
changeset (.changeset/cuddly-mugs-end.md). The ranker learns from the repository's own older commits whether,
and for which diffs, the entry is closer to the message written than the past's candidates
(`suggestion.FEATURES`' `changelog` marks it); where a repository keeps no changelog nothing changes.

It helps most where changelogs are written with the change, and changes little where they are
written at release time (docs/experiments.md keeps the figures, news fragments' and changesets'
too).
"""

from __future__ import annotations

import re

_KINDS = (  # the kinds of change towncrier's projects name their fragments for
    "feature", "features", "bugfix", "bugfixes", "bug", "fix", "doc", "docs", "removal", "removals",
    "misc", "trivial", "change", "changes", "breaking", "deprecation", "deprecations", "improvement",
    "improvements", "vendor", "process", "packaging", "contrib", "security", "performance", "internal",
    "added", "changed", "fixed",
)  # fmt: skip
CHANGELOG = re.compile(
    r"(?:^|/)(?:changes|changelog|history|news|release[-_]?notes)(?:\.(?:md|rst|txt|markdown|adoc))?$"
    # A towncrier news fragment (changelog.d/1606.change.md, changelog/13292.bugfix.rst, CHANGES/13509.bugfix,
    # newsfragments/+x.feature): the whole file is the change's entry, named for its kind.
    r"|(?:^|/)(?:changelog\.d|changelog|changes|changes\.d|newsfragments|news)/[^/]+"
    r"\.(?:" + "|".join(_KINDS) + r")(?:\.\d+)?(?:\.(?:md|rst|txt|markdown))?$"
    # A changeset (JavaScript monorepos): the entry follows a front matter that names the packages.
    r"|(?:^|/)\.changeset/(?!readme\.md$)[^/]+\.md$",
    re.IGNORECASE,
)  # CHANGES.rst, CHANGELOG.md, History.md, docs/release-notes.md; not src/history.go
_ITEM = re.compile(r"^(?:[-*+]|\d+\.)\s+")  # a list item's bullet or number
_BOLD = re.compile(r"^\*\*[^*]+\*\*:?$")  # "**Bugfixes**": a Markdown section's name, not an entry
_UNDERLINE = set("-=~^*#_")  # a line of these alone underlines a heading, or rules
# "-- by :user:`a` and :user:`b`": aiohttp's fragments credit their authors, who are not the change.
_CREDIT = re.compile(r"\s*(?:--|—|–)\s*by\s+:user:`[^`]*`(?:(?:\s*,\s*|\s+and\s+)+:user:`[^`]*`)*")
_ROLE = re.compile(r"(?::[a-z]+)?:([a-z]+):`([^`]*)`")  # :pr:`5928`, :class:`~flask.Flask`, :py:func:`f`
# Roles that name a pull request, an issue, a commit or a person: not the change, and left out. Any other
# role names what changed (:class:`~flask.Flask`, :option:`-c`), and is kept as its text, in code quotes.
_PROSE = {"ref", "doc", "term"}
_REFERENCES = {
    "pr", "pull", "issue", "issues", "gh", "ghissue", "ghpull", "bug", "commit", "sha", "user", "ghuser",
    "cve",
}  # fmt: skip
_ISSUE = re.compile(r"\s*\(?\[?#\d+\]?(?:\([^)]*\))?\)?")  # (#123), #123, [#123](https://…)
_SENTENCE_END = re.compile(r"(?<=[a-z0-9`)])\.\s")  # not after a capital: "Use e.g. X", "v. 2"
_FRONT_MATTER = re.compile(r"^(@@ -0,0 [^\n]*\n)\+---\n(?:\+[^\n]*\n)*?\+---\n", re.MULTILINE)  # a new file's
MIN_CHARS = 6  # shorter, and the line is a marker ("Fix", "Bugs"), not an entry


def entry(diff: str) -> str | None:
    """The first sentence of the first entry `diff` adds to a changelog, without its roles and issue
    numbers; None where it adds none."""
    lines = _first_entry(diff)
    if not lines:
        return None
    text = _ROLE.sub(_role, _CREDIT.sub("", " ".join(lines))).replace("``", "`").strip()
    end = _SENTENCE_END.search(text)
    text = (text[: end.start()] if end else text).rstrip(". ")
    return _ISSUE.sub("", text).strip().rstrip(".,;: ") or None


def _role(found: re.Match[str]) -> str:
    """A role as a reader sees it: nothing for a reference, the text of a link to a document or a term,
    else its text in code quotes ("~flask.Flask" shows "Flask")."""
    name, content = found.groups()
    if name in _REFERENCES:
        return ""
    text = content.split("<")[0].strip() if content.endswith(">") else content
    text = text.lstrip("!")
    if name in _PROSE:
        return text
    return f"`{text[1:].rsplit('.', 1)[-1] if text.startswith('~') else text}`"


def _first_entry(diff: str) -> list[str]:
    """The lines of the first entry `diff` adds to a changelog: its first added line that is not a
    Markdown heading or section name, a rule or a marker, with its bullet taken off, and the added
    lines that continue it (a wrapped entry) up to a blank line, the next item, a heading or an
    underline, or the end of the hunk. A reStructuredText heading is an entry: "Version 3.1.3" is what
    a release commit says; a comment or directive ("..") is not. A new file's front matter (a
    changeset's packages) is passed over, and a symbolic link is no entry (aiohttp links a fragment to
    another's text: its content is a path)."""
    path: str | None = None
    link = False
    lines: list[str] = []
    for line in _FRONT_MATTER.sub(r"\1", diff).split("\n"):
        if line.startswith("diff --git "):
            link = False
        elif line.startswith("new file mode "):
            link = line.endswith(" 120000")
        elif line.startswith("+++ "):
            if lines:
                break
            path = line[6:] if line.startswith("+++ b/") and not link else None
            continue
        if path is None or not CHANGELOG.search(path):
            continue
        text = line[1:].strip() if line.startswith("+") else None
        if lines:
            if not text or _ITEM.match(text) or text.startswith("#") or set(text) <= _UNDERLINE:
                break  # an underline: what came before was a heading ("Version 3.1.3"), and is the entry
            lines.append(text)
        elif text and not text.startswith(("#", "..")) and not _BOLD.match(text) and set(text) - _UNDERLINE:
            text = _ITEM.sub("", text)
            if len(text) >= MIN_CHARS:
                lines.append(text)
    return lines

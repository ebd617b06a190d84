"""The message a web editor writes for a change to one file, offered to the selector as a candidate.

GitHub's editor commits a change to one file as "Update models.py" ("Create …" for a new file,
"Delete …" for a deleted one, "Rename … to …"), GitLab's the same way, and a suggestion accepted in a
pull request's review as "Update src/requests/models.py": the file's path. Some repositories write
many, most few, and no past message can name a file that no earlier message named. So where at least
WEB_EDITOR_SHARE of the commits the selector learns from were written so, it is offered both forms for
a diff that changes one file, and learns from them whether, and for which diffs, one is the closest
candidate (`suggestion.FEATURES`' `web_default`). Where few write them, offering it only moved the
ranker's other choices (docs/experiments.md keeps the figures).
"""

from __future__ import annotations

from pathlib import PurePosixPath

from scrapers.parse import parse_diff

# The share of the commits a selector learns from whose message is their web editor's default, from which
# it is offered the web editor's messages (`suggestion.selector_features`).
WEB_EDITOR_SHARE = 0.05
_VERBS = {"A": "Create", "C": "Create", "D": "Delete"}  # by the change's status; any other: Update


def defaults(diff: str) -> list[tuple[str, str]]:
    """The web editor's messages for `diff` when it changes one file, each with its form: `name` (the
    file's name, as the editor writes it) and, where the file is in a folder, `path` (as an accepted
    review suggestion writes it); none for a diff of several files or of none. The diff is read as the
    scrape reads one (quoted paths, renames, prefixes), so a user's `git diff` reads as a scraped one."""
    data = diff.encode()
    changes = parse_diff(data, max_file_bytes=len(data))
    if len(changes) != 1:
        return []
    change = changes[0]
    path, old = change.path, change.old_path
    if change.status == "R" and old:
        names = PurePosixPath(old).name, PurePosixPath(path).name
        forms = [("name", "Rename {} to {}".format(*names)), ("path", f"Rename {old} to {path}")]
        if names[0] == names[1]:  # moved to another folder: only its paths say what happened
            return forms[1:]
    else:
        verb = _VERBS.get(change.status, "Update")
        forms = [("name", f"{verb} {PurePosixPath(path).name}"), ("path", f"{verb} {path}")]
    return forms if forms[0][1] != forms[1][1] else forms[:1]


def by_web_editor(diff: str, message: str) -> bool:
    """Whether `message`'s subject line is one a web editor writes for `diff`."""
    subject = message.split("\n", 1)[0].strip()
    return any(subject == written for _, written in defaults(diff))

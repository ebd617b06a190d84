"""The scores every system gets, with 95% bootstrap intervals (scipy's `bootstrap`): corpus chrF (sacrebleu's `CHRF()`
defaults, as Long Code Arena) and edit similarity of a commit message, exact match and edit similarity
of a next line or a block (resampled by commit: a commit's lines are not independent), and paired
differences."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

TASKS = ("message", "code", "code_context", "block", "block_context")
LINE_TASKS = ("code", "code_context")  # the next line
BLOCK_TASKS = ("block", "block_context")  # the body under a line that opens one
CODE_TASKS = LINE_TASKS + BLOCK_TASKS  # scored by exact match and edit similarity, resampled by commit

BOOTSTRAP_RESAMPLES = 1000


# chrF as sacrebleu's `CHRF()` scores it by default: character n-grams up to 6 (spaces left out), no word
# n-grams, recall weighted by beta = 2, precision and recall averaged over the orders both sides have.
CHRF_ORDER = 6
CHRF_BETA = 2


def chrf_statistics(outputs: Sequence[str], references: Sequence[str]):
    """Each sample's chrF statistics, a row of (output, reference, matched) n-gram counts per order,
    counted with sacrebleu's public n-gram helper as its `CHRF()` counts them: the corpus chrF of any
    resample is `chrf_of` their sum (its public `corpus_score` per resample is far too slow for a
    bootstrap; a test holds the two equal)."""
    import numpy as np
    from sacrebleu.metrics.helpers import extract_all_char_ngrams

    rows = []
    for output, reference in zip(outputs, references, strict=True):
        row = []
        mine = extract_all_char_ngrams(output, CHRF_ORDER, False)
        wanted = extract_all_char_ngrams(reference, CHRF_ORDER, False)
        for made, asked in zip(mine, wanted, strict=True):
            matched = sum(min(count, asked[gram]) for gram, count in made.items() if gram in asked)
            row += [sum(made.values()) if asked else 0, sum(asked.values()), matched]
        rows.append(row)
    return np.asarray(rows, dtype=float).reshape(len(rows), 3 * CHRF_ORDER)


def chrf_of(statistics) -> float:
    """Corpus chrF (0–100) of summed `chrf_statistics`."""
    import numpy as np

    return float(_chrf_rows(np.asarray(statistics, dtype=float)[None])[0])


def _chrf_rows(sums):
    """`chrf_of` each row of summed statistics, in one vectorised pass: a bootstrap scores a thousand
    resamples."""
    import numpy as np

    counts = sums.reshape(len(sums), CHRF_ORDER, 3)
    made, asked, matched = counts[..., 0], counts[..., 1], counts[..., 2]
    both = (made > 0) & (asked > 0)  # an order counts where both sides have n-grams of it
    orders = np.maximum(both.sum(axis=1), 1)
    precision = np.where(both, matched / np.where(both, made, 1), 0).sum(axis=1) / orders
    recall = np.where(both, matched / np.where(both, asked, 1), 0).sum(axis=1) / orders
    factor = CHRF_BETA**2
    denominator = factor * precision + recall
    score = 100 * (1 + factor) * precision * recall / np.where(denominator > 0, denominator, 1)
    return np.round(score, 2)


def edit_similarities(outputs: Sequence[str], references: Sequence[str]):
    """Each output's normalised character Levenshtein similarity to its reference, 0–100."""
    import numpy as np
    from rapidfuzz.distance import Levenshtein

    return np.asarray(
        [100 * Levenshtein.normalized_similarity(o, r) for o, r in zip(outputs, references, strict=True)]
    )


def _interval(statistic: Callable[[Any], Any], units: int) -> list[float]:
    """The 95% percentile interval of `statistic` over BOOTSTRAP_RESAMPLES bootstrap resamples of `units`
    units (samples, or the commits code is resampled by), from scipy's bootstrap. `statistic` maps drawn
    units' indices (a row a resample) to the score of each row; every score of a run draws the same
    resamples (one seed), so paired scores move together. Under two units there is nothing to resample."""
    import numpy as np
    from scipy.stats import bootstrap

    if units < 2:
        value = round(float(statistic(np.arange(units)[None])[0]), 2) if units else 0.0
        return [value, value]

    def rows(drawn, axis=-1):
        return statistic(drawn) if drawn.ndim > 1 else statistic(drawn[None])[0]

    found = bootstrap(
        (np.arange(units),), rows, n_resamples=BOOTSTRAP_RESAMPLES, vectorized=True, method="percentile",
        random_state=np.random.default_rng(0),
    ).confidence_interval  # fmt: skip
    return [round(float(found.low), 2), round(float(found.high), 2)]


def _mean_over(values, commits: Sequence[str] | None = None) -> Callable[[Any], Any]:
    """The statistic of `values`' mean for `_interval`, over samples, or over `commits` where given (a commit
    drawn k times counts each of its values k times: the interval of a mean over cases that share commits)."""
    import numpy as np

    values = np.asarray(values, dtype=float)
    if not commits:
        return lambda drawn: values[drawn].mean(axis=1)
    names = list(dict.fromkeys(commits))
    of_case = np.asarray([names.index(commit) for commit in commits])

    def resampled(drawn):
        weights = np.zeros((len(drawn), len(names)))
        np.add.at(weights, (np.arange(len(drawn))[:, None], drawn), 1)  # how often each row drew each commit
        weights = weights[:, of_case]
        return (weights @ values) / np.maximum(weights.sum(axis=1), 1)

    return resampled


def _units(samples: int, commits: Sequence[str] | None) -> int:
    """What a score's bootstrap resamples: its commits where given, else its samples."""
    return len(set(commits)) if commits else samples


def score_messages(
    outputs: Sequence[str], references: Sequence[str], commits: Sequence[str] = ()
) -> dict[str, Any]:
    """The message task's metrics over its samples (one a commit), with 95% bootstrap intervals."""
    produced = [o.strip() for o in outputs]
    wanted = [r.strip() for r in references]
    statistics = chrf_statistics(produced, wanted)
    similarity = edit_similarities(produced, wanted)
    subjects = [(_subject(o), _subject(r)) for o, r in zip(produced, wanted, strict=True)]
    return {
        "samples": len(wanted),
        "chrf": chrf_of(statistics.sum(axis=0)),
        "chrf_ci95": _interval(_chrf_over(statistics), len(wanted)),
        "edit_similarity": round(float(similarity.mean()), 2),
        "edit_similarity_ci95": _interval(_mean_over(similarity), len(wanted)),
        "subject_exact_match_pct": _pct(sum(o == r for o, r in subjects), len(wanted)),
        "first_word_match_pct": _pct(sum(_first_word(o) == _first_word(r) for o, r in subjects), len(wanted)),
        "commonest_opening": _commonest_opening(produced, wanted),
        "whitespace_only": sum(not o for o in produced),
        "output_chars_mean": round(sum(len(o) for o in produced) / len(wanted), 1),
        "reference_chars_mean": round(sum(len(r) for r in wanted) / len(wanted), 1),
    }


def score_code(outputs: Sequence[str], references: Sequence[str], commits: Sequence[str]) -> dict[str, Any]:
    """A code task's metrics (exact match and edit similarity of the line, spaces at its ends ignored),
    with 95% bootstrap intervals resampled by commit."""
    import numpy as np

    produced = [o.strip() for o in outputs]
    wanted = [r.strip() for r in references]
    exact = 100 * np.asarray([o == r for o, r in zip(produced, wanted, strict=True)], dtype=float)
    similarity = edit_similarities(produced, wanted)
    return {
        "samples": len(wanted),
        "commits": len(set(commits)),
        "exact_match_pct": round(float(exact.mean()), 2),
        "exact_match_pct_ci95": _interval(_mean_over(exact, commits), _units(len(wanted), commits)),
        "edit_similarity": round(float(similarity.mean()), 2),
        "edit_similarity_ci95": _interval(_mean_over(similarity, commits), _units(len(wanted), commits)),
        "whitespace_only": sum(not o for o in produced),
        "output_chars_mean": round(sum(len(o) for o in produced) / len(wanted), 1),
        "reference_chars_mean": round(sum(len(r) for r in wanted) / len(wanted), 1),
    }


def paired_difference(
    task: str,
    baseline: Sequence[str],
    system: Sequence[str],
    references: Sequence[str],
    commits: Sequence[str] | None = None,
) -> dict[str, Any]:
    """`system` − `baseline` on the same samples, with 95% paired bootstrap intervals: chrF and edit
    similarity for messages, exact match and edit similarity for code (resampled by `commits` where
    given: a commit's lines are not independent)."""
    units = _units(len(references), commits)
    result: dict[str, Any] = {}
    for key, (point, statistic) in _paired_statistics(task, baseline, system, references, commits).items():
        result[key], result[f"{key}_ci95"] = round(point, 2), _interval(statistic, units)
    return result


def mean_gain(
    baseline: Sequence[str], system: Sequence[str], references: Sequence[str], commits: Sequence[str] = ()
) -> dict[str, Any]:
    """`system` − `baseline` in the mean of the task's two scores (what a system is chosen by), with its
    95% paired bootstrap interval: chrF and edit similarity of commit messages, or with `commits` (a code
    task's, resampled by commit) exact match and edit similarity."""
    task = "code" if commits else "message"
    (first, firsts), (second, seconds) = _paired_statistics(
        task, baseline, system, references, commits or None
    ).values()
    both = _interval(lambda drawn: (firsts(drawn) + seconds(drawn)) / 2, _units(len(references), commits))
    return {"mean": round((first + second) / 2, 2), "mean_ci95": both}


def _paired_statistics(
    task: str,
    baseline: Sequence[str],
    system: Sequence[str],
    references: Sequence[str],
    commits: Sequence[str] | None = None,
) -> dict[str, tuple[float, Callable[[Any], Any]]]:
    """Each metric's paired difference, and its statistic for `_interval` (over `commits` where given,
    else over the samples)."""
    import numpy as np

    wanted = [r.strip() for r in references]
    ours, theirs = [o.strip() for o in system], [o.strip() for o in baseline]
    similarity = edit_similarities(ours, wanted) - edit_similarities(theirs, wanted)
    result = {"edit_similarity": (float(similarity.mean()), _mean_over(similarity, commits))}
    if task == "message":
        mine, other = chrf_statistics(ours, wanted), chrf_statistics(theirs, wanted)
        gained, lost = _chrf_over(mine), _chrf_over(other)
        result["chrf"] = (
            chrf_of(mine.sum(axis=0)) - chrf_of(other.sum(axis=0)),
            lambda drawn: gained(drawn) - lost(drawn),
        )
    else:
        exact = 100 * (
            np.asarray([o == r for o, r in zip(ours, wanted, strict=True)], dtype=float)
            - np.asarray([o == r for o, r in zip(theirs, wanted, strict=True)], dtype=float)
        )
        result["exact_match_pct"] = (float(exact.mean()), _mean_over(exact, commits))
    return result


def _chrf_over(statistics) -> Callable[[Any], Any]:
    """The statistic of corpus chrF for `_interval`: each resample's summed n-gram counts scored."""
    return lambda drawn: _chrf_rows(statistics[drawn].sum(axis=1))


def _subject(text: str) -> str:
    return text.strip().split("\n", 1)[0].strip()


def _first_word(text: str) -> str:
    return (text.split() or [""])[0].lower()


def _opening(text: str) -> str:
    """A message's first word as a register shows in it: lower case, a conventional commit's scope and
    colon left off ("refactor(cli): …" and "Refactor …" open alike)."""
    return re.split(r"[(:!]", _first_word(_subject(text)), maxsplit=1)[0]


def _commonest_opening(outputs: Sequence[str], references: Sequence[str]) -> dict[str, Any]:
    """The word that begins most of the answers, how many it begins, and how many commits written it
    begins: a model that writes in one register shows here before its scores explain it."""
    word, count = (Counter(_opening(o) for o in outputs if o).most_common(1) or [("", 0)])[0]
    return {"word": word, "answers": count, "references": sum(_opening(r) == word for r in references)}


def _pct(count: int, total: int) -> float:
    return round(100 * count / total, 1)


SCORERS = {"message": score_messages, **dict.fromkeys(CODE_TASKS, score_code)}

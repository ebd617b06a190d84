#!/usr/bin/env python3
"""Is the run worth more than the repository's own past? Train smollm2-135m on a real history's older
commits for each time budget, and score every system on the same newest (held-out) commits.

    python benchmarks/bench_learning.py /path/to/requests --budgets 10m,20m,40m

Runs the real CLI (`run_pipeline.py`, the default quick start with `--budget`) once per budget in a
subprocess, then reads each manifest and its evaluation.jsonl and prints, per budget, the commit-message
scoreboard: the base model, the fine-tuned model (the model without the repository's past), the lookup
(the message of the most similar earlier commit: no model) and the suggestion system the run chose on
its validation commits (the default system), each with chrF and edit similarity and 95% bootstrap
intervals, and the paired differences that decide the goal:

    suggested ≥ lookup + 3 chrF and + 3 edit similarity, and ≥ the fine-tuned model + 3 on both.

Then the code scoreboard (the next line at lines the held-out commits added: the base and fine-tuned
models alone and with retrieved context, and the lookup for code) and its goal:

    fine-tuned + context ≥ base + context + 5 exact-match and + 5 edit-similarity points, intervals above
    zero, and above each ingredient alone (the fine-tuned model alone, the lookup for code).

And held-out perplexity, before → after. Exit 0 when every budget meets
the goal, 1 when one does not, 2 when a run fails. Use a real history (psf/requests, pallets/flask):
the newest 100 kept commits are held out, the 100 before them validate every choice.
"""

from __future__ import annotations

import argparse
import functools
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # it imports pipeline, installed or not (as the other benchmarks)

from benchmarks.measured import RESULTS, name_option, repository_name, write_result  # noqa: E402  (after the path it is found on)
from pipeline.scores import difference, with_interval  # noqa: E402  (after the path it is found on)

GOAL_POINTS = 3.0  # chrF and edit-similarity points the suggestion must gain over the lookup and the model
CODE_GOAL_POINTS = 5.0  # exact-match and edit-similarity points fine-tuned + context must gain
SYSTEMS = {
    "before": "base model",
    "after": "fine-tuned model",
    "nearest_commit": "lookup",
    "suggested": "suggested",
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("repo", help="a git repository with a real history (hundreds of commits or more)")
    parser.add_argument(
        "--budgets", default="10m", help="comma-separated time budgets, one run each (default 10m)"
    )
    parser.add_argument("--model", default="smollm2-135m", help="base model (default smollm2-135m)")
    parser.add_argument(
        "--output-dir",
        help="where the runs write, one folder per budget (default bench-learning-output/REPO_NAME: a folder "
        "of one repository's training is refused to another's run)",
    )
    parser.add_argument("--samples", type=int, default=3, help="held-out commits shown side by side")
    parser.add_argument(
        "--set", dest="overrides", action="append", default=[], help="more config overrides, as for the CLI"
    )
    name_option(parser)
    parser.add_argument(
        "--label",
        default="default",
        help="what the runs vary (default: default, the command as shipped): it names the results file",
    )
    parser.add_argument(
        "--results",
        type=Path,
        help="the JSON results file the docs' figures are generated from (default: "
        "benchmarks/results/learning-REPO_NAME-LABEL.json)",
    )
    parser.add_argument(
        "--report-only",
        action="store_true",
        help="run nothing: report, and write the results file, from the runs already under --output-dir "
        "(one folder per budget), as a newer version of this script reads them",
    )
    args = parser.parse_args()
    args.name = repository_name(args.name, args.repo)
    args.output_dir = args.output_dir or str(Path("bench-learning-output") / args.name)

    outcomes = []
    for budget in args.budgets.split(","):
        output = Path(args.output_dir) / budget
        command = [
            sys.executable, str(ROOT / "run_pipeline.py"), "--repo", args.repo, "--output-dir", str(output),
            "--model", args.model, "--budget", budget,
            "--set", f"output.cache_dir={Path(args.output_dir) / 'cache'}",  # one token cache for every budget
            *[part for override in args.overrides for part in ("--set", override)],
        ]  # fmt: skip
        if args.report_only:
            outcomes.append((budget, output))
            continue
        print("$ " + " ".join(command), flush=True)
        finished = subprocess.run(command)  # in the caller's directory: relative paths are theirs
        if finished.returncode != 0:
            print(f"the {budget} run failed (exit {finished.returncode})", file=sys.stderr)
            return 2
        outcomes.append((budget, output))
    met = [report(budget, output, args.samples) for budget, output in outcomes]
    results = args.results or RESULTS / f"learning-{args.name}-{args.label}.json"
    write_results(results, args, {budget: summary(output) for budget, output in outcomes})
    print(f"\nresults: {results}")
    return 0 if all(met) else 1


def summary(output: Path) -> dict:
    """What the docs show of one budget's run: its training, and every system's scores on each task as the
    manifest has them (with their intervals and paired differences)."""
    import orjson

    from pipeline.evaluate.report import first_samples
    from pipeline.manifest import EVALUATION_FILE

    manifest = orjson.loads((output / "MANIFEST.json").read_bytes())
    answers = (orjson.loads(line) for line in (output / EVALUATION_FILE).read_bytes().splitlines() if line)
    params, report_ = manifest["training_parameters"], manifest["training_report"]
    evaluation = report_["evaluation"]
    before, after = evaluation["before"] or {}, evaluation["after"] or {}
    return {
        "repotune": manifest["tool"]["git_sha"],
        "head": manifest["repository"]["head"],
        "cores": manifest["hardware"]["usable_cores"],
        "gpus": [gpu.get("name") for gpu in manifest["hardware"]["gpus"] or []],
        "files_share": params.get("files_share"),
        "train_sequences": params["train_sequences"],
        "train_files": params.get("train_files"),
        "steps": report_["training"]["global_step"],
        "tokens_per_s": report_["throughput"]["tokens_per_s"],
        "precision": params.get("precision"),
        "train_s": manifest["timings"]["train_s"],
        "run_s": manifest["total_execution_time_seconds"],
        "loss": [before.get("loss"), after.get("loss")],
        "held_out_commits": evaluation["held_out_commits"],
        "system": (evaluation["system"] or {}).get("name"),
        "system_reason": (evaluation["system"] or {}).get("reason"),
        "code_system": (evaluation["code_system"] or {}).get("name"),
        "code_system_reason": (evaluation["code_system"] or {}).get("reason"),
        "tasks": evaluation["tasks"],
        "samples": first_samples(answers),  # the README shows them as what a run prints
        "written_before": written_before(output),
    }


@functools.cache  # the report and the results file both read it: the history is read once a run
def written_before(output: Path) -> dict:
    """How many of the next lines scored had been written before the split point: the same line (the
    spaces at its ends aside, as exact match compares) in a file at the split point or on a line of the
    training history (a diff's line without its marker); how many of those the run's training read (its
    newest `train_sequences` history sequences and `train_files` most recently changed files, as the scrape
    lists them); and, for each model with context, how many of its exact matches were such lines, and
    trained ones. Exact match is mostly the recall of a line the repository already had: this counts how
    many there were to recall, and whether training had read them."""
    import orjson

    from pipeline.manifest import EVALUATION_FILE
    from scrapers.files import FILES_FILE
    from scrapers.scrape import SEQUENCES_FILE

    params = orjson.loads((output / "MANIFEST.json").read_bytes())["training_parameters"]
    seen: set[str] = set()
    trained: set[str] = set()
    for index, line in enumerate((output / FILES_FILE).read_bytes().splitlines()):
        rows = {row.strip() for row in orjson.loads(line)["text"].split("\n")}
        seen |= rows
        trained |= rows if index < (params.get("train_files") or 0) else set()
    history = (orjson.loads(line) for line in (output / SEQUENCES_FILE).read_bytes().splitlines())
    for index, record in enumerate(record for record in history if record.get("split") == "train"):
        rows = {text for row in record["text"].split("\n") for text in (row.strip(), row[1:].strip())}
        seen |= rows
        trained |= rows if index < params["train_sequences"] else set()
    answers = [orjson.loads(line) for line in (output / EVALUATION_FILE).read_bytes().splitlines() if line]
    asked = [row for row in answers if row["task"] == "code_context"]
    recalled = [row for row in asked if row["reference"].strip() in seen]
    read = [row for row in recalled if row["reference"].strip() in trained]
    matched = {}
    for system in ("base", "fine_tuned"):
        exact = [row for row in asked if row[system].strip() == row["reference"].strip()]
        matched[system] = [
            len(exact),
            sum(row in recalled for row in exact),
            sum(row in read for row in exact),
        ]
    return {"lines": len(asked), "written_before": len(recalled), "trained": len(read), "matched": matched}


def write_results(path: Path, args: argparse.Namespace, budgets: dict) -> None:
    """The results file: what was run (repository, label, overrides) and each budget's summary. Budgets run
    before with the same repository, label, model and overrides are kept beside the new ones (each says
    which repotune commit measured it), so 20 and 40 minutes can be run after 10."""
    import orjson

    document = {
        "benchmark": "bench_learning",
        "repository": args.name,
        "label": args.label,
        "model": args.model,
        "overrides": args.overrides,
        "budgets": budgets,
    }
    if path.exists():
        earlier = orjson.loads(path.read_bytes())
        same = all(earlier.get(key) == document[key] for key in ("repository", "label", "model", "overrides"))
        document["budgets"] = {**(earlier["budgets"] if same else {}), **budgets}
    write_result(path, document)


def report(budget: str, output: Path, shown: int) -> bool:
    """One budget's scoreboard and goal lines; True when the goal is met."""
    import orjson

    from pipeline.evaluate.metrics import paired_difference
    from pipeline.evaluate.report import code_scoreboard
    from pipeline.manifest import EVALUATION_FILE

    manifest = orjson.loads((output / "MANIFEST.json").read_bytes())
    answers = [orjson.loads(line) for line in (output / EVALUATION_FILE).read_bytes().splitlines() if line]
    params, report_ = manifest["training_parameters"], manifest["training_report"]
    evaluation = report_["evaluation"]
    tasks, system = evaluation["tasks"], evaluation["system"] or {}
    left_out = manifest["dataset"]["left_out"] or {"sequences": 0}
    print(f"\n=== budget {budget}: {manifest['repository']['path']} ===")
    print(
        f"trained {report_['training']['global_step']} steps on the newest {params['train_sequences']} sequences "
        f"({left_out['sequences']} older left out) in {manifest['timings']['train_s']:.0f} s at "
        f"{report_['throughput']['tokens_per_s']} tokens/s; the run took {manifest['total_execution_time_seconds']:.0f} s, "
        f"evaluation {_cost(manifest, evaluation['cost']['before_cached'])}"
    )
    kept = report_["training"].get("kept")
    if kept:
        print(
            f"kept step {kept['step']} ({kept['kept']}): validation loss {kept['validation_loss']} (last {kept['last_validation_loss']})"
        )
    messages = {name: (tasks.get(name) or {}).get("message") for name in SYSTEMS}
    count = next((m["samples"] for m in messages.values() if m), 0)
    print(
        f"\ncommit message from diff, {count} held-out commits (suggested = {system.get('name')}: {system.get('reason')})"
    )
    print(f"{'system':<20}{'chrF [95%]':>22}{'ES [95%]':>22}{'chrF vs lookup':>24}{'ES vs lookup':>24}")
    for name, label in SYSTEMS.items():
        scored = messages[name]
        if not scored:
            continue
        versus = scored.get("vs_nearest_commit") or {}
        print(
            f"{label:<20}{with_interval(scored, 'chrf'):>22}{with_interval(scored, 'edit_similarity'):>22}"
            f"{_delta(versus, 'chrf'):>24}{_delta(versus, 'edit_similarity'):>24}"
        )
    asked = [row for row in answers if row["task"] == "message"]
    references = [row["reference"] for row in asked]
    over_model = paired_difference(
        "message", [row["fine_tuned"] for row in asked], [row["suggested"] for row in asked], references
    )
    print(
        f"{'suggested vs fine-tuned':<20}{'':>44}{_delta(over_model, 'chrf'):>24}{_delta(over_model, 'edit_similarity'):>24}"
    )

    print()
    for line in [
        *code_scoreboard(tasks, evaluation.get("code_system")),
        *code_scoreboard(tasks, blocks=True),
    ]:
        print(line)
    recall = written_before(output)
    print(
        f"written before the split point (in its files or the training history): {recall['written_before']} of the "
        f"{recall['lines']} next lines, {recall['trained']} of them in what training read; of the exact matches with "
        f"context, base {'/'.join(map(str, recall['matched']['base']))} and fine-tuned "
        f"{'/'.join(map(str, recall['matched']['fine_tuned']))} (matched / of them written before / trained)"
    )
    before, after = evaluation["before"], evaluation["after"]
    if before and after:
        print(f"held-out perplexity {before['perplexity']} → {after['perplexity']}")
        for name, was in before["per_format"].items():
            print(f"  {name:<8} {was['perplexity']} → {after['per_format'][name]['perplexity']}")

    for row in asked[:shown]:
        print(f"\ncommit {row['commit'][:10]}")
        for key, label in (("reference", "git has"), ("nearest_commit", "lookup"), ("selector", "selector"),
                           ("suggested", "suggested"), ("fine_tuned", "fine-tuned"), ("base", "base")):  # fmt: skip
            print(f"  {label:<11}: {_line(row.get(key) or '')}")

    suggested = messages["suggested"]["vs_nearest_commit"] if messages["suggested"] else {}
    goals = [
        (f"suggested vs lookup: chrF {_delta(suggested, 'chrf')}, ES {_delta(suggested, 'edit_similarity')} (goal ≥ +{GOAL_POINTS:g} each)",
         suggested.get("chrf", -1) >= GOAL_POINTS and suggested.get("edit_similarity", -1) >= GOAL_POINTS),
        (f"suggested vs fine-tuned: chrF {_delta(over_model, 'chrf')}, ES {_delta(over_model, 'edit_similarity')} (goal ≥ +{GOAL_POINTS:g} each)",
         over_model["chrf"] >= GOAL_POINTS and over_model["edit_similarity"] >= GOAL_POINTS),
    ]  # fmt: skip
    goals += code_goals(answers)
    print()
    for text, met in goals:
        print(f"{'met' if met else 'NOT met'} ({budget}): {text}")
    return all(met for _, met in goals)


def code_goals(answers: list[dict]) -> list[tuple[str, bool]]:
    """Fine-tuned + context against base + context, the fine-tuned model alone and the lookup for code, on
    the same lines (paired, resampled by commit): each gain at least CODE_GOAL_POINTS, its interval above zero."""
    from pipeline.evaluate.metrics import paired_difference

    bare = [row for row in answers if row["task"] == "code"]
    contextual = [row for row in answers if row["task"] == "code_context"]
    if not contextual:
        return [("the code goal: no case with context was scored (no file at the split point)", False)]
    references, commits = [row["reference"] for row in contextual], [row["commit"] for row in contextual]
    ours = [row["fine_tuned"] for row in contextual]
    against = {
        "base + context": [row["base"] for row in contextual],
        "fine-tuned alone": [row["fine_tuned"] for row in bare],
        "lookup for code": [row["nearest_commit"] for row in contextual],
    }
    goals = []
    for name, theirs in against.items():
        versus = paired_difference("code", theirs, ours, references, commits)
        met = all(
            versus[key] >= CODE_GOAL_POINTS and versus[f"{key}_ci95"][0] > 0
            for key in ("exact_match_pct", "edit_similarity")
        )
        goals.append(
            (f"fine-tuned + context vs {name}: EM {_delta(versus, 'exact_match_pct')}, ES "
             f"{_delta(versus, 'edit_similarity')} (goal ≥ +{CODE_GOAL_POINTS:g} each, intervals above zero)", met)
        )  # fmt: skip
    return goals


def _cost(manifest: dict, cached: bool) -> str:
    """The evaluation stages' time as the run timed them (`evaluation_seconds`: both models, the
    fine-tuned model on the validation commits where it answered them, and the past: the lookup, the
    selector and the backtest that chooses the system, which `.evaluation.cost.retrieval_s` leaves out)."""
    from pipeline.record.run import evaluation_seconds

    share = manifest["training_report"]["evaluation"]["cost"]["share_of_run_pct"]
    spent = evaluation_seconds(manifest["timings"])
    return f"{spent:.0f} s ({share:.1f}% of the run{' (base model cached)' if cached else ''})"


def _delta(versus: dict, key: str) -> str:
    return difference(versus, key) if key in versus else "-"


def _line(text: str) -> str:
    """An answer on one line: newlines shown, blank output named."""
    return repr(text[:100]) if text.strip() else "(blank: whitespace only)"


if __name__ == "__main__":
    sys.exit(main())

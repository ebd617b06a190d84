#!/usr/bin/env python3
"""Secret redaction on real histories: how often each rule fires, every line a person must judge, what
changed against another version, and what a long line costs.

    python benchmarks/bench_redaction.py /path/to/flask /path/to/requests [--against REV] [--show 0]

Each repository is scraped as a run scrapes it (the `diff` format: the message, then the change). The
changed lines (the diffs' `+`/`-` lines) and the lines holding a redaction are counted, per rule and per
10,000 changed lines. Then every distinct redacted line of the rules that read a value by its name or its
place (the provider forms are certain by shape) is printed with the file it was in (its values already
replaced, so the line shows what surrounded them): a redacted line that held no credential is a benign
line mangled, and the goal is at most 1 in 10,000 changed lines. `--show N` prints N of them at most.

`--against REV` scrapes the same histories with repotune at REV (a worktree of this checkout, in its own
process) and prints the lines either version redacts and the other does not: what a change of the rules
did, to read line by line.

Last, the cost of a long line: a 100 kB line made of one rule's hint again and again, in code,
configuration and a document, each redacted alone (the milliseconds of the slowest).

The counts and the long lines' costs are written to benchmarks/results/redaction.json (docs/data.md's
figure is generated from it; the lines themselves are printed, not kept).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.measured import RESULTS, measured_by, write_result
from pipeline.config import ScrapeConfig
from pipeline.hardware import usable_cores
from scrapers.providers import PROVIDER_TOKENS
from scrapers.scrape import scrape
from scrapers.secrets import MESSAGE_ORIGIN, REDACTION, RULES, redact

ROOT = Path(__file__).resolve().parent.parent
LONG_LINE = 100_000  # characters
CERTAIN = {row[0] for row in PROVIDER_TOKENS} | {
    "aws_access_key_id", "github_token", "gitlab_token", "slack_token", "slack_webhook", "stripe_key",
    "google_api_key", "openai_key", "anthropic_key", "huggingface_token", "npm_token", "pypi_token",
    "sendgrid_key", "shopify_token", "digitalocean_token", "vault_token", "databricks_token", "postman_key",
    "telegram_bot_token", "mailchimp_key", "square_token", "sonarqube_token", "sentry_token", "discord_webhook",
    "jwt", "private_key",
}  # fmt: skip
"""Rules that know a secret by its form alone: their lines are counted, not printed to be judged."""
SCRAPE_TEXTS = """
import sys, tempfile, orjson
from pathlib import Path
from pipeline.config import ScrapeConfig
from scrapers.scrape import scrape
with tempfile.TemporaryDirectory() as out:
    scrape([sys.argv[1]], ScrapeConfig(format="diff"), Path(out))
    for line in (Path(out) / "sequences.jsonl").open("rb"):
        sys.stdout.buffer.write(orjson.dumps(orjson.loads(line)["text"]) + b"\\n")
"""
"""A scrape's texts, one JSON string a line, by whichever repotune the process imports."""


def texts_now(repo: str) -> list[str]:
    with tempfile.TemporaryDirectory() as out:
        scrape([repo], ScrapeConfig(format="diff"), Path(out), usable_cores())
        return [orjson.loads(line)["text"] for line in (Path(out) / "sequences.jsonl").open("rb")]


def texts_at(checkout: Path, repo: str) -> list[str]:
    scraped = subprocess.run(
        [sys.executable, "-c", SCRAPE_TEXTS, repo], cwd=checkout, capture_output=True, check=True
    ).stdout
    return [orjson.loads(line) for line in scraped.splitlines()]


def redacted_lines(texts: list[str]) -> tuple[int, list[tuple[str, str]]]:
    """The changed lines of a scrape's texts, and each redacted line with the file it was in."""
    changed, found = 0, []
    for text in texts:
        where = MESSAGE_ORIGIN
        for line in text.splitlines():
            if line.startswith("diff --git "):
                where = line.removeprefix("diff --git ").removeprefix('"').removeprefix("a/").split(" b/")[0]
                continue
            if line.startswith(("+", "-")) and not line.startswith(("+++ ", "--- ")):
                changed += 1
            if "<REDACTED:" in line:
                found.append((where, line))
    return changed, found


def long_line_costs() -> list[tuple[float, str, str]]:
    """Seconds to redact a long line of each hint, in a file of each syntax: the slowest first."""
    hints = sorted({hint for rule in RULES for hint in rule.hints})
    costs = []
    for hint in hints:
        word = hint.replace("\\", "").strip("^$()[]?*+") or hint
        line = ((word + " ") * (LONG_LINE // (len(word) + 1) + 1))[:LONG_LINE]
        for path in ("dist/app.min.js", "config/app.yml", "README.md"):
            text = (
                f"Update\n\ndiff --git a/{path} b/{path}\n--- a/{path}\n+++ b/{path}\n@@ -1 +1 @@\n+{line}\n"
            )
            started = time.perf_counter()
            redact(text)
            costs.append((time.perf_counter() - started, hint, path))
    return sorted(costs, reverse=True)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("repos", nargs="+")
    parser.add_argument("--against", metavar="REV", help="also scrape with repotune at this revision")
    parser.add_argument("--show", type=int, default=None, help="print at most this many lines to judge")
    parser.add_argument("--no-long-line", action="store_true", help="skip the long lines' costs")
    args = parser.parse_args()

    baseline = None
    if args.against:
        baseline = Path(tempfile.mkdtemp(prefix="repotune-baseline-"))
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "add", "--detach", "-q", str(baseline), args.against],
            check=True,
        )
    try:
        changed, found, moved, counted = 0, [], [], []
        for repo in args.repos:
            texts = texts_now(repo)
            repo_changed, repo_found = redacted_lines(texts)
            name = mirror_name(repo)
            line = f"{name}: {repo_changed:,} changed lines, {len(repo_found):,} redacted lines"
            line += f" ({len(repo_found) / max(repo_changed, 1) * 10_000:.2f} per 10,000)"
            if baseline:
                _, before = redacted_lines(texts_at(baseline, repo))
                now_lines, then_lines = (
                    Counter(line for _, line in repo_found),
                    Counter(line for _, line in before),
                )
                line += f"; at {args.against}: {len(before):,}"
                moved += [(name, "+", text) for text in sorted((now_lines - then_lines).elements())]
                moved += [(name, "-", text) for text in sorted((then_lines - now_lines).elements())]
            print(line)
            counted.append({"name": name, "changed_lines": repo_changed, "redacted_lines": len(repo_found)})
            changed += repo_changed
            found += [(f"{name}:{where}", text) for where, text in repo_found]
    finally:
        if baseline:
            subprocess.run(
                ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(baseline)], check=True
            )

    per_rule = Counter(rule for _, line in found for rule in set(REDACTION.findall(line)))
    print(
        f"\nall: {changed:,} changed lines; redacted lines per 10,000: {len(found) / max(changed, 1) * 10_000:.2f}"
    )
    print(f"{'rule':<30}{'lines':>8}{'per 10,000':>12}")
    for rule, count in per_rule.most_common():
        print(f"{rule:<30}{count:>8}{count / changed * 10_000:>12.2f}")

    judged = sorted(
        {(where, line.strip()) for where, line in found if set(REDACTION.findall(line)) - CERTAIN}
    )
    shown = judged if args.show is None else judged[: args.show]
    print(
        f"\n{len(judged)} distinct lines redacted by a value's name or place, to judge ({len(shown)} shown):"
    )
    for where, line in shown:
        print(f"  {where}\n      {line[:200]}")
    if baseline:
        print(f"\n{len(moved)} lines redacted by one version and not the other (+ now, - at {args.against}):")
        for name, sign, line in moved:
            print(f"  {sign} {name}: {line.strip()[:200]}")

    measured = {
        "repositories": counted,
        "per_rule": dict(per_rule.most_common()),
        "judged_lines": len(judged),
    }
    if not args.no_long_line:
        costs = long_line_costs()
        print(
            f"\na {LONG_LINE:,}-character line of one hint, redacted alone ({len(costs)} lines): the slowest"
        )
        for seconds, hint, path in costs[:5]:
            print(f"  {seconds * 1000:8.1f} ms  {hint!r} in {path}")
        slowest, hint, path = costs[0]
        measured["long_line"] = {
            "characters": LONG_LINE,
            "lines": len(costs),
            "mean_s": sum(cost for cost, _, _ in costs) / len(costs),
            "slowest": {"seconds": slowest, "hint": hint, "path": path},
        }
    print(f"\nwritten: {write_result(RESULTS / 'redaction.json', measured_by() | measured)}")


def mirror_name(repo: str) -> str:
    """A repository's name: its folder's, or for a fetched mirror (`owner+name/repo`) owner/name."""
    path = Path(repo.rstrip("/"))
    return path.parent.name.replace("+", "/") if path.name == "repo" else path.name


if __name__ == "__main__":
    main()

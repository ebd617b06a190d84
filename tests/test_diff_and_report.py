"""`diff` and `report` on manifests from real runs: every kind, flag and exit code; every image decodes."""

from __future__ import annotations

import base64
import copy
import html
import io
from html.parser import HTMLParser
from pathlib import Path

import orjson
import pytest

from pipeline.use.diff import compare
from tests.conftest import (
    FAST_TRAINING,
    WITH_BUDGET,
    WITH_FILES,
    GitRepo,
    add_features,
    cpu_only_host,
    read_json,
)


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    """The same repository trained twice: micro-batch 1, then 2."""
    import run_pipeline

    base = tmp_path_factory.mktemp("runs")
    repo = add_features(GitRepo(base / "repo"))
    manifests = []
    for name, batch in (("before", "1"), ("after", "2")):
        out = base / name
        with cpu_only_host():
            code = run_pipeline.main(
                [
                    "--repo",
                    str(repo.path),
                    "--output-dir",
                    str(out),
                    *FAST_TRAINING,
                    *WITH_FILES,
                    *WITH_BUDGET,
                    "--set",
                    f"plan.batch_size={batch}",
                ]
            )
        assert code == 0
        manifests.append(out / "MANIFEST.json")
    return manifests


def write(path, document):
    path.write_bytes(orjson.dumps(document))
    return path


def test_identical_manifests_exit_0(cli, two_runs):
    result = cli("diff", two_runs[0], two_runs[0])
    assert (result.code, result.out.strip()) == (0, "no differences")
    by_directory = cli("diff", two_runs[0].parent, two_runs[0])  # a run's output directory names its manifest
    assert (by_directory.code, by_directory.out.strip()) == (0, "no differences")


def test_differences_are_grouped_by_section_with_deltas(cli, two_runs):
    result = cli("diff", *two_runs)
    assert result.code == 1
    assert "== training_parameters (params) ==" in result.out
    row = next(line.split() for line in result.out.splitlines() if line.split()[:1] == ["batch_size"])
    assert row == ["batch_size", "1", "2", "+1", "+100.0%", "changed"]
    assert "run.id" not in result.out and "started_at" not in result.out  # volatile: left out
    assert "loss_history" not in result.out  # series: compared through their summaries
    assert "training.summary.last" in result.out


def test_each_metric_says_what_it_is_and_a_measurement_is_never_a_param(cli, two_runs):
    out = cli("diff", *two_runs).out
    params = out.split("== training_parameters (params) ==")[1].split("\n\n")[0]
    assert "measured_tokens_per_s" not in params  # measured, not decided: under metrics
    rows = {line.strip().split("  ")[0]: line for line in out.splitlines() if line.startswith("  ")}
    assert "training.summary.last" in rows["loss (training), last step"]
    assert "evaluation.after.loss " in rows["held-out loss, fine-tuned"]
    assert "evaluation.after.perplexity" in rows["held-out perplexity, fine-tuned"]
    assert "measured_tokens_per_s" in rows["speed the plan rests on (tokens/s, measured)"]
    assert "vs_nearest_commit.chrf " in rows["commit message chrF, fine-tuned minus the lookup's"]


@pytest.mark.parametrize(
    ("path", "words"),
    [
        ("training_report.evaluation.tasks.suggested.message.edit_similarity_ci95",
         "commit message edit similarity, suggestion, 95% interval"),
        ("training_report.evaluation.tasks.before.code.exact_match_pct", "next line exact match %, base model"),
        ("training_report.evaluation.before.per_format.message.loss", "held-out loss, base model, message format"),
        ("training_report.evaluation.cost.after_s", ""),
        # What chose the suggestion system, and how alike the answers begin: named too.
        ("training_report.evaluation.system.lookup_gain.mean_ci95",
         "the lookup's gain over the selector in the mean of chrF and edit similarity, older commits, 95% interval"),
        ("training_report.evaluation.system.validation.selector.chrf",
         "commit message chrF, selector, older commits (choosing the system)"),
        ("training_report.evaluation.tasks.after.message.commonest_opening.answers",
         "answers beginning with their commonest first word, fine-tuned"),
    ],
)  # fmt: skip
def test_metric_names_are_built_from_the_path(path, words):
    from pipeline.use.diff import describe

    assert describe(path) == words


def test_json_output_lists_every_change_with_its_kind(cli, two_runs):
    result = cli("diff", *two_runs, "--json")
    report = orjson.loads(result.out)
    change = next(c for c in report["changes"] if c["path"] == "training_parameters.batch_size")
    assert change == {
        "path": "training_parameters.batch_size",
        "path_array": ["training_parameters", "batch_size"],
        "category": "params",
        "kind": "changed",
        "old": 1,
        "new": 2,
        "delta": 1,
        "rel_delta": 1.0,
    }
    assert set(report["counts"]) == {
        "changed",
        "added",
        "removed",
        "type_changed",
        "became_null",
        "became_non_null",
        "unchanged",
    }
    assert report["counts"]["changed"] == sum(c["kind"] == "changed" for c in report["changes"])


def test_every_kind_of_change(two_runs):
    before = read_json(two_runs[0])
    after = copy.deepcopy(before)
    after["training_parameters"]["seed"] = 7  # changed
    after["scrape"]["skipped"]["merge"] = 3  # added
    del after["config"]["overrides"]["train.epochs"]  # removed
    after["training_parameters"]["lr_scheduler"] = 5  # type_changed
    after["training_report"]["evaluation"]["after"] = None  # became_null
    after["error"] = "boom"  # became_non_null
    kinds = {c.path: c.kind for c in compare(before, after) if c.kind != "unchanged"}
    assert kinds == {
        "training_parameters.seed": "changed",
        "scrape.skipped.merge": "added",
        "config.overrides.train.epochs": "removed",
        "training_parameters.lr_scheduler": "type_changed",
        "training_report.evaluation.after": "became_null",
        "error": "became_non_null",
    }


def test_records_are_matched_by_identity_not_position(two_runs):
    before = read_json(two_runs[0])
    after = copy.deepcopy(before)
    after["training_report"]["training"]["epoch_summaries"].reverse()
    after["training_report"]["training"]["epoch_summaries"][0]["loss_mean"] += (
        1  # the last epoch, now listed first
    )
    changes = [c for c in compare(before, after) if c.kind != "unchanged"]
    last = len(before["training_report"]["training"]["epoch_summaries"])
    assert [c.path for c in changes] == [f"training_report.training.epoch_summaries[epoch={last}].loss_mean"]
    assert changes[0].path_array[-2] == {"epoch": last}


def test_flags_all_md_only_ignore_and_volatile(cli, two_runs):
    everything = cli("diff", *two_runs, "--unchanged").out
    assert (
        "unchanged" in everything and "training_parameters.seed" not in everything and "  seed " in everything
    )
    markdown = cli("diff", *two_runs, "--md").out
    assert (
        "### training_parameters (params)" in markdown and "| path | old | new | Δ | Δ% | kind |" in markdown
    )
    only = cli("diff", *two_runs, "--only", "training_parameters.*").out
    assert only.startswith("== training_parameters (params) ==") and "== timings ==" not in only
    ignored = cli("diff", *two_runs, "--ignore", "timings.*", "--ignore", "training_report.*").out
    assert (
        "== timings ==" not in ignored
        and "== training_report ==" not in ignored
        and "== training_parameters (params) ==" in ignored
    )
    volatile = cli("diff", *two_runs, "--include-volatile", "--only", "run.*").out
    assert "id" in volatile and "started_at" in volatile


def test_fail_if_gates(cli, two_runs):
    """With --fail-if the exit code is the gate's, apart from every error's (2): 1 a condition tripped, 0
    none did, differences or not."""
    steps = ["--only", "training_parameters.*"]
    tripped = cli("diff", *two_runs, *steps, "--fail-if", "training_parameters.total_steps<-10%")
    assert tripped.code == 1
    assert (
        "repotune: fail-if tripped: training_parameters.total_steps<-10%: training_parameters.total_steps"
        in tripped.err
    )
    assert cli("diff", *two_runs, *steps).code == 1  # they differ
    assert cli("diff", *two_runs, *steps, "--fail-if", "training_parameters.total_steps>+10%").code == 0
    assert (
        cli("diff", *two_runs, *steps, "--fail-if", "training_parameters.batch_size>=+1").code == 1
    )  # a change of +1
    assert (
        cli("diff", *two_runs, *steps, "--fail-if", "training_parameters.batch_size>5").code == 0
    )  # the new value
    identical = cli(
        "diff", two_runs[0], two_runs[0], "--fail-if", "training_report.training.summary.last>+5%"
    )
    assert identical.code == 0


@pytest.mark.parametrize(
    ("condition", "message"),
    [
        ("summary.last ~ 5", "expected PATH, an operator"),
        ("training_report.nope>1", "no path 'training_report.nope'"),
        ("run.command>1", "is not a number in both manifests"),
    ],
)
def test_bad_fail_if_is_one_line_exit_2(cli, two_runs, condition, message):
    result = cli("diff", *two_runs, "--fail-if", condition)
    assert result.code == 2
    assert message in result.err.strip().splitlines()[-1]


def test_unreadable_manifest_and_other_major_version(cli, two_runs, tmp_path):
    missing = cli("diff", tmp_path / "nope.json", two_runs[0])
    assert missing.code == 2 and "cannot read" in missing.err
    (tmp_path / "bad.json").write_text("{not json")
    broken = cli("diff", tmp_path / "bad.json", two_runs[0])
    assert broken.code == 2 and "is not valid JSON" in broken.err.strip().splitlines()[-1]
    future = read_json(two_runs[1])
    future["schema_version"] = "2.0.0"
    result = cli("diff", two_runs[0], write(tmp_path / "future.json", future))
    assert result.code == 1
    from pipeline.manifest import SCHEMA_VERSION

    assert (
        f"warning: this repotune reads manifest schema {SCHEMA_VERSION}; AFTER has schema 2.0.0" in result.err
    )


class Images(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.sources: list[str] = []
        self.headings: list[str] = []
        self._in_heading = False

    def handle_starttag(self, tag, attrs):
        if tag == "img":
            self.sources.append(dict(attrs)["src"])
        self._in_heading = tag == "h2"

    def handle_data(self, data):
        if self._in_heading:
            self.headings.append(data.split(" (")[0])
            self._in_heading = False


def test_report_is_one_page_whose_images_all_decode(cli, two_runs, tmp_path):
    from PIL import Image

    page = tmp_path / "report.html"
    result = cli("report", two_runs[1], "-o", page)
    assert result.code == 0 and result.out.strip() == str(page)
    parser = Images()
    parser.feed(page.read_text())
    assert parser.headings == [
        "What it learned", "Samples", "The run", "Training", "Throughput", "Stages", "Hardware", "Epochs", "Data",
        "Config",
    ]  # fmt: skip
    text = page.read_text()
    assert text.index("What it learned") < text.index("<summary>Plan") < text.index("Throughput")  # folded
    assert len(parser.sources) >= 2
    for source in parser.sources:
        assert source.startswith("data:image/png;base64,")  # embedded: the page opens offline
        image = Image.open(io.BytesIO(base64.b64decode(source.split(",", 1)[1])))
        image.verify()
        assert image.size[0] > 300 and image.size[1] > 100
    assert "http://" not in page.read_text() and "https://" not in page.read_text()


def test_report_of_a_scrape_says_what_was_not_measured(cli, sample_repo, tmp_path):
    out = tmp_path / "out"
    assert cli("scrape", "--repo", sample_repo.path, "--output-dir", out).code == 0
    assert cli("report", out).code == 0  # the output directory, as `generate --adapter` takes it
    text = (out / "report.html").read_text()
    assert "no training steps recorded" in text and "not planned" in text


def test_report_escapes_what_the_repository_wrote(two_runs, tmp_path):
    from pipeline.use.report import render_report

    manifest = read_json(two_runs[0])
    manifest["training_report"]["evaluation"]["samples"]["after"][0]["output"] = "<script>alert(1)</script>"
    page = render_report(manifest)
    assert "<script>alert(1)</script>" not in page and "&lt;script&gt;" in page


def test_report_shows_the_task_metrics_and_names_a_blank_answer(two_runs):
    from pipeline.use.report import render_report

    manifest = read_json(two_runs[0])
    manifest["training_report"]["evaluation"]["samples"]["after"][0]["output"] = "\n\n  \n"
    after = manifest["training_report"]["evaluation"]["tasks"]["after"]["message"]
    after["commonest_opening"] = {"word": "add", "answers": after["samples"], "references": 0}
    page = render_report(manifest)
    assert (
        f'the fine-tuned model begins {after["samples"]} of its {after["samples"]} answers with "add"'
        in html.unescape(page)
    )
    assert "Commit message from its diff" in page and "lookup (most similar past commit)" in page
    assert "chrF vs lookup" in page and "Next line at a cursor" in page and "exact match % [95%]" in page
    assert "diff perplexity" in page
    assert "(blank: 5 whitespace characters)" in page


def test_report_tables_read_at_a_glance(two_runs):
    """The scoreboard comes first, under a one-line title, and the run's facts after it; a list of facts
    has no blank header row and its names never wrap, nor a compared path; the scoreboard's headings break
    between words, never inside one (in a 1280-pixel window of headless Chromium, "subject exact %" had
    stood one letter a line, and "started / finished", "repository" a syllable a line); the held-out
    loss's change is a percentage, as the run prints it."""
    from pipeline.use.report import STYLE, render_report

    manifest = read_json(two_runs[0])
    page = render_report(manifest)
    title = page.split("<h1>", 1)[1].split("<h2>", 1)[0]
    assert manifest["run"]["id"] in title and "completed" in title and "<table" not in title
    assert page.index("<h2>What it learned") < page.index("<h2>The run</h2>")
    assert "<tr><th></th><th></th></tr>" not in page
    assert '<table class="facts"><tr><td>status</td>' in page
    assert "table.facts td:first-child, table.paths td:first-child { white-space: nowrap;" in STYLE
    assert "table.scores th { overflow-wrap: normal; }" in STYLE
    assert "table.scores td:first-child { white-space: normal;" in STYLE  # the system's name may wrap
    change = manifest["training_report"]["evaluation"]["relative_change"]
    assert f"({change:+.1%})</td>" in page and "relative)" not in page


def test_diff_compares_the_task_metrics(cli, two_runs):
    changed = cli("diff", *two_runs, "--json", "--all").out
    paths = {change["path"] for change in orjson.loads(changed)["changes"]}
    assert any(path.startswith("training_report.evaluation.tasks.after.") for path in paths)


def cookbook_queries() -> list[tuple[str, bool]]:
    """Every jq filter in the manual's cookbook and in the README, as a user would copy them, and whether
    it reads its manifests as one array (`-s`, over the runs an output directory keeps)."""
    return jq_lines("docs/manifest.md", "### jq cookbook") + jq_lines("README.md", "## Read what happened")


def jq_lines(page: str, heading: str) -> list[tuple[str, bool]]:
    """The jq filters of the first ```sh block after `heading` in `page`."""
    import shlex
    from pathlib import Path

    text = (Path(__file__).resolve().parent.parent / page).read_text()
    block = text.split(heading, 1)[1].split("```sh", 1)[1].split("```", 1)[0]
    queries = []
    for line in block.splitlines():
        words = shlex.split(line, comments=True)
        if words[:1] == ["jq"]:
            assert words[-1] in ("MANIFEST.json", "repotune-output/runs/*/MANIFEST.json"), line
            queries.append((next(word for word in words[1:] if not word.startswith("-")), "-s" in words))
    return queries


def test_the_readme_cookbook_runs_against_a_real_manifest(two_runs):
    import jq

    manifest = read_json(two_runs[1])
    results = {
        query: jq.compile(query).input([manifest, manifest] if slurp else manifest).all()
        for query, slurp in cookbook_queries()
    }
    assert len(results) >= 18
    rates = [
        entry["learning_rate"] for entry in results[".training_report.learning_rate.history | .[0:5]"][0]
    ]
    rising = rates[: manifest["training_parameters"]["warmup_steps"] + 1]
    assert (
        len(rates) == 5 and len(rising) > 1 and rising == sorted(rising) and rising[0] < rising[-1]
    )  # warmup
    assert results[".training_parameters.batch_size"] == [2]
    epochs = results[".training_report.training.epoch_summaries"][0]
    assert [summary["epoch"] for summary in epochs] == list(
        range(1, manifest["training_parameters"]["epochs"] + 1)
    )
    assert results[".training_report.hardware.collection_interval_seconds"] == [0.5]
    steps = results[".training_parameters | {total_steps, warmup_steps}"][0]
    assert 0 <= steps["warmup_steps"] < steps["total_steps"]
    assert results[".total_execution_time_seconds"][0] > 0
    assert results["{status, error}"] == [{"status": "completed", "error": None}]
    assert results[".training_report.evaluation.samples.after[0].output"][0]
    assert all(values != [None] for query, values in results.items() if "gpus" not in query), results


def test_diff_shows_params_and_metrics_unless_asked_for_all(cli, two_runs):
    shown = cli("diff", *two_runs).out
    sections = [line for line in shown.splitlines() if line.startswith("== ")]
    assert sections[0] == "== config (params) =="
    assert all(line.endswith(("(params) ==", "(metrics) ==")) for line in sections)
    assert (
        "effective.plan.batch_size" in shown and "tokens_per_s" in shown and "evaluation.after.loss" in shown
    )
    assert "timings" not in shown and "hardware" not in shown and "decisions" not in shown
    everything = cli("diff", *two_runs, "--all").out
    assert "== timings ==" in everything and "decisions.total_steps.reason" in everything
    assert len(everything.splitlines()) > 2 * len(shown.splitlines())


def test_diff_compares_identifiers_as_values_and_objects_as_paths(two_runs):
    before = read_json(two_runs[0])
    after = copy.deepcopy(before)
    after["training_report"]["hardware"]["followed_process"]["pid"] += 1
    after["training_report"]["hardware"]["nodes"][0]["hostname"] = "elsewhere"
    after["training_report"]["hardware"]["nodes"].append(
        {"node": 1, "hostname": "second", "summary": {"cpu_pct": {"max": 50}}}
    )
    changes = {c.path: c for c in compare(before, after) if c.kind != "unchanged"}
    pid = changes["training_report.hardware.followed_process.pid"]
    assert (pid.kind, pid.delta, pid.rel_delta) == ("changed", None, None)  # another process, not "+1"
    assert changes["training_report.hardware.nodes[node=0].hostname"].new == "elsewhere"
    added = sorted(path for path, c in changes.items() if c.kind == "added")
    assert added == [
        "training_report.hardware.nodes[node=1].hostname",
        "training_report.hardware.nodes[node=1].node",
        "training_report.hardware.nodes[node=1].summary.cpu_pct.max",
    ]  # leaf by leaf, never a JSON blob


def test_compare_page_overlays_runs_and_tables_what_differs(cli, two_runs, tmp_path):
    page = tmp_path / "compare.html"
    result = cli("report", *two_runs, "-o", page, "--name", "micro-1", "--name", "micro-2")
    assert result.code == 0 and result.out.strip() == str(page)
    html = page.read_text()
    parser = Images()
    parser.feed(html)
    # Each run's commit messages side by side, before the curves: not a screen of paths further down.
    assert parser.headings == ["Runs", "Commit messages", "Curves", "What differs"]
    messages = html.split("<h2>Commit messages</h2>", 1)[1].split("<h2>", 1)[0]
    for name, path in zip(("micro-1", "micro-2"), two_runs, strict=True):
        evaluation = read_json(path)["training_report"]["evaluation"]
        suggested = evaluation["tasks"]["suggested"]["message"]
        assert (
            f"<tr><td>{name}</td><td>{evaluation['system']['name']}</td><td>{suggested['samples']}</td>"
            f"<td>{suggested['chrf']:g} / {suggested['edit_similarity']:g}</td>" in messages
        )
    assert len(parser.sources) == 1 and "training and held-out loss of every run, overlaid" in html
    params = html.split("<h3>Params</h3>", 1)[1].split("<h3>", 1)[0]
    assert '<table class="paths"><tr><th>path</th><th>micro-1</th><th>micro-2</th>' in params
    assert "<tr><td>config.effective.plan.batch_size</td><td>1</td><td>2</td></tr>" in params
    assert (
        html.index("<h3>Params</h3>")
        < html.index("<h3>Metrics</h3>")
        < html.index("<h3>Everything else</h3>")
    )
    default = cli("report", *two_runs)  # named by output directory, written here
    assert default.code == 0 and default.out.strip() == "compare.html"
    assert "<td>before</td>" in (Path.cwd() / "compare.html").read_text()
    (Path.cwd() / "compare.html").unlink()
    wrong = cli("report", *two_runs, "--name", "only-one", "-o", page)
    assert (
        wrong.code == 2
        and wrong.err.strip() == "repotune: error: --name: give one per manifest (2), or none; got 1"
    )


def test_single_run_page_shows_what_the_manifest_holds(two_runs):
    from pipeline.use.report import held_out_curve, render_report

    manifest = read_json(two_runs[0])
    manifest["scrape"]["files_skipped"] = {"binary": 2}
    manifest["scrape"]["redactions"] = {"aws_access_key": 1}
    page = render_report(manifest)
    order = manifest["training_parameters"]["decision_order"]
    positions = [page.index(f"<td>{name}</td>") for name in order]
    assert positions == sorted(positions) and order[0] == "device"  # as the CLI prints them, not a-z
    assert "loss, gradient-norm and learning-rate curves" in page
    for shown in ("tokens per second", "waiting for data", "stage</th>", "tokenize", "files left out because",
                  "<td>binary</td><td>2</td>", "<td>aws_access_key</td><td>1</td>", "token cache", "plan.batch_size"):  # fmt: skip
        assert shown in page, shown
    curve = held_out_curve(manifest)
    evaluation = manifest["training_report"]["evaluation"]
    assert curve[0] == (0, evaluation["before"]["loss"])
    assert curve[-1] == (manifest["training_report"]["training"]["global_step"], evaluation["after"]["loss"])
    manifest["training_report"]["throughput"] = None  # an interrupted run
    assert "not measured: training did not finish" in render_report(manifest)
    assert "None" not in render_report(manifest).split("<h2>Throughput", 1)[0]

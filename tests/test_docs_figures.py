"""The docs' measured figures are what their benchmarks' results files say (`benchmarks/figures.py`)."""

from __future__ import annotations

import runpy
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIGURES = runpy.run_path(str(ROOT / "benchmarks" / "figures.py"))


def test_every_figure_in_the_readme_and_the_docs_is_generated_from_its_results():
    stale = []
    for page in FIGURES["pages"]():
        _, changed = FIGURES["rendered"](page.read_text())
        stale += [f"{page.name}: {name}" for name in changed]
    assert not stale, f"run `python benchmarks/figures.py` (or the benchmark again): {stale}"


def test_every_figure_is_on_a_page_and_every_results_file_is_read():
    pages = "".join(page.read_text() for page in FIGURES["pages"]())
    assert all(f"<!-- figure: {name} -->" in pages for name in FIGURES["FIGURES"])
    for name in FIGURES["FIGURES"]:
        FIGURES["FIGURES"][name]()  # every results file it reads is there


def test_a_page_that_disagrees_with_its_results_is_found_and_written_again(tmp_path):
    text = "before\n<!-- figure: ablation-flask -->\n| a stale table |\n<!-- /figure -->\nafter\n"
    new, changed = FIGURES["rendered"](text)
    assert changed == ["ablation-flask"]
    assert new.startswith("before\n<!-- figure: ablation-flask -->\n| trained on |") and new.endswith(
        "<!-- /figure -->\nafter\n"
    )
    assert FIGURES["rendered"](new) == (new, [])
    check = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "figures.py"), "--check"], capture_output=True, text=True
    )
    assert check.returncode == 0, check.stdout + check.stderr

"""Jupyter notebooks are read as their cells' source, in training and in the commit hook alike."""

from __future__ import annotations

import base64

import orjson

from pipeline.config import ScrapeConfig
from scrapers.filters import as_trained, file_filters
from scrapers.notebooks import cells_source, parse_batch
from scrapers.scrape import scrape
from tests.conftest import GitRepo, trained_diff

PLOT = base64.b64encode(bytes(range(256)) * 40).decode()  # a plot's PNG, as a notebook embeds it


def notebook(x: int, runs: int, plot: str = PLOT) -> str:
    """A notebook as Jupyter writes it: one-space indent, outputs and counts beside the source."""
    cells = [
        {"cell_type": "markdown", "metadata": {}, "source": ["# Load\n", "\n", "Read the data."]},
        {
            "cell_type": "code",
            "execution_count": runs,
            "metadata": {},
            "outputs": [{"output_type": "display_data", "data": {"image/png": plot}, "metadata": {}}],
            "source": ["import numpy as np\n", f"x = np.arange({x})\n", "x.sum()"],
        },
    ]
    document = {
        "cells": cells,
        "metadata": {"kernelspec": {"name": "python3"}},
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    return orjson.dumps(document, option=orjson.OPT_INDENT_2).decode() + "\n"


def test_a_notebook_is_trained_as_its_cells_source(tmp_path):
    """A change to a notebook is a diff of its cells in the percent format (what jupytext, VS Code and
    Spyder read): no JSON, outputs, counts or base64. A notebook only run again keeps its name and no
    hunk. One larger than `max_file_bytes` for its plots, which git does not diff, is read too."""
    repo = GitRepo(tmp_path / "nb")
    repo.commit("Add the analysis", {"analysis.ipynb": notebook(10, 1)})
    repo.commit("Sum a longer range", {"analysis.ipynb": notebook(20, 2, PLOT[::-1])})
    repo.commit("Run the analysis again", {"analysis.ipynb": notebook(20, 3, PLOT[1:])})
    out = tmp_path / "out"
    out.mkdir()
    result = scrape([repo.path], ScrapeConfig(format="diff", max_file_bytes=4096), out)
    texts = [orjson.loads(line)["text"] for line in (out / "sequences.jsonl").read_bytes().splitlines()]
    assert texts == [
        "Run the analysis again\n\ndiff --git a/analysis.ipynb b/analysis.ipynb\n",
        "Sum a longer range\n\n"
        "diff --git a/analysis.ipynb b/analysis.ipynb\n"
        "--- a/analysis.ipynb\n"
        "+++ b/analysis.ipynb\n"
        "@@ -5,5 +5,5 @@\n"
        " \n"
        " # %%\n"
        " import numpy as np\n"
        "-x = np.arange(10)\n"
        "+x = np.arange(20)\n"
        " x.sum()\n",
        "Add the analysis\n\n"
        "diff --git a/analysis.ipynb b/analysis.ipynb\n"
        "new file mode 100644\n"
        "--- /dev/null\n"
        "+++ b/analysis.ipynb\n"
        "@@ -0,0 +1,9 @@\n"
        "+# %% [markdown]\n"
        "+# # Load\n"
        "+#\n"
        "+# Read the data.\n"
        "+\n"
        "+# %%\n"
        "+import numpy as np\n"
        "+x = np.arange(10)\n"
        "+x.sum()\n",
    ]
    assert len(notebook(10, 1)) > 4096  # git called every version binary
    assert (result.stats.notebooks_read, dict(result.stats.files_skipped)) == (3, {})


def test_a_notebook_that_is_not_json_stays_as_git_diffed_it(tmp_path):
    """A conflict committed into a notebook is not a notebook: its diff is git's."""
    repo = GitRepo(tmp_path / "nb")
    repo.commit("Add the analysis", {"analysis.ipynb": notebook(10, 1)})
    broken = notebook(10, 1).replace('"cells"', '<<<<<<< HEAD\n "cells"', 1)
    repo.commit("Merge by hand", {"analysis.ipynb": broken})
    out = tmp_path / "out"
    out.mkdir()
    result = scrape([repo.path], ScrapeConfig(format="diff"), out)
    newest = orjson.loads((out / "sequences.jsonl").read_bytes().splitlines()[0])["text"]
    assert "+  <<<<<<< HEAD\n" in newest and result.stats.notebooks_read == 1  # the first, added whole


def test_a_staged_notebook_is_read_as_training_read_it(tmp_path, monkeypatch):
    """The commit hook reads a staged notebook from the repository it runs in, as the scrape read the
    same change once committed; outside a repository its versions cannot be read and git's diff stays."""
    from pipeline.use.hook import staged_diff

    repo = GitRepo(tmp_path / "nb")
    repo.commit("Add the analysis", {"analysis.ipynb": notebook(10, 1)})
    (repo.path / "analysis.ipynb").write_text(notebook(30, 2, PLOT[2:]))
    repo.git("add", "-A")
    monkeypatch.chdir(repo.path)
    staged = staged_diff()
    read = as_trained(staged, file_filters(ScrapeConfig()))
    monkeypatch.chdir(tmp_path)
    elsewhere = as_trained(staged, file_filters(ScrapeConfig()))
    assert read == trained_diff(repo, "Sum a longer range", tmp_path / "out")
    assert "+x = np.arange(30)\n" in read
    assert '"execution_count"' in elsewhere and "index " not in elsewhere


def test_cells_source_reads_both_notebook_formats():
    """nbformat 4's cells, nbformat 3's worksheets (code in `input`); anything else is not a notebook."""
    version_3 = {
        "worksheets": [
            {
                "cells": [
                    {"cell_type": "heading", "level": 1, "source": "Title"},
                    {"cell_type": "code", "input": ["a = 1\n", "a"], "outputs": []},
                ]
            }
        ],
        "nbformat": 3,
    }
    assert cells_source(orjson.dumps(version_3)) == ["# %% [heading]", "# Title", "", "# %%", "a = 1", "a"]
    assert cells_source(b'{"cells": []}') == []
    assert [cells_source(raw) for raw in (b"[1]", b"{}", b"not json", b'{"cells": [1]}', None)] == [None] * 5
    odd = {"worksheets": [{"cells": 5}, {"cells": [{"cell_type": "code", "source": ["x", 1, None]}]}]}
    assert cells_source(orjson.dumps(odd)) == ["# %%", "x1None"]  # never a traceback


def test_parse_batch_keys_each_blob_by_the_id_asked():
    """`git cat-file --batch` answers in the order asked, with full ids: a diff's abbreviated ids, and
    a missing one, still find theirs."""
    output = b"aaaa1111 blob 3\nabc\nbbbb missing\ncccc2222 blob 0\n\n"
    assert parse_batch(["aaaa", "bbbb", "cccc"], output) == {"aaaa": b"abc", "cccc": b""}


def test_blob_contents_reads_what_git_holds_up_to_the_limit(tmp_path):
    """The scrape's reader: a notebook larger than the limit, or a blob the repository does not hold
    (a partial clone's), is not read, and its change stays as git diffed it."""
    from scrapers.git import blob_contents, open_repository

    repo = GitRepo(tmp_path / "nb")
    repo.commit("Add", {"small.ipynb": '{"cells": []}', "large.ipynb": notebook(10, 1)})
    small, large = (repo.git("rev-parse", f"HEAD:{name}") for name in ("small.ipynb", "large.ipynb"))
    opened = open_repository(repo.path)
    read = blob_contents(opened, [small, large, "0123456789" * 4], max_bytes=4096)
    opened.git.clear_cache()
    assert read == {small: b'{"cells": []}'}

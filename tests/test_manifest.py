"""Manifest writing: atomic, readable layout, never NaN."""

from __future__ import annotations

import errno
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.manifest import finite, new_manifest, read_manifest, write_json

ROOT = Path(__file__).resolve().parent.parent


def test_write_is_sorted_indented_and_ends_with_a_newline(tmp_path):
    path = tmp_path / "MANIFEST.json"
    write_json(path, {"b": 1, "a": {"d": [1, 2], "c": None}})
    assert (
        path.read_text()
        == '{\n  "a": {\n    "c": null,\n    "d": [\n      1,\n      2\n    ]\n  },\n  "b": 1\n}\n'
    )
    assert [p.name for p in tmp_path.iterdir()] == ["MANIFEST.json"]  # no temporary file left behind


def test_non_finite_numbers_never_reach_the_file(tmp_path):
    path = tmp_path / "MANIFEST.json"
    write_json(path, {"loss": math.nan, "inf": math.inf, "ok": finite(math.inf)})
    assert read_manifest(path) == {"loss": None, "inf": None, "ok": None}


def test_a_failed_write_leaves_the_previous_manifest_intact(tmp_path):
    path = tmp_path / "MANIFEST.json"
    write_json(path, {"status": "completed"})
    with pytest.raises(TypeError):
        write_json(path, {"status": object()})  # not serialisable: fails before the rename
    assert read_manifest(path) == {"status": "completed"}


def test_a_write_the_disk_refuses_leaves_the_previous_manifest_and_no_temporary_file(tmp_path):
    """A full disk fails the temporary file's write: it is removed, and the manifest is what it was. A
    process whose files may not grow past 64 bytes meets that refusal for real."""
    path = tmp_path / "MANIFEST.json"
    write_json(path, {"status": "running"})
    refused = (
        "import resource, signal, sys\n"
        "from pathlib import Path\n"
        "from pipeline.manifest import write_json\n"
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (64, 64))\n"
        "try:\n"
        "    write_json(Path(sys.argv[1]), {'status': 'failed', 'error': 'x' * 100})\n"
        "except OSError as err:\n"
        "    print(err.strerror)\n"
    )
    said = subprocess.run([sys.executable, "-c", refused, path], cwd=ROOT, capture_output=True, text=True)
    assert said.stdout.strip() == os.strerror(errno.EFBIG), said.stderr
    assert read_manifest(path) == {"status": "running"}
    assert [p.name for p in tmp_path.iterdir()] == ["MANIFEST.json"]


def test_new_manifest_has_every_section():
    manifest = new_manifest("run", ["--repo", "x"])
    assert manifest["status"] == "running"
    assert manifest["tool"]["name"] == "repotune"
    for section in (
        "config",
        "repository",
        "scrape",
        "dataset",
        "hardware",
        "training_parameters",
        "training_report",
        "outputs",
    ):
        assert section in manifest

"""Scraping repositories for a benchmark the way a user does: the real CLI with the shipped config."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def scraped(repos: Iterable[str], output_dir: str) -> Iterator[tuple[str, Path]]:
    """Each repository's name and its scrape folder under `output_dir`, scraped by `run_pipeline.py
    scrape` (reused when nothing changed); exits 2, said on stderr, when a scrape fails."""
    for repo in repos:
        name = Path(repo).resolve().name
        output = Path(output_dir) / name
        command = [
            sys.executable,
            str(ROOT / "run_pipeline.py"),
            "scrape",
            "--repo",
            repo,
            "--output-dir",
            str(output),
        ]
        print("$ " + " ".join(command), flush=True)
        if subprocess.run(command, stdout=subprocess.DEVNULL).returncode != 0:
            print(f"scraping {repo} failed", file=sys.stderr)
            sys.exit(2)
        yield name, output

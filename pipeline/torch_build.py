"""Which torch build the set-up installs: `make install` runs this before anything is installed, so it
uses the standard library alone.

PyPI's torch for Linux is the CUDA build: NVIDIA's libraries come with it (gigabytes), useless on a
machine without an NVIDIA GPU. So where the machine has no NVIDIA driver and the torch requirement names
no index, PyTorch's CPU index is offered beside the others (pip prefers its 2.13.0+cpu to PyPI's 2.13.0),
and pip is first asked what it would install: where that is still the CUDA build (no CPU build for this
Python is at hand or on that index, or the index cannot be reached), the set-up stops in one line that
says how to choose, instead of downloading gigabytes.

    python -m pipeline.torch_build torch==2.13.0   # prints the pip arguments to install, or exits 1
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

CPU_INDEX = "https://download.pytorch.org/whl/cpu"
NVIDIA_DRIVER = Path("/proc/driver/nvidia/version")
"""Present where an NVIDIA driver is loaded (Linux)."""
INDEX_OPTIONS = ("-i", "--index-url", "--extra-index-url", "--no-index", "-f", "--find-links")


def nvidia_gpu() -> bool:
    """Whether the CUDA build is the one wanted: an NVIDIA driver is loaded, or its nvidia-smi is on PATH
    (WSL 2 has the latter and no /proc entry)."""
    return NVIDIA_DRIVER.exists() or shutil.which("nvidia-smi") is not None


def with_cpu_index(requirement: list[str], nvidia: bool) -> list[str]:
    """The pip arguments for `requirement`: with the CPU index beside the others where the machine has
    no NVIDIA driver and the requirement chooses no index itself (then it is the user's choice). No
    retries there: where the index cannot be reached (a machine offline but for a mirror of PyPI), each
    retry cost seconds and found nothing."""
    if nvidia or any(part.split("=")[0] in INDEX_OPTIONS for part in requirement):
        return requirement
    return [*requirement, "--extra-index-url", CPU_INDEX, "--retries", "0"]


def cuda_libraries(report: dict) -> list[str]:
    """The NVIDIA libraries in what pip's installation report would install (the CUDA build's)."""
    # Names as PEP 503 compares them: a wheel's metadata may spell nvidia-cublas nvidia_cublas.
    names = (
        re.sub(r"[-_.]+", "-", package["metadata"]["name"]).lower() for package in report.get("install", [])
    )
    return sorted(name for name in names if name.startswith("nvidia-"))


def refusal(requirement: list[str], libraries: list[str]) -> str:
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    wanted = " ".join(requirement)
    return (
        f"repotune set-up: pip would install {wanted} as the CUDA build ({len(libraries)} NVIDIA libraries, "
        f"gigabytes) on a machine without an NVIDIA GPU: no CPU build for Python {python} is at hand or at "
        f"{CPU_INDEX} (or that index cannot be reached from here). Use a Python that has one (make "
        f'PYTHON=python3.X), or choose the build: make TORCH_SPEC="{wanted} --index-url URL" with your mirror '
        f'of {CPU_INDEX}, or TORCH_SPEC="{wanted} --index-url https://pypi.org/simple" for the CUDA build all '
        "the same"
    )


def main(requirement: list[str]) -> int:
    arguments = with_cpu_index(requirement, nvidia_gpu())
    if arguments != requirement:
        planned = subprocess.run(
            [sys.executable, "-m", "pip", "install", "--dry-run", "--quiet", "--report", "-", *arguments],
            stdout=subprocess.PIPE,
            text=True,
        )
        if planned.returncode != 0:  # pip has said why, on stderr
            return planned.returncode
        libraries = cuda_libraries(json.loads(planned.stdout))
        if libraries:
            print(refusal(requirement, libraries), file=sys.stderr)
            return 1
    print(" ".join(arguments))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""The set-up's choice of torch build (pipeline/torch_build.py, which `make install` runs first): the CPU
build on a machine without an NVIDIA GPU, or a stop in one line where pip would install the CUDA build.
pip itself answers, offline: its index is a folder of wheels made here."""

import subprocess
import zipfile
from pathlib import Path

import pytest

from pipeline import torch_build


def wheel(folder: Path, name: str, version: str, *requires: str) -> None:
    """A wheel holding nothing but what pip reads to resolve it."""
    info = f"{name.replace('-', '_')}-{version}.dist-info"
    with zipfile.ZipFile(folder / f"{name.replace('-', '_')}-{version}-py3-none-any.whl", "w") as archive:
        archive.writestr(
            f"{info}/METADATA",
            f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
            + "".join(f"Requires-Dist: {requirement}\n" for requirement in requires),
        )
        archive.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        archive.writestr(f"{info}/RECORD", "")


@pytest.fixture
def wheels_at_hand(tmp_path, monkeypatch) -> Path:
    """pip reads this folder alone (no index, no configuration file) as a new environment's pip does (the
    suite's has torch already), and no NVIDIA driver is here."""
    folder = tmp_path / "wheels"
    folder.mkdir()
    monkeypatch.setenv("PIP_CONFIG_FILE", "/dev/null")
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(folder))
    monkeypatch.setenv("PIP_IGNORE_INSTALLED", "1")
    monkeypatch.setattr(torch_build, "nvidia_gpu", lambda: False)
    return folder


def test_where_only_the_cuda_build_is_found_the_set_up_stops_in_one_line(wheels_at_hand, capsys):
    wheel(wheels_at_hand, "torch", "2.13.0", "nvidia-cublas")
    wheel(wheels_at_hand, "nvidia-cublas", "13.1")

    assert torch_build.main(["torch==2.13.0"]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err.count("\n") == 1 and err.startswith(
        "repotune set-up: pip would install torch==2.13.0 as the CUDA"
    )
    assert "make PYTHON=" in err and 'TORCH_SPEC="torch==2.13.0 --index-url' in err


def test_where_a_cpu_build_is_found_the_set_up_installs_it_with_the_cpu_index_offered(wheels_at_hand, capsys):
    wheel(wheels_at_hand, "torch", "2.13.0", "nvidia-cublas")
    wheel(wheels_at_hand, "nvidia-cublas", "13.1")
    wheel(wheels_at_hand, "torch", "2.13.0+cpu")

    assert torch_build.main(["torch==2.13.0"]) == 0
    assert capsys.readouterr().out.split() == [
        "torch==2.13.0", "--extra-index-url", torch_build.CPU_INDEX, "--retries", "0"
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("requirement", "nvidia"),
    [
        (["torch==2.13.0", "--index-url", "https://download.pytorch.org/whl/cu128"], False),
        (["torch", "--index-url=URL"], False),
        (["torch==2.13.0"], True),
    ],
)
def test_a_requirement_that_names_its_index_or_a_machine_with_an_nvidia_gpu_is_left_as_it_is(
    requirement, nvidia
):
    assert torch_build.with_cpu_index(requirement, nvidia) == requirement


def test_make_chooses_the_build_before_it_installs_torch(tmp_path):
    planned = subprocess.run(
        ["make", "--dry-run", "install", f"VENV={tmp_path / 'venv'}"],
        cwd=Path(__file__).parent.parent, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    choose = planned.index(f"{tmp_path}/venv/bin/python -m pipeline.torch_build torch==2.13.0")
    assert choose < planned.index(f"{tmp_path}/venv/bin/python -m pip install --quiet --no-compile $torch uv")

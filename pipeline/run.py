"""A run's record: its output directory, its manifest, and how it ended.

`open_run` creates the output directory, writes a manifest with status
`running`, and makes sure that however the block ends (success, a
PipelineError, Ctrl-C, a bug) the manifest on disk says so.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pipeline.config import LoadedConfig
from pipeline.distributed import Coordinator, launch_from_environment
from pipeline.errors import Interrupted, OutputDirError, PipelineError
from pipeline.manifest import (
    MANIFEST_FILE,
    conform,
    mark_finished,
    new_manifest,
    read_manifest,
    write_manifest,
)


class Run:
    def __init__(
        self, output_dir: Path, loaded: LoadedConfig, command: str, argv: list[str], coordinator: Coordinator
    ):
        self.output_dir = output_dir
        self.loaded = loaded
        self.config = loaded.config
        self.coordinator = coordinator
        self.launch = coordinator.launch
        """This process's place in the launch: only rank 0 writes."""
        self.manifest_path = output_dir / MANIFEST_FILE
        self.doc = new_manifest(command, argv)
        self.doc["config"] = {
            "source": str(loaded.path) if loaded.path else None,
            "overrides": loaded.overrides,
            "effective": loaded.config.to_dict(),
        }
        self._started = time.perf_counter()
        self.previous = _read_previous(self.manifest_path)
        """The manifest this output directory held before this run (None if none), read before overwriting."""
        self.doc["distributed"] = coordinator.to_manifest()
        self.hardware = None
        """The Hardware planned for, once the plan stage ran."""
        self.planned_launch = None
        """The Launch planned for (this one, or a hardware profile's), once the plan stage ran."""

    def save(self) -> None:
        if not self.launch.writes:
            return
        self.doc["total_execution_time_seconds"] = round(time.perf_counter() - self._started, 3)
        # Whole sections are replaced by stages; conforming puts back every key the schema defines.
        self.doc = conform(self.doc)
        write_manifest(self.manifest_path, self.doc)

    def record(self, **sections: Any) -> None:
        """Set whole manifest sections and write the manifest."""
        self.doc.update(sections)
        self.save()

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        """Time a stage into `.timings.<name>_s` (written even if the stage fails)."""
        started = time.perf_counter()
        try:
            yield
        finally:
            self.doc["timings"][f"{name}_s"] = round(time.perf_counter() - started, 3)

    def finish(self, status: str, error: str | None = None) -> None:
        mark_finished(self.doc, status, error)
        self.save()

    def announce(self) -> None:
        """The result's path, last on stdout (rank 0 only)."""
        if self.launch.writes:
            print(self.manifest_path)


def _read_previous(path: Path) -> dict[str, Any] | None:
    try:
        return read_manifest(path)
    except (OSError, ValueError):
        return None


def prepare_output_dir(path: str | Path) -> Path:
    """Create `path` and prove it is writable before any work is done."""
    output_dir = Path(path).expanduser()
    try:
        output_dir.mkdir(parents=True, exist_ok=True)
        probe = output_dir / f".write-test-{time.time_ns()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as err:
        raise OutputDirError(
            f"cannot write to output directory {output_dir}: {err.strerror or err}"
        ) from None
    return output_dir


@contextmanager
def open_run(loaded: LoadedConfig, command: str, argv: list[str], distributed: bool = False) -> Iterator[Run]:
    """Start a run in `loaded.config.output.dir`; on any failure leave a manifest that says why.
    `distributed`: the command can run as several ranks (torchrun / accelerate launch)."""
    launch = launch_from_environment()
    if launch.world_size > 1 and not distributed:
        raise PipelineError(f"`{command}` runs in one process: start it without torchrun / accelerate launch")
    coordinator = Coordinator(launch, loaded.config.distributed).start()
    output_dir = (
        prepare_output_dir(loaded.config.output.dir) if launch.writes else Path(loaded.config.output.dir)
    )
    run = Run(output_dir, loaded, command, argv, coordinator)
    run.save()
    finished = False
    try:
        yield run
        finished = True
    except Interrupted as err:
        run.finish("interrupted", str(err))
        raise
    except PipelineError as err:
        run.finish("failed", str(err))
        raise
    except KeyboardInterrupt:
        run.finish("interrupted", "interrupted by the user (Ctrl-C)")
        raise
    except Exception as err:
        run.finish("failed", f"internal error: {type(err).__name__}: {err}")
        raise
    finally:
        coordinator.close(finished)

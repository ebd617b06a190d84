"""A run's record: its output directory and its manifest, built from what the stages return.

`open_run` creates the output directory, writes a manifest with status `running`, and makes sure
that however the block ends (success, a PipelineError, Ctrl-C, a bug) the manifest on disk says so.
`Record.step` times a stage into `.timings` and maps what it returns into the manifest: `sections` is
the one place that knows where each result goes; the schema (`manifest.schema.json`) is the one
place that knows the layout, and a finished manifest is validated against it.
"""

from __future__ import annotations

import os
import signal
import socket
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager, nullcontext, suppress
from functools import singledispatch
from pathlib import Path
from shlex import quote
from typing import Any, ParamSpec, TypeVar

import orjson

from pipeline.config import LoadedConfig
from pipeline.errors import USER_ERRORS, Interrupted, OutputDirError, PipelineError, disk_full
from pipeline.evaluate.report import evaluation_report
from pipeline.hardware import LoadMeter
from pipeline.manifest import (
    MANIFEST_FILE,
    conform,
    mark_finished,
    new_manifest,
    read_manifest,
    recorded_argv,
    recorded_error,
    schema_problems,
    utc_now,
    write_json,
)
from pipeline.progress import say
from pipeline.record.history import RUNS_DIR, keep, keep_previous, trained_there
from pipeline.signals import on_stop_signals
from pipeline.train.distributed import Coordinator, launch_from_environment
from pipeline.train.model import ADAPTER_DIR, CHECKPOINT_DIR, newest_checkpoint
from pipeline.types import (
    Evaluation,
    Lineage,
    Loaded,
    Machine,
    Outputs,
    Packed,
    Past,
    PastScores,
    Plan,
    Prepared,
    Scores,
    Scraped,
    TrainOutcome,
)
from scrapers.errors import RepositoryError
from scrapers.git import holds_any, open_repository

T = TypeVar("T")
P = ParamSpec("P")


def evaluation_seconds(timings: dict[str, float]) -> float:
    """What a run spent scoring, as `.timings` has it: every `evaluate_*` stage (both models, the model on
    the validation commits, the past with the backtest that chooses the system, an update's parent)."""
    return sum(seconds for name, seconds in timings.items() if name.startswith("evaluate_"))


class Record:
    def __init__(
        self, output_dir: Path, loaded: LoadedConfig, command: str, argv: list[str], coordinator: Coordinator
    ):
        self.output_dir = output_dir
        self.coordinator = coordinator
        self.launch = coordinator.launch
        """This process's place in the launch: only rank 0 writes."""
        self.manifest_path = output_dir / MANIFEST_FILE
        self.previous = _read_previous(self.manifest_path)
        """The manifest this output directory held before this run (None if none), read before overwriting."""
        self.argv = argv
        """The command line as typed (its record keeps it as `recorded_argv` does)."""
        self.doc = new_manifest(command, argv)
        self.doc["config"] = {
            "source": str(loaded.path) if loaded.path else None,
            "overrides": loaded.overrides,
            "effective": loaded.config.to_dict(),
        }
        self.doc["distributed"] = coordinator.to_manifest()
        self.doc["run"]["replaced"] = _stale(self.previous)
        self.keep_adapter = loaded.config.output.keep_adapter
        self.stage: str | None = None
        """The stage running now (named if the run ends in it)."""
        self._started = time.perf_counter()
        self.load = LoadMeter()
        """Other processes' CPU use from now until the machine is detected: what training will share."""

    @property
    def writes(self) -> bool:
        return self.launch.writes

    @property
    def elapsed_s(self) -> float:
        return time.perf_counter() - self._started

    def cache_root(self, configured: str | None) -> Path:
        """Where the token cache lives: `output.cache_dir`, or the output directory's `cache/`."""
        return Path(configured).expanduser() if configured else self.output_dir / "cache"

    def step(self, name: str, stage: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """Run a stage, time it into `.timings.<name>_s` (even if it fails), and record what it returns."""
        started, self.stage = time.perf_counter(), name
        try:
            result = stage(*args, **kwargs)
        finally:
            self.doc["timings"][f"{name}_s"] = round(time.perf_counter() - started, 3)
        self.stage = None
        self.add(result)
        return result

    def shared(self, work: Callable[[], T]) -> T:
        """Rank 0 does `work` (recording its steps); every rank gets its result."""
        return self.coordinator.share(work)

    def add(self, result: Any) -> None:
        """Put a stage's result where it belongs in the manifest, and write the manifest."""
        for name, section in sections(result).items():
            if isinstance(section, dict) and isinstance(self.doc.get(name), dict):
                self.doc[name].update(section)
            else:
                self.doc[name] = section
        self.save()

    def progress(self, report: dict[str, Any], evaluations: list[dict[str, Any]]) -> None:
        """The live manifest during training: `report` is the training report so far (history, this
        node's hardware), `evaluations` the held-out loss during training; the current step and loss."""
        losses = report["training"]["loss_history"]
        last = losses[-1] if losses else {}
        self.doc["run"].update(current_step=last.get("step"), latest_loss=last.get("loss"))
        self.doc["training_report"].update(report)
        self.doc["training_report"]["evaluation"]["history"] = evaluations
        self.save()

    def save(self) -> None:
        if not self.writes:
            return
        self.doc["total_execution_time_seconds"] = round(self.elapsed_s, 3)
        cost = ((self.doc.get("training_report") or {}).get("evaluation") or {}).get("cost")
        if cost:  # what the scoreboard cost, as a share of the run so far (the goal: 10% of it)
            spent = evaluation_seconds(self.doc["timings"])
            cost["share_of_run_pct"] = round(100 * spent / self.elapsed_s, 1) if self.elapsed_s else None
        # Whole sections are replaced by stages; conforming puts back every key the schema defines.
        self.doc = conform(self.doc)
        write_json(self.manifest_path, self.doc)

    def finish(self, status: str, error: str | None = None) -> None:
        """How the run ended. A manifest that ends well and does not match the schema is a bug, said
        here (a failed run's manifest is written as it is: its error is what the user needs)."""
        mark_finished(self.doc, status, recorded_error(error, self.argv) if error else None)
        self.doc["run"]["stage"] = self.stage
        self.save()
        if self.writes:
            self.keep(adapter=self.keep_adapter and status == "completed")
        problems = schema_problems(self.doc) if self.writes and error is None else []
        if problems:
            raise RuntimeError(f"{self.manifest_path} does not match its schema: {'; '.join(problems[:3])}")

    def keep(self, adapter: bool = False) -> None:
        """Copy the run's record under runs/ (`pipeline.record.history`); a copy that fails says so and
        loses nothing: the run's own files are written already."""
        try:
            folder = keep(self.output_dir, self.doc, adapter)
        except OSError as err:
            say(f"could not keep this run's record under {self.output_dir / RUNS_DIR}: {err.strerror or err}")
            return
        if adapter:
            size = sum(path.stat().st_size for path in (folder / ADAPTER_DIR).rglob("*") if path.is_file())
            say(
                f"kept the adapter in {folder / ADAPTER_DIR} ({size / 1e6:.1f} MB on disk, each run that keeps one)"
            )

    def announce(self) -> None:
        """The result's path, last on stdout (rank 0 only)."""
        if self.writes:
            print(self.manifest_path)


@singledispatch
def sections(result: Any) -> dict[str, Any]:
    """The manifest sections a stage's result fills; a stage that returns nothing fills none."""
    if result is None:
        return {}
    raise TypeError(f"no manifest sections for {type(result).__name__}")


@sections.register
def _(scraped: Scraped) -> dict[str, Any]:
    return {
        "repository": scraped.repositories[0],
        "repositories": scraped.repositories,
        "scrape": scraped.summary,
    }


@sections.register
def _(prepared: Prepared) -> dict[str, Any]:
    facts, stats = prepared.facts, prepared.stats
    return {
        "model": {
            "name": facts.name,
            "random_init": facts.random_init,
            "pretrained": not facts.random_init,
            "source": facts.source,
            "note": "randomly initialised base model (no download): the adapter shows the pipeline works, "
            "not what a pretrained model would learn"
            if facts.random_init
            else None,
            "parameters_total": facts.parameters,
            "hidden_size": facts.hidden_size,
            "num_layers": facts.num_layers,
            "vocab_size": len(prepared.tokenizer),
            "max_positions": facts.max_positions,
        },
        "dataset": {
            "cache": prepared.cache.to_manifest(),
            "estimate": prepared.estimate,
            **prepared.counts,
            "token_length_median": stats.percentile(50),
            "token_length_p95": stats.percentile(95),
            "token_length_max": max(stats.length_counts),
        },
    }


@sections.register
def _(machine: Machine) -> dict[str, Any]:
    return {"hardware": machine.hardware.to_manifest()}


@sections.register
def _(plan: Plan) -> dict[str, Any]:
    return {"training_parameters": plan.to_manifest()}


@sections.register
def _(packed: Packed) -> dict[str, Any]:
    train = packed.train
    if packed.sample:  # a sample's blocks: the plan's own decisions (train_blocks) are the estimate
        return {}
    return {
        "dataset": {
            "block_size": train.block_size,
            "train_blocks": train.blocks,
            "eval_blocks": sum(split.blocks for split in packed.held_out.values()),
            "valid_blocks": sum(split.blocks for split in packed.validation.values()),
            "real_tokens": train.real_tokens,
            "packing_efficiency": round(train.efficiency, 4),
            "packing_method": packed.method,
            "left_out": packed.left_out,
        }
    }


@sections.register
def _(loaded: Loaded) -> dict[str, Any]:
    return {
        "model": {
            "parameters_trainable": loaded.trainable_parameters,
            "quantization": loaded.quantization,
            "weights_gb": loaded.weights_gb,
        }
    }


@sections.register
def _(scores: Scores) -> dict[str, Any]:
    return {}  # recorded with the evaluation after training, beside the one before (`Evaluation`)


@sections.register
def _(evaluation: Evaluation) -> dict[str, Any]:

    return {"training_report": {"evaluation": evaluation_report(evaluation)}}


@sections.register
def _(outcome: TrainOutcome) -> dict[str, Any]:
    return {
        "training_report": {
            **outcome.history,
            "hardware": outcome.hardware,
            "throughput": outcome.throughput,
        },
        "training_parameters": {**outcome.plan.to_manifest(), "oom_retries": outcome.oom_retries},
        "run": {"resumed_from": outcome.resumed_from},
    }


@sections.register
def _(past: Past) -> dict[str, Any]:
    return {"retrieval": past.facts}


@sections.register
def _(scored: PastScores) -> dict[str, Any]:
    return {}  # recorded with the evaluation after training, beside the model's scores (`Evaluation`)


@sections.register
def _(lineage: Lineage) -> dict[str, Any]:
    return {"lineage": lineage.to_manifest()}


@sections.register
def _(outputs: Outputs) -> dict[str, Any]:
    return {
        "outputs": {
            "output_dir": str(outputs.output_dir.resolve()),
            "adapter_dir": str(outputs.adapter_dir.resolve()),
            "adapter_files": outputs.adapter_files,
            "base_model_dir": str(outputs.base_model_dir.resolve()) if outputs.base_model_dir else None,
            "sequences_path": str(outputs.sequences_path.resolve()),
        }
    }


@contextmanager
def _signals_interrupt() -> Iterator[None]:
    """The stop signals end any stage with the manifest saying `interrupted` and where (training
    replaces this with its own handler, which saves a checkpoint first)."""

    owner = os.getpid()

    def stop(signum: int) -> None:
        if os.getpid() != owner:
            # A worker forked from this process (scraping, tokenizing) inherits this handler: when an
            # interrupted pool stops it, it ends as the signal would, quietly (raising printed a traceback
            # per worker, and a worker blocked on its pool's queue could keep the pool waiting for it).
            os._exit(128 + signum)
        raise Interrupted(f"interrupted by {signal.Signals(signum).name}", signum)

    with ExitStack() as handlers:
        with suppress(ValueError):  # not the main thread: leave signals as they are
            handlers.enter_context(on_stop_signals(stop))
        yield


def _stopped(record: Record, message: str, checkpointed: bool = False) -> str:
    """What stopped the run (an interruption, a full disk), the stage it came in, and what the next run can
    reuse (training that saved a checkpoint says where and how to resume itself)."""
    if checkpointed or record.stage is None:
        return message
    done = set(record.doc["timings"]) - {f"{record.stage}_s"}
    kept = [
        what
        for stage, what in (
            ("scrape_s", "the scrape (reused by the next run on the same HEADs and config)"),
            ("tokenize_s", "the token cache"),
            ("load_model_s", "the converted model"),
        )
        if stage in done
    ]
    if "train_s" in done and (trained := newest_checkpoint(record.output_dir / CHECKPOINT_DIR)):
        # Scoring and saving come after training: the last checkpoint holds all of it.
        kept.append(
            f"the trained model's last checkpoint ({trained.name}: run the same command with --resume to "
            "start from it instead of training again)"
        )
    return f"{message} during {record.stage}; kept: {', '.join(kept) if kept else 'nothing yet'}"


def _stale(previous: dict[str, Any] | None) -> dict[str, Any] | None:
    """The manifest this directory held, if it says `running` and its process (on this host) is gone."""
    run = (previous or {}).get("run") or {}
    pid = run.get("pid")
    if run.get("status") != "running" or not pid or run.get("hostname") != socket.gethostname():
        return None
    if pid != os.getpid():
        try:
            os.kill(pid, 0)
            return None  # still alive
        except ProcessLookupError:
            pass
        except PermissionError:  # alive, someone else's
            return None
    return {"id": run.get("id"), "pid": pid, "started_at": run.get("started_at")}


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


LOCK_FILE = ".repotune.lock"


@contextmanager
def holding(output_dir: Path, command: str) -> Iterator[None]:
    """Hold `output_dir` for one run: an exclusive lock on its lock file (fcntl), which the operating
    system releases when the process ends however it ends (kill -9 included), so a stale hold never
    blocks. Held already: one line naming the holder, and nothing in the directory changes."""
    import fcntl

    path = output_dir / LOCK_FILE
    try:
        handle = open(path, "a+b")  # noqa: SIM115 (held for the whole run; closed below)
    except OSError as err:
        raise OutputDirError(
            f"cannot write to output directory {output_dir}: {err.strerror or err}"
        ) from None
    try:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            raise OutputDirError(
                f"{output_dir} is in use by another run ({_holder(handle.read())}): wait for it to end, or "
                "give another --output-dir"
            ) from None
        handle.seek(0)
        handle.truncate()
        handle.write(
            orjson.dumps(
                {"pid": os.getpid(), "command": command, "started": utc_now(), "host": socket.gethostname()}
            )
        )
        handle.flush()
        yield
    finally:
        handle.close()  # releases the lock


def _holder(text: bytes) -> str:
    try:
        holder = orjson.loads(text)
        return f"pid {holder['pid']} on {holder['host']}, `{holder['command']}`, started {holder['started']}"
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return "a run that is starting"


@contextmanager
def open_run(
    loaded: LoadedConfig, command: str, argv: list[str], repos: Sequence[str], distributed: bool = False
) -> Iterator[Record]:
    """Start a run on `repos` in `loaded.config.output.dir`; on any failure leave a manifest that says why.
    `distributed`: the command can run as several ranks (torchrun / accelerate launch)."""
    launch = launch_from_environment()
    if launch.world_size > 1 and not distributed:
        raise PipelineError(f"`{command}` runs in one process: start it without torchrun / accelerate launch")
    output_dir = (
        prepare_output_dir(loaded.config.output.dir) if launch.writes else Path(loaded.config.output.dir)
    )
    with holding(output_dir, command) if launch.writes else nullcontext():
        if launch.writes and (kept := _trained_elsewhere(output_dir, repos)):
            raise OutputDirError(kept)
        coordinator = Coordinator(launch, loaded.config.distributed).start()
        record = Record(output_dir, loaded, command, argv, coordinator)
        # Named before it is read, so a run that stops first (a model name that is not one) still says
        # which; the scrape replaces it with what it read.
        record.doc["repository"]["path"] = _asked(repos[0]) if repos else None
        yield from _recorded(record, command, coordinator)


def _asked(repo: str) -> str:
    """The repository a run was asked to read, as its record keeps it: a path made absolute where there is
    one, else as typed (a URL without its user info)."""
    return os.path.abspath(repo) if os.path.exists(repo) else recorded_argv([repo])[0]


def _trained_elsewhere(output_dir: Path, repos: Sequence[str]) -> str | None:
    """What to say where `output_dir` holds what a run trained on other repositories than `repos` (an
    adapter, or checkpoints to resume): a second `make run REPO=…` into the default directory would have
    replaced it without a word, and a commit hook suggesting with it would have gone on suggesting the
    other repository's messages. None where it holds nothing trained, or trained on the same ones or clones
    of them (a run again on one project replaces the last, as it always has). A repository that cannot be
    opened is left to the scrape to say so."""

    trained = [(output_dir / name).exists() for name in (ADAPTER_DIR, CHECKPOINT_DIR)]
    previous = _read_previous(output_dir / MANIFEST_FILE) if any(trained) else None
    learned = trained_there(output_dir, previous) if previous else []
    before = sorted(path for path, _ in learned)
    if not before:
        return None
    try:
        opened = [open_repository(path) for path in repos]
    except RepositoryError:
        return None
    now = sorted(repository.path for repository in opened)
    heads = [head for _, head in learned]
    # The same repositories, or clones of them (each holds a commit the run trained up to): its own run.
    if now == before or all(holds_any(here, heads) for here in opened):
        return None
    return (
        f"{output_dir} holds a run trained on {', '.join(before)}; this one reads {', '.join(now)}: give "
        f"another --output-dir, or remove that run first (rm -r {quote(str(output_dir))}) to replace it"
    )


def _recorded(record: Record, command: str, coordinator: Coordinator) -> Iterator[Record]:
    """The run's body: its manifest saved at once, and on any failure saved again saying why."""
    output_dir = record.output_dir
    if replaced := record.doc["run"]["replaced"]:
        say(
            f"the run {replaced['id']} that {output_dir} last recorded was still `running` but its process "
            f"({replaced['pid']}) is gone: it was killed (kill -9, out of memory, a reboot); starting afresh"
            + (" (--resume continues from its newest complete checkpoint)" if command == "run" else "")
        )
    if record.writes:
        try:
            keep_previous(output_dir, record.previous)
        except OSError as err:
            say(f"could not keep the last run's record under {output_dir / RUNS_DIR}: {err.strerror or err}")
    record.save()
    finished = False
    try:
        with _signals_interrupt():
            yield record
        finished = True
    except Interrupted as err:
        if err.partial is not None:  # what training did before the signal
            record.add(err.partial)
        err.args = (_stopped(record, str(err), err.checkpointed),)  # the line the user reads says it too
        _ended(record, "interrupted", str(err))
        raise
    except USER_ERRORS as err:
        _ended(record, "failed", str(err))
        raise
    except KeyboardInterrupt:
        _ended(record, "interrupted", _stopped(record, "interrupted by the user (Ctrl-C)"))
        raise
    except Exception as err:
        if full := disk_full(err, {"--output-dir": output_dir}):
            full.args = (f"{_stopped(record, full.happened)}; {full.fix}",)
            _ended(record, "failed", str(full))
            raise full from err
        _ended(record, "failed", f"internal error: {type(err).__name__}: {err}")
        raise
    finally:
        coordinator.close(finished)


def _ended(record: Record, status: str, error: str | None) -> None:
    """`record.finish`, where a full disk can refuse even that: the manifest keeps what it said last (its
    writes are atomic), and the user still reads the error that ended the run, not this one."""
    try:
        record.finish(status, error)
    except OSError as err:
        said = err.strerror or err
        say(
            f"could not record how the run ended in {record.manifest_path} ({said}): it says what it said last"
        )

"""The data-loader workers leave the stop signals (SIGINT, SIGTERM, SIGHUP) to the run.

A terminal's Ctrl-C, `timeout`, `kill -- -PGID`, systemd and Slurm signal every process of a run at once.
torch's loader workers die of a SIGTERM, and the loader then raised their deaths as an internal error
("DataLoader worker (pid …) is killed by signal: Terminated") before the run could save a checkpoint
(`trainer.GracefulStop`). Imports nothing heavy: a test's process starts it alone.
"""

from __future__ import annotations

import atexit
import multiprocessing
import signal
from collections.abc import Callable
from functools import partial

from pipeline.signals import stop_signals


def leaving_signals_to_the_run(init: Callable[[int], None] | None) -> Callable[[int], None]:
    """A loader's `worker_init_fn`: `init` (the Trainer's seeding), then the run's signals ignored. Also
    makes sure this process's exit ends the workers that ignore them (`_killing_workers_left_at_exit`)."""
    # Registered once, and after multiprocessing's own exit handler, which it therefore precedes.
    atexit.unregister(_killing_workers_left_at_exit)
    atexit.register(_killing_workers_left_at_exit)
    return partial(_started, init)


def _started(init: Callable[[int], None] | None, worker_id: int) -> None:
    """A worker's start, after torch set its own handlers. Ignored, not masked: a signal mask is a thread's,
    and a worker already has a second thread. The run stops at the end of its step, then ends its workers
    with a message on their queue, or at its exit."""
    if init is not None:
        init(worker_id)
    for signum in stop_signals():
        signal.signal(signum, signal.SIG_IGN)


def _killing_workers_left_at_exit() -> None:
    """The daemonic workers still running at exit (a loader whose iterator outlived training), which
    multiprocessing would stop with a SIGTERM they ignore, then wait for forever. Their deaths are no longer
    the loader's to report (torch's SIGCHLD handler raised them in whatever code was running)."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    for child in multiprocessing.active_children():
        if child.daemon:
            child.kill()

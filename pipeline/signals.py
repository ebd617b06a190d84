"""The signals a run stops at, saving what it has, and their handlers' installation: Ctrl-C; `kill`,
`timeout`, systemd and Slurm; a closed terminal (SIGHUP). Imports nothing heavy: the data-loader workers
(`train.workers`) read it."""

from __future__ import annotations

import os
import signal
import stat
from collections.abc import Callable, Iterator
from contextlib import contextmanager


def stop_signals() -> tuple[signal.Signals, ...]:
    """SIGINT, SIGTERM and SIGHUP; SIGHUP not where the run was started to ignore it (`nohup`)."""
    if signal.getsignal(signal.SIGHUP) == signal.SIG_IGN:
        return signal.SIGINT, signal.SIGTERM
    return signal.SIGINT, signal.SIGTERM, signal.SIGHUP


@contextmanager
def on_stop_signals(handler: Callable[[int], None]) -> Iterator[None]:
    """`handler(signum)` at each stop signal while inside, the handlers before it back after; a SIGHUP
    leaves the closed terminal first (`_leave_a_closed_terminal`). Outside the main thread, ValueError (as
    `signal.signal`), with nothing installed."""

    def handle(signum, frame) -> None:
        if signum == signal.SIGHUP:
            _leave_a_closed_terminal()
        handler(signum)

    previous = {signum: signal.signal(signum, handle) for signum in stop_signals()}
    try:
        yield
    finally:
        for signum, earlier in previous.items():
            signal.signal(signum, earlier)


def _leave_a_closed_terminal() -> None:
    """After SIGHUP the terminal is gone and writing to it fails (EIO): the run would end in that error
    instead of saving its checkpoint and manifest. What it says to a terminal goes nowhere from then on (the
    manifest says it all); a log file or a pipe it writes to is left as it is."""
    nowhere = os.open(os.devnull, os.O_WRONLY)
    for fd in (1, 2):  # the process's own, whatever sys.stdout stands for
        if stat.S_ISCHR(os.fstat(fd).st_mode):  # a terminal (or /dev/null already), not a file or a pipe
            os.dup2(nowhere, fd)
    os.close(nowhere)

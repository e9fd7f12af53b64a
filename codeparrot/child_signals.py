"""SIGTERM passed on to the child process a CLI is waiting for, instead of ending the CLI under it.

`scripts/launch.py` with one process (accelerate's one-process launcher runs the training script as a child) and
`make demo` (one child per stage) wait for a child that knows best how to stop: a training run saves a checkpoint
first (training/stop_signal.py), every CLI removes its temporary output (`run_cli`). Kubernetes, `kill PID` and
many process managers signal only the process they started, so without this the child kept running, orphaned, or
was SIGKILLed mid-write. Inside `sigterm_passed_to_children()` this process's SIGTERM is sent on to its direct
children and the wait goes on: the child's exit status says how it stopped. With no child (not started yet, or
between two) SIGTERM does what it did before (under `run_cli`: `stopped by SIGTERM`, 143). A scheduler that signals
every process of the job (Slurm, Ctrl-C's process group) gives the child its own SIGTERM as well; both take a
second one as the same stop. Multi-process launches don't need it: torch elastic's agent installs its own handler,
which forwards.
"""

from __future__ import annotations

import os
import signal
import threading
from contextlib import contextmanager
from typing import Callable, Iterator


class Forwarded:
    """What `sigterm_passed_to_children` yields: whether a SIGTERM arrived (and was passed on) while inside."""

    received: bool = False


def _children(psutil) -> list[int]:
    try:
        return [child.pid for child in psutil.Process().children(recursive=False)]
    except psutil.Error:
        return []


def _as_before(previous: Callable | int | None, signum: int, frame) -> None:
    """SIGTERM handled by `previous`, the handler that was there before: called, or the default action (the
    process ends), or ignored (SIG_IGN; None: a handler set outside Python, left to itself)."""
    if callable(previous):
        previous(signum, frame)
    elif previous == signal.SIG_DFL:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)


@contextmanager
def sigterm_passed_to_children() -> Iterator[Forwarded]:
    """While inside, a SIGTERM this process receives is sent to each of its direct child processes, and the caller
    keeps waiting for them; with none, the handler from before takes it (`run_cli`'s raises `Terminated`; the
    default action ends the process). Only the main thread can take over a signal: elsewhere nothing changes."""
    forwarded = Forwarded()
    if threading.current_thread() is not threading.main_thread():
        yield forwarded
        return
    # accelerate's dependency; imported now, never in the handler: a second SIGTERM arriving during that import
    # (a scheduler's and a forwarder's) would run the handler again on a half-imported module
    import psutil

    def forward(signum, frame) -> None:
        forwarded.received = True
        children = _children(psutil)
        if not children:
            _as_before(previous, signum, frame)
        for pid in children:
            try:
                os.kill(pid, signal.SIGTERM)
            except (ProcessLookupError, PermissionError):  # it has just ended
                pass

    previous = signal.signal(signal.SIGTERM, forward)
    try:
        yield forwarded
    finally:  # unless a handler took over meanwhile (torch elastic's), or `raise_terminated` made it SIG_IGN
        if signal.getsignal(signal.SIGTERM) is forward:
            signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)

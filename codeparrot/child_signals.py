"""SIGTERM and Ctrl-C passed on to the child process a CLI is waiting for, instead of ending the CLI under it.

`scripts/launch.py` with one process (accelerate's one-process launcher runs the training script as a child) and
`make demo` (one child per stage) wait for a child that knows best how to stop: a training run saves a checkpoint
first (training/stop_signal.py), every CLI removes its temporary output (`run_cli`). Kubernetes, `kill PID` and
many process managers signal only the process they started, so without this the child kept running, orphaned, or
was SIGKILLed mid-write. Inside `signals_passed_to_children()` this process's SIGTERM is sent on to its direct
children and the wait goes on: the child's exit status says how it stopped. With no child (not started yet, or
between two) SIGTERM does what it did before (under `run_cli`: `stopped by SIGTERM`, 143). A scheduler that signals
every process of the job (Slurm, Ctrl-C's process group) gives the child its own SIGTERM as well; both take a
second one as the same stop. Multi-process launches don't need it: torch elastic's agent installs its own handler,
which forwards.

Ctrl-C (SIGINT) used to end the waiting CLI a quarter of a second later (`subprocess`'s wait gives up then): the
prompt came back while the child (the training run under `scripts/launch.py`, two levels under `make demo`) was
still stopping, and went on printing over it. Now the wait goes on for SIGINT too. A terminal's Ctrl-C reaches
every process of its foreground group, children included, so it is passed on only to children outside that group
(or to all of them where there is no terminal, as after `kill -INT PID`): a Python child must not get a second
KeyboardInterrupt in the middle of its clean-up. A second SIGINT is passed on to every child (the user insists).
"""

from __future__ import annotations

import os
import signal
import threading
from contextlib import contextmanager
from typing import Callable, Iterator


class Forwarded:
    """What `signals_passed_to_children` yields: whether a SIGTERM (`received`) or a SIGINT (`interrupted`) arrived
    while inside (and was passed on, to what had not got it)."""

    received: bool = False
    interrupted: bool = False


def _children(psutil) -> list:
    try:
        return psutil.Process().children(recursive=False)
    except psutil.Error:
        return []


def _terminal_group() -> int | None:
    """The foreground process group of this process's terminal (the one a Ctrl-C signals), None without one."""
    try:
        fd = os.open("/dev/tty", os.O_RDONLY | os.O_NOCTTY)
    except OSError:
        return None
    try:
        return os.tcgetpgrp(fd)
    except OSError:
        return None
    finally:
        os.close(fd)


def _as_before(previous: Callable | int | None, signum: int, frame) -> None:
    """`signum` handled by `previous`, the handler that was there before: called (SIGINT's default raises
    KeyboardInterrupt), or the default action (the process ends), or ignored (SIG_IGN; None: a handler set outside
    Python, left to itself)."""
    if callable(previous):
        previous(signum, frame)
    elif previous == signal.SIG_DFL:
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)


@contextmanager
def signals_passed_to_children() -> Iterator[Forwarded]:
    """While inside, a SIGTERM or SIGINT this process receives is sent to its direct child processes (a first
    SIGINT only to those a terminal's Ctrl-C did not reach: module docstring), and the caller keeps waiting for
    them; with none, the handler from before takes it (`run_cli`'s raises `Terminated` or KeyboardInterrupt; the
    default action ends the process). Only the main thread can take over a signal: elsewhere nothing changes."""
    forwarded = Forwarded()
    if threading.current_thread() is not threading.main_thread():
        yield forwarded
        return
    # accelerate's dependency; imported now, never in the handler: a second SIGTERM arriving during that import
    # (a scheduler's and a forwarder's) would run the handler again on a half-imported module
    import psutil

    def forward(signum, frame) -> None:
        first_interrupt = signum == signal.SIGINT and not forwarded.interrupted
        if signum == signal.SIGINT:
            forwarded.interrupted = True
        else:
            forwarded.received = True
        children = _children(psutil)
        if not children:
            _as_before(previous[signum], signum, frame)
        skip = _terminal_group() if first_interrupt else None  # the group a terminal's Ctrl-C has reached
        for child in children:
            try:
                if skip is None or os.getpgid(child.pid) != skip:
                    os.kill(child.pid, signum)
            except (ProcessLookupError, PermissionError):  # it has just ended
                pass

    previous = {signum: signal.signal(signum, forward) for signum in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield forwarded
    finally:  # unless a handler took over meanwhile (torch elastic's), or `raise_terminated` made it SIG_IGN
        for signum, handler in previous.items():
            if signal.getsignal(signum) is forward:
                signal.signal(signum, handler if handler is not None else signal.SIG_DFL)

"""One error type for every user-facing failure, and the CLI wrapper that prints it as one line.

Library code raises `CodeParrotError("what went wrong, naming the file/line/key")`; scripts wrap their
`main()` in `run_cli`, which prints `error: <message>` to stderr and exits with status 2 instead of a
traceback. Anything else (a real bug) still shows its traceback.

Under a multi-process launcher (`accelerate launch --num_processes N`, torchrun) every process runs the same
checks and fails the same way; only the main process (RANK 0) prints the line, so it appears once. The
launcher's own failure report comes after it; `scripts/launch.py` (accelerate's launcher, run in-process)
replaces that report so the `error:` line stays the last thing printed.

SIGTERM (`kill`, a scheduler's stop) unwinds a CLI the way Ctrl-C does: temporary outputs are removed, child
processes and sandboxes stopped, `finally` blocks run; then `stopped by SIGTERM` (not in a process of a
multi-process launch: its launcher reports) and status 143. A script that takes SIGTERM over itself (a training run
saves a checkpoint first; the server finishes its requests) keeps it.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Callable

# The exit status of a reported user error; `codeparrot.training.launcher` recognises it in a failed process.
USER_ERROR_EXIT = 2
# The exit status of a process the stall watchdog stopped (codeparrot.training.watchdog), after its `error:` line.
STALL_EXIT = 75  # EX_TEMPFAIL (sysexits.h): a temporary failure, the run can be resumed
# The exit status of a training run that SIGTERM stopped after a step with a checkpoint (training/stop_signal.py).
PREEMPTED_EXIT = 128 + 15  # the shell's status for "terminated by SIGTERM"
# Statuses whose process reported its own one line (the launcher adds nothing).
REPORTED_EXITS = (USER_ERROR_EXIT, STALL_EXIT, PREEMPTED_EXIT)
# Set by `scripts/launch.py` for the processes it starts: the launcher prints the `error:` line itself, once, after
# every process has exited (read from torch elastic's per-process error file), so the processes don't.
LAUNCHER_REPORTS_ENV = "CODEPARROT_LAUNCHER_REPORTS"


class CodeParrotError(Exception):
    """A problem with the user's input or environment, reported as one line without a traceback."""


class OutputWriteError(CodeParrotError, OSError):
    """An output file that could not be written (a read-only folder, a full disk, a file where a folder should be),
    as one line naming the file. Still an OSError with the original errno, strerror and filename: code that handles
    a failed write itself (a best-effort cache, a pretokenize job's resume advice, a checkpoint save) keeps doing
    so; only an unhandled one reaches `run_cli`, which prints the line instead of a traceback."""

    def __init__(self, message: str, cause: OSError):
        OSError.__init__(self, cause.errno, cause.strerror, cause.filename)
        self.message = message

    def __str__(self) -> str:
        return self.message

    def __reduce__(self):  # across processes (a worker pool): rebuilt from the message and the original error
        return type(self), (self.message, OSError(self.errno, self.strerror, self.filename))


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in a CLI's main thread (`run_cli`). A `KeyboardInterrupt`, so that everything that cleans up
    after Ctrl-C (ours and the libraries': worker pools, progress bars, servers) does the same for it."""


# Whether `raise_terminated` ran: a library may turn the `Terminated` it raised into a KeyboardInterrupt of its own
# (Ray's ray.get/ray.wait raise a new one when a signal handler raised inside them), which is still SIGTERM's stop.
_sigterm_received = False


def raise_terminated(signum, frame) -> None:
    """SIGTERM's handler in a CLI (`run_cli`): raise `Terminated` in the main thread."""
    global _sigterm_received
    _sigterm_received = True
    # Further SIGTERMs change nothing (a scheduler that signals the whole job and a parent that passes its own on
    # send two): the cleanup is not cut short. SIGKILL still ends it.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise Terminated


def _take(signum: int, handler: Callable, default, ours: tuple) -> Callable[[], None]:
    """Install `handler` for `signum` in the main thread while the signal still has its `default` handler (a
    launcher or library that installed its own keeps it); returns what puts the previous handler back, unless
    `main` took the signal over meanwhile (its handler is no longer one of `ours`)."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    previous = signal.getsignal(signum)
    if previous is not default:
        return lambda: None
    signal.signal(signum, handler)

    def restore() -> None:
        if signal.getsignal(signum) in ours:
            signal.signal(signum, previous)
    return restore


def _take_sigterm() -> Callable[[], None]:
    """Have SIGTERM raise `Terminated` in the main thread while it still has its default action."""
    return _take(signal.SIGTERM, raise_terminated, signal.SIG_DFL, (raise_terminated, signal.SIG_IGN))


# Whether SIGINT (Ctrl-C) reached `run_cli`'s handler: a library may turn the KeyboardInterrupt it raised into an
# error of its own, which is still Ctrl-C's stop (seen: Ctrl-C inside numpy's lazy import of a submodule while
# transformers loads a model class ends as its ModuleNotFoundError from a RecursionError, the interrupt lost).
_sigint_received = False


def _interrupt(signum, frame) -> None:
    """SIGINT's handler in a CLI (`run_cli`): Python's own (KeyboardInterrupt), remembered."""
    global _sigint_received
    _sigint_received = True
    signal.default_int_handler(signum, frame)


def _take_sigint() -> Callable[[], None]:
    """Have SIGINT remembered (`_interrupt`) while it has Python's default handler."""
    return _take(signal.SIGINT, _interrupt, signal.default_int_handler, (_interrupt,))


# Called with the `error: ...` line on EVERY process when run_cli reports a CodeParrotError, also on the
# non-main ranks that do not print it (codeparrot.training.rank_logs writes it to <run>/logs/rank-N.log).
_error_listeners: list[Callable[[str], None]] = []


def add_error_listener(listener: Callable[[str], None]) -> None:
    """Have `listener(line)` called with each reported `error: ...` line, on every process (idempotent)."""
    if listener not in _error_listeners:
        _error_listeners.append(listener)


def run_cli(main: Callable[[], int | None]) -> None:
    """Run a script's `main()`, turning `CodeParrotError`, Ctrl-C and SIGTERM into a one-line message and exit
    code."""
    global _sigterm_received, _sigint_received
    _sigterm_received = _sigint_received = False
    restores = (_take_sigterm(), _take_sigint())
    try:
        code = main()
    except CodeParrotError as err:
        for listener in list(_error_listeners):
            try:
                listener(f"error: {error_message(err)}")
            except Exception:  # noqa: BLE001 - recording the error must never hide it
                pass
        report_error_line(f"error: {error_message(err)}")
        sys.exit(USER_ERROR_EXIT)
    except KeyboardInterrupt as err:
        if not (isinstance(err, Terminated) or _sigterm_received):
            print("interrupted", file=sys.stderr)
            sys.exit(130)
        # Under torch elastic's agent (a multi-process launch) the SIGTERM is the agent's: it stops the other
        # processes when one failed (that one's error is the news), or passes on its own, which it reports itself.
        if "TORCHELASTIC_RUN_ID" not in os.environ and is_main_launched_process():
            print("stopped by SIGTERM", file=sys.stderr, flush=True)
        sys.exit(PREEMPTED_EXIT)
    except Exception:
        if not _sigint_received:
            raise  # a bug: its traceback
        print("interrupted", file=sys.stderr)  # what a library made of Ctrl-C's KeyboardInterrupt
        sys.exit(130)
    finally:
        for restore in restores:
            restore()
    sys.exit(code or 0)


def report_error_line(line: str, status: int = USER_ERROR_EXIT) -> None:
    """Print `line` (an `error: ...` line) once for the whole job: the main process prints it, unless
    `scripts/launch.py` prints it itself from the error file this writes for every process. `status`: the exit
    status the process is about to leave with, recorded beside the line (the launcher's job leaves with it even
    when this process is stopped by a signal before it leaves: another rank failed first)."""
    recorded = _record_for_launcher(line, status)
    if is_main_launched_process() and not (recorded and os.environ.get(LAUNCHER_REPORTS_ENV) == "1"):
        print(line, file=sys.stderr, flush=True)


def _record_for_launcher(line: str, status: int) -> bool:
    """Write the error into torch elastic's error file for this process, when its launcher gave one.

    torch's launcher stops the other processes as soon as one fails: the main process may be stopped before it
    prints. The file lets the launcher show the message anyway (`scripts/launch.py` prints it; plain
    `accelerate launch` shows it in its report). Same JSON shape as torch's own `@record` handler.
    `exitStatus` is ours (torch ignores it). Returns whether the file was written."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path:
        return False
    data = {"message": {"message": line, "extraInfo": {"py_callstack": line, "timestamp": str(int(time.time())),
                                                       "exitStatus": status}}}
    try:  # not codeparrot.atomic_io (it imports this module); the launcher reads the file after this process exits
        Path(path).write_text(json.dumps(data), encoding="utf-8")
    except OSError:
        return False  # then the main process prints it
    return True


def error_message(err: CodeParrotError) -> str:
    """The line a `CodeParrotError` stands for. One raised in a DataLoader worker (a damaged shard, a token id past
    the vocabulary) reaches the main process re-raised by torch as the same type whose message is the worker's
    whole traceback ("Caught CodeParrotError in DataLoader worker process 0.\nOriginal Traceback ...\n
    codeparrot.errors.CodeParrotError: <the line>"): its line is the traceback's last."""
    text = str(err)
    if text.startswith("Caught ") and "\nOriginal Traceback" in text:
        name, sep, line = text.rstrip().rsplit("\n", 1)[-1].partition(": ")
        if sep and name.rsplit(".", 1)[-1] == type(err).__name__:
            return line
    return text


def first_line(err: BaseException | str, default: str | None = None) -> str:
    """The first non-blank line of an error's message: what a one-line report shows of a library's error (theirs
    span pages: tracebacks, advice, request ids). Where the message is blank: `default`, or else the exception's
    type name ("" for text)."""
    lines = str(err).strip().splitlines()
    if lines:
        return lines[0].strip()
    if default is not None:
        return default
    return type(err).__name__ if isinstance(err, BaseException) else ""


def is_main_launched_process() -> bool:
    """True unless this process is a non-zero rank started by a distributed launcher (which sets RANK)."""
    return os.environ.get("RANK", "0").strip() in ("", "0")

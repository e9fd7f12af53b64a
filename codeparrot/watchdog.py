"""A stall watchdog: a job that stops making progress stops loudly instead of hanging silently.

A hung process prints nothing: a network file system that stops answering, a collective that never completes
because another rank died or hangs, a DataLoader worker stuck in a read. The loop calls `beat()` whenever it
makes progress (an optimizer step, an evaluation, a checkpoint; a batch of records in preprocessing). When no
beat comes for `minutes`, the watchdog thread

1. appends the stacks of every thread of this process to its log file (`faulthandler`: the same dump a
   `kill -SIGABRT` would give, without killing it first), with one header line;
2. prints one `error:` line (the main process only, or `scripts/launch.py`: once per job) naming the rank, the
   step it was waiting for, the data it was reading and the source line the main thread is blocked on;
3. kills its own child processes (DataLoader workers, maybe blocked in the same read) and ends the process with
   `STALL_EXIT` (75, EX_TEMPFAIL: resumable; `os._exit`: the main thread is blocked and cannot be unwound).

Nothing is written to the run's checkpoints: the last complete checkpoint stays the resume point.

The watchdog is a Python thread, so it needs the GIL. A hang inside C code that holds the GIL would block it
too; `faulthandler.dump_traceback_later`, a C thread that needs no GIL, is armed as a backstop a minute later
(it dumps the stacks to the process's stderr and exits with status 1).
"""

from __future__ import annotations

import faulthandler
import io
import os
import sys
import threading
import time
import traceback
from pathlib import Path
from functools import wraps
from typing import Callable

from codeparrot.errors import STALL_EXIT, report_error_line

# The C backstop fires this long after the Python watchdog should have (it only matters when the GIL is held).
BACKSTOP_SECONDS = 60.0
# In a job of several processes each one waits this long after its report before it leaves: they all stall
# together (the next collective waits for the stuck one), and a process that leaves turns the others' wait into
# a "connection closed by peer" crash (and the launcher stops them) before their own watchdog has reported.
EXIT_GRACE_SECONDS = 5.0

_active: list["StallWatchdog"] = []  # started and not stopped: `stops_watchdogs` stops them when the job returns


def stops_watchdogs(job: Callable) -> Callable:
    """Decorator: every watchdog started inside `job` is stopped when it returns or raises (an in-process caller,
    a test, must never be killed later by the watchdog of a job that already ended)."""
    @wraps(job)
    def run(*args, **kwargs):
        try:
            return job(*args, **kwargs)
        finally:
            for watchdog in list(_active):
                watchdog.stop()
    return run


def blocked_at(thread_id: int | None = None, inside: str = "") -> str:
    """Where a thread is now: its innermost frame, plus the innermost frame of a file whose path ends with
    `inside` (the loop's own source line) when that is a different frame. E.g.
    "train.py:185 `batch = next(train_iter)` > queues.py:113 `if not self._poll(timeout)`"."""
    frame = sys._current_frames().get(thread_id if thread_id is not None else threading.main_thread().ident)
    if frame is None:
        return "unknown"
    stack = traceback.extract_stack(frame)

    def short(entry) -> str:
        return f"{Path(entry.filename).name}:{entry.lineno} `{(entry.line or '').strip()}`"

    ours = next((e for e in reversed(stack) if inside and e.filename.endswith(inside)), None)
    innermost = stack[-1]
    if ours is None or ours is innermost:
        return short(innermost)
    return f"{short(ours)} > {short(innermost)}"


class StallWatchdog:
    """`beat()` on progress; after `minutes` without one: stacks into `log_path`, one line, exit `STALL_EXIT`.

    `describe(progress)` says, for the line, what the process was waiting for (`progress`: the last value
    given to `beat`). `minutes` <= 0 makes a watchdog that does nothing."""

    def __init__(self, minutes: float, log_path: Path, describe: Callable[[int], str], loop_file: str = "",
                 poll_seconds: float | None = None, exit: Callable[[int], None] | None = None):
        self.limit = 60.0 * minutes
        self.log_path = Path(log_path)
        self.describe = describe
        self.loop_file = loop_file
        self.poll = poll_seconds if poll_seconds is not None else min(10.0, max(0.05, self.limit / 20))
        self._exit = exit or exit_killing_children  # a test passes its own: pytest's children stay alive
        self.progress = 0
        self._last = time.monotonic()
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None
        self._backstop = False
        self.fired = False
        self.hint = ""  # the end of the line, e.g. "; `--resume auto` continues from the last checkpoint"

    @property
    def enabled(self) -> bool:
        return self.limit > 0

    def start(self, progress: int = 0) -> "StallWatchdog":
        if not self.enabled or self._thread is not None:
            return self
        self.progress, self._last = progress, time.monotonic()
        self._backstop = self._arm_backstop()
        self._thread = threading.Thread(target=self._watch, name="stall-watchdog", daemon=True)
        self._thread.start()
        _active.append(self)
        return self

    def beat(self, progress: int) -> None:
        """Progress was made (`progress`: the step just completed, or the records done so far)."""
        self.progress, self._last = progress, time.monotonic()
        if self._backstop:
            self._arm_backstop()

    def stop(self) -> None:
        self._stopped.set()
        if self in _active:
            _active.remove(self)
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        if self._backstop:
            faulthandler.cancel_dump_traceback_later()
            self._backstop = False

    def __enter__(self) -> "StallWatchdog":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # ---- the watching thread ----
    def _arm_backstop(self) -> bool:
        """(Re)arm the C backstop (stacks to the process's stderr, exit 1); False where stderr has no descriptor."""
        try:
            faulthandler.dump_traceback_later(self.limit + BACKSTOP_SECONDS, exit=True, file=sys.__stderr__)
        except (AttributeError, ValueError, OSError, io.UnsupportedOperation):
            return False
        return True

    def _watch(self) -> None:
        while not self._stopped.wait(self.poll):
            idle = time.monotonic() - self._last
            if idle >= self.limit:
                self._fire(idle)
                return

    def _fire(self, idle: float) -> None:
        self.fired = True
        where = blocked_at(inside=self.loop_file)
        line = (f"error: stalled: no progress for {idle / 60:.2f} min (stall_minutes {self.limit / 60:g}): "
                f"{self.describe(self.progress)}, blocked at {where}; stacks of its threads in {self.log_path}"
                f"{self.hint}")
        try:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.log_path, "a", encoding="utf-8") as log:
                log.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {line}\n")
                log.flush()
                faulthandler.dump_traceback(file=log, all_threads=True)
        except OSError as err:  # the log's file system may be what hangs: say so on the console instead
            line += f" (could not write it: {err})"
        report_error_line(line, STALL_EXIT)  # once per job: the main process, or scripts/launch.py from the error files
        if int(os.environ.get("WORLD_SIZE", "1") or 1) > 1:
            time.sleep(EXIT_GRACE_SECONDS)
        self._exit(STALL_EXIT)


def exit_killing_children(status: int) -> None:
    """The process's end after a stall: its child processes first (see `kill_children`), then `os._exit`."""
    kill_children()
    os._exit(status)


def kill_children() -> None:
    """SIGKILL this process's own child processes (DataLoader workers, compile workers): `os._exit` does not stop
    them, and a worker blocked in the same read would live on, holding the job's output pipes open."""
    import psutil  # a dependency of accelerate

    for child in psutil.Process().children(recursive=True):
        try:
            child.kill()
        except psutil.Error:  # already gone
            pass


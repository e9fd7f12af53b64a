"""A `multiprocessing.Pool` whose worker processes are forked with SIGTERM at its default action.

`Pool.terminate()` stops the workers with SIGTERM. A worker forked from a process that has a Python SIGTERM handler
(Ray's driver installs one; so does a training run or a service that wants a graceful stop) inherits it: the signal
then runs that handler inside the worker instead of ending it, and `terminate()` waits for it forever (seen with
`pretokenize` in a process that had run the Ray engine). Both data paths that fork workers start them here:
the preprocess pool (`data/local_engine.py`) and the pretokenizer's (`training/datasets/pretokenized.py`).

A worker that dies (the kernel's out-of-memory killer, a crash in native code) is replaced by `Pool` without a
word, and the task it held is lost: waiting for its result would wait forever (until a stall watchdog fires, 30
minutes later by default). `WatchedResult(pool, result)` waits instead with a one-line error as soon as one of the
pool's workers has died, and `stop_pool` ends the pool even then: after a worker's death `Pool.terminate()` can
wait forever (checked: with an idle worker killed, it still waited after 15 s).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import threading
from typing import Any, Callable

from codeparrot.errors import CodeParrotError

POLL_SECONDS = 0.5  # how often a wait for a result looks at the workers


def start_pool(num_workers: int, initializer: Callable[..., None], initargs: tuple[Any, ...] = (),
               start_method: str | None = None):
    """`num_workers` processes of `multiprocessing.get_context(start_method)` (None: the platform's default)
    running `initializer(*initargs)` first, forked while SIGTERM is at SIG_DFL; the caller's handler is restored at
    once. Only the main thread can change a handler (`signal.signal`); from another thread the pool starts as is."""
    in_main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, signal.SIG_DFL) if in_main else None
    try:
        pool = multiprocessing.get_context(start_method).Pool(num_workers, initializer, initargs)
    finally:
        if in_main:
            signal.signal(signal.SIGTERM, previous)
    pool.codeparrot_workers = list(pool._pool)  # the processes started now (Pool replaces a dead one silently)
    return pool


def dead_worker(pool) -> str | None:
    """How the first of `pool`'s original workers that has exited ended ("killed by SIGKILL", "exit code 1"), or
    None while all of them run. Workers never exit on their own before the pool is closed."""
    for worker in pool.codeparrot_workers:
        code = worker.exitcode  # polls without blocking
        if code is None:
            continue
        if code < 0:
            name = signal.Signals(-code).name if -code in signal.valid_signals() else f"signal {-code}"
            hint = " (what the kernel's out-of-memory killer sends)" if -code == signal.SIGKILL else ""
            return f"worker process {worker.pid} was killed by {name}{hint}"
        return f"worker process {worker.pid} exited with code {code}"
    return None


def stop_pool(pool, seconds: float = 10.0) -> None:
    """`pool.terminate()` and `join()`, which can wait forever once a worker has died: the dead one may have held
    the task queue's lock, which terminate() takes (CPython issues 96062, 78178). Then the live workers are killed
    first and terminate() gets `seconds` in a daemon thread; the pool's own threads are daemons too, so nothing
    keeps the process from exiting with its error line."""
    if dead_worker(pool) is None:
        pool.terminate()
        pool.join()
        return
    for worker in list(pool._pool) + pool.codeparrot_workers:
        if worker.exitcode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(worker.pid, signal.SIGKILL)
    stopper = threading.Thread(target=lambda: (pool.terminate(), pool.join()), daemon=True, name="pool-stop")
    stopper.start()
    stopper.join(seconds)


class WatchedResult:
    """`pool.apply_async`'s result whose `get()` raises a one-line CodeParrotError once a worker of `pool` has
    died, instead of waiting forever for a task that died with it."""

    def __init__(self, pool, result):
        self.pool, self.result = pool, result

    def ready(self) -> bool:
        return self.result.ready()

    def get(self) -> Any:
        while True:
            try:
                return self.result.get(timeout=POLL_SECONDS)
            except multiprocessing.TimeoutError:
                pass
            death = dead_worker(self.pool)
            if death is not None:
                raise CodeParrotError(f"{death}: the work it held is lost, so the run stops (fewer workers, or "
                                      f"smaller batches, need less memory)")

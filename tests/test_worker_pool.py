"""codeparrot/worker_pool.py: `terminate()` ends the workers even when the caller has a SIGTERM handler (Ray's
driver, a training run's graceful stop): forked with it, an idle worker ran the handler and waited forever."""

from __future__ import annotations

import os
import signal

import pytest

from codeparrot.errors import CodeParrotError
from codeparrot.worker_pool import start_pool, watched


def _nothing() -> None:
    pass


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)  # what the out-of-memory killer does to a worker


def _pid_and_handler(_item: int) -> tuple[int, bool]:
    return os.getpid(), signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


@pytest.mark.timeout(60)  # the bug was a hang in terminate()/join(): fail instead of waiting forever
def test_terminate_ends_workers_forked_under_a_sigterm_handler():
    def ignore(signum, frame):  # what a graceful-stop handler does with the signal: note it, carry on
        pass

    previous = signal.signal(signal.SIGTERM, ignore)
    try:
        pool = start_pool(2, _nothing, (), "fork")
        seen = pool.map(_pid_and_handler, range(8), chunksize=1)
        assert all(default for _, default in seen)  # SIGTERM kills a worker, wherever it waits
        pids = {pid for pid, _ in seen}
        assert signal.getsignal(signal.SIGTERM) is ignore  # the caller's handler is back at once
        pool.terminate()  # SIGTERM to idle workers
        pool.join()
        assert pids and os.getpid() not in pids
        for pid in pids:
            with pytest.raises(ProcessLookupError):
                os.kill(pid, 0)
    finally:
        signal.signal(signal.SIGTERM, previous)


@pytest.mark.timeout(60)  # the bug was a wait that never ended: Pool replaces a dead worker and drops its task
def test_a_worker_killed_mid_task_is_a_one_line_error_not_a_hang():
    import time

    pool = start_pool(2, _nothing, (), "fork")
    try:
        start = time.monotonic()
        with pytest.raises(CodeParrotError, match=r"^worker process \d+ was killed by SIGKILL \(what the kernel's "
                                                  r"out-of-memory killer sends\): the work it held is lost"):
            watched(pool, pool.apply_async(_die)).get()
        assert time.monotonic() - start < 10
        assert watched(pool, pool.apply_async(_pid_and_handler, (1,))).ready() in (True, False)  # the API callers use
    finally:
        pool.terminate()
        pool.join()

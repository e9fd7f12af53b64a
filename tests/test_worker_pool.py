"""codeparrot/worker_pool.py: `terminate()` ends the workers even when the caller has a SIGTERM handler (Ray's
driver, a training run's graceful stop): forked with it, an idle worker ran the handler and waited forever."""

from __future__ import annotations

import os
import signal

import pytest

from codeparrot.errors import CodeParrotError
from codeparrot.worker_pool import WatchedResult, start_pool, stop_pool


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
            WatchedResult(pool, pool.apply_async(_die)).get()
        assert time.monotonic() - start < 10
    finally:
        stop_pool(pool, seconds=2)  # after a worker's death plain terminate() may wait forever (the next test)


def _record_and_sleep(path: str, seconds: float) -> None:
    import time

    with open(path, "w") as f:
        f.write(str(os.getpid()))
    time.sleep(seconds)


@pytest.mark.timeout(60)
def test_stopping_a_pool_whose_idle_worker_was_killed_does_not_hang(tmp_path):
    """An idle worker waits for tasks holding the task queue's lock: killed then, it takes the lock with it, and
    Pool.terminate() (which takes that lock) waited forever. The error line must still come out."""
    import time

    pool = start_pool(2, _nothing, (), "fork")
    busy = pool.apply_async(_record_and_sleep, (str(tmp_path / "busy.pid"), 30))  # longer than the test may take
    for _ in range(100):
        if (tmp_path / "busy.pid").is_file() and (tmp_path / "busy.pid").read_text():
            break
        time.sleep(0.05)
    busy_pid = int((tmp_path / "busy.pid").read_text())
    time.sleep(0.5)  # the other worker is idle now: waiting for a task, holding the queue's lock
    [idle] = [w for w in pool.codeparrot_workers if w.pid != busy_pid]
    os.kill(idle.pid, signal.SIGKILL)
    with pytest.raises(CodeParrotError, match="killed by SIGKILL"):
        WatchedResult(pool, busy).get()
    start = time.monotonic()
    stop_pool(pool, seconds=2)  # plain terminate() here waits forever (checked by hand: still waiting after 15 s)
    assert time.monotonic() - start < 10
    assert all(w.exitcode is not None for w in pool.codeparrot_workers)

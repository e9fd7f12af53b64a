"""codeparrot/worker_pool.py: `terminate()` ends the workers even when the caller has a SIGTERM handler (Ray's
driver, a training run's graceful stop): forked with it, an idle worker ran the handler and waited forever."""

from __future__ import annotations

import os
import signal

import pytest

from codeparrot.worker_pool import start_pool


def _nothing() -> None:
    pass


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

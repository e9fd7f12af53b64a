"""SIGTERM stops a training run after a step, with a checkpoint, instead of losing every step since the last one.

Clusters end a job with SIGTERM and SIGKILL a grace period later: Slurm signals every process of the job (KillWait,
30 s by default), torch elastic's launcher forwards the signal to its workers and waits 30 s, Kubernetes waits
terminationGracePeriodSeconds (30 s by default). The handler only notes the signal. After every optimizer step the
processes agree on "a process was asked to stop" with a one-element all-reduce (MAX) whose result is read one step
later: by then the device has long finished it, so the read waits for that point of the stream only, never for the
step in flight, and the loop still does not wait on the device. Every process reads the same agreed value, so all
stop after the same step. The loop then saves a checkpoint (no evaluation and no push: the grace period is short)
and the process leaves with `PREEMPTED_EXIT` (143 = 128 + SIGTERM) after one line naming it; `--resume auto`
continues from it exactly.

Further SIGTERMs change nothing (a launcher forwards the one the cluster already sent each process); SIGKILL or
Ctrl-C stop at once. A process that has not stopped `GIVE_UP_SECONDS` after its SIGTERM (blocked in a collective
whose peer died: torch elastic SIGTERMs the survivors of a failed rank) ends with one line and status 143.
DataLoader workers ignore SIGTERM (training/datasets/loader.py): their main process ends them (and SIGKILLs them at
its exit, `kill_workers_at_exit`).
"""

from __future__ import annotations

import atexit
import multiprocessing
import os
import signal
import sys
import threading
from functools import wraps
from typing import Callable

import torch

# After SIGTERM, the longest a process keeps running towards its agreed stop before SIGTERM's default action.
GIVE_UP_SECONDS = 120.0
_INSTALLED: list["StopSignal"] = []  # their give-up timers are cancelled when `train` returns (`restores_sigterm`)


class StopSignal:
    """`install()` before the loop; `agreed()` once per optimizer step on every process: True when all stop now."""

    def __init__(self, device: torch.device, distributed: bool):
        self.device = device
        self.distributed = distributed
        self.received = False  # this process got SIGTERM
        self._pid = os.getpid()
        # the last step's agreement: (its result in host memory, the event after its copy; None without one)
        self._pending: tuple | None = None
        # CUDA: the flag in pinned host memory, on the device, and the result in pinned host memory
        self._buffers: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
        self._give_up: threading.Timer | None = None

    def install(self) -> "StopSignal":
        """Take over SIGTERM (only the main thread can; elsewhere, e.g. a test's thread, SIGTERM keeps its meaning).
        The previous handler comes back when `train` returns (`restores_sigterm`)."""
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._handle)
            _INSTALLED.append(self)
        return self

    def _handle(self, signum, frame) -> None:
        if os.getpid() != self._pid:  # a process forked after install: SIGTERM ends it, as it would have
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        if not self.received:
            self.received = True
            self._give_up = threading.Timer(GIVE_UP_SECONDS, self._terminate)
            self._give_up.daemon = True
            self._give_up.start()

    def _terminate(self) -> None:
        """The give-up timer's end (its own thread: the main thread may be blocked in C, where no Python signal
        handler runs): one line saying where the main thread is, this process's children killed, exit 143."""
        from codeparrot.errors import PREEMPTED_EXIT
        from codeparrot.watchdog import blocked_at, exit_killing_children

        print(f"SIGTERM: no stop within {GIVE_UP_SECONDS:g} s (blocked at {blocked_at()}); ending without a "
              "checkpoint", file=sys.__stderr__, flush=True)
        exit_killing_children(PREEMPTED_EXIT)

    def cancel(self) -> None:
        if self._give_up is not None:
            self._give_up.cancel()

    def agreed(self) -> bool:
        """Whether any process had received SIGTERM by the end of the previous step (one process alone: by now)."""
        if not self.distributed:
            return self.received
        import torch.distributed as dist

        agreed = self._read_pending()  # after it, the previous step's copies are done: their buffers are free
        if self.device.type == "cuda":
            if self._buffers is None:  # allocated once: pinning host memory every step costs a host stall
                self._buffers = (torch.empty(1, dtype=torch.int32, pin_memory=True),
                                 torch.empty(1, dtype=torch.int32, device=self.device),
                                 torch.empty(1, dtype=torch.int32, pin_memory=True))
            host, on_device, result = self._buffers
            host.fill_(int(self.received))  # pinned: the copies below do not wait for the stream to drain
            on_device.copy_(host, non_blocking=True)
            dist.all_reduce(on_device, op=dist.ReduceOp.MAX)
            result.copy_(on_device, non_blocking=True)
            event = torch.cuda.Event()
            event.record()
            self._pending = (result, event)
        else:  # gloo: the collective completes before it returns
            flag = torch.tensor([int(self.received)], dtype=torch.int32)
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            self._pending = (flag, None)
        return agreed

    def _read_pending(self) -> bool:
        if self._pending is None:
            return False
        result, event = self._pending
        if event is not None:
            event.synchronize()  # the previous step's end on the device: passed already, unless the device lags
        return bool(result.item())


def restores_sigterm(job: Callable) -> Callable:
    """Decorator: SIGTERM's handler is what it was before `job` once it returns or raises (an in-process caller,
    a test, keeps its own)."""
    @wraps(job)
    def run(*args, **kwargs):
        if threading.current_thread() is not threading.main_thread():
            return job(*args, **kwargs)
        previous = signal.getsignal(signal.SIGTERM)
        try:
            return job(*args, **kwargs)
        finally:
            signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)
            while _INSTALLED:
                _INSTALLED.pop().cancel()
    return run


def ignore_sigterm(worker_id: int | None = None) -> None:
    """A DataLoader worker's `worker_init_fn`: SIGTERM is for the main process (module docstring). A cluster's
    SIGTERM reaches every process of a job; a worker killed by it would end the run with torch's "DataLoader worker
    exited unexpectedly" before the main process could stop at a step and save. The main process must call
    `kill_workers_at_exit()`."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


_KILL_AT_EXIT = False


def kill_workers_at_exit() -> None:
    """In the main process, where workers that ignore SIGTERM are started: at exit its daemonic child processes
    are SIGKILLed. multiprocessing's own exit handler SIGTERMs them and then waits without a timeout: it would
    wait forever for such a worker when a run crashes with a DataLoader iterator still alive (the traceback holds
    its frame, so the iterator never shuts its workers down). atexit runs handlers last-registered first, so this
    one runs before multiprocessing's (registered when multiprocessing.util is imported, below)."""
    global _KILL_AT_EXIT
    if not _KILL_AT_EXIT:
        import multiprocessing.util  # noqa: F401  (its exit handler registered first, so it runs after ours)

        atexit.register(_kill_daemonic_children)
        _KILL_AT_EXIT = True


def _kill_daemonic_children() -> None:
    # torch's SIGCHLD handler would report each death as a new error after the real one
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    for child in multiprocessing.active_children():
        if child.daemon:  # what multiprocessing would SIGTERM now; SIGKILL cannot be ignored
            child.kill()

"""A `multiprocessing.Pool` whose worker processes are forked with SIGTERM at its default action.

`Pool.terminate()` stops the workers with SIGTERM. A worker forked from a process that has a Python SIGTERM handler
(Ray's driver installs one; so does a training run or a service that wants a graceful stop) inherits it: the signal
then runs that handler inside the worker instead of ending it, and `terminate()` waits for it forever (seen with
`pretokenize` in a process that had run the Ray engine). Both data paths that fork workers start them here:
the preprocess pool (`data/local_engine.py`) and the pretokenizer's (`training/datasets/pretokenized.py`).
"""

from __future__ import annotations

import multiprocessing
import signal
import threading
from typing import Any, Callable


def start_pool(num_workers: int, initializer: Callable[..., None], initargs: tuple[Any, ...] = (),
               start_method: str | None = None):
    """`num_workers` processes of `multiprocessing.get_context(start_method)` (None: the platform's default)
    running `initializer(*initargs)` first, forked while SIGTERM is at SIG_DFL; the caller's handler is restored at
    once. Only the main thread can change a handler (`signal.signal`); from another thread the pool starts as is."""
    in_main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, signal.SIG_DFL) if in_main else None
    try:
        return multiprocessing.get_context(start_method).Pool(num_workers, initializer, initargs)
    finally:
        if in_main:
            signal.signal(signal.SIGTERM, previous)

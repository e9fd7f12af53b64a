"""`in_background`: a request's long work (a generation, a losses computation) on a thread of its own, which is
told to stop once nobody waits for its result any more.

Gradio closes a streaming handler's generator when its client cancels (/cancel) or disconnects
(`Queue.reset_iterators`), but only while the generator is suspended at a `yield`: `SyncToAsyncIterator.aclose`
retries `close()` while the generator runs and gives up after 60 s, leaving the work running for nobody (and every
request queued behind it waiting). So the work runs on a thread, and the request's generator only waits for the
work's reports and yields them, so that it is closable between any two of them; closing it sets the work's stop
event, which the work checks (between tokens, between evaluation batches).
"""

from __future__ import annotations

import queue
import threading
from typing import Any, Callable, Iterator, TypeVar

T = TypeVar("T")
_DONE = object()  # the end of the reports: the work returned or raised


def in_background(work: Callable[[threading.Event, Callable[[Any], None]], T], name: str,
                  heartbeat: float | None = None) -> Iterator[tuple[Any, T | None]]:
    """Run `work(stop, report)` on a thread named `name` while this generator yields `(report, None)` for each
    value it reports and, last, `(None, result)`: what `work` returned, which must not be None. An error in the
    work is raised here, in the request's thread.

    With `heartbeat` (seconds), the last report is yielded again whenever none came for that long, so that a work
    that reports seldom (a checkpoint's evaluation can take minutes) can still be closed within `heartbeat`;
    the work should report at once then (before its first report there is nothing to repeat).

    Closing this generator early sets `stop`: the work must check it and end (return or raise) soon after."""
    reports: queue.Queue = queue.Queue()
    outcome: dict = {}
    stop = threading.Event()

    def run() -> None:
        try:
            outcome["result"] = work(stop, reports.put)
        except BaseException as err:  # noqa: BLE001 - re-raised in the request's thread below
            outcome["error"] = err
        finally:
            reports.put(_DONE)

    worker = threading.Thread(target=run, name=name, daemon=True)
    worker.start()
    last = _DONE
    try:
        while True:
            try:
                report = reports.get(timeout=heartbeat)
            except queue.Empty:
                if last is not _DONE:
                    yield last, None
                continue
            if report is _DONE:
                break
            last = report
            yield report, None
    finally:
        # Only signal, never join here: Gradio closes the generator on its event loop, which must not wait for
        # a forward pass. After a normal end the worker has finished, and this changes nothing.
        stop.set()
    worker.join()
    if "error" in outcome:
        raise outcome["error"]
    yield None, outcome["result"]

"""`in_background`: a request's long work (a generation, a losses computation) on a thread of its own, which is
told to stop once nobody waits for its result any more.

Gradio closes a streaming handler's generator when its client cancels (/cancel) or disconnects
(`Queue.reset_iterators`), but only while the generator is suspended at a `yield`: `SyncToAsyncIterator.aclose`
retries `close()` while the generator runs and gives up after 60 s, leaving the work running for nobody (and every
request queued behind it waiting). So the work runs on a thread, and the request's generator only waits for the
work's reports and yields them, so that it is closable between any two of them; closing it sets the work's stop
event, which the work checks (between tokens, between evaluation batches). A work can be quiet for long (a
generation queued for the generation lock behind another tab's, a slow first token, a checkpoint's evaluation), so
the generator also yields a `HEARTBEAT` whenever no report came for `HEARTBEAT_S`: every consumer skips it as data
but yields in turn (what it shows, unchanged), so that its own generator, the one Gradio closes, is suspended too.
"""

from __future__ import annotations

import queue
import threading
from typing import Any, Callable, Iterator, TypeVar

T = TypeVar("T")
_DONE = object()  # the end of the reports: the work returned or raised
# How long a request's generator may go without yielding, so without being closable by Gradio. Read at each call
# (the tests shorten it). A yield that changes nothing reaches the page as an empty diff (the /call API, which
# sends whole outputs, gets them again): cheap.
HEARTBEAT_S = 0.5


class _Heartbeat:
    def __repr__(self) -> str:
        return "HEARTBEAT"


# Yielded as `(HEARTBEAT, None)`: "no report yet". A marker, not a repeat of the last report: a repeated report
# would be data to its consumer (a generation's piece appended twice), and before the first one there is nothing
# to repeat.
HEARTBEAT = _Heartbeat()


def in_background(work: Callable[[threading.Event, Callable[[Any], None]], T],
                  name: str) -> Iterator[tuple[Any, T | None]]:
    """Run `work(stop, report)` on a thread named `name` while this generator yields `(report, None)` for each
    value it reports, `(HEARTBEAT, None)` whenever none came for `HEARTBEAT_S` and, last, `(None, result)`: what
    `work` returned, which must not be None. An error in the work is raised here, in the request's thread.

    A consumer must skip `HEARTBEAT` as data and yield at it all the same (see the module's docstring).

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
    try:
        while True:
            try:
                report = reports.get(timeout=HEARTBEAT_S)
            except queue.Empty:
                yield HEARTBEAT, None
                continue
            if report is _DONE:
                break
            yield report, None
    finally:
        # Only signal, never join here: Gradio closes the generator on its event loop, which must not wait for
        # a forward pass. After a normal end the worker has finished, and this changes nothing.
        stop.set()
    worker.join()
    if "error" in outcome:
        raise outcome["error"]
    yield None, outcome["result"]

"""preprocess.py's stall watchdog (`codeparrot.watchdog`): progress is a batch of records coming back from the
workers; the line names the records done and the chunk it was waiting for (its first record's file:line)."""

from __future__ import annotations

from collections import deque
from pathlib import Path

from codeparrot.watchdog import StallWatchdog


def stall_log(output_dir: Path) -> Path:
    """Where the stacks go: OUTPUT_DIR.stall.log, next to the output (its temporary folder is removed by the next
    run: atomic_io.remove_stale_temporaries)."""
    return output_dir.with_name(f"{output_dir.name}.stall.log")


def records_watchdog(stall_minutes: float, output_dir: Path, pending: deque) -> StallWatchdog:
    """Started; `pending` is pass 1's queue of chunks in flight, (chunk, ...), chunk = [(line, text, where, copies)]."""

    def describe(done: int) -> str:
        try:
            where = pending[0][0][0][2]  # the first record of the oldest chunk in flight
        except IndexError:  # nothing in flight: the reader itself is blocked
            return f"preprocess reading the input after {done:,} records done"
        return f"preprocess waiting for a worker's batch of records from {where} ({done:,} records done)"

    watchdog = StallWatchdog(stall_minutes, stall_log(output_dir), describe, loop_file="data/local_engine.py")
    watchdog.hint = f"; {output_dir} was not written"
    return watchdog.start()

"""The training loop's stall watchdog (`codeparrot.watchdog`): progress is an optimizer step (or an evaluation,
a checkpoint); the line names the rank, the step it waited for and the data it was reading."""

from __future__ import annotations

from pathlib import Path

from codeparrot.watchdog import StallWatchdog, stops_watchdogs

__all__ = ["stops_watchdogs", "training_watchdog"]


def training_watchdog(stall_minutes: float, run_dir: Path, rank: int, accum: int, data: str,
                      first_step: int = 0) -> StallWatchdog:
    """The training loop's watchdog, started: progress = optimizer steps; the line names the rank, the step it
    waited for and that step's micro-batches of this rank's share of `data` (the loader continues its position
    across a resume, so micro-batch k is the k-th this rank has drawn since the run started)."""

    def describe(step: int) -> str:
        return (f"rank {rank} waiting for step {step + 1} (its micro-batches {step * accum + 1}-{(step + 1) * accum} "
                f"of data.train {data})")

    log = Path(run_dir) / "logs" / f"rank-{rank}.log"
    watchdog = StallWatchdog(stall_minutes, log, describe, loop_file="training/train.py")
    watchdog.hint = (" (every process writes its own rank-N.log); nothing was saved: `--resume auto` continues from "
                     "the last checkpoint")
    return watchdog.start(first_step)

"""The row type every benchmark returns, and the repeat-and-take-the-median helper."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Callable


@dataclass
class BenchRow:
    """One line of the benchmark table: a median over repeats with its spread (min..max)."""

    stage: str  # e.g. "preprocess: exact dedup + filters (site-packages)"
    metric: str  # e.g. "files/s"
    median: float
    low: float
    high: float
    repeats: int
    note: str = ""  # context: corpus size, ratio to a target, MFU convention, ...


def measure(fn: Callable[[], float], repeats: int = 3, warmup: int = 0) -> tuple[float, float, float]:
    """Call `fn` (which returns a rate) `warmup + repeats` times; (median, min, max) of the timed calls."""
    for _ in range(warmup):
        fn()
    values = [fn() for _ in range(repeats)]
    return statistics.median(values), min(values), max(values)


def rate(work: float, fn: Callable[[], object]) -> float:
    """`work` units divided by the seconds `fn()` takes."""
    start = time.perf_counter()
    fn()
    return work / max(time.perf_counter() - start, 1e-9)

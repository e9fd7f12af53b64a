"""The row type every benchmark returns, the repeat-and-take-the-median helper, and the command line of a benchmark
module run alone (`python -m codeparrot.tools.benchmarks.<area> [--quick]`)."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Callable, TypeVar

from codeparrot.config import doc
from codeparrot.config_flags import parse_config
from codeparrot.errors import run_cli

F = TypeVar("F", bound="AreaFlags")


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


@dataclass
class AreaFlags:
    """The flags of a benchmark module run alone; a module with more flags subclasses it."""

    quick: bool = doc(False, "small inputs and few repeats (make bench's smoke run, `scripts/bench.py --quick`): "
                             "not figures to quote")


def print_rows(rows: list[BenchRow]) -> None:
    for row in rows:
        print(row)


def area_cli(description: str, run: Callable[[F], object], flags: type[F] = AreaFlags) -> None:
    """A benchmark module's `__main__`: its flags parsed first (`--help` shows `description`, the module docstring,
    and exits before anything is measured; an unknown flag is an error, status 2), then `run(flags)` under
    `run_cli`, so that SIGTERM unwinds like Ctrl-C and the benchmark's temporary folders are removed."""
    def main() -> int:
        run(parse_config(flags, None, description))
        return 0

    run_cli(main)

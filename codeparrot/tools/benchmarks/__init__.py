"""Benchmark rows for `make bench`: each module exposes `rows(quick: bool) -> list[BenchRow]`."""

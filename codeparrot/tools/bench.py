"""`make bench`: one table of throughput figures, each a median over repeated runs with its spread.

Rows come from `codeparrot/benchmarks/<area>.py` modules (`rows(quick) -> list[BenchRow]`); this module adds
the machine details (cores, measured matmul peak), prints the table and writes it to a Markdown file with the
command that produced it. A benchmark that fails is reported as a row with its error, never hides the rest.
"""

from __future__ import annotations

import importlib
import os
import platform
import sys
import time
import traceback
from pathlib import Path

import torch

from codeparrot.atomic_io import atomic_write_text
from codeparrot.tools.benchmarks.common import BenchRow

# Order of the table: the pipeline's order.
AREAS = ["data", "ray_engine", "near_dedup", "tokenizer", "loader", "train", "sandbox"]


def machine_lines() -> list[str]:
    """Cores, CPU model, torch version and this machine's measured matmul peak (the MFU denominator on CPU)."""

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    lines = [
        f"- machine: {os.cpu_count()} cores ({cpu}), torch {torch.__version__} with {torch.get_num_threads()} threads, "
        f"Python {platform.python_version()}",
    ]
    try:
        from codeparrot.training.mfu import cpu_matmul_peak

        fp32, bf16 = cpu_matmul_peak("float32"), cpu_matmul_peak("bfloat16")
        lines.append(f"- measured matmul peak (2 threads, large square matrices): fp32 {fp32 / 1e9:.0f} GFLOP/s, "
                     f"bf16 {bf16 / 1e9:.0f} GFLOP/s")
    except Exception as err:  # the MFU module reports its own problems; the table still prints
        lines.append(f"- measured matmul peak: unavailable ({type(err).__name__}: {err})")
    return lines


def collect(areas: list[str], quick: bool) -> list[BenchRow]:
    rows: list[BenchRow] = []
    for area in areas:
        start = time.perf_counter()
        print(f"[bench] {area} ...", file=sys.stderr, flush=True)
        try:
            module = importlib.import_module(f"codeparrot.tools.benchmarks.{area}")
            rows.extend(module.rows(quick=quick))
        except Exception as err:
            traceback.print_exc()
            rows.append(BenchRow(area, "error", float("nan"), float("nan"), float("nan"), 0, f"{type(err).__name__}: {err}"))
        print(f"[bench] {area} done in {time.perf_counter() - start:.0f} s", file=sys.stderr, flush=True)
    return rows


def _fmt(x: float) -> str:
    if x != x:  # NaN
        return "-"
    if abs(x) >= 100:
        return f"{x:,.0f}"
    if abs(x) >= 1:
        return f"{x:.2f}"
    return f"{x:.3g}"


def format_table(rows: list[BenchRow]) -> str:
    header = "| stage | metric | median | spread (min..max) | runs | note |\n|---|---|---:|---:|---:|---|"
    body = [
        f"| {r.stage} | {r.metric} | {_fmt(r.median)} | {_fmt(r.low)}..{_fmt(r.high)} | {r.repeats} | {r.note} |"
        for r in rows
    ]
    return "\n".join([header, *body])


def run(output: str | None, areas: list[str] | None = None, quick: bool = False) -> str:
    command = "make bench" if not quick else "python scripts/bench.py --quick"
    rows = collect(areas or AREAS, quick)
    text = "\n".join([
        "# CodeParrot benchmarks",
        "",
        f"Produced by `{command}` on {time.strftime('%Y-%m-%d')}.",
        "",
        *machine_lines(),
        "",
        format_table(rows),
        "",
    ])
    print(text)
    if output:
        atomic_write_text(output, text)
        print(f"written to {output}", file=sys.stderr)
    return text

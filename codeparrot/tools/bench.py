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
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, get_args

import torch

from codeparrot.atomic_io import atomic_write_text
from codeparrot.config import doc
from codeparrot.tools.benchmarks.common import BenchRow

# Order of the table: the pipeline's order.
Area = Literal["data", "data_stages", "ray_engine", "near_dedup", "tokenizer", "loader", "train", "sandbox"]
AREAS: list[str] = list(get_args(Area))


@dataclass
class BenchConfig:
    """scripts/bench.py: which benchmark areas run, how big, and where the table goes."""

    output: str = doc("bench/results.md", "Markdown file the table is written to (atomically)")
    areas: list[Area] = doc(AREAS, "benchmark areas to run, in table order")
    quick: bool = doc(False, "small inputs and few repeats: a smoke run, not figures to quote")


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


# The GPU figures of the published setup: what measures them (codeparrot-small, bf16, seq 1024).
GPU_COMMANDS = [
    ("tokens/s, MFU (target >= 45%; the original ~5%), peak memory; with and without --compile",
     "accelerate launch --num_processes 1 --mixed_precision bf16 scripts/train.py --config "
     "configs/train/codeparrot-small.yaml --model REPO --data.train tokens/train --max_steps 200 "
     "--eval.eval_steps 0 --checkpoint.save_steps 0 [--compile true]"),
    ("a profile of one step", "the same command with --profile-steps 50:51"),
    ("a short real run: loss curve, tokens/s, MFU, then pass@k",
     "the same command with --max_minutes 10 (checkpoints pushed to branch run_name of REPO), then "
     "accelerate launch scripts/human_eval.py --model REPO --revision RUN_NAME --output he.json --n-samples 10 "
     "--allow-code-execution"),
]


def gpu_lines() -> list[str]:
    """Where no CUDA device exists: the GPU rows, marked not measured, with the commands that measure them
    (figures are never estimated)."""
    if torch.cuda.is_available():
        return [f"GPU present ({torch.cuda.get_device_name(0)}): measure the figures below with these commands.", "",
                *[f"- {what}: `{cmd}`" for what, cmd in GPU_COMMANDS], ""]
    return ["GPU figures: **not measured** (no CUDA device on this machine). They come from:", "",
            *[f"- {what}: `{cmd}`" for what, cmd in GPU_COMMANDS], ""]


def run(cfg: BenchConfig) -> str:
    """Run `cfg.areas`, print the table and write it to `cfg.output` (atomically); returns the Markdown."""
    command = "make bench" if not cfg.quick else "python scripts/bench.py --quick"
    rows = collect(list(cfg.areas) or AREAS, cfg.quick)
    text = "\n".join([
        "# CodeParrot benchmarks",
        "",
        f"Produced by `{command}` on {time.strftime('%Y-%m-%d')}.",
        "",
        *machine_lines(),
        "",
        format_table(rows),
        "",
        *gpu_lines(),
    ])
    print(text)
    if cfg.output:
        atomic_write_text(cfg.output, text)
        print(f"written to {cfg.output}", file=sys.stderr)
    return text

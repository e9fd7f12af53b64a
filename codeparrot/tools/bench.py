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
Area = Literal["data", "data_stages", "ray_engine", "near_dedup", "tokenizer", "loader", "train", "sandbox",
               "serving"]
AREAS: list[str] = list(get_args(Area))


@dataclass
class BenchConfig:
    """scripts/bench.py: which benchmark areas run, how big, and where the table goes."""

    output: str = doc("bench/results.md", "Markdown file the table is written to (atomically)")
    areas: list[Area] = doc(AREAS, "benchmark areas to run, in table order")
    quick: bool = doc(False, "small inputs and few repeats, no bf16 matmul peak: a smoke run, not figures to quote")


def machine_lines(quick: bool = False) -> list[str]:
    """Cores, CPU model, torch version and this machine's measured matmul peak (the MFU denominator on CPU);
    `quick`: the fp32 peak alone (the bf16 one, emulated on most CPUs, costs seconds more to measure)."""

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

        fp32 = cpu_matmul_peak("float32")
        bf16 = "not measured (--quick)" if quick else f"{cpu_matmul_peak('bfloat16') / 1e9:.0f} GFLOP/s"
        lines.append(f"- measured matmul peak (2 threads, large square matrices): fp32 {fp32 / 1e9:.0f} GFLOP/s, "
                     f"bf16 {bf16}")
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


# The GPU figures of the published setup: what measures them (codeparrot-small, bf16, seq 1024), on the model
# repository and tokens `make gpu-data` builds. Each train.py command here loads through the config loader
# (tests/tools/test_gpu_commands.py). 200 steps of the recipe's global batch (192 × 1,024 tokens): the config's
# 2,000 warmup steps are cut to 20 (warmup longer than the run is an error), no validation split, no pushes.
GPU_LAUNCH = "python scripts/launch.py --num_processes 1 --num_machines 1 --mixed_precision bf16 --dynamo_backend no"


def gpu_train(run_name: str, extra: str = "") -> str:
    """The 200-step codeparrot-small command into run `run_name` (each variant its own run folder)."""
    return (f"{GPU_LAUNCH} scripts/train.py --config configs/train/codeparrot-small.yaml --model gpu_data/model-repo "
            f"--data.train gpu_data/tokens/train --data.valid '' --run_name {run_name} --max_steps 200 "
            f"--schedule.warmup_steps 20 --eval.eval_steps 0 --checkpoint.save_steps 0 --checkpoint.push false{extra}")


GPU_COMMANDS = [
    ("versions, device, peak row, GEMM and copy ceilings, attention and loss variants, training-step variants",
     "python scripts/gpu_check.py (make gpu-check)"),
    ("the repository and tokens the commands below train on", "make gpu-data"),
    ("tokens/s, MFU (PaLM appendix B, 6N + 12LHQT; target >= 45%, the original ~5%), peak memory: the run's "
     "summary line (median after the warm-up window) and runs/gpu-200/throughput.json", gpu_train("gpu-200")),
    ("the same in eager mode (no torch.compile of the blocks or the loss), to see what compiling is worth",
     gpu_train("gpu-200-eager", " --compile false --compile_loss false")),
    ("the same with each micro-step replayed from one CUDA graph (cuda_graphs: true): its tokens/s against the "
     "first command's, and its losses (metrics.jsonl) against the first run's",
     gpu_train("gpu-200-graphs", " --cuda_graphs true")),
    ("a profile of steps 50-51 (TensorBoard, runs/gpu-200-profile/tensorboard/profile)",
     gpu_train("gpu-200-profile", " --profile-steps 50:51")),
    ("a short real run: loss curve, validation loss, checkpoints pushed to branch gpu-10min, then pass@k",
     f"{GPU_LAUNCH} scripts/train.py --config configs/train/codeparrot-small.yaml --model gpu_data/model-repo "
     "--data.train gpu_data/tokens/train --data.valid gpu_data/tokens/valid --run_name gpu-10min --max_steps 3000 "
     "--schedule.warmup_steps 300 --max_minutes 10 --eval.eval_steps 500 --eval.max_eval_steps 50 "
     f"--checkpoint.save_steps 500; {GPU_LAUNCH} scripts/human_eval.py --model gpu_data/model-repo "
     "--revision gpu-10min --output he.json --n-samples 10 --allow-code-execution"),
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
        *machine_lines(cfg.quick),
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

"""Stage `headline`: the training CLI at the recipe's global batch, as a user runs it on one GPU.

`accelerate launch scripts/train.py --config configs/train/codeparrot-small.yaml` with global batch 192 sequences
of 1,024 tokens on one process, three times: with `--batch.micro_batch_size auto` (the run measures the largest
micro-batch that fits and derives the accumulation), auto with `--cuda_graphs true` (each micro-step replayed from
one CUDA graph, training/micro_step.py), and at the published micro-batch 12 (so 16 accumulation steps); `--smoke`
runs the auto row only (`Shapes.headline_micro_batches`). No row may take more than ROW_SECONDS, so that one
slow or stuck run cannot spend the stages after it (1.5B, JAX). Each run trains
`Shapes.headline_steps` optimizer steps, logged every 2, on `end_to_end.prepare()`'s model and tokens; its
figures are the CLI's own summary (`<run>/throughput.json`: the median of the log windows after the warm-up
one), so they are what a user of the CLI gets, start-up and compilation left out. The CUDA-graph row also gives
its tokens/s as a multiple of the eager auto row's and, where both chose the same micro-batch, whether it trained
what that row trained: the largest difference between their logged losses (the same seed, data and kernels:
expected 0 or rounding).

A run the CLI refuses (an option it does not know yet, a budget that does not divide) is a row with the CLI's
one-line error, not a failed stage: the other row still counts.
"""

from __future__ import annotations

import json
import re
import shlex
import sys
import time
from pathlib import Path

import torch

from codeparrot.tools.gpu_check.config import REPO_ROOT, Shapes
from codeparrot.tools.gpu_check.end_to_end import cli_env, error_line, launcher, run_until, training_entries

LOG_EVERY = 2
# One row's wall-clock limit: start-up, compilation and 14 steps took 50-60 s on an H100 (micro-batch 12 and 48,
# before issue 28); the auto probe adds seconds (PROBE_SECONDS, 120, bounds its worst case). A run past this will
# not give a figure in time for the stages after it.
ROW_SECONDS = 240.0
LOG_TAIL_LINES = 20  # of a failed run's log, kept in its row: the logs are in a temporary folder
# What the CLI prints about its batch (training/config.py budget_summary; training/micro_batch.py for auto)
BUDGET_LINE = re.compile(r"(\d+) sequences/step = (\d+)/process × (\d+) accumulation")
AUTO_LINE = re.compile(r"micro-batch auto: (\d+) \(accumulation (\d+)\)")


GRAPHS = "+graphs"  # a headline row name's suffix: the same run with --cuda_graphs true


def headline_command(shapes: Shapes, model: Path, tokens: Path, run_dir: Path, micro_batch: str,
                     cuda: bool) -> list[str]:
    """The recipe's training command at `shapes.global_batch` sequences per step on one process; `micro_batch`
    is a number or "auto", with GRAPHS appended for a CUDA-graph run. No validation split, one checkpoint (at
    the end), no pushes, no trackers."""
    micro_batch, graphs = micro_batch.removesuffix(GRAPHS), micro_batch.endswith(GRAPHS)
    return [*launcher(cuda), str(REPO_ROOT / "scripts" / "train.py"), "--config", str(shapes.train_preset),
            "--model", str(model), "--revision", "null", "--data.train", str(tokens), "--data.valid", "",
            "--data.seq_length", str(shapes.seq_length), "--output_dir", str(run_dir),
            "--max_steps", str(shapes.headline_steps), "--schedule.warmup_steps", "2", "--eval.eval_steps", "0",
            "--checkpoint.save_steps", "0", "--checkpoint.push", "false", "--logging.log_steps", str(LOG_EVERY),
            "--logging.trackers", "[]", "--batch.micro_batch_size", micro_batch,
            "--batch.global_batch_size", str(shapes.global_batch), "--batch.gradient_accumulation_steps", "null",
            "--batch.num_processes", "1", *(["--cuda_graphs", "true"] if graphs else [])]


def chosen_batch(run_dir: Path, log: Path) -> tuple[int | None, int | None]:
    """(micro-batch, accumulation) the run trained with: `<run>/micro_batch.json` when auto wrote one, else the
    CLI's own lines (the auto line, or the budget line once it holds numbers)."""
    record = run_dir / "micro_batch.json"
    if record.is_file():
        try:
            data = json.loads(record.read_text(encoding="utf-8"))
            return int(data["micro_batch_size"]), int(data["accumulation_steps"])
        except (ValueError, KeyError, TypeError):
            pass  # an unexpected format: the log lines below still say it
    text = log.read_text(encoding="utf-8", errors="replace") if log.is_file() else ""
    found = AUTO_LINE.search(text)
    if found:
        return int(found.group(1)), int(found.group(2))
    found = BUDGET_LINE.search(text)
    return (int(found.group(2)), int(found.group(3))) if found else (None, None)


def cli_row(label: str, micro_batch: str, root: Path, shapes: Shapes, prepared: tuple[Path, Path], cuda: bool,
            deadline: float) -> dict:
    model, tokens = prepared
    slug = re.sub(r"\W+", "-", micro_batch)
    run_dir, log = root / f"headline-{slug}", root / f"headline-{slug}.log"
    command = headline_command(shapes, model, tokens, run_dir, micro_batch, cuda)
    row = {"row": label, "requested_micro_batch": micro_batch, "global_batch": shapes.global_batch,
           "seq_length": shapes.seq_length, "steps": shapes.headline_steps,
           "command": "accelerate launch " + shlex.join(command[3:])}  # without `python -m accelerate...`
    start = time.monotonic()
    try:
        code = run_until(command, log, deadline, cli_env(shapes, torch.device("cuda" if cuda else "cpu")))
    except RuntimeError as err:  # the budget ran out: this row has no figure
        return {**row, "error": str(err), "wall_s": time.monotonic() - start}
    row["wall_s"] = time.monotonic() - start  # start-up, compilation, the auto probe and the final save included
    if code != 0:
        return {**row, "error": error_line(log), "log_tail": log_tail(log)}
    row["micro_batch"], row["accumulation"] = chosen_batch(run_dir, log)
    summary_file = run_dir / "throughput.json"
    if not summary_file.is_file():
        return {**row, "error": f"train.py wrote no {summary_file.name}", "log_tail": log_tail(log)}
    summary = json.loads(summary_file.read_text(encoding="utf-8"))
    row.update(tokens_per_s=summary.get("median_tokens_per_s"), mfu=summary.get("median_mfu"),
               peak_memory_gib=summary.get("peak_memory_gib"), timed_windows=summary.get("windows"),
               losses=logged_losses(run_dir))
    return row


def log_tail(log: Path) -> list[str]:
    """The last LOG_TAIL_LINES non-empty lines of a run's log."""
    text = log.read_text(encoding="utf-8", errors="replace") if log.is_file() else ""
    return [line for line in text.splitlines() if line.strip()][-LOG_TAIL_LINES:]


def logged_losses(run_dir: Path) -> list[float]:
    """The training losses of `<run>/metrics.jsonl`, in step order; none without the file."""
    if not (run_dir / "metrics.jsonl").is_file():
        return []
    return [entry["loss"] for entry in training_entries(run_dir).values()]


def compare_with_eager(rows: list[dict]) -> None:
    """Each CUDA-graph row that has figures, against the eager row of the same micro-batch request (in place): its
    tokens/s as a multiple of the eager row's, which is what switching `--cuda_graphs` gives a user of that
    request, and the largest loss difference over their common log steps, only where both trained the same
    micro-batch (auto sizes a graph run with a wider margin, and another split draws other dropout masks)."""
    eager = {r["requested_micro_batch"]: r for r in rows if not r["requested_micro_batch"].endswith(GRAPHS)}
    for row in rows:
        base = eager.get(row["requested_micro_batch"].removesuffix(GRAPHS))
        if not row["requested_micro_batch"].endswith(GRAPHS) or base is None or "tokens_per_s" not in row:
            continue
        if base.get("tokens_per_s") and row.get("tokens_per_s"):
            row["speedup_vs_eager"] = row["tokens_per_s"] / base["tokens_per_s"]
        if row.get("micro_batch") != base.get("micro_batch"):
            row["not_compared"] = (f"auto chose micro-batch {row.get('micro_batch')} with CUDA graphs and "
                                   f"{base.get('micro_batch')} without: losses not compared (other dropout draws)")
            continue
        pairs = list(zip(row.get("losses") or [], base.get("losses") or []))
        if pairs:
            row["loss_max_abs_diff_vs_eager"] = max(abs(a - b) for a, b in pairs)


def progress(row: dict) -> None:
    """One line per finished row on stderr: a call killed before the stage ends still shows what it measured."""
    figures = {k: row[k] for k in ("micro_batch", "accumulation", "tokens_per_s", "mfu", "peak_memory_gib", "wall_s",
                                   "error") if k in row}
    print(f"  {row['row']}: {json.dumps(figures)}", file=sys.stderr, flush=True)


def row_label(micro_batch: str, global_batch: int) -> str:
    graphs = " + CUDA graphs" if micro_batch.endswith(GRAPHS) else ""
    micro_batch = micro_batch.removesuffix(GRAPHS)
    if micro_batch == "auto":
        return f"micro-batch auto{graphs}"
    return f"micro-batch {micro_batch} × {global_batch // int(micro_batch)} accumulation{graphs}"


def headline_stage(root: Path, shapes: Shapes, prepared: tuple[Path, Path], cuda: bool, deadline: float) -> list[dict]:
    """One row per `shapes.headline_micro_batches`, each killed after ROW_SECONDS at most; a row that cannot start
    before `deadline` is recorded as skipped."""
    results = []
    for micro_batch in shapes.headline_micro_batches:
        label = row_label(micro_batch, shapes.global_batch)
        if time.monotonic() >= deadline:
            results.append({"row": label, "requested_micro_batch": micro_batch,
                            "skipped": "skipped: time budget spent"})
            continue
        row_deadline = min(deadline, time.monotonic() + ROW_SECONDS)
        results.append(cli_row(label, micro_batch, root, shapes, prepared, cuda, row_deadline))
        progress(results[-1])
    compare_with_eager(results)
    return results

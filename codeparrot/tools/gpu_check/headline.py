"""Stage `headline`: the training CLI at the recipe's global batch, as a user runs it on one GPU.

`accelerate launch scripts/train.py --config configs/train/codeparrot-small.yaml` with global batch 192 sequences
of 1,024 tokens on one process, twice: at the published micro-batch 12 (so 16 accumulation steps) and with
`--batch.micro_batch_size auto` (the run measures the largest micro-batch that fits and derives the
accumulation); `--smoke` runs the auto row only (`Shapes.headline_micro_batches`). Each run trains
`Shapes.headline_steps` optimizer steps, logged every 2, on `end_to_end.prepare()`'s model and tokens; its
figures are the CLI's own summary (`<run>/throughput.json`: the median of the log windows after the warm-up
one), so they are what a user of the CLI gets, start-up and compilation left out.

A run the CLI refuses (an option it does not know yet, a budget that does not divide) is a row with the CLI's
one-line error, not a failed stage: the other row still counts.
"""

from __future__ import annotations

import json
import shlex
import re
import time
from pathlib import Path

import torch

from codeparrot.tools.gpu_check.config import REPO_ROOT, Shapes
from codeparrot.tools.gpu_check.end_to_end import cli_env, error_line, launcher, run_until

LOG_EVERY = 2
# What the CLI prints about its batch (training/config.py budget_summary; training/micro_batch.py for auto)
BUDGET_LINE = re.compile(r"(\d+) sequences/step = (\d+)/process × (\d+) accumulation")
AUTO_LINE = re.compile(r"micro-batch auto: (\d+) \(accumulation (\d+)\)")


def headline_command(shapes: Shapes, model: Path, tokens: Path, run_dir: Path, micro_batch: str,
                     cuda: bool) -> list[str]:
    """The recipe's training command at `shapes.global_batch` sequences per step on one process; `micro_batch`
    is a number or "auto". No validation split, one checkpoint (at the end), no pushes, no trackers."""
    return [*launcher(cuda), str(REPO_ROOT / "scripts" / "train.py"), "--config", str(shapes.train_preset),
            "--model", str(model), "--revision", "null", "--data.train", str(tokens), "--data.valid", "",
            "--data.seq_length", str(shapes.seq_length), "--output_dir", str(run_dir),
            "--max_steps", str(shapes.headline_steps), "--schedule.warmup_steps", "2", "--eval.eval_steps", "0",
            "--checkpoint.save_steps", "0", "--checkpoint.push", "false", "--logging.log_steps", str(LOG_EVERY),
            "--logging.trackers", "[]", "--batch.micro_batch_size", micro_batch,
            "--batch.global_batch_size", str(shapes.global_batch), "--batch.gradient_accumulation_steps", "null",
            "--batch.num_processes", "1"]


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
        return {**row, "error": error_line(log)}
    row["micro_batch"], row["accumulation"] = chosen_batch(run_dir, log)
    summary_file = run_dir / "throughput.json"
    if not summary_file.is_file():
        return {**row, "error": f"train.py wrote no {summary_file.name} (log: {log})"}
    summary = json.loads(summary_file.read_text(encoding="utf-8"))
    row.update(tokens_per_s=summary.get("median_tokens_per_s"), mfu=summary.get("median_mfu"),
               peak_memory_gib=summary.get("peak_memory_gib"), timed_windows=summary.get("windows"))
    return row


def row_label(micro_batch: str, global_batch: int) -> str:
    if micro_batch == "auto":
        return "micro-batch auto"
    return f"micro-batch {micro_batch} × {global_batch // int(micro_batch)} accumulation"


def headline_stage(root: Path, shapes: Shapes, prepared: tuple[Path, Path], cuda: bool, deadline: float) -> list[dict]:
    """One row per `shapes.headline_micro_batches`; a row that cannot start before `deadline` is recorded as
    skipped."""
    results = []
    for micro_batch in shapes.headline_micro_batches:
        label = row_label(micro_batch, shapes.global_batch)
        if time.monotonic() >= deadline:
            results.append({"row": label, "requested_micro_batch": micro_batch,
                            "skipped": "skipped: time budget spent"})
            continue
        results.append(cli_row(label, micro_batch, root, shapes, prepared, cuda, deadline))
    return results

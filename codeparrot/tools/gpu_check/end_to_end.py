"""Stage `end_to_end`: the training CLI as a user runs it, then an exact resume.

1. A byte-level BPE is trained on this Python's standard library (`Shapes.end_to_end_files` files), the preset
   model is initialized into a plain folder (no git) and the same files are pretokenized.
2. `accelerate launch scripts/train.py --config <preset's train config>` runs 30 steps, saving at 10, 20, 30.
3. Step 30's checkpoint and `final/` are removed and the same command runs with `--resume auto`: it must
   resume from step 20 and log the same losses for steps 21-30 as the uninterrupted run.
The CLI's own metrics (tokens/s, MFU of the windows after the first) are reported.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from statistics import median

import torch

from codeparrot.repository.model import build_model, load_model_config, save_model_folder, to_gpt2_config
from codeparrot.tokenizer import save_tokenizer, train_tokenizer
from codeparrot.tools.benchmarks.loader import stdlib_texts
from codeparrot.tools.gpu_check.config import REPO_ROOT, Shapes
from codeparrot.tools.toy_run import write_shards
from codeparrot.training.datasets.pretokenized import pretokenize

STEPS, SAVE_EVERY, LOG_EVERY = 30, 10, 5


def prepare(root: Path, shapes: Shapes) -> tuple[Path, Path]:
    """(model folder, pretokenized train folder) under `root`."""
    texts = stdlib_texts(shapes.end_to_end_files)
    tokenizer = train_tokenizer(texts, vocab_size=shapes.vocab_size, show_progress=False)
    save_tokenizer(tokenizer, root / "tokenizer")
    model = build_model(to_gpt2_config(load_model_config(str(shapes.model_preset)), tokenizer), seed=0)
    save_model_folder(model, root / "model", tokenizer)
    pretokenize(write_shards(texts, root / "shards"), tokenizer, root / "tokens", progress=False)
    return root / "model", root / "tokens"


def train_command(shapes: Shapes, model: Path, tokens: Path, run_dir: Path, cuda: bool) -> list[str]:
    launcher = [sys.executable, "-m", "accelerate.commands.launch", "--num_processes", "1", "--num_machines", "1",
                "--mixed_precision", "bf16" if cuda else "no", "--dynamo_backend", "no"]
    return [*launcher, str(REPO_ROOT / "scripts" / "train.py"), "--config", str(shapes.train_preset),
            "--model", str(model), "--revision", "null", "--data.train", str(tokens), "--data.valid", "", "--data.seq_length",
            str(shapes.seq_length), "--data.num_workers", "1", "--output_dir", str(run_dir),
            "--max_steps", str(STEPS), "--schedule.warmup_steps", "5", "--checkpoint.save_steps", str(SAVE_EVERY),
            "--checkpoint.push", "false", "--logging.log_steps", str(LOG_EVERY), "--logging.trackers", "[]",
            "--batch.micro_batch_size", str(shapes.micro_batches[0]), "--batch.global_batch_size", "null",
            "--batch.gradient_accumulation_steps", "1", "--batch.num_processes", "1"]


def run_logged(command: list[str], log: Path, deadline: float) -> None:
    """Run `command` into `log`; killed at `deadline` (time.monotonic()): a stage never outlives its budget."""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    left = deadline - time.monotonic()
    if left <= 0:
        raise RuntimeError(f"stage time budget spent before {log.stem} started")
    with open(log, "w", encoding="utf-8") as out:
        try:
            done = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=REPO_ROOT, timeout=left)
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"stage time budget spent: {log.stem} killed after {left:.0f} s (log: {log})") from None
    if done.returncode != 0:
        tail = log.read_text(encoding="utf-8", errors="replace").strip().splitlines()[-3:]
        raise RuntimeError(f"train.py exited {done.returncode}: {' | '.join(tail)} (log: {log})")


def logged_losses(run_dir: Path) -> dict[int, dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text(encoding="utf-8").splitlines()]
    return {row["step"]: row for row in rows if "loss" in row}


def end_to_end_stage(root: Path, shapes: Shapes, deadline: float | None = None) -> dict:
    """`deadline`: time.monotonic() by which both runs must be done (default: 20 minutes from now)."""
    deadline = time.monotonic() + 1200 if deadline is None else deadline
    model, tokens = prepare(root, shapes)
    run_dir = root / "run"
    command = train_command(shapes, model, tokens, run_dir, torch.cuda.is_available())
    run_logged(command, root / "train.log", deadline)
    first = logged_losses(run_dir)
    shutil.rmtree(run_dir / "checkpoints" / f"step-{STEPS}")
    shutil.rmtree(run_dir / "final")
    run_logged([*command, "--resume", "auto"], root / "resume.log", deadline)
    resumed = logged_losses(run_dir)
    resume_log = (root / "resume.log").read_text(encoding="utf-8", errors="replace")
    later = [row for step, row in sorted(first.items()) if step > LOG_EVERY]  # the first window holds start-up
    diffs = [abs(resumed[s]["loss"] - first[s]["loss"]) for s in first if s > STEPS - SAVE_EVERY and s in resumed]
    return {"command": "accelerate launch " + " ".join(command[3:]),  # without `python -m accelerate...`
            "vocab_size": json.loads((model / "config.json").read_text())["vocab_size"],
            "tokens_per_s": median(r["tokens_per_s"] for r in later) if later else None,
            "mfu": median(r["mfu"] for r in later) if later and later[0].get("mfu") is not None else None,
            "memory_gib": max((r.get("memory_gib") or 0) for r in first.values()) or None,
            "resumed_from_step_20": "step-20" in resume_log and "resumed from" in resume_log,
            "max_loss_difference_after_resume": max(diffs) if diffs else None,
            "final_step": max(resumed)}

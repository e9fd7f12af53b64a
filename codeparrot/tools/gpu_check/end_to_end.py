"""Stage `end_to_end`: the training CLI as a user runs it, then an exact resume.

1. A byte-level BPE is trained on this Python's standard library (`Shapes.end_to_end_files` files), the preset
   model is initialized into a plain folder (no git) and the same files are pretokenized.
2. `accelerate launch scripts/train.py --config <preset's train config>` runs 30 steps, saving at 10, 20, 30.
3. Step 30's checkpoint and `final/` are removed and the same command runs with `--resume auto`: it must
   resume from step 20 and log the same losses for steps 21-30 as the uninterrupted run.
`--smoke` runs the same with 4 steps, saving at 2 and 4, resumed from step 2 (`Shapes.end_to_end_steps`).
The CLI's own metrics (tokens/s, MFU of the windows after the first) are reported.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
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
from codeparrot.tools.gpu_check.kernels import device_peak
from codeparrot.tools.toy_run import write_shards
from codeparrot.training.datasets.pretokenize import pretokenize


def prepare(root: Path, shapes: Shapes) -> tuple[Path, Path]:
    """(model folder, pretokenized train folder) under `root`."""
    texts = stdlib_texts(shapes.end_to_end_files)
    tokenizer = train_tokenizer(texts, vocab_size=shapes.vocab_size, show_progress=False)
    save_tokenizer(tokenizer, root / "tokenizer")
    model = build_model(to_gpt2_config(load_model_config(str(shapes.model_preset)), tokenizer), seed=0)
    save_model_folder(model, root / "model", tokenizer)
    pretokenize(write_shards(texts, root / "shards"), tokenizer, root / "tokens", progress=False)
    return root / "model", root / "tokens"


def launcher(cuda: bool) -> list[str]:
    """`accelerate launch` on one process, as docs/gpu.md runs it (the first 3 items are `python -m ...`)."""
    return [sys.executable, "-m", "accelerate.commands.launch", "--num_processes", "1", "--num_machines", "1",
            "--mixed_precision", "bf16" if cuda else "no", "--dynamo_backend", "no"]


def train_command(shapes: Shapes, model: Path, tokens: Path, run_dir: Path, cuda: bool) -> list[str]:
    schedule = shapes.end_to_end_steps
    return [*launcher(cuda), str(REPO_ROOT / "scripts" / "train.py"), "--config", str(shapes.train_preset),
            "--model", str(model), "--revision", "null", "--data.train", str(tokens), "--data.valid", "",
            "--data.seq_length", str(shapes.seq_length), "--data.num_workers", "1", "--output_dir", str(run_dir),
            "--max_steps", str(schedule.steps), "--schedule.warmup_steps", str(schedule.warmup),
            "--checkpoint.save_steps", str(schedule.save_every), "--checkpoint.push", "false",
            "--logging.log_steps", str(schedule.log_every), "--logging.trackers", "[]",
            "--batch.micro_batch_size", str(shapes.micro_batches[0]), "--batch.global_batch_size", "null",
            "--batch.gradient_accumulation_steps", "1", "--batch.num_processes", "1"]


def cli_env(shapes: Shapes, device: torch.device) -> dict[str, str]:
    """What the CLI runs get besides this environment on a CPU: `Shapes.cpu_threads` torch threads, and the CPU
    peak this process measured at that thread count (each run would measure it again on a busy machine)."""
    if device.type != "cpu":
        return {}
    env = {"OMP_NUM_THREADS": str(shapes.cpu_threads)} if shapes.cpu_threads else {}
    peak, _ = device_peak(device)
    if peak and "CODEPARROT_PEAK_TFLOPS" not in os.environ:
        env["CODEPARROT_PEAK_TFLOPS"] = f"{peak / 1e12:.6f}"
    return env


def run_until(command: list[str], log: Path, deadline: float, extra_env: dict[str, str] | None = None) -> int:
    """Run `command` into `log`, return its exit status; killed at `deadline` (time.monotonic()), which raises:
    a stage never outlives its budget. The command runs in a process group of its own, and the whole group is
    killed: `accelerate launch` starts train.py as a child process, which would otherwise keep training (and
    holding GPU memory) while the next stage measures."""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
           **(extra_env or {})}
    left = deadline - time.monotonic()
    if left <= 0:
        raise RuntimeError(f"stage time budget spent before {log.stem} started")
    with open(log, "w", encoding="utf-8") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=REPO_ROOT,
                                   start_new_session=True)
        try:
            return process.wait(timeout=left)
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"stage time budget spent: {log.stem} killed after {left:.0f} s (log: {log})") from None
        finally:  # on time-out, and on anything else that ends the wait (Ctrl-C): no process of the group survives
            kill_group(process)


def kill_group(process: subprocess.Popen) -> None:
    """SIGKILL to every process of `process`'s group (it leads one: start_new_session), then reap it."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass  # the group is gone: everything in it has exited
    process.wait()


def error_line(log: Path) -> str:
    """What a failed CLI run said: its one-line `error: ...` (the launcher's traceback follows it), else the last
    line of its log."""
    lines = [line.strip() for line in log.read_text(encoding="utf-8", errors="replace").splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("error:")]
    return (errors[0] if errors else lines[-1] if lines else "no output")[:300]


def run_logged(command: list[str], log: Path, deadline: float, extra_env: dict[str, str] | None = None) -> None:
    """`run_until`, and a RuntimeError with the end of the log when the command fails."""
    code = run_until(command, log, deadline, extra_env)
    if code != 0:
        tail = log.read_text(encoding="utf-8", errors="replace").strip().splitlines()[-3:]
        raise RuntimeError(f"train.py exited {code}: {' | '.join(tail)} (log: {log})")


def training_entries(run_dir: Path) -> dict[int, dict]:
    """{step: entry} of the training log lines of `<run>/metrics.jsonl` (evaluation entries have no loss)."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text(encoding="utf-8").splitlines()]
    return {row["step"]: row for row in rows if "loss" in row}


def end_to_end_stage(root: Path, shapes: Shapes, deadline: float | None = None,
                     prepared: tuple[Path, Path] | None = None) -> dict:
    """`deadline`: time.monotonic() by which both runs must be done (default: 20 minutes from now); `prepared`:
    `prepare()`'s folders when another stage made them already (they are only read)."""
    deadline = time.monotonic() + 1200 if deadline is None else deadline
    model, tokens = prepared or prepare(root, shapes)
    run_dir = root / "run"
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    command, env = train_command(shapes, model, tokens, run_dir, device.type == "cuda"), cli_env(shapes, device)
    run_logged(command, root / "train.log", deadline, env)
    first = training_entries(run_dir)
    schedule = shapes.end_to_end_steps
    shutil.rmtree(run_dir / "checkpoints" / f"step-{schedule.steps}")
    shutil.rmtree(run_dir / "final")
    run_logged([*command, "--resume", "auto"], root / "resume.log", deadline, env)
    resumed = training_entries(run_dir)
    resume_log = (root / "resume.log").read_text(encoding="utf-8", errors="replace")
    later = [row for step, row in sorted(first.items()) if step > schedule.log_every]  # 1st window: start-up
    diffs = [abs(resumed[s]["loss"] - first[s]["loss"]) for s in first if s > schedule.resume_from and s in resumed]
    return {"command": "accelerate launch " + shlex.join(command[3:]),  # without `python -m accelerate...`
            "vocab_size": json.loads((model / "config.json").read_text())["vocab_size"],
            "tokens_per_s": median(r["tokens_per_s"] for r in later) if later else None,
            "mfu": median(r["mfu"] for r in later) if later and later[0].get("mfu") is not None else None,
            "memory_gib": max((r.get("memory_gib") or 0) for r in first.values()) or None,
            "resume_from_step": schedule.resume_from,  # the checkpoint the resume must start from
            "resumed": f"step-{schedule.resume_from}" in resume_log and "resumed from" in resume_log,
            "max_loss_difference_after_resume": max(diffs) if diffs else None,
            "final_step": max(resumed)}

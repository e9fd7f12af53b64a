"""SIGTERM (a cluster's preemption or time limit) stops a run after a step with a checkpoint that `--resume auto`
continues from (verified here; exact resume itself is test_resume.py's), instead of losing every step since the
last checkpoint: two gloo processes where only rank 1 and rank 0's DataLoader worker get the signal (a cluster
signals every process; a worker killed by it would end the run with torch's "worker exited unexpectedly")."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import yaml

from codeparrot.config import to_dict
from codeparrot.errors import PREEMPTED_EXIT
from codeparrot.tools.toy_run import build_toy_run
from codeparrot.training.checkpointing import resolve_resume

pytestmark = pytest.mark.slow(40)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_process(launcher: subprocess.Popen, rank: int, timeout: float = 60) -> psutil.Process:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for child in psutil.Process(launcher.pid).children(recursive=True):
            try:
                env = child.environ()
            except psutil.Error:
                continue
            if env.get("RANK") == str(rank) and "train.py" in " ".join(child.cmdline()):
                return child
        time.sleep(0.1)
    raise AssertionError(f"no rank {rank} process within {timeout} s")


def _logged_steps(metrics: Path) -> list[int]:
    if not metrics.exists():
        return []
    return [json.loads(line)["step"] for line in metrics.read_text().splitlines() if '"loss"' in line]


def test_sigterm_on_one_rank_stops_both_after_the_same_step_with_a_checkpoint(tmp_path, stdlib_texts, repo_root,
                                                                             scripts_env):
    toy = build_toy_run(tmp_path / "toy", stdlib_texts[:20], vocab_size=300)
    run_dir = tmp_path / "run"
    cfg = toy.config(max_steps=10_000, **{"output_dir": str(run_dir), "data.valid": "", "data.seq_length": 32,
                                         "data.num_workers": 1, "batch.micro_batch_size": 2,
                                         "checkpoint.save_steps": 0, "logging.log_steps": 1})
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(to_dict(cfg)))
    env = {**scripts_env, "ACCELERATE_USE_CPU": "1", "OMP_NUM_THREADS": "1", "CODEPARROT_PEAK_TFLOPS": "1"}
    launch = [sys.executable, "scripts/launch.py", "--config_file", "accelerate_config.yaml", "--num_processes", "2",
              "--mixed_precision", "no", "--main_process_port", str(_free_port())]
    proc = subprocess.Popen([*launch, "scripts/train.py", "--config", str(config)], cwd=repo_root, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        rank0, rank1 = _rank_process(proc, 0), _rank_process(proc, 1)
        deadline = time.monotonic() + 90
        while len(_logged_steps(run_dir / "metrics.jsonl")) < 3 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _logged_steps(run_dir / "metrics.jsonl"), "training never logged a step"
        workers = rank0.children()
        assert workers, "rank 0 has no DataLoader worker"
        for process in (rank1, *workers):
            os.kill(process.pid, signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == PREEMPTED_EXIT, out + err
    lines = [line for line in err.splitlines() if line.startswith("stopped by SIGTERM")]
    assert len(lines) == 1, out + err  # the main process's line, once
    assert "Traceback" not in out + err and "error:" not in out + err, out + err
    step = int(lines[0].split("after step ")[1].split(":")[0])
    checkpoint = run_dir / "checkpoints" / f"step-{step}"
    assert f"saved {checkpoint}" in lines[0] and checkpoint.is_dir(), lines[0]
    assert not (run_dir / "final").exists()  # the run is not finished
    assert _logged_steps(run_dir / "metrics.jsonl")[-1] == step  # both ranks stopped there: the checkpoint agrees

    assert resolve_resume("auto", run_dir) == checkpoint  # complete and verified: `--resume auto` starts there


def test_a_crash_with_loader_workers_alive_still_exits(tmp_path, repo_root, scripts_env):
    """DataLoader workers ignore SIGTERM, and multiprocessing's exit handler SIGTERMs them and waits without a
    timeout: a crash whose traceback keeps the iterator alive would hang at exit instead of ending."""
    source = ("import torch\n"
              "from codeparrot.training.datasets.loader import build_dataloader\n"
              "class Zeros(torch.utils.data.IterableDataset):\n"
              "    def __iter__(self):\n"
              "        while True:\n"
              "            yield torch.zeros(4, dtype=torch.long)\n"
              "def train():\n"
              "    batches = iter(build_dataloader(Zeros(), batch_size=2, num_workers=1))\n"
              "    next(batches)\n"
              "    raise RuntimeError('crashed with its loader alive')\n"
              "train()\n")
    done = _run_script(tmp_path / "crash.py", source, repo_root, scripts_env)
    assert done.returncode == 1, done.stderr
    assert done.stderr.strip().splitlines()[-1] == "RuntimeError: crashed with its loader alive", done.stderr


def test_a_process_that_cannot_reach_its_stop_still_ends_and_a_finished_run_is_not_ended(tmp_path, repo_root,
                                                                                         scripts_env):
    """A rank blocked in a collective whose peer died never reaches the agreed stop: `GIVE_UP_SECONDS` after its
    SIGTERM it ends, saying where it was blocked. A run that stopped in time (or an in-process caller after
    `train` returned) is never ended later by that timer."""
    source = ("import os, signal, time\n"
              "import torch\n"
              "import codeparrot.training.stop_signal as stop_signal\n"
              "stop_signal.GIVE_UP_SECONDS = 0.5\n"
              "@stop_signal.restores_sigterm\n"
              "def stops_in_time():\n"
              "    stop = stop_signal.StopSignal(torch.device('cpu'), distributed=False).install()\n"
              "    os.kill(os.getpid(), signal.SIGTERM)\n"
              "    assert stop.agreed()\n"
              "stops_in_time()\n"
              "time.sleep(1.5)\n"
              "print('survived', flush=True)\n"
              "stop_signal.StopSignal(torch.device('cpu'), distributed=False).install()\n"
              "os.kill(os.getpid(), signal.SIGTERM)\n"
              "time.sleep(20)\n"
              "print('never ended', flush=True)\n")
    done = _run_script(tmp_path / "give_up.py", source, repo_root, scripts_env)
    assert done.returncode == PREEMPTED_EXIT and done.stdout == "survived\n", (done.stdout, done.stderr)
    assert done.stderr.startswith("SIGTERM: no stop within 0.5 s (blocked at give_up.py:15 `time.sleep(20)`)")


def _run_script(path: Path, source: str, repo_root, scripts_env) -> subprocess.CompletedProcess:
    path.write_text(source, encoding="utf-8")
    return subprocess.run([sys.executable, str(path)], cwd=repo_root, env=scripts_env, capture_output=True,
                          text=True, timeout=90)

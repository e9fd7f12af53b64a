"""Exact resume after a real kill: a run of 2N steps and a run SIGKILLed after checkpoint N then resumed to 2N
end with identical weights (CPU, fp32), identical per-step losses and learning rates.

The setup exercises everything a resume must restore: dropout on (RNG states), gradient accumulation
(Accelerate's micro-step counter), the text ConstantLengthDataset with both shuffle buffers and a DataLoader
worker (the data position, the carried tail), AdamW moments and the cosine schedule."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest
import torch
import yaml

from codeparrot.config import to_dict
from codeparrot.tools.toy_run import build_toy_run

N = 4  # checkpoint step; runs go to 2N


@pytest.fixture(scope="module")
def toy(tmp_path_factory, stdlib_texts):
    return build_toy_run(tmp_path_factory.mktemp("resume"), stdlib_texts[:60], vocab_size=400,
                         resid_pdrop=0.1, embd_pdrop=0.1, attn_pdrop=0.1)


def _config_file(toy, path, **overrides) -> str:
    cfg = toy.config(run_name="resume", max_steps=2 * N, **{
        "batch.micro_batch_size": 2, "batch.gradient_accumulation_steps": 2, "data.num_workers": 1,
        "data.seq_length": 32, "schedule.warmup_steps": 2, "logging.log_steps": 1, "checkpoint.save_steps": N,
        "checkpoint.keep_last": 5, "checkpoint.push": False, "data.valid": "", **overrides})
    path.write_text(yaml.safe_dump(to_dict(cfg)))
    return str(path)


def _launch(python, repo_root, env, config, *extra) -> subprocess.Popen:
    return subprocess.Popen([python, str(repo_root / "scripts" / "train.py"), "--config", config, *extra],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _weights(folder):
    from safetensors.torch import load_file

    return load_file(str(folder / "model.safetensors"))


def _train_entries(run_dir) -> dict[int, dict]:
    entries = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [e["step"] for e in entries if "loss" in e]
    assert len(steps) == len(set(steps)), f"a step was logged twice: {steps}"
    return {e["step"]: e for e in entries if "loss" in e}


def test_kill_and_resume_gives_identical_weights(toy, tmp_path, python, repo_root, scripts_env):
    env = {**scripts_env, "OMP_NUM_THREADS": "1"}  # same thread count in every run: bitwise-comparable math
    full_dir, killed_dir = tmp_path / "full", tmp_path / "killed"
    full_cfg = _config_file(toy, tmp_path / "full.yaml", output_dir=str(full_dir))
    # The run to kill evaluates the whole (large) validation split right after step N+1: a long window in which
    # it is certainly still running when the kill arrives. Evaluation never touches the training RNG stream.
    killed_cfg = _config_file(toy, tmp_path / "killed.yaml", output_dir=str(killed_dir), **{
        "data.valid": str(toy.train_data), "eval.eval_steps": N + 1, "eval.max_eval_steps": -1})
    full = _launch(python, repo_root, env, full_cfg)
    killed = _launch(python, repo_root, env, killed_cfg)

    marker = killed_dir / "checkpoints" / f"step-{N}" / "trainer_state.json"
    deadline = time.monotonic() + 120
    while not marker.exists():
        assert killed.poll() is None, f"the run ended before checkpoint {N}:\n{killed.stdout.read()}"
        assert time.monotonic() < deadline, "no checkpoint within 120 s"
        time.sleep(0.005)
    os.kill(killed.pid, signal.SIGKILL)
    killed.wait(timeout=30)
    assert killed.returncode == -signal.SIGKILL
    assert not (killed_dir / "checkpoints" / f"step-{2 * N}").exists()  # really killed mid-run

    resumed = _launch(python, repo_root, env, killed_cfg, "--resume", "auto", "--data.valid", "")
    out, _ = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, out
    assert f"resumed from {killed_dir / 'checkpoints' / f'step-{N}'}: step {N}" in out
    out, _ = full.communicate(timeout=300)
    assert full.returncode == 0, out

    reference, result = _weights(full_dir / "final"), _weights(killed_dir / "final")
    assert reference.keys() == result.keys()
    for key in reference:
        assert torch.equal(reference[key], result[key]), key
    # the same per-step losses and learning rates after the resume: same data, same schedule position
    ref_log, res_log = _train_entries(full_dir), _train_entries(killed_dir)
    assert sorted(res_log) == list(range(1, 2 * N + 1))
    for step in range(1, 2 * N + 1):
        assert res_log[step]["loss"] == ref_log[step]["loss"], step
        assert res_log[step]["lr"] == ref_log[step]["lr"], step
        assert res_log[step]["tokens_seen"] == ref_log[step]["tokens_seen"], step

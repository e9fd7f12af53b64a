"""Exact resume after a real kill: a run of 2N steps and a run SIGKILLed after checkpoint N then resumed to 2N
end with identical weights (CPU, fp32), identical per-step losses and learning rates.

The setup exercises everything a resume must restore: dropout on (RNG states), gradient accumulation
(Accelerate's micro-step counter), the text ConstantLengthDataset with both shuffle buffers and a DataLoader
worker (the data position, the carried tail), AdamW moments and the cosine schedule.

What could make a resume depend on the moment of the kill or on the process's state is exercised too: the kill
lands at two moments (right as checkpoint N appears; two steps later, with the DataLoader worker's prefetch
ahead of the loop and metrics.jsonl holding steps past the checkpoint), and the runs differ in their process and
start-up. The killed run is a launched `scripts/train.py`, the thing a kill hits; the uninterrupted reference and
the resumes run in this test process (`train()`, as tests/training/test_fsdp.py's references do: a launch costs
an interpreter importing torch and transformers, ~8 s of CPU on the 2-core test machine), so each resume starts
in a process that has already trained (the reference, the other kill moment's resume): whatever it does not
restore from its checkpoint is left over from another run, not a fresh start. The uninterrupted run measures the
CPU matmul peak (training/mfu.py: ~2 s of large matmuls, with an empty cache) while the resumes are given the
peak and measure nothing. The results must be bitwise equal. (`--resume auto` on the command line is
test_fsdp.py's and test_checkpoint_verification.py's; the machine is loaded by `make test`'s other worker.)"""

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

from .in_process import train_here

# two killed training launches: early in `make test`'s order; every run in this process on one torch thread, as
# the launched ones (OMP_NUM_THREADS=1): the same float sums
pytestmark = [pytest.mark.slow(30), pytest.mark.usefixtures("one_torch_thread")]

N = 4  # checkpoint step; runs go to 2N


@pytest.fixture(scope="module")
def toy(tmp_path_factory, stdlib_texts):
    return build_toy_run(tmp_path_factory.mktemp("resume"), stdlib_texts[:60], vocab_size=400,
                         resid_pdrop=0.1, embd_pdrop=0.1, attn_pdrop=0.1)


def _config(toy, **overrides):
    return toy.config(run_name="resume", max_steps=2 * N, **{
        "batch.micro_batch_size": 2, "batch.gradient_accumulation_steps": 2, "data.num_workers": 1,
        "data.seq_length": 32, "schedule.warmup_steps": 2, "logging.log_steps": 1, "checkpoint.save_steps": N,
        "checkpoint.keep_last": 5, "checkpoint.push": False, "data.valid": "", **overrides})


def _config_file(toy, path, **overrides) -> str:
    path.write_text(yaml.safe_dump(to_dict(_config(toy, **overrides))))
    return str(path)


def _peak_source(run_dir) -> str:
    return json.loads((run_dir / "throughput.json").read_text())["peak_source"]


def _weights(folder):
    from safetensors.torch import load_file

    return load_file(str(folder / "model.safetensors"))


def _train_entries(run_dir) -> dict[int, dict]:
    entries = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [e["step"] for e in entries if "loss" in e]
    assert len(steps) == len(set(steps)), f"a step was logged twice: {steps}"
    return {e["step"]: e for e in entries if "loss" in e}


@pytest.fixture(scope="module")
def uninterrupted(toy, tmp_path_factory):
    """The 2N-step reference run, in this process, measuring the CPU peak at start (its own empty cache)."""
    import codeparrot.training.mfu as mfu

    root = tmp_path_factory.mktemp("uninterrupted")
    run_dir = root / "full"
    with pytest.MonkeyPatch.context() as patch:
        patch.delenv("CODEPARROT_PEAK_TFLOPS", raising=False)
        patch.setattr(mfu, "CACHE", root / "cache" / "cpu_peak.json")
        train_here(_config(toy, output_dir=str(run_dir)))
    # the start-up the resumed runs skip
    assert _peak_source(run_dir).startswith("measured float32 matmul peak"), _peak_source(run_dir)
    assert (run_dir / "final").is_dir()
    return run_dir


def _wait_for(path_check, killed, what: str) -> None:
    deadline = time.monotonic() + 120
    while not path_check():
        assert killed.poll() is None, f"the run ended before {what}:\n{killed.stdout.read()}"
        assert time.monotonic() < deadline, f"no {what} within 120 s"
        time.sleep(0.005)


def _logged_steps(run_dir) -> set[int]:
    try:
        lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    except OSError:
        return set()
    steps = set()
    for line in lines:
        try:
            steps.add(json.loads(line).get("step"))
        except ValueError:  # a line being written
            continue
    return steps


@pytest.mark.parametrize("kill_at", ["checkpoint", "two steps later"])
def test_kill_and_resume_gives_identical_weights(toy, tmp_path, python, repo_root, scripts_env, uninterrupted,
                                                 monkeypatch, capsys, kill_at):
    env = {**scripts_env, "OMP_NUM_THREADS": "1", "CODEPARROT_PEAK_TFLOPS": "1"}  # no peak measurement here
    full_dir, killed_dir = uninterrupted, tmp_path / "killed"
    # The run to kill evaluates the whole (large) validation split right after step N+3: a long window in which
    # it is certainly still running when the kill arrives. Evaluation never touches the training RNG stream.
    killed_cfg = _config_file(toy, tmp_path / "killed.yaml", output_dir=str(killed_dir), **{
        "data.valid": str(toy.train_data), "eval.eval_steps": N + 3, "eval.max_eval_steps": -1})
    killed = subprocess.Popen([python, str(repo_root / "scripts" / "train.py"), "--config", killed_cfg], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    marker = killed_dir / "checkpoints" / f"step-{N}" / "trainer_state.json"
    if kill_at == "checkpoint":
        _wait_for(marker.exists, killed, f"checkpoint {N}")
    else:  # steps N+1 and N+2 done and logged, the loader's worker already preparing the batches after them
        _wait_for(lambda: N + 2 in _logged_steps(killed_dir), killed, f"step {N + 2}")
    os.kill(killed.pid, signal.SIGKILL)
    killed.wait(timeout=30)
    killed.stdout.close()
    assert killed.returncode == -signal.SIGKILL
    assert not (killed_dir / "checkpoints" / f"step-{2 * N}").exists()  # really killed mid-run

    # the killed run's config, without its validation split (as `--resume auto --data.valid ""` would run it)
    monkeypatch.setenv("CODEPARROT_PEAK_TFLOPS", "1")
    capsys.readouterr()
    train_here(_config(toy, output_dir=str(killed_dir), **{"eval.eval_steps": N + 3, "eval.max_eval_steps": -1}),
                resume="auto")
    out = capsys.readouterr().out
    assert f"resumed from {killed_dir / 'checkpoints' / f'step-{N}'}: step {N}" in out, out
    assert _peak_source(killed_dir) == "CODEPARROT_PEAK_TFLOPS"  # given, not measured

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

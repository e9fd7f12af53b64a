"""Non-finite losses and gradients: such a step is skipped (weights and optimizer untouched, schedule and data
advance), counted with its data position in the log and metrics.jsonl; `max_bad_steps` in a row stop the run with
one line naming the first; a checkpoint never holds non-finite weights. 1 process in this test process (`train()`),
2 processes launched over gloo."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
import yaml

from codeparrot.config import to_dict
from codeparrot.errors import CodeParrotError
from codeparrot.tools.toy_run import build_toy_run
from codeparrot.training.optim import lr_factor

pytestmark = [pytest.mark.slow(60),  # training launches: first in `make test`'s order
              pytest.mark.usefixtures("fresh_accelerate_state")]

# Run as the training script, with the loss of the given (1-based) forward calls of one rank turned into NaN:
# a batch that blows up, as a corrupt record or an overflow would.
POISON = """import os, runpy, sys
import codeparrot.training.micro_step as micro_step
real, calls = micro_step.forward_loss, [0]
def poisoned(model, head, batch):
    calls[0] += 1
    loss = real(model, head, batch)
    bad = os.environ.get("RANK", "0") == os.environ["POISON_RANK"] and calls[0] in {CALLS}
    return loss * float("nan") if bad else loss
micro_step.forward_loss = poisoned
sys.argv = ["scripts/train.py", *sys.argv[1:]]
runpy.run_path("scripts/train.py", run_name="__main__")
"""


@pytest.fixture(scope="module")
def toy(tmp_path_factory, stdlib_texts):
    return build_toy_run(tmp_path_factory.mktemp("nonfinite"), stdlib_texts[:30], vocab_size=300)


def _config(toy, tmp_path, **overrides):
    return toy.config(**{
        "max_steps": 4, "output_dir": str(tmp_path / "run"), "data.valid": "", "data.seq_length": 32, "batch.micro_batch_size": 2,
        "logging.log_steps": 1, "checkpoint.save_steps": 1, "checkpoint.keep_last": 10, "checkpoint.push": False,
        **overrides})


def _weights(folder):
    from safetensors.torch import load_file

    return load_file(str(folder / "model.safetensors"))


def _same(a, b) -> bool:
    return all(torch.equal(a[k], b[k]) for k in a)


def _metrics(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _poisoned_run(toy, tmp_path, repo_root, scripts_env, calls, rank, launcher, **overrides):
    cfg = _config(toy, tmp_path, **overrides)
    config = tmp_path / "cfg.yaml"
    config.write_text(yaml.safe_dump(to_dict(cfg)))
    script = tmp_path / "poisoned_train.py"
    script.write_text(POISON.replace("{CALLS}", repr(set(calls))))
    env = {**scripts_env, "POISON_RANK": str(rank), "OMP_NUM_THREADS": "1", "ACCELERATE_USE_CPU": "1",
           "CODEPARROT_PEAK_TFLOPS": "1"}
    done = subprocess.run([*launcher, str(script), "--config", str(config)], cwd=repo_root, env=env,
                          capture_output=True, text=True, timeout=240)
    return done, cfg.run_dir()


def _poison_here(monkeypatch, calls) -> None:
    """The POISON script's patch, in this process (one process: rank 0)."""
    import codeparrot.training.micro_step as micro_step_module

    real, count = micro_step_module.forward_loss, [0]

    def poisoned(model, head, batch):
        count[0] += 1
        loss = real(model, head, batch)
        return loss * float("nan") if count[0] in set(calls) else loss

    monkeypatch.setattr(micro_step_module, "forward_loss", poisoned)
    monkeypatch.setenv("CODEPARROT_PEAK_TFLOPS", "1")


def _two_processes(port: int) -> list[str]:
    return [sys.executable, "scripts/launch.py", "--config_file", "accelerate_config.yaml", "--num_processes", "2",
            "--mixed_precision", "no", "--main_process_port", str(port)]


@pytest.mark.parametrize("processes,fused", [(1, False), (2, False), (1, True), (2, True)],
                         ids=["1-process", "2-processes", "1-process-fused", "2-processes-fused"])
def test_a_non_finite_step_is_skipped_and_the_run_goes_on(toy, tmp_path, repo_root, scripts_env, launch_port,
                                                          monkeypatch, processes, fused):
    # step 3 of 4 (one micro-batch per step) gets a NaN loss on the last rank only: every rank must skip it.
    # fused: the CUDA default optimizer, where the skip is decided on the device (no host sync per step)
    if processes == 1:
        from codeparrot.training.train import train

        _poison_here(monkeypatch, calls=[3])
        cfg = _config(toy, tmp_path, **{"optim.fused": fused})
        train(cfg)
        run_dir = cfg.run_dir()
    else:
        done, run_dir = _poisoned_run(toy, tmp_path, repo_root, scripts_env, calls=[3], rank=processes - 1,
                                      launcher=_two_processes(launch_port()), **{"optim.fused": fused})
        assert done.returncode == 0, done.stdout + done.stderr
    ckpt = run_dir / "checkpoints"
    w2, w3, w4 = (_weights(ckpt / f"step-{s}") for s in (2, 3, 4))
    assert _same(w2, w3)  # not applied, on the rank whose own loss was finite too (its weights are the ones saved)
    assert not _same(w3, w4)  # the next step trains again
    assert all(torch.isfinite(t).all() for t in w4.values())
    entries = _metrics(run_dir)
    skips = [e for e in entries if e.get("skipped_update")]
    assert [e["step"] for e in skips] == [3], entries
    if processes == 1:  # the data of the batch: this rank's micro-batch 3, and the loader position after it
        assert "micro-batches 3-3 of data.train" in skips[0]["data"] and "epoch 0" in skips[0]["data"], skips
    logged = {e["step"]: e for e in entries if "loss" in e}
    assert [logged[s]["skipped_steps"] for s in (1, 2, 3, 4)] == [0, 0, 1, 1]
    cfg = _config(toy, tmp_path)  # the schedule advanced through the skipped step: step 4 uses lr(3)
    assert logged[4]["lr"] == pytest.approx(cfg.optim.lr * lr_factor(3, cfg.max_steps, cfg.schedule))
    assert "update skipped" in (run_dir / "logs" / f"rank-{processes - 1}.log").read_text()


@pytest.mark.parametrize("fused", [False, True], ids=["host", "fused"])
def test_max_bad_steps_in_a_row_stop_the_run_naming_the_first(toy, tmp_path, monkeypatch, fused):
    from codeparrot.training.train import train

    _poison_here(monkeypatch, calls=[2, 3, 4, 5])
    cfg = _config(toy, tmp_path, max_steps=10, max_bad_steps=3, **{"optim.fused": fused})
    with pytest.raises(CodeParrotError) as error:  # the CLI prints it as one `error:` line and exits with 2
        train(cfg)
    line = str(error.value)
    assert "\n" not in line and "3 steps in a row had a non-finite loss or gradient norm" in line, line
    assert "the first at step 2 (rank 0's micro-batches 2-2 of data.train" in line, line
    assert sorted(p.name for p in (cfg.run_dir() / "checkpoints").iterdir()) == ["step-1", "step-2", "step-3"]


def test_a_checkpoint_never_holds_non_finite_weights(toy, tmp_path, monkeypatch):
    import codeparrot.training.train as train_module

    # finite loss and gradients, but the update overflows a weight (as an absurd lr can): step 1's weights hold inf
    real = train_module.build_optimizer

    def overflowing(model, cfg, device):
        optimizer = real(model, cfg, device)

        class Overflowing(type(optimizer)):
            def step(self, *args, **kwargs):
                out = super().step(*args, **kwargs)
                with torch.no_grad():
                    next(model.parameters()).view(-1)[0] = float("inf")
                return out

        optimizer.__class__ = Overflowing
        return optimizer

    monkeypatch.setattr(train_module, "build_optimizer", overflowing)
    cfg = _config(toy, tmp_path)
    with pytest.raises(CodeParrotError, match="the weights after step 1 are not finite"):
        train_module.train(cfg)
    assert not list(cfg.run_dir().glob("checkpoints/step-*"))
    assert not (cfg.run_dir() / "final").exists()

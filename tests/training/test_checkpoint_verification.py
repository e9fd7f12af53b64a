"""Damaged checkpoints, made the way they happen (a file deleted, a copy cut short), are caught before a resume:
an explicit `--resume PATH` is a one-line error naming what is wrong; `--resume auto` skips to the previous
checkpoint that verifies and says why."""

from __future__ import annotations

import shutil
import subprocess

import pytest
import torch
import yaml

from codeparrot.config import to_dict
from codeparrot.errors import CodeParrotError
from codeparrot.tools.toy_run import build_toy_run
from codeparrot.training.checkpointing import MANIFEST_FILE, resolve_resume, verify_checkpoint

from ..script_cases import run_cases

pytestmark = pytest.mark.slow(60)  # training launches: first in `make test`'s order


@pytest.fixture(scope="module")
def run(tmp_path_factory, stdlib_texts):
    """A 2-step run checkpointed at steps 1 and 2 (through the training CLI)."""
    import os
    import sys
    from pathlib import Path

    toy = build_toy_run(tmp_path_factory.mktemp("verify"), stdlib_texts[:40], vocab_size=300)
    cfg = toy.config(run_name="verify", max_steps=2, **{
        "output_dir": str(toy.root / "runs" / "verify"), "data.valid": "", "checkpoint.push": False,
        "checkpoint.save_steps": 1, "checkpoint.keep_last": 3, "logging.log_steps": 1, "data.seq_length": 32,
        "batch.micro_batch_size": 2, "batch.gradient_accumulation_steps": 1})
    config = toy.root / "verify.yaml"
    config.write_text(yaml.safe_dump(to_dict(cfg)))
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, str(root / "scripts" / "train.py"), "--config", str(config)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    return cfg, config, env, root, toy, done.stdout


def _damaged_copy(run, tmp_path, damage):
    """A copy of the whole run folder with step-2 damaged by `damage(step_2_folder)`."""
    cfg = run[0]
    copy = tmp_path / "run"
    shutil.copytree(cfg.run_dir(), copy)
    damage(copy / "checkpoints" / "step-2")
    return copy


def _delete(name):
    return lambda folder: (folder / name).unlink()


def _truncate(folder):
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])


DAMAGE = {
    "optimizer": (_delete("training_state/optimizer.bin"), "training_state/optimizer.bin is missing"),
    "scheduler": (_delete("training_state/scheduler.bin"), "training_state/scheduler.bin is missing"),
    "rng": (_delete("training_state/random_states_0.pkl"), "training_state/random_states_0.pkl is missing"),
    "data": (_delete("training_state/data_rank0.pt"), "training_state/data_rank0.pt is missing"),
    "truncated": (_truncate, "model.safetensors is truncated"),
}


def test_a_complete_checkpoint_verifies_and_has_a_manifest(run):
    step2 = run[0].run_dir() / "checkpoints" / "step-2"
    assert verify_checkpoint(step2) == []
    manifest = yaml.safe_load((step2 / MANIFEST_FILE).read_text())["files"]
    assert {"model.safetensors", "trainer_state.json", "training_state/optimizer.bin"} <= set(manifest)
    assert manifest["model.safetensors"]["size"] == (step2 / "model.safetensors").stat().st_size


@pytest.mark.parametrize("kind", sorted(DAMAGE))
def test_damage_is_named_and_auto_falls_back(run, tmp_path, kind):
    damage, message = DAMAGE[kind]
    copy = _damaged_copy(run, tmp_path, damage)
    assert any(message in p for p in verify_checkpoint(copy / "checkpoints" / "step-2"))
    with pytest.raises(CodeParrotError, match=f"cannot resume from .*step-2: .*{message}"):
        resolve_resume(str(copy / "checkpoints" / "step-2"), copy)
    warnings = []
    assert resolve_resume("auto", copy, report=warnings.append) == copy / "checkpoints" / "step-1"
    assert len(warnings) == 1 and "step-2" in warnings[0] and message in warnings[0] and "step-1" in warnings[0]


def test_a_changed_small_file_fails_its_hash(run, tmp_path):
    def corrupt(folder):
        state = folder / "training_state" / "scheduler.bin"
        data = bytearray(state.read_bytes())
        data[-1] ^= 0xFF
        state.write_bytes(bytes(data))

    copy = _damaged_copy(run, tmp_path, corrupt)
    assert verify_checkpoint(copy / "checkpoints" / "step-2") == [
        "training_state/scheduler.bin does not match its sha256 in the manifest"]


@pytest.fixture(scope="module")
def resumes(run, tmp_path_factory):
    """Three `scripts/train.py` command lines after the run, in one process (tests/script_cases.py): an explicit
    resume from a damaged step-2 (a copy of the run), `--resume auto` on that copy, and `--resume auto` on the
    finished run itself."""
    import sys

    cfg, config, env, root, _, _ = run
    copy = _damaged_copy(run, tmp_path_factory.mktemp("damaged"), _delete("training_state/optimizer.bin"))
    script, on_copy = root / "scripts" / "train.py", ["--config", str(config), "--output_dir", str(copy)]
    explicit, auto, finished = run_cases(sys.executable, env, [
        (script, [*on_copy, "--resume", str(copy / "checkpoints" / "step-2")]),
        (script, [*on_copy, "--resume", "auto"]),
        (script, ["--config", str(config), "--resume", "auto"])])
    return copy, explicit, auto, finished


def test_the_cli_reports_damage_in_one_line_and_auto_resumes_from_the_previous(run, resumes):
    cfg = run[0]
    copy, explicit, auto, _ = resumes
    assert explicit.returncode == 2
    assert explicit.stderr.strip().splitlines() == [
        f"error: cannot resume from {copy / 'checkpoints' / 'step-2'}: training_state/optimizer.bin is missing"]
    assert auto.returncode == 0, auto.stdout + auto.stderr
    assert "skipped step-2 (training_state/optimizer.bin is missing); resuming from step-1" in auto.stderr
    assert f"resumed from {copy / 'checkpoints' / 'step-1'}: step 1" in auto.stdout
    # step 2 was redone from step 1 and re-saved complete, with the same weights as the undamaged run
    assert verify_checkpoint(copy / "checkpoints" / "step-2") == []
    from safetensors.torch import load_file

    redone = load_file(str(copy / "checkpoints" / "step-2" / "model.safetensors"))
    original = load_file(str(cfg.run_dir() / "checkpoints" / "step-2" / "model.safetensors"))
    for key in original:
        torch.testing.assert_close(redone[key], original[key], rtol=0, atol=0)


def test_a_run_says_where_it_starts_and_ends(run):
    cfg, config, env, root, toy, stdout = run
    assert f"starting weights: {toy.repo} @ main (commit " in stdout and "'initial model')" in stdout
    assert stdout.strip().splitlines()[-1] == f"final model (step 2): {cfg.run_dir() / 'final'}"


def test_resume_auto_on_a_finished_run_says_so(run, resumes):
    cfg, finished = run[0], resumes[3]
    assert finished.returncode == 0, finished.stderr
    assert finished.stdout.strip() == (f"run verify is already finished: step-2 reached max_steps 2; its final model "
                                       f"is in {cfg.run_dir() / 'final'} (raise --max_steps to train further)")


def test_starting_from_a_promoted_main_warns(run, tmp_path):
    from codeparrot.repository.refs import open_repository
    from codeparrot.training.model_io import model_source_lines

    cfg, _, _, _, toy, _ = run
    repo_copy = tmp_path / "repo"
    shutil.copytree(toy.repo, repo_copy)
    fresh = cfg.__class__(**{**cfg.__dict__, "model": str(repo_copy)})
    assert not any(line.startswith("warning") for line in model_source_lines(fresh))
    repo = open_repository(str(repo_copy))
    repo.commit_folder(cfg.run_dir() / "final", "verify", "step 2")  # the trained weights on a branch
    repo.promote("verify")  # main now holds a "promote ..." commit
    lines = model_source_lines(fresh)
    assert lines[0].startswith(f"starting weights: {repo_copy} @ main (commit ") and "'promote verify@" in lines[0]
    assert lines[1].startswith(f"warning: {repo_copy}@main holds a promoted, already-trained model")

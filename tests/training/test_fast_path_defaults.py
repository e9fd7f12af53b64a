"""The fast path's switches resolve as documented (null = on for CUDA, off elsewhere; an explicit value wins), the
allocator setting never overrides the user's, and the training path imports `datasets` only for Hub streams."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from codeparrot.training.config import TrainConfig
from codeparrot.training.fast_path import FastPath, configure_cuda_allocator


def test_nulls_mean_on_for_cuda_and_off_for_the_cpu():
    cfg = TrainConfig()
    assert (cfg.compile, cfg.compile_loss) == (None, None)  # the shipped defaults are the nulls
    gpu, cpu = FastPath.resolve(cfg, torch.device("cuda")), FastPath.resolve(cfg, torch.device("cpu"))
    assert (gpu.compile_model, gpu.compile_regions, gpu.compile_loss) == (True, True, True)
    assert (cpu.compile_model, cpu.compile_loss) == (False, False)
    assert gpu.dynamo_plugin() is None  # per-block compile happens in place, never Accelerate's whole-model one
    assert "per transformer block" in gpu.describe(cfg) and "torch.compile: off" in cpu.describe(cfg)


def test_an_explicit_setting_wins_on_either_device():
    off = TrainConfig(compile=False, compile_loss=False)
    assert not FastPath.resolve(off, torch.device("cuda")).compile_model
    assert not FastPath.resolve(off, torch.device("cuda")).compile_loss
    whole = FastPath.resolve(TrainConfig(compile=True, compile_regions=False), torch.device("cpu"))
    assert whole.compile_model and whole.dynamo_plugin() is not None  # whole-model compile through Accelerate


@pytest.mark.parametrize("user", [None, "PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF"])
def test_expandable_segments_unless_the_user_chose(monkeypatch, user):
    for name in ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF"):
        monkeypatch.delenv(name, raising=False)
    if user:
        monkeypatch.setenv(user, "max_split_size_mb:64")
    configure_cuda_allocator()
    values = {name: os.environ.get(name) for name in ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF")}
    if user:
        assert values == {n: ("max_split_size_mb:64" if n == user else None) for n in values}
    else:
        assert "expandable_segments:True" in values.values()


@pytest.mark.slow
def test_the_training_path_does_not_import_datasets():
    """The GPU machine's image has no `datasets`: training on local shards or pretokenized data must not need it."""
    code = ("import sys, codeparrot.training.train, codeparrot.training.datasets.loader, "
            "codeparrot.training.datasets.record_streams; print('datasets' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "False"

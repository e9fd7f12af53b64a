"""A launch whose processes do not form one job stops at once with one line (never two trainings in one run
folder), and every process writes its warnings and errors to `<run>/logs/rank-N.log`."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest
import torch
from accelerate.utils import DistributedType

from codeparrot.errors import CodeParrotError
from codeparrot.training.launch_checks import check_one_job, check_sharding


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow(25)
def test_fsdp_launch_on_a_machine_without_gpus_stops_at_once_with_one_line(repo_root, scripts_env, tmp_path):
    """The shipped FSDP config through the real `accelerate launch` on this CPU-only machine: Accelerate starts
    2 processes that each run alone (DistributedType.NO); both refuse before writing anything."""
    env = {**scripts_env, "OMP_NUM_THREADS": "1"}
    env.pop("ACCELERATE_USE_CPU", None)
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", "configs/accelerate/fsdp.yaml",
           "--num_processes", "2", "--mixed_precision", "no", "--main_process_port", str(_free_port()),
           "scripts/train.py", "--config", "configs/train/tiny.yaml", "--output_dir", str(run_dir)]
    done = subprocess.run(cmd, cwd=repo_root, env=env, capture_output=True, text=True, timeout=180, check=False)
    everything = done.stdout + done.stderr
    assert done.returncode != 0
    errors = [line for line in everything.splitlines() if line.startswith("error: ")]
    assert errors == [("error: the launcher started FSDP over 2 process(es) (WORLD_SIZE=2, ACCELERATE_USE_FSDP=true) "
                      "but this process runs alone (NO, no process group): 2 independent trainings would write the "
                      "same run folder. On a machine without a GPU set ACCELERATE_USE_CPU=1: the processes then "
                      "form one job over gloo (FSDP included, configs/accelerate/fsdp.yaml; DeepSpeed needs GPUs)")
                      ], everything
    assert not run_dir.exists()  # stopped before the run folder was touched


def test_processes_that_form_one_job_pass():
    check_one_job(2, DistributedType.MULTI_CPU, {"WORLD_SIZE": "2"})
    check_one_job(1, DistributedType.NO, {})  # a plain `python scripts/train.py`
    check_sharding(DistributedType.FSDP, {"WORLD_SIZE": "2", "ACCELERATE_USE_FSDP": "true"})
    check_sharding(DistributedType.MULTI_CPU, {"WORLD_SIZE": "2"})  # no sharding asked for


def test_sharding_asked_for_and_dropped_is_refused():
    with pytest.raises(CodeParrotError, match=r"asked for DEEPSPEED over 4 process\(es\) .* but the Accelerator "
                                              r"runs MULTI_GPU \(not sharded\)"):
        check_sharding(DistributedType.MULTI_GPU, {"WORLD_SIZE": "4", "ACCELERATE_USE_DEEPSPEED": "true"})
    with pytest.raises(CodeParrotError, match="asked for FSDP over 1 process"):
        check_sharding(DistributedType.NO, {"ACCELERATE_USE_FSDP": "true"})


RANK_SCRIPT = """
import logging, sys, warnings
from codeparrot.training.rank_logs import open_rank_log
print(open_rank_log(sys.argv[1], 3))
warnings.warn("tracker wandb could not start")
logging.getLogger("codeparrot.repository.pusher").warning("push 'step 5' failed (attempt 1/4)")
logging.getLogger("codeparrot.training").info("not a warning: stays out of the rank log")
raise RuntimeError("boom")
"""


def test_rank_log_holds_this_process_warnings_and_errors(tmp_path, scripts_env):
    """A process (as rank 3 would) warns, logs a warning, and dies of an uncaught error: all three are in its
    rank log, and the console shows what it showed without one."""
    done = subprocess.run([sys.executable, "-c", RANK_SCRIPT, str(tmp_path / "run")], env=scripts_env,
                          capture_output=True, text=True, timeout=120, check=False)
    path = tmp_path / "run" / "logs" / "rank-3.log"
    assert done.returncode == 1 and done.stdout.strip() == str(path)
    text = path.read_text()
    assert "rank 3 WARNING py.warnings:" in text and "UserWarning: tracker wandb could not start" in text
    assert "rank 3 WARNING codeparrot.repository.pusher: push 'step 5' failed" in text
    assert "rank 3 ERROR uncaught: Traceback" in text and "RuntimeError: boom" in text
    assert "not a warning" not in text
    console = done.stderr
    assert "UserWarning: tracker wandb could not start" in console and "push 'step 5' failed" in console
    assert console.rstrip().endswith("RuntimeError: boom") and console.count("RuntimeError: boom") == 1


ERROR_SCRIPT = """
import sys
from codeparrot.errors import CodeParrotError, run_cli
from codeparrot.training.rank_logs import open_rank_log

def main():
    open_rank_log(sys.argv[1], 1)
    raise CodeParrotError("shard 7 of rank 1 is unreadable")

run_cli(main)
"""


def test_non_main_rank_error_line_goes_to_its_rank_log(tmp_path, scripts_env):
    """run_cli prints a CodeParrotError on the main process only (once on the console); a non-main rank's
    `error:` line still reaches its own rank log."""
    env = {**scripts_env, "RANK": "1"}
    done = subprocess.run([sys.executable, "-c", ERROR_SCRIPT, str(tmp_path / "run")], env=env,
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 2 and "error:" not in done.stderr, done.stderr
    text = (tmp_path / "run" / "logs" / "rank-1.log").read_text()
    assert "rank 1 ERROR codeparrot: error: shard 7 of rank 1 is unreadable" in text


@pytest.fixture
def fake_nvidia_smi(tmp_path):
    """A PATH on which `nvidia-smi` exists, as on a machine with an NVIDIA driver."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    tool = bin_dir / "nvidia-smi"
    tool.write_text("#!/bin/sh\necho 'NVIDIA-SMI 570.00'\n")
    tool.chmod(0o755)
    return f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"


def test_mixed_precision_on_a_gpu_machine_whose_gpu_torch_cannot_see_is_refused(monkeypatch, fake_nvidia_smi):
    from codeparrot.training.launch_checks import check_gpu_visible

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for asked, env in (("bf16", {}), ("fp16", {}), (None, {"ACCELERATE_MIXED_PRECISION": "bf16"})):
        with pytest.raises(CodeParrotError, match=r"asked for on a machine with an NVIDIA GPU .* would train on the "
                                                  r"CPU\. To train on the CPU anyway set ACCELERATE_USE_CPU=1"):
            check_gpu_visible(asked, {"PATH": fake_nvidia_smi, **env})
    check_gpu_visible("bf16", {"PATH": fake_nvidia_smi, "ACCELERATE_USE_CPU": "1"})  # the CPU, on purpose
    check_gpu_visible("bf16", {"PATH": fake_nvidia_smi, "CUDA_VISIBLE_DEVICES": ""})  # GPUs hidden on purpose
    check_gpu_visible("no", {"PATH": fake_nvidia_smi})  # fp32 asked for: nothing to lose on the way to the GPU
    check_gpu_visible("bf16", {"PATH": "/nonexistent"})  # no NVIDIA driver: bf16 on a CPU machine is a choice
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    check_gpu_visible("bf16", {"PATH": fake_nvidia_smi})


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine where torch sees no GPU")
def test_train_script_refuses_bf16_on_the_cpu_of_a_gpu_machine(repo_root, scripts_env, tmp_path, fake_nvidia_smi):
    """The real entry point, with nvidia-smi on PATH and this CPU torch: one line, nothing written, and said
    before the model code is imported (transformers: ~4 s of CPU more before the user hears of it)."""
    env = {**scripts_env, "PATH": fake_nvidia_smi}
    env.pop("ACCELERATE_USE_CPU", None)
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-X", "importtime", "scripts/train.py", "--config", "configs/train/tiny.yaml",
           "--mixed_precision", "bf16", "--output_dir", str(run_dir)]
    done = subprocess.run(cmd, cwd=repo_root, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode != 0
    imported = [line.rsplit("|", 1)[1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")]
    assert "torch" in imported and "transformers" not in imported
    lines = [line for line in (done.stdout + done.stderr).strip().splitlines() if not line.startswith("import time:")]
    assert lines[-1].startswith("error: bf16 asked for on a machine with an NVIDIA GPU"), lines[-5:]
    assert "Traceback" not in done.stderr and not run_dir.exists()


def test_torch_build_report_names_the_build_and_the_gpu(monkeypatch, fake_nvidia_smi):
    from codeparrot.training.launch_checks import torch_build_report

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.version, "cuda", None)
    assert torch_build_report({"PATH": "/nonexistent"}) == f"torch {torch.__version__} (CPU build); CUDA not visible"
    assert "make install CUDA=cu130" in torch_build_report({"PATH": fake_nvidia_smi})
    monkeypatch.setattr(torch.version, "cuda", "12.6")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100 80GB HBM3")
    assert torch_build_report() == (f"torch {torch.__version__} (CUDA 12.6); CUDA visible: 1 × NVIDIA H100 80GB HBM3")

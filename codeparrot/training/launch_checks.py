"""Refuse a launch whose processes do not form one training job, before anything is written.

Seen on a CPU-only machine (accelerate 1.x): `accelerate launch` with an FSDP config and no `use_cpu` starts
2 processes through torchrun (WORLD_SIZE=2, ACCELERATE_USE_FSDP=true), but each finds no GPU, joins no process
group and runs with `DistributedType.NO`: two independent trainings writing the same run folder. A launcher
that asked for sharding (FSDP, DeepSpeed) whose processes run plain data parallel instead would, likewise,
train something other than what was asked. Both stop here with one line saying what was asked and what was got.
(On CPU processes, `ACCELERATE_USE_CPU=1`, Accelerate runs MULTI_CPU and codeparrot/training/sharding.py turns an
FSDP request into Accelerate's FSDP2 path before `check_sharding` runs; DeepSpeed on CPU is refused here.)

A run asked for bf16/fp16 on a machine with an NVIDIA GPU that torch cannot use (a CPU build of torch, or a CUDA
build the driver or CUDA_VISIBLE_DEVICES keeps from the GPU) would otherwise train on the CPU, slowly and with an
MFU against the CPU's peak, without a word: `check_gpu_visible` stops it with one line (ACCELERATE_USE_CPU=1 is
the way to mean the CPU).

Only torch and Accelerate are imported here (~2 s of CPU, against ~6 s for the model code): scripts/train.py runs
`check_launch` before it imports the training loop, so a refused launch says so at once. The resume checks are in
resume_checks.py.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping

import torch
from accelerate import PartialState
from accelerate.utils import DistributedType, parse_flag_from_env

from codeparrot.errors import CodeParrotError

# launcher flag -> the distributed type that honours it
SHARDING_FLAGS = {"ACCELERATE_USE_FSDP": DistributedType.FSDP, "ACCELERATE_USE_DEEPSPEED": DistributedType.DEEPSPEED}


def _flag(env: Mapping[str, str], name: str) -> bool:
    return env.get(name, "false").strip().lower() in ("1", "true", "yes")


def asked_sharding(env: Mapping[str, str]) -> list[str]:
    """The sharding the launcher asked for ("FSDP", "DEEPSPEED"), from the variables `accelerate launch` sets."""
    return [kind.name for name, kind in SHARDING_FLAGS.items() if _flag(env, name)]


def _asked(env: Mapping[str, str]) -> str:
    launched = int(env.get("WORLD_SIZE", "1") or 1)
    asked = asked_sharding(env)
    flags = "".join(f", ACCELERATE_USE_{a}=true" for a in asked)
    return f"{'/'.join(asked) + ' over ' if asked else ''}{launched} process(es) (WORLD_SIZE={launched}{flags})"


def check_one_job(num_processes: int, distributed_type: DistributedType, env: Mapping[str, str] | None = None) -> None:
    """One-line `CodeParrotError` when the launcher started several processes (WORLD_SIZE > 1) but this one
    runs alone (`num_processes`, `distributed_type`: what `PartialState` found)."""
    env = os.environ if env is None else env
    launched = int(env.get("WORLD_SIZE", "1") or 1)
    if launched > 1 and num_processes == 1:
        raise CodeParrotError(
            f"the launcher started {_asked(env)} but this process runs alone ({distributed_type.name}, no process "
            f"group): {launched} independent trainings would write the same run folder. On a machine without a "
            "GPU set ACCELERATE_USE_CPU=1: the processes then form one job over gloo (FSDP included, "
            "configs/accelerate/fsdp.yaml; DeepSpeed needs GPUs)")


def check_sharding(distributed_type: DistributedType, env: Mapping[str, str] | None = None) -> None:
    """One-line `CodeParrotError` when the launcher asked for FSDP or DeepSpeed and the `Accelerator` does not
    run it (`distributed_type`: the Accelerator's)."""
    env = os.environ if env is None else env
    asked = asked_sharding(env)
    if asked and distributed_type.name not in asked:
        raise CodeParrotError(f"the launcher asked for {_asked(env)} but the Accelerator runs "
                              f"{distributed_type.name} (not sharded): refusing to train something other than asked")


def torch_build() -> str:
    """The installed torch build in words: `torch 2.13.0+cpu (CPU build)`, `torch 2.9.1+cu126 (CUDA 12.6)`."""
    if torch.version.cuda:
        return f"torch {torch.__version__} (CUDA {torch.version.cuda})"
    if getattr(torch.version, "hip", None):
        return f"torch {torch.__version__} (ROCm {torch.version.hip})"
    return f"torch {torch.__version__} (CPU build)"


def nvidia_smi(env: Mapping[str, str] | None = None) -> str | None:
    """Path of `nvidia-smi` on PATH (the sign of an NVIDIA driver on this machine), or None."""
    env = os.environ if env is None else env
    return shutil.which("nvidia-smi", path=env.get("PATH", os.defpath))


def torch_build_report(env: Mapping[str, str] | None = None) -> str:
    """One line after `make install`: the torch build and whether it sees a GPU."""
    line = torch_build()
    if torch.cuda.is_available():
        return f"{line}; CUDA visible: {torch.cuda.device_count()} × {torch.cuda.get_device_name(0)}"
    line += "; CUDA not visible"
    if nvidia_smi(env):
        line += (" although nvidia-smi is on PATH: a CPU build of torch (make install CUDA=cu130)" if not
                 torch.version.cuda else " although nvidia-smi is on PATH: check the driver and CUDA_VISIBLE_DEVICES")
    return line


def check_gpu_visible(mixed_precision: str | None, env: Mapping[str, str] | None = None) -> None:
    """One-line `CodeParrotError` when bf16/fp16 is asked for (`mixed_precision`, or the launcher's
    ACCELERATE_MIXED_PRECISION when it is None), this machine has an NVIDIA GPU (nvidia-smi on PATH) and torch
    sees none: the run would train on the CPU. ACCELERATE_USE_CPU=1, or CUDA_VISIBLE_DEVICES set to nothing,
    says the CPU is meant."""
    env = os.environ if env is None else env
    precision = mixed_precision or env.get("ACCELERATE_MIXED_PRECISION", "no")
    if precision not in ("bf16", "fp16") or torch.cuda.is_available() or _flag(env, "ACCELERATE_USE_CPU"):
        return
    if env.get("CUDA_VISIBLE_DEVICES") in ("", "-1"):
        return  # the GPUs are hidden on purpose
    if nvidia_smi(env) is None:
        return  # no NVIDIA GPU here: bf16 on a CPU is a choice (the CPU demo and benchmarks run it)
    why = ("a CPU build: install a CUDA build (make install CUDA=cu130)" if not torch.version.cuda else
           "a CUDA build that sees no GPU: check the driver (nvidia-smi) and CUDA_VISIBLE_DEVICES")
    raise CodeParrotError(f"{precision} asked for on a machine with an NVIDIA GPU (nvidia-smi found) but "
                          f"{torch_build()} is {why}; the run would train on the CPU. "
                          "To train on the CPU anyway set ACCELERATE_USE_CPU=1")


def check_launch(mixed_precision: str | None) -> PartialState:
    """This process's `PartialState` (as `Accelerator()` will read it), after the checks that need no model:
    `check_one_job` and `check_gpu_visible`. Cheap to call again: `train()` does, and scripts/train.py first."""
    state = PartialState(cpu=parse_flag_from_env("ACCELERATE_USE_CPU"))
    check_one_job(state.num_processes, state.distributed_type)  # never N independent trainings in one folder
    check_gpu_visible(mixed_precision)  # bf16/fp16 asked for, a GPU here that torch cannot use: not on the CPU
    return state

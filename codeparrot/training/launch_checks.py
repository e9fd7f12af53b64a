"""Refuse a launch whose processes do not form one training job, before anything is written.

Seen on a CPU-only machine (accelerate 1.x): `accelerate launch` with an FSDP config and no `use_cpu` starts
2 processes through torchrun (WORLD_SIZE=2, ACCELERATE_USE_FSDP=true), but each finds no GPU, joins no process
group and runs with `DistributedType.NO`: two independent trainings writing the same run folder. A launcher
that asked for sharding (FSDP, DeepSpeed) whose processes run plain data parallel instead would, likewise,
train something other than what was asked. Both stop here with one line saying what was asked and what was got.
(On CPU processes, `ACCELERATE_USE_CPU=1`, Accelerate runs MULTI_CPU and codeparrot/training/sharding.py turns an
FSDP request into Accelerate's FSDP2 path before `check_sharding` runs; DeepSpeed on CPU is refused here.)
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from accelerate.utils import DistributedType

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

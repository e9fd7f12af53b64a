"""FSDP2 sharding through Accelerate, on GPUs and on CPU processes (gloo) alike.

On GPUs `accelerate launch --config_file configs/accelerate/fsdp.yaml` sets `ACCELERATE_USE_FSDP=true` and the
`FSDP_*` variables, and Accelerate shards the model itself. On CPU processes (`ACCELERATE_USE_CPU=1`, or a
machine without a GPU) Accelerate 1.x never does: its state turns the FSDP request into FSDP only for GPU-like
distributed types, so the processes run `MULTI_CPU` (plain data parallel over gloo) and the request is dropped
silently. Torch's FSDP2 (`fully_shard`) does run on CPU over gloo, and Accelerate's FSDP2 code path
(`fsdp2_prepare_model`, sharded save/load through torch.distributed.checkpoint, full state dict for pushes,
DTensor-aware gradient clipping, `set_requires_gradient_sync` for accumulation) is device-agnostic. So
`enable_fsdp_on_cpu` switches the already-initialized Accelerate state from `MULTI_CPU` to `FSDP` with the
launcher's own FSDP2 plugin, before `prepare`: CPU runs then take exactly the code path GPU runs take, which
is what makes the CPU tests of sharded training (tests/training/test_fsdp.py) meaningful for the GPU presets.

This writes two fields of Accelerate's shared state (`distributed_type`, `fsdp_plugin`; Accelerate writes the
same fields itself when it sets FSDP up on GPUs). `report_sharding` then verifies the result, so a future
Accelerate that ignores the switch fails with one line instead of training unsharded.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping

import torch
from accelerate.state import AcceleratorState, PartialState
from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin

from codeparrot.errors import CodeParrotError


def fsdp_asked(env: Mapping[str, str] | None = None) -> bool:
    """Whether the launcher asked for FSDP (`accelerate launch` with an FSDP config sets ACCELERATE_USE_FSDP)."""
    env = os.environ if env is None else env
    return env.get("ACCELERATE_USE_FSDP", "false").strip().lower() in ("1", "true", "yes")


def enable_fsdp_on_cpu(accelerator, env: Mapping[str, str] | None = None) -> bool:
    """Turn Accelerate's CPU data parallel (`MULTI_CPU`, gloo) into FSDP2 when the launcher asked for FSDP;
    True when it did. Call right after creating the `Accelerator`, before `prepare`.

    The plugin is built from the launcher's `FSDP_*` variables, as Accelerate builds it on GPUs. Only FSDP2
    (`fsdp_version: 2`) is supported on CPU: FSDP1 wraps the model in a CUDA-oriented module."""
    if accelerator.distributed_type != DistributedType.MULTI_CPU or not fsdp_asked(env):
        return False
    plugin = FullyShardedDataParallelPlugin()  # reads FSDP_VERSION, FSDP_TRANSFORMER_CLS_TO_WRAP, ...
    if plugin.fsdp_version != 2:
        raise CodeParrotError(f"the launcher asked for FSDP version {plugin.fsdp_version} on CPU processes; "
                              "only FSDP2 runs on CPUs (set fsdp_version: 2, as configs/accelerate/fsdp.yaml does)")
    if accelerator.mixed_precision != "no":
        plugin.set_mixed_precision(accelerator.mixed_precision)
    # AcceleratorState copies PartialState's distributed_type each time it is constructed: set both.
    AcceleratorState._shared_state["fsdp_plugin"] = plugin
    for shared in (AcceleratorState._shared_state, PartialState._shared_state):
        shared["distributed_type"] = DistributedType.FSDP
    return True


def reduce_gradients_in_fp32(accelerator) -> bool:
    """Under FSDP with bf16/fp16 compute, reduce-scatter the gradients in float32, as DDP all-reduces them and as
    torchtitan does by default; True when the policy was changed. Call before `prepare`.

    Accelerate's default FSDP mixed-precision policy reduces in the compute dtype (`reduce_dtype = param_dtype`):
    summing N ranks' gradients in bf16 (8 mantissa bits) loses precision that DDP keeps (2 CPU processes, tiny
    model: step-4 loss 5.75373 vs DDP's 5.75332). A policy whose reduce dtype differs from its parameter dtype
    was chosen on purpose (FSDP_* variables, a plugin) and is left alone."""
    import dataclasses

    plugin = getattr(accelerator.state, "fsdp_plugin", None)
    policy = getattr(plugin, "mixed_precision_policy", None)
    if accelerator.distributed_type != DistributedType.FSDP or policy is None:
        return False
    low = (torch.bfloat16, torch.float16)
    if getattr(policy, "reduce_dtype", None) not in low or policy.reduce_dtype != policy.param_dtype:
        return False
    plugin.mixed_precision_policy = dataclasses.replace(policy, reduce_dtype=torch.float32)
    return True


def reduce_dtypes(model: torch.nn.Module) -> set[str]:
    """The dtypes FSDP2 reduce-scatters gradients in, read from the sharded modules' own policies (what runs,
    not what was asked): the policy's `reduce_dtype`, or its `param_dtype` when that is unset."""
    dtypes = set()
    for module in model.modules():
        state = module._get_fsdp_state() if hasattr(module, "_get_fsdp_state") else None
        for group in getattr(state, "_fsdp_param_groups", []) or []:
            policy = group.mp_policy
            dtype = policy.reduce_dtype or policy.param_dtype or torch.float32
            dtypes.add(str(dtype).removeprefix("torch."))
    return dtypes


def sharded_fraction(model: torch.nn.Module) -> float:
    """Local elements ÷ global elements over the model's parameters (1.0 unsharded; ≈ 1/N over N processes)."""
    from torch.distributed.tensor import DTensor

    local = total = 0
    for param in model.parameters():
        total += param.numel()
        local += param.to_local().numel() if isinstance(param, DTensor) else param.numel()
    return local / max(total, 1)


def report_sharding(accelerator, model: torch.nn.Module) -> float | None:
    """After `prepare`: the fraction of the parameters this process holds when FSDP was asked for (launcher or
    Accelerate state), printed once (main process); None without FSDP. One-line `CodeParrotError` when the
    parameters are not actually sharded over several processes: never train something other than asked."""
    if not (accelerator.distributed_type == DistributedType.FSDP or fsdp_asked()):
        return None
    fraction = sharded_fraction(model)
    if accelerator.num_processes > 1 and fraction > 0.75:  # 1/N, plus rounding of odd-sized tensors
        raise CodeParrotError(
            f"FSDP was asked for over {accelerator.num_processes} processes but after Accelerator.prepare each "
            f"process holds {fraction:.0%} of the parameters ({accelerator.distributed_type.name}): "
            "refusing to train unsharded")
    # FSDP2 warns on every forward that the root returned a view (GPT-2's final hidden state is a .view()): an
    # in-place op on it would skip a pre-backward hook. The loop and the fused loss only read it (slices, matmuls).
    warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module .* returned a view tensor")
    reduce = "/".join(sorted(reduce_dtypes(model))) or "float32"
    accelerator.print(f"FSDP2 over {accelerator.num_processes} process(es), {accelerator.state.backend or 'no'} "
                      f"backend: each holds {fraction:.1%} of the parameters (DTensor shards); gradients reduced "
                      f"in {reduce}")
    return fraction

"""GPT-2's inverse-layer attention scale held as a tensor per block, so that one compiled graph serves every block.

CodeParrot's models set `scale_attn_by_inverse_layer_idx=True`: transformers' GPT2Attention scales block l's
attention logits by 1/sqrt(head_dim) / (l + 1), a Python float (`module.scaling`) that it passes to the attention
function as `scaling=`. A float that reaches a traced op is a constant to dynamo, guarded by value: the graph
compiled for block 0 holds `scaling == 0.125`, block 1 fails that guard and compiles again, and so on until
dynamo's `recompile_limit` (8): the later blocks then run eagerly, with a warning in the user's log.

`install_layer_scales` gives every GPT2Attention the part that changes with the layer as a non-persistent 0-d
float32 buffer, `inverse_layer_scale` = 1/(l + 1) (1 without the flag), which a compiled graph takes as an input
like the block's weights, and the part that does not as a float, `base_scale` = 1/sqrt(head_dim) (1 without
`scale_attn_weights`), the same in every block. The causal attention function (causal_attention.py) then calls
SDPA(query · inverse_layer_scale, key, value, scale=base_scale): transformers' own product q·k / sqrt(head_dim) /
(l + 1), with one extra rounding of the scaled query (computed in float32, rounded once to the query's dtype)
where 1/(l + 1) is not a power of two. In fp32, losses and gradients agree with transformers' sdpa and eager
attention to rounding (tests/training/test_regional_compile.py).

Why a non-persistent buffer: it is not in the state dict, so checkpoint keys do not change and saved models load
in stock transformers; it follows `model.to(device)` and FSDP2's `fully_shard` (buffers are moved, not sharded;
Accelerate's low-memory FSDP loading restores non-persistent buffers). GPT-2 has no other buffer, and DDP would
broadcast buffers from rank 0 before every forward: the scales are computed identically on every rank, so they
are named in DDP's ignore list (`_ddp_params_and_buffers_to_ignore`) and DDP keeps syncing nothing.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from transformers.models.gpt2.modeling_gpt2 import GPT2Attention

from codeparrot.errors import CodeParrotError

LAYER_SCALE = "inverse_layer_scale"  # buffer: 0-d float32, 1/(layer_idx + 1)
BASE_SCALE = "base_scale"  # float attribute: 1/sqrt(head_dim), the same in every block


def install_layer_scales(model: nn.Module) -> int:
    """Give every GPT2Attention of `model` its layer scale as a buffer (idempotent); returns how many. Call on the
    root model before DDP/FSDP wrap it (DDP reads its ignore list, FSDP2 moves buffers, when they wrap)."""
    names = []
    for name, module in model.named_modules():
        if not isinstance(module, GPT2Attention):
            continue
        factor = 1.0 / (module.layer_idx + 1) if module.scale_attn_by_inverse_layer_idx else 1.0
        base = module.head_dim ** -0.5 if module.scale_attn_weights else 1.0
        if not math.isclose(base * factor, module.scaling, rel_tol=1e-12):  # transformers changed its formula
            raise CodeParrotError(f"{name}: attention scaling {module.scaling!r} is not {base!r} / "
                                  f"{1 / factor:g} (layer {module.layer_idx}): the layer scale cannot replace it")
        device = module.c_attn.weight.device
        module.register_buffer(LAYER_SCALE, torch.tensor(factor, dtype=torch.float32, device=device),
                               persistent=False)
        setattr(module, BASE_SCALE, base)
        names.append(f"{name}.{LAYER_SCALE}" if name else LAYER_SCALE)
    if names:
        ignored = set(getattr(model, "_ddp_params_and_buffers_to_ignore", ())) | set(names)
        DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(model, sorted(ignored))
    return len(names)


def fold_layer_scale(module: nn.Module, query: torch.Tensor,
                     scaling: float | None) -> tuple[torch.Tensor, float | None]:
    """(query, scale) for SDPA. With the installed buffer: the query [B, H, T, Q] times 1/(l + 1) and the base
    scale, the same float for every block. Without (a model nobody installed the scales on): the query and
    transformers' per-layer float as they are, exact but guarded per block under torch.compile.

    `scaling` is not read on the first path: dynamo guards on a float only when a traced op uses it."""
    layer_scale = module._buffers.get(LAYER_SCALE)
    if layer_scale is None:
        return query, scaling
    # In float32 whatever the query's dtype: a bf16 query times a float32 0-d tensor may, depending on the kernel,
    # round the factor to bf16 first (1/3 -> 0.3340: +0.2% on every logit of the block); this rounds the product
    # once. An fp32 query is not copied; under torch.compile the casts fuse into the multiply.
    scaled = (query.float() * layer_scale).to(query.dtype)  # [B, H, T, Q]
    return scaled, getattr(module, BASE_SCALE)

"""Per-block (regional) torch.compile, in place: each transformer block's forward compiled, the module tree kept.

One compiled graph serves every block (same code, same shapes: the later blocks hit the compile cache), so the
cold start is one block's compile instead of the whole model's, and mask creation, the embedding and the loss
stay eager. Compiling in place (`nn.Module.compile`) rather than wrapping (`torch.compile(module)`) keeps the
model a plain `GPT2LMHeadModel`: DDP and FSDP2 wrap it as usual, `unwrap_model` returns it, and state-dict keys
get no `_orig_mod.` prefix. (Accelerate's own regional compilation of a DDP model returns a shallow copy of the
DDP wrapper that `unwrap_model` no longer sees through.)
"""

from __future__ import annotations

from typing import Callable

from torch import nn


def repeated_blocks(model: nn.Module) -> list[nn.Module]:
    """The modules of every ModuleList whose children are all of one class (GPT-2: `transformer.h`)."""
    blocks = []
    for module in model.modules():
        if isinstance(module, nn.ModuleList) and len(module) > 1 and len({type(m) for m in module}) == 1:
            blocks.extend(module)
    return blocks


def compile_blocks(model: nn.Module, backend: str | Callable = "inductor") -> int:
    """Compile each repeated block of `model` in place; returns how many were compiled."""
    blocks = repeated_blocks(model)
    for block in blocks:
        block.compile(backend=backend)
    return len(blocks)

"""Per-block (regional) torch.compile, in place: each transformer block's forward compiled, the module tree kept.

Every block runs the same code, so dynamo keeps one list of graphs for all of them, at most `recompile_limit` (8)
long. A block's weights and buffers are graph inputs, and the same shapes reuse a graph; a Python number read
from the block is a constant the graph is guarded on by value. GPT-2's inverse-layer attention scale is such a
number (`GPT2Attention.scaling` = 1/sqrt(head_dim) / (layer + 1)): left as it is, each block fails the previous
blocks' guards and compiles its own graph, and after 8 blocks dynamo gives up with a warning and runs the rest
eagerly. So `compile_blocks` first installs that scale as a 0-d tensor per block (attention_scale.py), which
the `causal_sdpa` attention multiplies into the query: then one graph serves every block (12 in
codeparrot-small, 48 in codeparrot; tests/training/test_regional_compile.py fails on any recompile), and the
cold start is one block's compile instead of the whole model's. transformers' own `sdpa` and `eager` attention
read the float: with them it is one graph per block, up to the limit.

Training and evaluation are two graphs (evaluation runs under no_grad and without dropout), and dynamo would
keep both in one list: the first evaluation fails the training graph's grad-mode guard and is logged as a
recompile, and each one spends the list's budget. So a compiled block calls one of two compiled functions,
`_training_call` (grad mode on and the block training) or `_evaluation_call` (anything else), whose code objects
differ: each has its own list, compiled once, and neither is ever a recompile (the validation loop gives every
forward the same shape, validation.py). Dynamo starts tracing at those functions and inlines the block's
`_call_impl` (its hooks, as `nn.Module.compile` would) and `forward`.

Mask creation, the embedding and the loss stay eager. Compiling in place (`nn.Module.compile`) rather than
wrapping (`torch.compile(module)`) keeps the model a plain `GPT2LMHeadModel`: DDP and FSDP2 wrap it as usual,
`unwrap_model` returns it, and state-dict keys get no `_orig_mod.` prefix (the scales are non-persistent
buffers, not in the state dict either). (Accelerate's own regional compilation of a DDP model returns a shallow
copy of the DDP wrapper that `unwrap_model` no longer sees through.)
"""

from __future__ import annotations

import functools
from typing import Callable

import torch
from torch import nn

from codeparrot.training.attention_scale import install_layer_scales


def repeated_blocks(model: nn.Module) -> list[nn.Module]:
    """The modules of every ModuleList whose children are all of one class (GPT-2: `transformer.h`)."""
    blocks = []
    for module in model.modules():
        if isinstance(module, nn.ModuleList) and len(module) > 1 and len({type(m) for m in module}) == 1:
            blocks.extend(module)
    return blocks


def _training_call(block: nn.Module, *args, **kwargs):
    """A block's forward while training: compiled, its own graph list (see the module docstring)."""
    return block._call_impl(*args, **kwargs)


def _evaluation_call(block: nn.Module, *args, **kwargs):
    """A block's forward otherwise (no_grad, eval mode): compiled, its own graph list."""
    return block._call_impl(*args, **kwargs)


@functools.cache
def _compiled_calls(backend: str | Callable) -> tuple[Callable, Callable]:
    """The two compiled functions, built once per backend (their graph lists live on the code objects)."""
    return torch.compile(_training_call, backend=backend), torch.compile(_evaluation_call, backend=backend)


def compile_blocks(model: nn.Module, backend: str | Callable = "inductor") -> int:
    """Compile each repeated block of `model` in place; returns how many were compiled. Call on the root model,
    before DDP/FSDP wrap it. Idempotent."""
    install_layer_scales(model)  # GPT-2's per-layer float as a tensor: one graph for every block
    training_call, evaluation_call = _compiled_calls(backend)
    blocks = repeated_blocks(model)
    for block in blocks:
        # What nn.Module.__call__ runs instead of _call_impl once set (nn.Module.compile sets it the same way).
        block._compiled_call_impl = functools.partial(_dispatch, block, training_call, evaluation_call)
    return len(blocks)


def _dispatch(block: nn.Module, training_call: Callable, evaluation_call: Callable, *args, **kwargs):
    """Per call, in Python (not traced): which of the two compiled functions runs `block`."""
    if block.training and torch.is_grad_enabled():
        return training_call(block, *args, **kwargs)
    return evaluation_call(block, *args, **kwargs)

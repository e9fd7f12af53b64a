"""Causal self-attention for training: SDPA with `is_causal=True`, and no attention mask ever built.

Why: in transformers 5, GPT-2 asks `masking_utils.create_causal_mask` for a mask before its blocks run.
- Under whole-model `torch.compile` the packed-sequence check cannot run while tracing, so a 4-D boolean mask
  is materialized and every SDPA call in the graph becomes `attn_mask=<tensor>, is_causal=False`: the flash
  and causal kernels never run (the masked "efficient" or math kernel does, reading a [B, 1, T, T] mask).
- In eager mode the same check (`find_packed_sequence_indices`) ends with `(mask[:, -1] == 0).all()` in a
  Python `if`: a device→host sync on every forward.

An attention function registered under its own name (`CAUSAL_SDPA`) is not in transformers' table of mask
builders, so `create_causal_mask` returns None at once (no mask, no packing check, no sync), and this function
calls SDPA with `is_causal=True`: PyTorch then picks the flash / cuDNN / memory-efficient causal kernel on a
GPU, compiled or not.

This is only valid for what training does: whole, unpadded sequences (packed files separated by EOS, each row
one causal context) with no key/value cache. A padding mask would be dropped by transformers before it reached
this function, so the model is switched to it only inside training and validation (`TrainConfig.
attn_implementation`); saved checkpoints keep the preset's `codeparrot_attn_implementation` (sdpa/eager), and
generation never uses it. A cache (queries shorter than keys) is refused: `is_causal` would align the causal
triangle to the top-left and attend to the wrong keys.

GPT-2's inverse-layer scale (`scale_attn_by_inverse_layer_idx`, set in CodeParrot's models): where
attention_scale.py installed it as a tensor per block (`compile_blocks` does), the query is multiplied by
1/(l + 1) and SDPA gets the base scale 1/sqrt(head_dim), the same float in every block, so one compiled graph
serves them all; otherwise transformers' per-layer float goes to SDPA's `scale=` as it is. The same product
either way, up to one rounding of the scaled query.

Shapes: query/key/value [B, H, T, Q] (batch, heads, tokens, head width); returns ([B, T, H, Q], None) as
transformers' attention functions do.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from codeparrot.training.attention_scale import fold_layer_scale

CAUSAL_SDPA = "causal_sdpa"


def causal_sdpa_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                          attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                          **kwargs) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature; `scaling` is GPT-2's per-layer float (base / (l + 1))."""
    if attention_mask is not None:
        raise ValueError(f"{CAUSAL_SDPA} attention takes no mask (training on whole sequences); got one of shape "
                         f"{tuple(attention_mask.shape)}: load the model with attn_implementation='sdpa'")
    if query.shape[-2] != key.shape[-2]:
        raise ValueError(f"{CAUSAL_SDPA} attention needs as many queries as keys (no cache): got "
                         f"{query.shape[-2]} queries and {key.shape[-2]} keys")
    query, scale = fold_layer_scale(module, query, scaling)  # no per-block float left for dynamo to guard on
    out = F.scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=dropout, is_causal=True,
                                         scale=scale)  # [B, H, T, Q]
    return out.transpose(1, 2).contiguous(), None  # [B, T, H, Q]


def register_causal_attention() -> str:
    """Make `attn_implementation=CAUSAL_SDPA` known to transformers (idempotent); returns the name."""
    from transformers import AttentionInterface

    AttentionInterface.register(CAUSAL_SDPA, causal_sdpa_attention)
    return CAUSAL_SDPA

"""Next-token cross-entropy fused with the LM head, in chunks: the [B, T, V] logits are never materialized.

With CodeParrot's 32,768-token vocabulary the LM head dominates small models: for the tiny preset 80% of
the FLOPs, and for every model the largest activations (codeparrot-small: 12 × 1024 × 32,768 logits = 1.6 GB
in fp32, plus their gradient). The usual path writes the logits, reads them for log-softmax, keeps them for
the backward pass and writes a gradient of the same size. Here the rows (tokens) are processed `chunk_rows`
at a time: logits of one chunk [c, V] → log-sum-exp and the target logit → loss; then, in place, the same
buffer becomes softmax − one-hot, the gradient of the loss w.r.t. those logits, which is immediately
multiplied back into the gradients of the hidden states [c, D] and of the head weight [V, D]. The backward
pass only scales those two precomputed gradients. Same mathematics as `F.cross_entropy(h @ Wᵀ, t)`; on a
2-core CPU the training step of the tiny model is ~1.5× faster, and on a GPU the logits' memory is freed.

Matmuls run in the autocast dtype when autocast is on (bf16 on GPUs), the softmax in fp32.
"""

from __future__ import annotations

import torch

IGNORE_INDEX = -100


def default_chunk_rows(vocab_size: int, device: torch.device) -> int:
    """Rows per chunk: a [rows, V] fp32 buffer of ~16 MiB on CPU (cache-friendly), ~1 GiB on GPU."""
    budget = (1 << 30) if device.type == "cuda" else (16 << 20)
    return max(16, budget // (4 * vocab_size))


def _compute_dtype(tensor: torch.Tensor) -> torch.dtype:
    device_type = tensor.device.type
    if torch.is_autocast_enabled(device_type):
        return torch.get_autocast_dtype(device_type)
    return tensor.dtype


class _LinearCrossEntropy(torch.autograd.Function):
    """sum over rows of CE(hidden @ weightᵀ, targets) and its gradients, computed chunk by chunk in forward."""

    @staticmethod
    def forward(ctx, hidden, weight, targets, chunk_rows: int, need_grad: bool):
        # hidden [N, D], weight [V, D], targets [N] (IGNORE_INDEX rows contribute nothing)
        dtype = _compute_dtype(hidden)
        w = weight.to(dtype)
        loss = torch.zeros((), dtype=torch.float32, device=hidden.device)
        grad_hidden = torch.empty_like(hidden) if need_grad else None
        grad_weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if need_grad else None
        with torch.autocast(hidden.device.type, enabled=False):  # dtypes are explicit below
            for start in range(0, hidden.shape[0], chunk_rows):
                h = hidden[start : start + chunk_rows].to(dtype)  # [c, D]
                t = targets[start : start + chunk_rows]  # [c]
                valid = t != IGNORE_INDEX
                safe_t = torch.where(valid, t, 0)
                logits = torch.matmul(h, w.t()).float()  # [c, V]
                # log-sum-exp in place, 4 passes over the buffer and no temporary: it becomes exp(logits − max)
                row_max = logits.amax(dim=-1, keepdim=True)  # [c, 1]
                target_logit = logits.gather(1, safe_t[:, None])  # [c, 1]
                row_sum = logits.sub_(row_max).exp_().sum(dim=-1, keepdim=True)  # [c, 1]
                lse = row_max + row_sum.log()
                loss += ((lse - target_logit).squeeze(1) * valid).sum()
                if not need_grad:
                    continue
                # d(sum CE)/d logits = softmax − one-hot, zero on ignored rows; built in the same buffer
                probs = logits.div_(row_sum)
                probs.scatter_add_(1, safe_t[:, None], -valid[:, None].to(probs.dtype))
                probs.mul_(valid[:, None])
                grad_logits = probs.to(dtype)
                grad_hidden[start : start + chunk_rows] = torch.matmul(grad_logits, w).to(hidden.dtype)  # [c, D]
                if dtype == torch.float32:
                    grad_weight.addmm_(grad_logits.t(), h)  # [V, D], accumulated in place
                else:
                    grad_weight += torch.matmul(grad_logits.t(), h).float()
        if need_grad:
            ctx.save_for_backward(grad_hidden, grad_weight)
        ctx.weight_dtype = weight.dtype
        return loss

    @staticmethod
    def backward(ctx, grad_loss):
        grad_hidden, grad_weight = ctx.saved_tensors
        return grad_hidden * grad_loss.to(grad_hidden.dtype), (grad_weight * grad_loss).to(ctx.weight_dtype), None, None, None


def linear_cross_entropy_sum(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                             chunk_rows: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum of CE(hidden @ weightᵀ, targets) over rows, number of counted rows) without [N, V] logits.

    hidden [N, D], weight [V, D], targets [N] with IGNORE_INDEX for rows that do not count."""
    chunk_rows = chunk_rows or default_chunk_rows(weight.shape[0], hidden.device)
    need_grad = torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad)
    loss_sum = _LinearCrossEntropy.apply(hidden, weight, targets, chunk_rows, need_grad)
    return loss_sum, (targets != IGNORE_INDEX).sum()


def causal_lm_loss(model, head_weight: torch.Tensor, input_ids: torch.Tensor, labels: torch.Tensor | None = None,
                   chunk_rows: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum of next-token cross-entropies, predicted tokens) of a Hugging Face causal LM on `input_ids` [B, T].

    `model` may be wrapped (DDP, compiled): it is called normally, asking for no logits (`logits_to_keep`
    an empty slice) and for the hidden states, whose last entry is the final LayerNorm's output.
    `head_weight` is the LM head's weight [V, D] (GPT-2: the tied token embedding)."""
    labels = input_ids if labels is None else labels
    out = model(input_ids=input_ids, logits_to_keep=slice(0, 0), output_hidden_states=True, use_cache=False)
    hidden = out.hidden_states[-1]  # [B, T, D]
    h = hidden[:, :-1].reshape(-1, hidden.shape[-1])  # position t predicts token t+1: [B·(T-1), D]
    return linear_cross_entropy_sum(h, head_weight, labels[:, 1:].reshape(-1), chunk_rows)

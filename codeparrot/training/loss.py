"""The training and validation losses: next-token cross-entropy, fused with the LM head in chunks (the [B, T, V]
logits are never materialized), or through the model's own head (FSDP1 and DeepSpeed, whose sharded head
the fused loss cannot gather; under FSDP2 it reads the gathered head weight, see `FusedHead`).

With CodeParrot's 32,768-token vocabulary the LM head dominates small models: for the tiny preset 80% of
the FLOPs, and for every model the largest activations (codeparrot-small: 12 × 1024 × 32,768 logits = 1.6 GB
in fp32, plus their gradient). The usual path writes the logits, reads them for log-softmax, keeps them for
the backward pass and writes a gradient of the same size. Here the rows (tokens) are processed `chunk_rows`
at a time: logits of one chunk [c, V] → (in place) exp(logits − row max), its row sums → loss; the gradient
w.r.t. the logits, softmax − one-hot, is never formed: its row scaling goes onto the [c, D] operands and
its one-hot part is a gather/scatter of D-vectors, so the [c, V] buffer is written once, updated in place
twice and read by two matmuls that produce the gradients of the hidden states [c, D] and of the head weight
[V, D]. The backward pass only scales those two precomputed gradients. Same mathematics as
`F.cross_entropy(h @ Wᵀ, t)`; on a 2-core CPU the tiny model's training step is ~1.7× faster than with the
Hugging Face loss, and on a GPU the logits' memory (GBs for codeparrot-small) is never allocated.

The softmax passes: eager (the CPU default), the [c, V] chunk is upcast to fp32 and updated in place (max, exp,
sum: five passes over 4-byte values). `compiled=True` (the CUDA default, `compile_loss`) hands the chunk to
`chunk_softmax`, compiled by inductor into one reduction kernel and one pointwise kernel that read the matmul's
bf16 output directly and write exp(logits − max) once in bf16: about 4× less memory traffic per chunk
(codeparrot-small, 12 × 1024 tokens: ~15 GB of fp32 passes per micro-step otherwise).

Matmuls run in the training's mixed-precision dtype, the softmax and the loss sum in fp32. Accelerate applies
autocast inside `model.forward` only, and this head is called outside it, so `fused_head_weight` returns a
`FusedHead` that carries the dtype (bf16 under `mixed_precision: bf16`) and `causal_lm_loss` opens that autocast
itself; without it the head, a large share of the FLOPs with a 32k vocabulary, ran in fp32 (TF32 on a GPU,
about half the bf16 peak).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch
import torch.nn.functional as F
from accelerate.utils import DistributedType

from codeparrot.errors import CodeParrotError

IGNORE_INDEX = -100


class FusedHead(NamedTuple):
    """The LM head for the fused loss: its weight [V, D] and the dtype its matmuls run in (None: the autocast
    in effect at the call, else the weight's dtype).

    Under FSDP2 the weight is sharded (a DTensor holding V/N rows) except while its FSDP group is gathered:
    `owner` is then the head module, whose `.weight` is read after each forward pass. Accelerate's FSDP2
    preparation puts the final LayerNorm and the (tied) embedding/LM head in one group that stays gathered
    from the forward pass to the backward pass (`reshard_after_forward=False`), so that read is the full [V, D]
    parameter; its gradient, computed first in the backward pass, is reduce-scattered with the group's."""

    weight: torch.Tensor | None
    compute_dtype: torch.dtype | None = None
    owner: torch.nn.Module | None = None
    compiled: bool = False  # the softmax passes through `chunk_softmax` compiled (see the module docstring)
    final_norm: "FinalNormOutput | None" = None  # where the final hidden states come from (else hidden_states)

    def live_weight(self) -> torch.Tensor:
        """The full [V, D] weight to use now (after the model's forward pass)."""
        if self.owner is None:
            return self.weight
        from torch.distributed.tensor import DTensor

        weight = self.owner.weight
        if isinstance(weight, DTensor):
            raise CodeParrotError("the LM head's weight is still sharded after the forward pass (its FSDP group "
                                  "was resharded): the fused loss cannot run; set fused_loss: false")
        return weight


class FinalNormOutput:
    """The output of the model's final LayerNorm ([B, T, D]) from its latest forward pass, kept by a forward
    hook. Asking the model for `output_hidden_states` instead makes transformers' output-capturing hooks read a
    ContextVar inside every block, which torch.compile cannot trace: one graph break per block per forward
    (12 for codeparrot-small) under per-block compilation. This hook only stores an attribute, which compiles."""

    def __init__(self, model: torch.nn.Module):
        norm = getattr(getattr(model, "base_model", model), "ln_f", None)  # GPT-2's final LayerNorm
        if norm is None:
            raise CodeParrotError(f"{type(model).__name__} has no final LayerNorm `ln_f` for the fused loss")
        self.value: torch.Tensor | None = None
        self.handle = norm.register_forward_hook(self._keep)

    def _keep(self, module, args, output) -> None:
        self.value = output

    def take(self) -> torch.Tensor:
        value, self.value = self.value, None
        if value is None:
            raise CodeParrotError("the model's forward pass did not run its final LayerNorm")
        return value


def default_chunk_rows(vocab_size: int, device: torch.device) -> int:
    """Rows per chunk: a [rows, V] fp32 buffer of ~16 MiB on CPU (cache-friendly), ~1 GiB on GPU."""
    budget = (1 << 30) if device.type == "cuda" else (16 << 20)
    return max(16, budget // (4 * vocab_size))


def _compute_dtype(tensor: torch.Tensor) -> torch.dtype:
    device_type = tensor.device.type
    if torch.is_autocast_enabled(device_type):
        return torch.get_autocast_dtype(device_type)
    return tensor.dtype


def chunk_softmax(logits: torch.Tensor, safe_t: torch.Tensor, need_exps: bool):
    """One chunk's softmax passes, written to be fused by inductor: logits [c, V] in the matmul dtype, targets
    [c] → (cross-entropy per row [c] fp32, exp(logits − row max) [c, V] in the logits' dtype or None, row sums
    [c, 1] fp32). Everything is computed in fp32 from the logits as they are read."""
    x = logits.float()
    row_max = x.amax(dim=-1, keepdim=True)  # [c, 1]
    exps = torch.exp(x - row_max)  # [c, V], fused into the reductions and the store below
    row_sum = exps.sum(dim=-1, keepdim=True)  # [c, 1]
    ce = (row_max + row_sum.log() - x.gather(1, safe_t[:, None])).squeeze(1)  # [c]
    return ce, (exps.to(logits.dtype) if need_exps else None), row_sum


def _training_chunk_softmax(logits: torch.Tensor, safe_t: torch.Tensor):
    """`chunk_softmax` keeping exp(logits − max) for the gradients (compiled_chunk_softmax)."""
    return chunk_softmax(logits, safe_t, True)


def _evaluation_chunk_softmax(logits: torch.Tensor, safe_t: torch.Tensor):
    """`chunk_softmax` without gradients (compiled_chunk_softmax)."""
    return chunk_softmax(logits, safe_t, False)


@functools.cache
def compiled_chunk_softmax(need_exps: bool):
    """`chunk_softmax` under torch.compile, built once per process: one compiled function for training chunks and
    one for evaluation chunks. Their code objects differ, so each keeps its own graphs and neither is a recompile
    of the other (as the blocks' training and evaluation calls, regional_compile.py). Static shapes: with
    `balanced_chunk_rows` the recipe's micro-batches (B × 1,023 rows) split into equal chunks, one graph each;
    other row counts compile their last, shorter chunk once more."""
    return torch.compile(_training_chunk_softmax if need_exps else _evaluation_chunk_softmax, dynamic=False)


def balanced_chunk_rows(rows: int, chunk_rows: int) -> int:
    """The chunk size, at most `chunk_rows`, that splits `rows` into as many chunks as `chunk_rows` would, as evenly
    as possible (12 × 1,023 rows at 8,192: 2 × 6,138 instead of 8,192 + 4,084). Equal chunks mean one compiled
    shape for the softmax passes, and no small last chunk that keeps the GPU half busy."""
    if rows <= chunk_rows:
        return max(rows, 1)
    chunks = -(-rows // chunk_rows)
    return -(-rows // chunks)


def _eager_chunk_softmax(logits: torch.Tensor, safe_t: torch.Tensor, need_exps: bool):
    """`chunk_softmax` for eager mode: one fp32 buffer, updated in place (no temporaries on a CPU's caches)."""
    logits = logits.float()  # [c, V] (a copy unless the matmul ran in fp32)
    row_max = logits.amax(dim=-1, keepdim=True)  # [c, 1]
    target_logit = logits.gather(1, safe_t[:, None])  # [c, 1]
    row_sum = logits.sub_(row_max).exp_().sum(dim=-1, keepdim=True)  # the buffer is now exp(logits − max)
    ce = (row_max + row_sum.log() - target_logit).squeeze(1)
    return ce, (logits if need_exps else None), row_sum


class _LinearCrossEntropy(torch.autograd.Function):
    """sum over rows of CE(hidden @ weightᵀ, targets) and its gradients, computed chunk by chunk in forward."""

    @staticmethod
    def forward(ctx, hidden, weight, targets, chunk_rows: int, need_grad: bool, compiled: bool = False):
        # hidden [N, D], weight [V, D], targets [N] (IGNORE_INDEX rows contribute nothing)
        dtype = _compute_dtype(hidden)
        w = weight.to(dtype)
        loss = torch.zeros((), dtype=torch.float32, device=hidden.device)
        grad_hidden = torch.empty_like(hidden) if need_grad else None
        grad_weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if need_grad else None
        softmax = (compiled_chunk_softmax(need_grad) if compiled  # (logits, safe_t) -> (ce, exps or None, sums)
                   else functools.partial(_eager_chunk_softmax, need_exps=need_grad))
        chunk_rows = balanced_chunk_rows(hidden.shape[0], chunk_rows)
        with torch.autocast(hidden.device.type, enabled=False):  # dtypes are explicit below
            for start in range(0, hidden.shape[0], chunk_rows):
                h = hidden[start : start + chunk_rows].to(dtype)  # [c, D]
                t = targets[start : start + chunk_rows]  # [c]
                valid = t != IGNORE_INDEX
                safe_t = torch.where(valid, t, 0)
                logits = torch.matmul(h, w.t())  # [c, V] in the compute dtype
                ce, exps, row_sum = softmax(logits, safe_t)  # exps: exp(logits − row max)
                loss += (ce * valid).sum()
                if not need_grad:
                    continue
                # d(sum CE)/d logits = softmax − one-hot (zero on ignored rows). The softmax's row scaling
                # 1/row_sum is applied to the small [c, D] operands instead of the [c, V] buffer, and the
                # one-hot part is a row gather / scatter of D-vectors: the buffer is only read by the matmuls.
                scale = valid[:, None] / row_sum  # [c, 1]
                exps = exps.to(dtype)  # no copy on the compiled path (already the compute dtype)
                h_valid = h * valid[:, None].to(h.dtype)  # [c, D]
                grad_h = torch.matmul(exps, w).float() * scale - w[safe_t].float() * valid[:, None]
                grad_hidden[start : start + chunk_rows] = grad_h.to(hidden.dtype)  # [c, D]
                h_scaled = (h.float() * scale).to(dtype)  # [c, D]
                if dtype == torch.float32:
                    grad_weight.addmm_(exps.t(), h_scaled)  # [V, D], accumulated in place
                else:
                    grad_weight += torch.matmul(exps.t(), h_scaled).float()
                grad_weight.index_add_(0, safe_t, -h_valid.float())  # the one-hot part: − h at row t
        if need_grad:
            ctx.save_for_backward(grad_hidden, grad_weight)
        ctx.weight_dtype = weight.dtype
        return loss

    @staticmethod
    def backward(ctx, grad_loss):
        grad_hidden, grad_weight = ctx.saved_tensors
        return (grad_hidden * grad_loss.to(grad_hidden.dtype), (grad_weight * grad_loss).to(ctx.weight_dtype),
                None, None, None, None)


def linear_cross_entropy_sum(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                             chunk_rows: int | None = None, compiled: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum of CE(hidden @ weightᵀ, targets) over rows, number of counted rows) without [N, V] logits.

    hidden [N, D], weight [V, D], targets [N] with IGNORE_INDEX for rows that do not count. `compiled`: the
    softmax passes run through the compiled `chunk_softmax`."""
    chunk_rows = chunk_rows or default_chunk_rows(weight.shape[0], hidden.device)
    need_grad = torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad)
    loss_sum = _LinearCrossEntropy.apply(hidden, weight, targets, chunk_rows, need_grad, compiled)
    return loss_sum, (targets != IGNORE_INDEX).sum()


def causal_lm_loss(model, head_weight: torch.Tensor | FusedHead, input_ids: torch.Tensor,
                   labels: torch.Tensor | None = None, chunk_rows: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum of next-token cross-entropies, predicted tokens) of a Hugging Face causal LM on `input_ids` [B, T].

    `model` may be wrapped (DDP, compiled): it is called normally, asking for no logits (`logits_to_keep`
    an empty slice) and for the hidden states, whose last entry is the final LayerNorm's output.
    `head_weight` is the LM head's weight [V, D] (GPT-2: the tied token embedding), or a `FusedHead` whose
    `compute_dtype` the head's matmuls run in (the model's own autocast ends with its forward)."""
    head = head_weight if isinstance(head_weight, FusedHead) else FusedHead(head_weight)
    labels = input_ids if labels is None else labels
    if head.final_norm is not None:
        model(input_ids=input_ids, logits_to_keep=slice(0, 0), use_cache=False)
        hidden = head.final_norm.take()  # [B, T, D]
    else:
        out = model(input_ids=input_ids, logits_to_keep=slice(0, 0), output_hidden_states=True, use_cache=False)
        hidden = out.hidden_states[-1]  # [B, T, D]
    h = hidden[:, :-1].reshape(-1, hidden.shape[-1])  # position t predicts token t+1: [B·(T-1), D]
    targets = labels[:, 1:].reshape(-1)
    weight = head.live_weight()  # under FSDP2: the gathered parameter, valid only now
    if head.compute_dtype is None or head.compute_dtype == torch.float32:
        return linear_cross_entropy_sum(h, weight, targets, chunk_rows, head.compiled)
    with torch.autocast(h.device.type, dtype=head.compute_dtype):
        return linear_cross_entropy_sum(h, weight, targets, chunk_rows, head.compiled)


# ------------------------------------------------------------------------ what the loop and validation call
MIXED_PRECISION_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def fused_head_weight(accelerator, model, compiled: bool = False) -> FusedHead | None:
    """The LM head for the fused loss: its weight [V, D] (under FSDP2 the head module, read after each forward)
    and the accelerator's mixed-precision dtype (fp32 when there is none), or None where the head is sharded
    in a way the fused loss cannot gather (FSDP1, DeepSpeed): those use the model's own loss. `compiled`: the
    softmax passes run compiled (`chunk_softmax`)."""
    dtype = MIXED_PRECISION_DTYPES.get(accelerator.mixed_precision, torch.float32)
    unwrapped = accelerator.unwrap_model(model)
    head = unwrapped.get_output_embeddings()
    if accelerator.distributed_type == DistributedType.FSDP and getattr(accelerator, "is_fsdp2", False):
        return FusedHead(None, dtype, owner=head, compiled=compiled, final_norm=FinalNormOutput(unwrapped))
    if accelerator.distributed_type in (DistributedType.FSDP, DistributedType.DEEPSPEED):
        return None
    return FusedHead(head.weight, dtype, compiled=compiled, final_norm=FinalNormOutput(unwrapped))


def forward_loss(model, head: FusedHead | torch.Tensor | None, batch: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy of `batch` [B, T] (labels = inputs): fused with the LM head when `head`
    (its weight) is given, else through the model's own loss."""
    if head is None:
        return model(input_ids=batch, labels=batch, use_cache=False).loss
    loss_sum, count = causal_lm_loss(model, head, batch)
    return loss_sum / count


def token_loss_sum(model, input_ids: torch.Tensor, labels: torch.Tensor,
                   head_weight: FusedHead | torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum of next-token cross-entropies, number of predicted tokens) of one batch [B, T]; fp32 on device.

    With `head_weight` (the LM head's weight, or a `FusedHead`) the fused chunked path is used (no [B, T, V]
    logits)."""
    if head_weight is not None:
        return causal_lm_loss(model, head_weight, input_ids, labels)
    logits = model(input_ids=input_ids, use_cache=False).logits  # [B, T, V]
    targets = labels[:, 1:].reshape(-1)  # token t predicts t+1: [B·(T-1)]
    loss_sum = F.cross_entropy(logits[:, :-1].reshape(-1, logits.size(-1)).float(), targets,
                               ignore_index=IGNORE_INDEX, reduction="sum")
    return loss_sum, (targets != IGNORE_INDEX).sum()

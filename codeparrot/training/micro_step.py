"""One micro-step of the training loop (forward, fused loss, backward of one micro-batch), run eagerly or replayed
from a CUDA graph (`cuda_graphs: true`).

Why a graph: at the recipe's micro-batch a GPU finishes a micro-step's few hundred kernels faster than the host
can launch them (H100, codeparrot-small, micro-batch 12: 31 ms of device time in a 43 ms step). Captured once,
the whole micro-step is one launch.

How (PyTorch's whole-network capture, with gradient accumulation):
- *Warm-up*: the first `WARMUP_MICRO_STEPS` micro-steps run eagerly on a side stream, the one the capture then
  uses: they compile the blocks (forward and backward), create the stream's cuBLAS workspace and give every
  parameter its `.grad`. They are real training micro-steps, not extra ones.
- *Gradients stay allocated*: the loop zeroes them in place (`zero_grad(set_to_none=False)`, `keeps_gradients`)
  instead of freeing them, so each parameter's gradient keeps its address, and the captured backward pass adds
  into it (autograd accumulates in place into an existing `.grad`). The first micro-step of a step thus computes
  0 + g instead of taking g: the same number.
- *Capture* (once, on the next micro-step): the micro-step is recorded into a graph with a static input batch
  [B, T] and its loss; nothing runs while recording. Every micro-step from then on copies its batch into the
  static one and replays the graph; the loss is copied out at once.
- *Outside the graph*, as in eager mode: gradient clipping, the non-finite guard, the optimizer step, the
  learning-rate schedule, zeroing, evaluation (its own compiled graph, eager launches) and checkpoints.
- *Random numbers*: PyTorch registers the default CUDA generator with the graph; each replay advances its
  offset by what the captured kernels (dropout, SDPA's dropout, inductor's seeds) consume, as the same kernels
  launched eagerly would. Dropout masks differ from replay to replay, and a resumed run (warm-up and capture
  again) draws what the uninterrupted run drew.

Where it is refused (`graph_refusal`, a one-line error before any compute when asked for): not CUDA; several
processes (the gradient all-reduce inside the backward pass is not captured); FSDP/DeepSpeed; the model's own
loss instead of the fused one; an attention other than `causal_sdpa` (transformers builds the mask differently
while a stream is capturing: another graph than the warm-up's, and flash-attention-2 reads a number on the host);
gradient checkpointing (its recompute reads the RNG state on the host); fp16 (the gradient scaler's checks);
whole-model compilation in a mode that makes CUDA graphs of its own (`reduce-overhead`, `max-autotune`).
Micro-batches must all have the same shape (training batches do). Memory: the graph's pool keeps one
micro-step's activations for the whole run, outside the expandable segments the rest of the run uses, so
`micro_batch_size: auto` leaves a larger margin with graphs (micro_batch.py).
"""

from __future__ import annotations

from typing import Callable

import torch
from accelerate.utils import DistributedType, DynamoBackend

from codeparrot.errors import CodeParrotError, first_line
from codeparrot.training.causal_attention import CAUSAL_SDPA
from codeparrot.training.config import TrainConfig
from codeparrot.training.loss import forward_loss

WARMUP_MICRO_STEPS = 3  # eager micro-steps before the capture (PyTorch's guidance: a few, on the capture stream)


def graph_refusal(cfg: TrainConfig, accelerator) -> str | None:
    """Why this run's micro-step cannot be captured as a CUDA graph, or None when it can."""
    if accelerator.device.type != "cuda":
        return f"CUDA graphs need a CUDA device (this run is on {accelerator.device.type})"
    if accelerator.num_processes > 1:
        return (f"CUDA graphs run on one process only ({accelerator.num_processes} here): the gradient all-reduce "
                f"inside the backward pass is not captured")
    if accelerator.distributed_type in (DistributedType.FSDP, DistributedType.DEEPSPEED):
        return f"CUDA graphs do not run under {accelerator.distributed_type.value}"
    if not cfg.fused_loss:
        return "CUDA graphs need the fused loss (fused_loss: true)"
    if cfg.attn_implementation != CAUSAL_SDPA:
        return (f"CUDA graphs need attn_implementation: {CAUSAL_SDPA} (with {cfg.attn_implementation} transformers "
                f"builds the attention mask differently while capturing)")
    if cfg.gradient_checkpointing:
        return "CUDA graphs do not run with gradient_checkpointing (its recompute reads the RNG state on the host)"
    if accelerator.mixed_precision == "fp16":
        return "CUDA graphs do not run under fp16 (the gradient scaler checks on the host); use bf16"
    dynamo = getattr(getattr(accelerator, "state", None), "dynamo_plugin", None)
    if dynamo is not None and dynamo.backend != DynamoBackend.NO and dynamo.mode in ("reduce-overhead",
                                                                                      "max-autotune"):
        return (f"CUDA graphs cannot contain the graphs of whole-model compilation in mode {dynamo.mode!r} "
                f"(ACCELERATE_DYNAMO_MODE)")
    return None


def resolve_cuda_graphs(cfg: TrainConfig, accelerator) -> bool:
    """Whether this run replays its micro-steps from a CUDA graph: `cuda_graphs` true where it can (else a
    one-line error naming why not); null and false: eager."""
    if not cfg.cuda_graphs:
        return False
    refusal = graph_refusal(cfg, accelerator)
    if refusal is not None:
        raise CodeParrotError(f"cuda_graphs: true: {refusal}; set --cuda_graphs false")
    return True


def capture_failure(err: BaseException) -> str:
    """One line for a failed capture, led by its first cause: when an operation fails inside `torch.cuda.graph`,
    leaving the block ends the capture, which raises again ("operation failed due to a previous error during
    capture"), and the error that says what went wrong is the first one of the chain."""
    chain, seen = [err], {id(err)}
    while True:
        inner = chain[-1].__cause__ or chain[-1].__context__
        if inner is None or id(inner) in seen:
            break
        chain.append(inner)
        seen.add(id(inner))
    first = [first_line(e) for e in reversed(chain)]
    return first[0] if len(first) == 1 else f"{first[0]}; then: {first[-1]}"


class MicroStep:
    """`micro_step(batch)`: forward, loss and backward of one micro-batch [B, T] (token ids on the device; the loss is
    divided by the accumulation, as `accelerator.backward` does); returns its mean loss, a 0-d device tensor the
    caller may keep. With `graphs`, replayed from a CUDA graph after the warm-up (module docstring)."""

    def __init__(self, accelerator, model, head, graphs: bool = False,
                 warmup_micro_steps: int = WARMUP_MICRO_STEPS):
        self.accelerator, self.model, self.head = accelerator, model, head
        self.graphs = graphs
        self.warmup_micro_steps = self.warmup_left = warmup_micro_steps
        self.graph: torch.cuda.CUDAGraph | None = None
        self.static_batch: torch.Tensor | None = None  # [B, T], the captured input
        self.static_loss: torch.Tensor | None = None  # 0-d, the captured output
        self.stream: torch.cuda.Stream | None = None  # warm-up and capture stream, made at the first micro-step

    @property
    def keeps_gradients(self) -> bool:
        """Gradients must keep their memory between steps: zero them in place, never set them to None."""
        return self.graphs

    def __call__(self, batch: torch.Tensor) -> torch.Tensor:
        if not self.graphs:
            return self._eager(batch)
        if self.graph is None and self.warmup_left > 0:
            self.warmup_left -= 1
            return self._on_capture_stream(lambda: self._eager(batch))
        if self.graph is None:
            self._capture(batch)
        if batch.shape != self.static_batch.shape:
            raise CodeParrotError(f"cuda_graphs: a micro-batch of shape {tuple(batch.shape)} after the graph was "
                                  f"captured for {tuple(self.static_batch.shape)}: every micro-batch must have "
                                  f"the same shape")
        self.static_batch.copy_(batch, non_blocking=True)
        self.graph.replay()
        return self.static_loss.clone()  # the next replay overwrites static_loss

    def _eager(self, batch: torch.Tensor) -> torch.Tensor:
        loss = forward_loss(self.model, self.head, batch)  # mean over the B·(T-1) predicted tokens
        self.accelerator.backward(loss)  # divides by the accumulation: the step's gradient is the token mean
        return loss.detach()

    def _on_capture_stream(self, work: Callable[[], torch.Tensor]) -> torch.Tensor:
        """`work` on the capture stream, ordered after everything queued so far and before everything after."""
        if self.stream is None:
            self.stream = torch.cuda.Stream()
        current = torch.cuda.current_stream()
        self.stream.wait_stream(current)  # the batch was copied on the current stream
        with torch.cuda.stream(self.stream):
            result = work()
        current.wait_stream(self.stream)
        return result

    def _capture(self, batch: torch.Tensor) -> None:
        missing = [name for name, p in self.model.named_parameters() if p.requires_grad and p.grad is None]
        if missing:  # the captured backward pass would replace these gradients instead of adding to them
            raise CodeParrotError(f"cuda_graphs: {len(missing)} parameter(s) have no gradient after the warm-up "
                                  f"(first: {missing[0]}): zero gradients in place (MicroStep.keeps_gradients) "
                                  f"and train every parameter")
        self.static_batch = batch.clone()
        graph = torch.cuda.CUDAGraph()
        # The graph gets a memory pool of its own, kept for the run: first hand the warm-up's cached activation
        # blocks back, so the card does not hold a micro-step's activations twice (micro_batch_size auto fills it).
        torch.cuda.synchronize()
        torch.cuda.empty_cache()

        def record() -> torch.Tensor:
            # thread_local: the DataLoader's pin-memory thread may allocate pinned host memory meanwhile
            with torch.cuda.graph(graph, stream=self.stream, capture_error_mode="thread_local"):
                return self._eager(self.static_batch)

        try:
            self.static_loss = self._on_capture_stream(record)
        except (RuntimeError, torch.cuda.OutOfMemoryError) as err:  # what a capture raises (CUDA, allocator)
            raise CodeParrotError(f"cuda_graphs: capturing the micro-step failed ({capture_failure(err)}); train "
                                  f"with --cuda_graphs false") from err
        self.graph = graph

    def describe(self) -> str:
        if not self.graphs:
            return "CUDA graphs: off"
        return (f"CUDA graphs: the micro-step (forward, loss, backward) captured after {self.warmup_micro_steps} "
                f"eager micro-step(s), then replayed")

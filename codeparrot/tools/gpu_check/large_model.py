"""Stage `model_1_5b`: the 1.5B preset (configs/model/codeparrot.yaml, 48 layers) on one GPU: its memory and MFU
at the largest micro-batch that fits, with activation checkpointing only if nothing fits without it.

1. The model is built once, directly on the device (initializing 1.5B parameters on the CPU takes a minute),
   with the recipe's causal attention, AdamW and clipping, bf16 mixed precision through Accelerate.
2. Search (`largest_fitting`): micro-batch `Shapes.large_start`, doubled while it fits (up to `large_max`),
   halved while it does not, at most log2(large_max) + 1 tries, each two real eager training steps (forward,
   backward, clipping, AdamW): the first allocates AdamW's moments, the second is the steady state whose peak
   is recorded. An out-of-memory error is caught, its memory freed, and counts as "does not fit". Eager, because
   a compile per try would cost a minute each, and the compiled blocks save no more for the backward pass.
3. If not even micro-batch 1 fits, activation checkpointing is switched on and the search runs again.
4. The winner is measured as train.py runs it: compiled per transformer block on CUDA (one graph for all 48
   blocks), the loss's softmax compiled, warm-up steps, then timed steps. Should that run out of memory (the
   compiled kernels' workspaces), smaller sizes are measured instead, halving down to 1 (`measurement_sizes`);
   out-of-memory errors include cuBLAS's and cuDNN's allocation failures, which PyTorch raises as RuntimeError.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import replace
from statistics import median
from typing import Callable

import torch

from codeparrot.repository.model import build_model, gpt2_config, load_model_config
from codeparrot.tools.gpu_check.config import GpuCheckConfig, Shapes
from codeparrot.tools.gpu_check.kernels import (
    device_peak,
    peak_memory_gib,
    reset_peak_memory,
    short_error,
    sync,
)
from codeparrot.tools.gpu_check.train_steps import dynamo_counts
from codeparrot.training.causal_attention import CAUSAL_SDPA, register_causal_attention
from codeparrot.training.config import OptimConfig
from codeparrot.training.loss import FusedHead, forward_loss, fused_head_weight
from codeparrot.training.mfu import mfu, model_flops_per_token
from codeparrot.training.micro_batch import free_step, is_out_of_memory
from codeparrot.training.optim import build_optimizer
from codeparrot.training.regional_compile import compile_blocks

MAX_TIMED_STEPS = 10  # a 1.5B step at the largest micro-batch takes about a second: 10 give a stable median


def largest_fitting(start: int, limit: int, fits: Callable[[int], bool],
                    time_left: Callable[[], bool]) -> tuple[int, bool]:
    """(the largest micro-batch of the powers-of-two walk from `start` that `fits`, 0 when not even 1 does;
    whether the walk stopped because `time_left()` said no). Up while it fits (never past `limit`), down while
    it does not; after one size failed no larger size is tried again."""
    best, size, failed = 0, start, None
    while True:
        if not time_left():
            return best, True
        if fits(size):
            best = size
            if size * 2 > limit or (failed is not None and size * 2 >= failed):
                return best, False
            size *= 2
        else:
            failed = size
            if best or size == 1:
                return best, False
            size //= 2


def enable_activation_checkpointing(model) -> None:
    """As load_model() does for `gradient_checkpointing: true` (training/model_io.py)."""
    kwargs = {"use_reentrant": False}  # the non-reentrant variant works with torch.compile
    if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.x name
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


class LargeModel:
    """The preset's model, optimizer and accelerator, built once; `step(batch)` is one optimizer step."""

    def __init__(self, shapes: Shapes, device: torch.device):
        from accelerate import Accelerator
        from accelerate.state import AcceleratorState, GradientState

        AcceleratorState._reset_state(True)
        GradientState._reset_state()
        torch._dynamo.reset()
        preset = load_model_config(str(shapes.large_preset))
        preset = replace(preset, **dict(shapes.large_override))
        self.n_layer = preset.n_layer
        register_causal_attention()
        with torch.device(device):
            model = build_model(gpt2_config(preset, shapes.vocab_size, 0, 0, 0), seed=0)
        model.set_attn_implementation(CAUSAL_SDPA)
        model.loss_type = model.config.loss_type = "ForCausalLM"
        self.device, self.vocab_size, self.seq_length = device, shapes.vocab_size, shapes.large_seq_length
        self.accelerator = Accelerator(mixed_precision="bf16" if device.type == "cuda" else "no",
                                       cpu=device.type == "cpu")
        self.model, self.optimizer = self.accelerator.prepare(model, build_optimizer(model, OptimConfig(), device))
        self.unwrapped = self.accelerator.unwrap_model(self.model)
        self.parameters = sum(p.numel() for p in self.unwrapped.parameters())
        self.flops_per_token = model_flops_per_token(self.unwrapped, shapes.large_seq_length)
        self.head: FusedHead | None = fused_head_weight(self.accelerator, self.model, compiled=False)
        self.model.train()

    def batch(self, micro_batch: int) -> torch.Tensor:
        return torch.randint(0, self.vocab_size, (micro_batch, self.seq_length), device=self.device)

    def step(self, batch: torch.Tensor) -> None:
        loss = forward_loss(self.model, self.head, batch)
        self.accelerator.backward(loss)
        self.accelerator.clip_grad_norm_(self.model.parameters(), 1.0)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def try_size(self, micro_batch: int, checkpointing: bool) -> dict:
        """Two eager steps at `micro_batch`: {'fits', 'peak_memory_gib' (the second step's), 'seconds'}."""
        start, row = time.perf_counter(), {"micro_batch": micro_batch, "activation_checkpointing": checkpointing}
        out_of_memory = None
        try:
            batch = self.batch(micro_batch)
            self.step(batch)  # AdamW's moments are allocated here
            sync(self.device)
            reset_peak_memory(self.device)
            self.step(batch)
            sync(self.device)
            row["peak_memory_gib"] = peak_memory_gib(self.device)
        except (torch.OutOfMemoryError, RuntimeError) as err:  # cuBLAS/cuDNN report theirs as RuntimeError
            if not is_out_of_memory(err):
                raise
            out_of_memory = short_error(err)
        if out_of_memory:  # freed outside the handler: the exception's frames held the activations
            free_step(self.optimizer, self.head, self.device, collect=True)
        row.update(fits=out_of_memory is None, seconds=time.perf_counter() - start)
        if out_of_memory:
            row["detail"] = out_of_memory
        return row

    def measure(self, micro_batch: int, cfg: GpuCheckConfig) -> dict:
        """The recipe's fast path at `micro_batch`: compiled blocks and loss on CUDA, warm-up, timed steps."""
        from torch._dynamo.utils import counters

        cuda = self.device.type == "cuda"
        torch._dynamo.reset()
        counters.clear()
        if cuda:
            compile_blocks(self.unwrapped)  # in place, as train() does (idempotent on a compiled model)
        if self.head is not None and self.head.final_norm is not None:
            self.head.final_norm.handle.remove()  # the search's head: one final-norm hook at a time
        self.head = fused_head_weight(self.accelerator, self.model, compiled=cuda)
        batch, start = self.batch(micro_batch), time.perf_counter()
        for _ in range(max(cfg.warmup_steps, 1)):
            self.step(batch)
        sync(self.device)
        warmup_s = time.perf_counter() - start
        breaks, graphs = dynamo_counts()
        reset_peak_memory(self.device)
        times = []
        for _ in range(min(cfg.steps, MAX_TIMED_STEPS)):
            t0 = time.perf_counter()
            self.step(batch)
            sync(self.device)
            times.append(time.perf_counter() - t0)
        step_s = median(times)
        tokens_per_s = micro_batch * self.seq_length / step_s
        peak, _ = device_peak(self.device)
        breaks_after, graphs_after = dynamo_counts()
        return {"micro_batch": micro_batch, "compile": "regional" if cuda else "off", "ms_per_step": 1000 * step_s,
                "tokens_per_s": tokens_per_s, "mfu": mfu(tokens_per_s, self.flops_per_token, peak),
                "peak_memory_gib": peak_memory_gib(self.device), "warmup_s": warmup_s, "graph_breaks": breaks,
                "recompiles_while_timed": graphs_after - graphs + (breaks_after - breaks)}


def large_model_stage(shapes: Shapes, device: torch.device, cfg: GpuCheckConfig, deadline: float) -> dict:
    """`deadline`: time.monotonic() after which no try and no measurement starts."""
    runner = LargeModel(shapes, device)
    search = f"from {shapes.large_start}, ×2 while it fits, ÷2 while not, at most {shapes.large_max}"
    result = {"preset": shapes.large_preset.name, "n_layer": runner.n_layer, "parameters": runner.parameters,
              "seq_length": shapes.large_seq_length, "search": search, "trials": []}
    if device.type == "cuda":
        result["device_memory_gib"] = torch.cuda.get_device_properties(device).total_memory / 2**30

    def time_left() -> bool:
        return time.monotonic() < deadline

    chosen, checkpointing, out_of_time = 0, False, False
    for checkpointing in (False, True):
        if checkpointing:
            enable_activation_checkpointing(runner.unwrapped)

        def fits(size: int, checkpointing: bool = checkpointing) -> bool:
            result["trials"].append(runner.try_size(size, checkpointing))
            print(f"  1.5B trial: {json.dumps(result['trials'][-1])}", file=sys.stderr, flush=True)
            return result["trials"][-1]["fits"]

        chosen, out_of_time = largest_fitting(shapes.large_start, shapes.large_max, fits, time_left)
        if chosen or out_of_time:
            break
    result.update(micro_batch=chosen or None, activation_checkpointing=checkpointing)
    if out_of_time:
        result["note"] = "search stopped: time budget spent"
    elif chosen == shapes.large_max:
        result["note"] = f"the largest size tried ({chosen}) fits; larger ones were not tried"
    if not chosen:
        result["not_measured"] = ("time budget spent" if out_of_time else
                                  "nothing fits, even micro-batch 1 with activation checkpointing")
        return result
    for size in measurement_sizes(chosen, [t["micro_batch"] for t in result["trials"] if t["fits"]]):
        if not time_left():
            result["not_measured"] = "time budget spent before the measurement"
            break
        try:
            result["measured"] = runner.measure(size, cfg)
            print(f"  1.5B measured: {json.dumps(result['measured'])}", file=sys.stderr, flush=True)
            break
        except Exception as err:  # noqa: BLE001 - out of memory (compiled kernels' workspaces): a smaller size
            if not is_out_of_memory(err):  # anything else (a compile error, the budget's end): the trials stay
                result["not_measured"] = f"the measurement at micro-batch {size} failed: {short_error(err)}"
                return result
            result.setdefault("measure_errors", []).append(f"micro-batch {size}: {short_error(err)}")
        free_step(runner.optimizer, runner.head, runner.device, collect=True)
    else:
        result["not_measured"] = "every size ran out of memory once compiled (measure_errors)"
    return result


def measurement_sizes(chosen: int, fitted: list[int]) -> list[int]:
    """The sizes to measure, in order, until one runs: the chosen one, the smaller ones the search saw fit, then
    halves of the smallest down to 1 (compiled kernels need workspace the eager search did not)."""
    sizes = sorted({size for size in fitted if size <= chosen} | {chosen}, reverse=True)
    while sizes[-1] > 1:
        sizes.append(sizes[-1] // 2)
    return sizes

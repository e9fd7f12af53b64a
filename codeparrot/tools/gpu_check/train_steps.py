"""Stage `train_step`: the recipe's optimizer step on synthetic token ids, variant by variant.

Each variant builds a fresh model from the preset (vocabulary `Shapes.vocab_size`), prepares it with Accelerate
exactly as `train()` does (bf16 mixed precision on CUDA, the recipe's AdamW, clipping at 1.0, regional or
whole-model compilation through Accelerate's TorchDynamoPlugin) and times `steps` optimizer steps after
`warmup_steps` untimed ones. Token ids are random: the speed of a step does not depend on them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from statistics import median

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
from codeparrot.training.causal_attention import CAUSAL_SDPA, register_causal_attention
from codeparrot.training.config import OptimConfig
from codeparrot.training.loss import forward_loss, fused_head_weight
from codeparrot.training.mfu import mfu, model_flops_per_token
from codeparrot.training.optim import build_optimizer
from codeparrot.training.regional_compile import compile_blocks


@dataclass(frozen=True)
class StepVariant:
    name: str
    micro_batch: int
    attn: str = CAUSAL_SDPA
    compile: str = "regional"  # "off" | "regional" (per transformer block) | "whole"
    loss: str = "fused_compiled"  # "hf" | "fused" (eager softmax) | "fused_compiled"
    dropout: bool = True  # the preset's dropout (0.1 for codeparrot-small); False: all 0
    activation: str | None = None  # None: the preset's (gelu_pytorch_tanh)


def variants_for(cfg: GpuCheckConfig, shapes: Shapes) -> list[StepVariant]:
    """The default (what `train.py` runs on CUDA now) at every micro-batch, and what each change is worth."""
    first = shapes.micro_batches[0]
    default = [StepVariant(f"default: compiled per block, micro-batch {b}", b) for b in shapes.micro_batches]
    others = [
        StepVariant(f"as shipped before (sdpa + mask, eager, gelu_new), micro-batch {first}", first, attn="sdpa",
                    compile="off", loss="fused", activation="gelu_new"),
        StepVariant(f"eager, causal attention, micro-batch {first}", first, compile="off", loss="fused"),
        StepVariant(f"whole-model compile (old --compile true), micro-batch {first}", first, attn="sdpa",
                    compile="whole", loss="fused", activation="gelu_new"),
        StepVariant(f"default without dropout, micro-batch {first}", first, dropout=False),
        StepVariant(f"default with the Hugging Face loss, micro-batch {first}", first, loss="hf"),
    ]
    chosen = default[:1] + others[:2] + default[1:] + others[2:]
    if cfg.smoke:  # the tool's check, not a measurement: one compiled variant (inductor on a CPU is slow)
        chosen = default[:1] + others[:2]
    if cfg.variants:
        chosen = [v for v in chosen if any(word in v.name for word in cfg.variants)]
    return chosen


class StepRunner:
    """One variant's model, optimizer and accelerator; `step()` is one optimizer step of the recipe."""

    def __init__(self, variant: StepVariant, shapes: Shapes, device: torch.device):
        from accelerate import Accelerator
        from accelerate.state import AcceleratorState, GradientState
        from accelerate.utils import TorchDynamoPlugin

        from torch._dynamo.utils import counters

        AcceleratorState._reset_state(True)
        GradientState._reset_state()
        torch._dynamo.reset()
        counters.clear()  # graph breaks and graphs are counted per variant
        preset = load_model_config(str(shapes.model_preset))
        if not variant.dropout:
            preset = replace(preset, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
        if variant.activation:
            preset = replace(preset, activation_function=variant.activation)
        config = gpt2_config(preset, shapes.vocab_size, 0, 0, 0)
        register_causal_attention()
        model = build_model(config, seed=0)
        model.set_attn_implementation(variant.attn)
        model.loss_type = model.config.loss_type = "ForCausalLM"
        if variant.compile == "regional":
            compile_blocks(model)  # in place, as train() does
        plugin = TorchDynamoPlugin(backend="inductor") if variant.compile == "whole" else None
        self.accelerator = Accelerator(mixed_precision="bf16" if device.type == "cuda" else "no",
                                       cpu=device.type == "cpu", dynamo_plugin=plugin)
        optimizer = build_optimizer(model, OptimConfig(), device)
        self.model, self.optimizer = self.accelerator.prepare(model, optimizer)
        self.head = None if variant.loss == "hf" else fused_head_weight(
            self.accelerator, self.model, compiled=variant.loss == "fused_compiled")
        self.batch = torch.randint(0, shapes.vocab_size, (variant.micro_batch, shapes.seq_length),
                                   generator=torch.Generator().manual_seed(0)).to(device)
        self.tokens_per_step = variant.micro_batch * shapes.seq_length
        self.flops_per_token = model_flops_per_token(self.accelerator.unwrap_model(self.model), shapes.seq_length)
        self.model.train()

    def step(self) -> None:
        loss = forward_loss(self.model, self.head, self.batch)
        self.accelerator.backward(loss)
        self.accelerator.clip_grad_norm_(self.model.parameters(), 1.0)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)


def dynamo_counts() -> tuple[int, int]:
    """(graph breaks, unique graphs compiled) so far in this process."""
    from torch._dynamo.utils import counters

    return sum(counters["graph_break"].values()), int(counters["stats"]["unique_graphs"])


def measure_variant(variant: StepVariant, shapes: Shapes, device: torch.device, cfg: GpuCheckConfig) -> dict:
    row = {"variant": variant.name, "micro_batch": variant.micro_batch, "attention": variant.attn,
           "compile": variant.compile, "loss": variant.loss, "dropout": variant.dropout}
    try:
        reset_peak_memory(device)
        start = time.perf_counter()
        runner = StepRunner(variant, shapes, device)
        for _ in range(max(cfg.warmup_steps, 1)):
            runner.step()
        sync(device)
        row["warmup_s"] = time.perf_counter() - start  # model build + compile + first steps
        breaks, graphs = dynamo_counts()
        times = []
        for _ in range(cfg.steps):
            t0 = time.perf_counter()
            runner.step()
            sync(device)  # per step: the median is over whole steps, device work included
            times.append(time.perf_counter() - t0)
        step_s = median(times)
        tokens_per_s = runner.tokens_per_step / step_s
        peak, _ = device_peak(device)
        breaks_after, graphs_after = dynamo_counts()
        row.update(ms_per_step=1000 * step_s, tokens_per_s=tokens_per_s,
                   mfu=mfu(tokens_per_s, runner.flops_per_token, peak), peak_memory_gib=peak_memory_gib(device),
                   graph_breaks=breaks, recompiles_while_timed=graphs_after - graphs + (breaks_after - breaks))
    except Exception as err:  # noqa: BLE001 - out of memory at micro-batch 48, a compile failure: recorded
        row["error"] = short_error(err)
    finally:
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return row

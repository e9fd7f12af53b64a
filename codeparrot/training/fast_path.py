"""The training fast path: what a run compiles (`FastPath`, null settings = on for CUDA, off elsewhere) and the
CUDA allocator setting it runs with."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
from accelerate.utils import TorchDynamoPlugin

from codeparrot.training.config import TrainConfig


@dataclass
class FastPath:
    """What this run compiles, resolved from the config's nulls (null = on for CUDA, off elsewhere)."""

    cuda: bool
    compile_model: bool
    compile_regions: bool
    compile_loss: bool

    @classmethod
    def resolve(cls, cfg: TrainConfig, device: torch.device) -> "FastPath":
        cuda = device.type == "cuda"
        compile_model = cuda if cfg.compile is None else cfg.compile
        return cls(cuda, compile_model, cfg.compile_regions, cuda if cfg.compile_loss is None else cfg.compile_loss)

    def dynamo_plugin(self) -> TorchDynamoPlugin | None:
        """Accelerate's compile settings for whole-model compilation; None leaves the decision to the launcher
        (`--dynamo_backend`). Per-block compilation is done in place by `train()` before `accelerator.prepare`
        (regional_compile.py)."""
        if not self.compile_model or self.compile_regions:
            return None
        return TorchDynamoPlugin(backend="inductor")

    def describe(self, cfg: TrainConfig) -> str:
        compiled = ("per transformer block" if self.compile_regions else "whole model") if self.compile_model else "off"
        return f"attention: {cfg.attn_implementation}; torch.compile: {compiled}"


def configure_cuda_allocator() -> None:
    """Expandable segments: large, changing allocations (the fused loss's chunks, the last shorter chunk,
    evaluation batches) reuse memory instead of fragmenting it into OOMs on a nearly full card. The user's own
    setting wins; torch >= 2.9 reads PYTORCH_ALLOC_CONF (the CUDA-named variable still works there)."""
    if "PYTORCH_ALLOC_CONF" not in os.environ and "PYTORCH_CUDA_ALLOC_CONF" not in os.environ:
        os.environ["PYTORCH_CUDA_ALLOC_CONF" if torch.__version__ < "2.9" else "PYTORCH_ALLOC_CONF"] = (
            "expandable_segments:True")

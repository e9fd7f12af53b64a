"""Model FLOPs utilization: the PaLM formula (appendix B) against the device's peak.

    FLOPs/token = 6·N + 12·L·H·Q·T

N counts every weight that takes part in a matmul: all parameters except the position embeddings (the token
embedding counts once, as the tied LM head; biases and LayerNorm gains are included, as in the published
0.775 GFLOP/token for codeparrot-small, and are < 0.1% of N). 6·N is the forward (2) + backward (4) matmul work
per token; 12·L·H·Q·T is attention's QKᵀ and AV over a context of T (L layers, H heads of width Q), counted as
if no causal mask skipped half of it. MFU = tokens/s × FLOPs/token / peak FLOP/s (summed over processes).

Peaks: dense bf16 tensor-core figures from the vendors' data sheets (the MFU of a bf16 run); on a CPU, the
matmul rate measured on this machine with torch (large square matrices, all threads), cached per CPU model,
thread count and torch version in ~/.cache/codeparrot/cpu_peak.json; for a bf16 run on a CPU, the larger of
the bf16 and fp32 figures (CPUs without native bf16 emulate it more slowly than fp32).
"""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path

import torch
from torch import nn

from codeparrot.atomic_io import atomic_write_json

# Dense (no sparsity) data-sheet peak FLOP/s by GPU name fragment: (bf16/fp16 tensor core, TF32 tensor core,
# plain fp32). fp32 runs use the TF32 figure when `torch.backends.cuda.matmul.allow_tf32` is on (training turns
# it on), since the matmuls then run on the tensor cores. First match wins, so specific names come first.
GPU_PEAKS: list[tuple[str, float, float, float]] = [
    ("H100 PCIe", 756e12, 378e12, 51e12),
    ("H100 NVL", 835e12, 418e12, 60e12),
    ("H100", 989e12, 494.5e12, 67e12),  # SXM reports "H100 80GB HBM3"
    ("H200", 989e12, 494.5e12, 67e12),
    ("A100", 312e12, 156e12, 19.5e12),
    ("L4", 121e12, 60e12, 30.3e12),
    ("V100", 125e12, 15.7e12, 15.7e12),  # fp16 tensor cores (no bf16, no TF32)
]

CACHE = Path(os.environ.get("CODEPARROT_CACHE", Path.home() / ".cache" / "codeparrot")) / "cpu_peak.json"


def flops_per_token(n_matmul_params: int, n_layer: int, n_head: int, head_dim: int, seq_len: int) -> float:
    """PaLM's training FLOPs per token: 6·N + 12·L·H·Q·T."""
    return 6.0 * n_matmul_params + 12.0 * n_layer * n_head * head_dim * seq_len


def matmul_params(model: nn.Module) -> int:
    """N of the formula: unique parameters minus position embeddings (GPT-2's `wpe`, or `*position_embedding*`)."""
    seen: set[int] = set()
    total = 0
    for name, param in model.named_parameters(remove_duplicate=True):
        if id(param) in seen:
            continue
        seen.add(id(param))
        leaf = name.rsplit(".", 2)[-2] if "." in name else name
        if leaf == "wpe" or "position_embedding" in leaf:
            continue
        total += param.numel()
    return total


def model_flops_per_token(model: nn.Module, seq_len: int) -> float:
    """FLOPs/token of a Hugging Face decoder (reads n_layer/n_head/n_embd from its config)."""
    cfg = model.config
    n_layer = getattr(cfg, "n_layer", None) or cfg.num_hidden_layers
    n_head = getattr(cfg, "n_head", None) or cfg.num_attention_heads
    width = getattr(cfg, "n_embd", None) or cfg.hidden_size
    return flops_per_token(matmul_params(model), n_layer, n_head, width // n_head, seq_len)


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _measure_matmul(dtype: torch.dtype, size: int, seconds: float) -> float:
    """Best FLOP/s of `size`² matmuls over about `seconds`."""
    a = torch.randn(size, size).to(dtype)
    b = torch.randn(size, size).to(dtype)
    out = torch.empty(size, size, dtype=dtype)
    torch.matmul(a, b, out=out)  # warm up (allocations, oneDNN primitive creation)
    best, deadline = 0.0, time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        start = time.perf_counter()
        torch.matmul(a, b, out=out)
        best = max(best, 2.0 * size**3 / (time.perf_counter() - start))
    return best


def cpu_matmul_peak(dtype: str = "float32", refresh: bool = False) -> float:
    """Matmul FLOP/s of this CPU for `dtype` ("float32" or "bfloat16") at torch's current thread count.

    Measured once (about 2 s) and cached; the cache keeps the best figure ever seen for the same CPU model,
    thread count and torch version, because a machine busy with other work only ever measures too low."""
    key = f"{_cpu_name()} | threads={torch.get_num_threads()} | torch={torch.__version__} | {dtype}"
    try:
        cache = json.loads(CACHE.read_text()) if CACHE.is_file() else {}
    except (OSError, ValueError):
        cache = {}
    if key in cache and not refresh:
        return float(cache[key])
    torch_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
    value = max(_measure_matmul(torch_dtype, size, seconds=0.6) for size in (1024, 2048))
    cache[key] = max(value, float(cache.get(key, 0.0)))
    try:
        atomic_write_json(CACHE, cache)
    except OSError:
        pass  # a read-only home only costs a re-measurement next time
    return cache[key]


def _tf32_enabled() -> bool:
    """Whether fp32 CUDA matmuls run as TF32 on the tensor cores (training enables it)."""
    return bool(torch.backends.cuda.matmul.allow_tf32)


def peak_flops(device: torch.device, dtype: torch.dtype) -> tuple[float | None, str]:
    """(peak FLOP/s of one device for matmuls in `dtype`, where the figure comes from); None when unknown.

    `CODEPARROT_PEAK_TFLOPS` overrides the table (e.g. for a GPU not listed)."""
    if os.environ.get("CODEPARROT_PEAK_TFLOPS"):
        return float(os.environ["CODEPARROT_PEAK_TFLOPS"]) * 1e12, "CODEPARROT_PEAK_TFLOPS"
    half = dtype in (torch.bfloat16, torch.float16)
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        tf32 = _tf32_enabled()
        for fragment, tensor_core, tf32_peak, fp32 in GPU_PEAKS:
            if fragment.lower() in name.lower():
                if half:
                    return tensor_core, f"{name} bf16 data sheet"
                return (tf32_peak, f"{name} TF32 data sheet") if tf32 else (fp32, f"{name} fp32 data sheet")
        return None, f"{name}: not in the peak table (set CODEPARROT_PEAK_TFLOPS)"
    if device.type == "cpu":
        fp32 = cpu_matmul_peak("float32")
        if dtype != torch.bfloat16:
            return fp32, "measured float32 matmul peak of this CPU"
        # Autocast runs the matmuls in bf16, but the hardware's peak is whichever unit is faster: on CPUs without
        # native bf16 (no AVX512-BF16/AMX) bf16 matmuls are emulated and slower than fp32, and an MFU against
        # that figure would flatter a run that leaves the fp32 units idle.
        bf16 = cpu_matmul_peak("bfloat16")
        if bf16 >= fp32:
            return bf16, "measured bfloat16 matmul peak of this CPU"
        return fp32, f"measured float32 matmul peak of this CPU (above its emulated bf16 {bf16 / 1e9:.0f} GFLOP/s)"
    return None, f"{device.type}: no peak known (set CODEPARROT_PEAK_TFLOPS)"


def mfu(tokens_per_s: float, flops_per_tok: float, peak: float | None, num_devices: int = 1) -> float | None:
    """Fraction of the peak of `num_devices` devices; None when the peak is unknown."""
    if not peak:
        return None
    return tokens_per_s * flops_per_tok / (peak * num_devices)

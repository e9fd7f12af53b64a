"""Model FLOPs utilization: the PaLM formula (appendix B) against the device's peak.

    FLOPs/token = 6·N + 12·L·H·Q·T

N counts every weight that takes part in a matmul: all parameters except the position embeddings (the token
embedding counts once, as the tied LM head; biases and LayerNorm gains are included, as in the published
0.775 GFLOP/token for codeparrot-small, and are < 0.1% of N). 6·N is the forward (2) + backward (4) matmul work
per token; 12·L·H·Q·T is attention's QKᵀ and AV over a context of T (L layers, H heads of width Q), counted as
if no causal mask skipped half of it. MFU = tokens/s × FLOPs/token / peak FLOP/s (summed over processes).

Peaks: dense bf16 tensor-core figures from the vendors' data sheets (the MFU of a bf16 run); on a CPU, the
matmul rate measured on this machine with torch (large square matrices, best of several rounds, at the thread count
the training process runs with), cached per CPU model, thread count and torch version in
~/.cache/codeparrot/cpu_peak.json, but not when the machine looked busy while measuring (too low a peak makes
MFU read above 100%); for a bf16 run on a CPU, the larger of the bf16 and fp32 figures (CPUs without native bf16
emulate it more slowly than fp32). An MFU above 100% is reported with a warning that the peak is wrong.
"""

from __future__ import annotations

import json
import os
import platform
import time
import warnings
from dataclasses import dataclass
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


def _measure_matmul(dtype: torch.dtype, size: int, seconds: float, repeats: int = 5) -> tuple[float, float]:
    """(best FLOP/s of `size`² matmuls over `repeats` timed rounds of about `seconds` / `repeats` each, the share
    of this process's threads that actually ran during them: process CPU time / (wall time × threads))."""
    rng = torch.Generator().manual_seed(0)  # never the global RNG: training resumes its restored state after this
    a = torch.randn(size, size, generator=rng).to(dtype)
    b = torch.randn(size, size, generator=rng).to(dtype)
    out = torch.empty(size, size, dtype=dtype)
    torch.matmul(a, b, out=out)  # warm up (allocations, oneDNN primitive creation, clocks ramping up)
    torch.matmul(a, b, out=out)
    best, cpu, wall = 0.0, 0.0, 0.0
    for _ in range(repeats):
        cpu0, wall0 = time.process_time(), time.perf_counter()
        deadline = wall0 + seconds / repeats
        while True:
            start = time.perf_counter()
            torch.matmul(a, b, out=out)
            now = time.perf_counter()
            best = max(best, 2.0 * size**3 / (now - start))
            if now >= deadline:
                break
        cpu, wall = cpu + time.process_time() - cpu0, wall + time.perf_counter() - wall0
    return best, cpu / (wall * torch.get_num_threads())


def machine_busy(cpu_share: float) -> str | None:
    """Why a peak measured now would be too low (None when the machine looks idle): this process's threads got
    less than 80% of their CPU time, or the 1-minute load average exceeds the cores left to us."""
    if cpu_share < 0.8:
        return f"the matmul threads got only {cpu_share:.0%} of their CPU time"
    try:
        load = os.getloadavg()[0]
    except OSError:
        return None
    cores = os.cpu_count() or 1
    if load > cores + 0.5:  # the load includes our own threads, so only count what exceeds the cores
        return f"load average {load:.1f} on {cores} cores"
    return None


@dataclass(frozen=True)
class CpuPeak:
    """A CPU matmul peak: FLOP/s at `threads` threads; `busy` says why it may be too low (then not cached)."""

    flops: float
    threads: int
    cached: bool
    busy: str | None = None


def measure_cpu_peak(dtype: str = "float32", refresh: bool = False) -> CpuPeak:
    """Matmul FLOP/s of this CPU for `dtype` ("float32", "bfloat16") at torch's current thread count: the one
    the training process runs with (`accelerate launch --num_cpu_threads_per_process`, OMP_NUM_THREADS).

    Best of 5 rounds at each of two sizes (about 2 s). Cached per CPU model, thread count, torch version and dtype,
    keeping the best figure ever seen (a busy machine only ever measures too low); a figure measured while the
    machine looks busy (`machine_busy`) is used for this run but not cached."""
    threads = torch.get_num_threads()
    key = f"{_cpu_name()} | threads={threads} | torch={torch.__version__} | {dtype}"
    try:
        cache = json.loads(CACHE.read_text()) if CACHE.is_file() else {}
    except (OSError, ValueError):
        cache = {}
    if key in cache and not refresh:
        return CpuPeak(float(cache[key]), threads, cached=True)
    torch_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
    runs = [_measure_matmul(torch_dtype, size, seconds=0.6) for size in (1024, 2048)]
    value = max(flops for flops, _ in runs)
    busy = machine_busy(min(share for _, share in runs))
    best = max(value, float(cache.get(key, 0.0)))
    if busy is None:
        cache[key] = best
        try:
            atomic_write_json(CACHE, cache)
        except OSError:
            pass  # a read-only home only costs a re-measurement next time
    return CpuPeak(best, threads, cached=False, busy=busy)


def cpu_matmul_peak(dtype: str = "float32", refresh: bool = False) -> float:
    """`measure_cpu_peak(dtype, refresh).flops`."""
    return measure_cpu_peak(dtype, refresh).flops


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
        fp32 = measure_cpu_peak("float32")
        note = f"{fp32.threads} thread(s)"
        if fp32.busy:
            note += f"; measured while the machine was busy ({fp32.busy}), not cached: MFU may read high"
        if dtype != torch.bfloat16:
            return fp32.flops, f"measured float32 matmul peak of this CPU, {note}"
        # Autocast runs the matmuls in bf16, but the hardware's peak is whichever unit is faster: on CPUs without
        # native bf16 (no AVX512-BF16/AMX) bf16 matmuls are emulated and slower than fp32, and an MFU against
        # that figure would flatter a run that leaves the fp32 units idle.
        bf16 = measure_cpu_peak("bfloat16")
        if bf16.busy and not fp32.busy:
            note += f"; bf16 measured while the machine was busy ({bf16.busy}), not cached: MFU may read high"
        if bf16.flops >= fp32.flops:
            return bf16.flops, f"measured bfloat16 matmul peak of this CPU, {note}"
        return fp32.flops, (f"measured float32 matmul peak of this CPU (above its emulated bf16 "
                            f"{bf16.flops / 1e9:.0f} GFLOP/s), {note}")
    return None, f"{device.type}: no peak known (set CODEPARROT_PEAK_TFLOPS)"


def mfu(tokens_per_s: float, flops_per_tok: float, peak: float | None, num_devices: int = 1) -> float | None:
    """Fraction of the peak of `num_devices` devices; None when the peak is unknown. Above 1 (impossible: the
    peak is wrong, e.g. measured on a busy machine) it is still returned, with a warning (once per process)."""
    if not peak:
        return None
    value = tokens_per_s * flops_per_tok / (peak * num_devices)
    if value > 1.0:
        global _warned_above_100
        if not _warned_above_100:
            _warned_above_100 = True
            warnings.warn(f"MFU {value:.0%} is above 100%: the peak ({peak / 1e12:.3f} TFLOP/s per device) is "
                          f"too low, so every MFU of this run is wrong; set CODEPARROT_PEAK_TFLOPS to the real "
                          f"peak, or delete {CACHE} and re-run on an idle machine", stacklevel=2)
    return value


_warned_above_100 = False

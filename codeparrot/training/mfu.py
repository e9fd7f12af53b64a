"""Model FLOPs utilization: the PaLM formula (appendix B) against the device's peak.

    FLOPs/token = 6·N + 12·L·H·Q·T

N counts every weight that takes part in a matmul: all parameters except the position embeddings (the token
embedding counts once, as the tied LM head; biases and LayerNorm gains are included, as in the published
0.775 GFLOP/token for codeparrot-small, and are < 0.1% of N). 6·N is the forward (2) + backward (4) matmul work
per token; 12·L·H·Q·T is attention's QKᵀ and AV over a context of T (L layers, H heads of width Q), counted as
if no causal mask skipped half of it. MFU = tokens/s × FLOPs/token / peak FLOP/s (summed over processes).

Peaks: dense bf16 tensor-core figures from the vendors' data sheets (the MFU of a bf16 run), one row per device
matched on the whole name `torch.cuda.get_device_name` reports (`GPU_PEAKS`; unlisted devices: no peak, MFU n/a,
unless CODEPARROT_PEAK_TFLOPS gives it); on a CPU, the
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
import re
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from codeparrot.atomic_io import atomic_write_json

@dataclass(frozen=True)
class GpuPeak:
    """One data-sheet row: dense (no 2:4 sparsity) peak FLOP/s of one GPU for bf16/fp16 on the tensor cores, TF32
    on the tensor cores, and plain fp32; `names`: a regular expression the whole device name must match (after
    a leading "NVIDIA "/"Tesla "), so that "L4" never matches "L40S" nor "H100" an "H100 NVL"; `source`: where
    the figures come from."""

    names: str
    bf16: float
    tf32: float
    fp32: float
    source: str


# Dense figures: NVIDIA's data sheets quote "with sparsity" numbers (marked *) that are 2x these. Device names as
# `torch.cuda.get_device_name` reports them; a MIG slice ("... MIG 1g.10gb") or an unlisted card matches no row
# and reports MFU "n/a" unless CODEPARROT_PEAK_TFLOPS gives its peak.
GPU_PEAKS: list[GpuPeak] = [
    # H100 data sheet (nvidia.com/en-us/data-center/h100): SXM BF16 1,979*, TF32 989*, FP32 67; PCIe (shipped as
    # "H100 PCIe") 1,513*, 756*, 51; NVL 1,671*, 835*, 60 (per GPU). glennklockwood.com/garden/processors/h100
    # lists the SXM dense matrix rates: 989.4 BF16, 494.7 TF32. SXM cards report "H100 80GB HBM3".
    GpuPeak(r"H100 PCIe", 756e12, 378e12, 51e12, "H100 PCIe data sheet"),
    GpuPeak(r"H100 NVL", 835e12, 418e12, 60e12, "H100 NVL data sheet"),
    GpuPeak(r"H100( SXM5?)?( \d+GB)?( HBM3)?", 989e12, 494.5e12, 67e12, "H100 SXM data sheet"),
    # H200 data sheet (nvidia.com/en-us/data-center/h200): SXM BF16 1,979*, TF32 989*, FP32 67 (the H100 SXM's
    # GPU with HBM3e); NVL (PCIe card, 600 W) 1,671*, 835*, 60.
    GpuPeak(r"H200 NVL", 835e12, 418e12, 60e12, "H200 NVL data sheet"),
    GpuPeak(r"H200( SXM5?)?( \d+GB)?( HBM3e)?", 989e12, 494.5e12, 67e12, "H200 SXM data sheet"),
    # A100 data sheet: BF16 312 (624*), TF32 156 (312*), FP32 19.5, the same for SXM4 and PCIe, 40 and 80 GB
    # ("A100-SXM4-40GB", "A100-SXM4-80GB", "A100-PCIE-40GB", "A100 80GB PCIe").
    GpuPeak(r"A100([- ](SXM4?|PCIE|\d+GB))*", 312e12, 156e12, 19.5e12, "A100 data sheet"),
    # L40S data sheet: BF16 362.05 (733*), TF32 183 (366*), FP32 91.6. L40 data sheet: BF16 181.05 (362.1*),
    # TF32 90.5 (181*), FP32 90.5. L4 data sheet: BF16 242*, TF32 120*, FP32 30.3.
    GpuPeak(r"L40S", 362e12, 183e12, 91.6e12, "L40S data sheet"),
    GpuPeak(r"L40", 181e12, 90.5e12, 90.5e12, "L40 data sheet"),
    GpuPeak(r"L4", 121e12, 60e12, 30.3e12, "L4 data sheet"),
    # A10 data sheet: BF16 125 (250*), TF32 62.5 (125*), FP32 31.2. (AWS's A10G has no NVIDIA data sheet: n/a.)
    GpuPeak(r"A10", 125e12, 62.5e12, 31.2e12, "A10 data sheet"),
    # V100 data sheet: fp16 tensor cores only (no bf16, no TF32): SXM2 125, PCIe 112 TFLOPS; FP32 15.7 / 14.
    GpuPeak(r"V100-SXM2-\d+GB", 125e12, 15.7e12, 15.7e12, "V100 SXM2 data sheet (fp16 tensor cores)"),
    GpuPeak(r"V100-PCIE-\d+GB", 112e12, 14e12, 14e12, "V100 PCIe data sheet (fp16 tensor cores)"),
]


def gpu_peak_row(device_name: str) -> GpuPeak | None:
    """The data-sheet row of a device named as `torch.cuda.get_device_name` says, or None (not listed)."""
    name = re.sub(r"^(NVIDIA|Tesla)\s+", "", device_name.strip(), flags=re.IGNORECASE)
    return next((row for row in GPU_PEAKS if re.fullmatch(row.names, name, flags=re.IGNORECASE)), None)


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


def _matmul_sizes(dtype: torch.dtype, budget: float = 1.0) -> list[int]:
    """The square sizes to measure at: 512, plus 1024 and 2048 where one matmul of that size takes at most
    `budget` seconds at the rate a 512² probe shows (best of 3). The budget is generous: fp32 keeps every size on
    any CPU of the last decade, even at one thread. The peak is the best of them: on some CPUs (AMD EPYC here)
    cache-resident 512² matmuls run ~5% faster than the large ones, and a training step's smaller matmuls must
    not read above 100% MFU. A CPU without native bf16/fp16 instructions
    emulates them orders of magnitude slower than fp32: 2048² there took minutes per matmul."""
    a = torch.ones(512, 512, dtype=dtype)
    out = torch.empty(512, 512, dtype=dtype)
    fastest = float("inf")
    for _ in range(4):  # the first call pays the kernel's set-up
        start = time.perf_counter()
        torch.matmul(a, a, out=out)
        fastest = min(fastest, time.perf_counter() - start)
    rate = 2.0 * 512**3 / max(fastest, 1e-9)  # FLOP/s
    return [512] + [size for size in (1024, 2048) if 2.0 * size**3 / rate <= budget]


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

    Best of 5 rounds at each of up to three sizes (about 2 s). Cached per CPU model, thread count, torch version and dtype,
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
    runs = [_measure_matmul(torch_dtype, size, seconds=0.6) for size in _matmul_sizes(torch_dtype)]
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
        row = gpu_peak_row(name)
        if row is None:
            return None, f"{name}: not in the peak table, MFU n/a (set CODEPARROT_PEAK_TFLOPS to its dense peak)"
        if half:
            return row.bf16, f"{name}: {row.source}, dense bf16"
        if _tf32_enabled():
            return row.tf32, f"{name}: {row.source}, dense TF32"
        return row.fp32, f"{name}: {row.source}, fp32"
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

"""Stages `device`, `ceilings`, `attention` and `loss`: what the hardware and the recipe's kernels reach."""

from __future__ import annotations

import functools
import platform
import time
from statistics import median
from typing import Callable

import torch
import torch.nn.functional as F

from codeparrot.errors import first_line
from codeparrot.tools.gpu_check.config import Shapes
from codeparrot.training.loss import linear_cross_entropy_sum
from codeparrot.training.mfu import peak_flops
from codeparrot.training.reporting import memory_gib

MFU_CONVENTION = ("PaLM appendix B: 6N + 12·L·H·Q·T FLOPs per token, N = all weights but the position "
                  "embeddings (tied LM head counted once), against the dense bf16 peak of one device")


def step_dtype(device: torch.device) -> torch.dtype:
    """The dtype every training step here runs its matmuls in: bf16 on a GPU, fp32 on a CPU (--smoke), whose
    bf16 matmuls may be emulated so slowly that measuring their peak alone takes minutes."""
    return torch.bfloat16 if device.type == "cuda" else torch.float32


@functools.lru_cache(maxsize=None)
def device_peak(device: torch.device) -> tuple[float | None, str]:
    """(peak FLOP/s, its source) at `step_dtype`, once per process: on a CPU every `peak_flops` call measures
    again while the machine looks busy (2-3 s of CPU each, and the suite keeps the machine busy)."""
    return peak_flops(device, step_dtype(device))


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_ms(fn: Callable[[], object], device: torch.device, repeats: int = 10, warmup: int = 2) -> float:
    """Median wall milliseconds of `fn` (device work included), after `warmup` calls."""
    for _ in range(warmup):
        fn()
    sync(device)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        sync(device)
        times.append(1000 * (time.perf_counter() - start))
    return median(times)


def reset_peak_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def peak_memory_gib(device: torch.device) -> float | None:
    """The training log's peak-memory figure on CUDA; None on a CPU (the process's RSS says nothing per variant)."""
    return memory_gib(device) if device.type == "cuda" else None


def short_error(err: BaseException) -> str:
    return f"{type(err).__name__}: {first_line(err, '')[:160]}"


def device_stage(device: torch.device, shapes: Shapes) -> dict:
    import accelerate
    import transformers

    dtype = step_dtype(device)
    peak, source = device_peak(device)
    info = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
            "transformers": transformers.__version__, "accelerate": accelerate.__version__,
            "device": str(device), "peak_dtype": str(dtype).removeprefix("torch."),
            "peak_tflops": None if peak is None else peak / 1e12, "peak_source": source,
            "mfu_convention": MFU_CONVENTION, "model_preset": shapes.model_preset.name}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info.update(name=props.name, capability=f"{props.major}.{props.minor}", memory_gib=props.total_memory / 2**30,
                    multiprocessors=props.multi_processor_count, cudnn=torch.backends.cudnn.version())
        try:
            import triton

            info["triton"] = triton.__version__
        except ImportError:
            info["triton"] = None
    else:
        info["name"] = platform.processor() or platform.machine()
    return info


def ceilings_stage(device: torch.device, shapes: Shapes) -> dict:
    """bf16 GEMM rate on a large square product, and device-memory copy bandwidth (read + write counted)."""
    n = shapes.gemm_size
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    gemm_ms = time_ms(lambda: a @ b, device, repeats=20, warmup=3)
    src = torch.empty(shapes.copy_mib * 2**20, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    copy_ms = time_ms(lambda: dst.copy_(src), device, repeats=20, warmup=3)
    return {"gemm_size": n, "gemm_bf16_tflops": 2 * n**3 / (gemm_ms / 1000) / 1e12,
            "copy_mib": shapes.copy_mib, "copy_gb_s": 2 * src.numel() / (copy_ms / 1000) / 1e9}


def attention_stage(device: torch.device, shapes: Shapes, heads: int, head_dim: int) -> list[dict]:
    """Forward + backward of SDPA at the training shape [B, H, T, Q], per backend, dropout and masking."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    shape = (shapes.attention_batch, heads, shapes.seq_length, head_dim)
    q, k, v = (torch.randn(shape, device=device, dtype=dtype, requires_grad=True) for _ in range(3))
    mask = torch.ones(shapes.seq_length, shapes.seq_length, device=device, dtype=torch.bool).tril()
    # causal attention does half of the 4·B·H·T²·Q matmul FLOPs of the full product (forward); backward is 2×
    flops = 3 * 4 * shape[0] * heads * shapes.seq_length**2 * head_dim
    rows = []
    backends = [("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION),
                ("efficient", SDPBackend.EFFICIENT_ATTENTION), ("math", SDPBackend.MATH)]
    for name, backend in backends:
        for dropout in (0.0, 0.1):
            for masking in ("causal", "masked"):
                def step():
                    kwargs = {"is_causal": True} if masking == "causal" else {"attn_mask": mask}
                    out = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, **kwargs)
                    out.sum().backward()

                row = {"backend": name, "dropout": dropout, "masking": masking}
                try:
                    with sdpa_kernel(backend):
                        ms = time_ms(step, device, repeats=5, warmup=1)
                    row.update(ms=ms, tflops=flops / 2 / (ms / 1000) / 1e12)  # useful (causal) FLOPs
                except RuntimeError as err:  # the backend does not support this case on this device
                    row["error"] = short_error(err)
                rows.append(row)
    return rows


def loss_stage(device: torch.device, shapes: Shapes, width: int) -> list[dict]:
    """LM head + cross-entropy over one micro-batch of tokens, forward + backward, in bf16 (fp32 on a CPU)."""
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    gen = torch.Generator(device="cpu").manual_seed(0)
    hidden = (torch.randn(shapes.loss_rows, width, generator=gen) * 0.5).to(device)
    weight = (torch.randn(shapes.vocab_size, width, generator=gen) * 0.02).to(device)
    targets = torch.randint(0, shapes.vocab_size, (shapes.loss_rows,), generator=gen).to(device)

    def reference():  # fp32, materialized logits: the number every variant is compared with
        return F.cross_entropy(hidden.double() @ weight.double().t(), targets, reduction="sum").item()

    exact = reference()

    def hugging_face(h, w):
        with torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32):
            logits = h @ w.t()  # [N, V]: what the model's own head writes
        return F.cross_entropy(logits.float(), targets, reduction="sum")

    def fused(compiled: bool):
        def run(h, w):  # the autocast sets the matmul dtype, as FusedHead does in training
            with torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32):
                return linear_cross_entropy_sum(h, w, targets, compiled=compiled)[0]
        return run

    rows = []
    for name, fn in (("Hugging Face (materialized logits)", hugging_face), ("fused, eager softmax", fused(False)),
                     ("fused, compiled softmax", fused(True))):
        h = hidden.clone().requires_grad_()
        w = weight.clone().requires_grad_()

        def step():
            h.grad = w.grad = None
            fn(h, w).backward()

        row = {"variant": name}
        try:
            value = fn(h, w).item()
            reset_peak_memory(device)
            row.update(ms=time_ms(step, device, repeats=5, warmup=1), peak_memory_gib=peak_memory_gib(device),
                       relative_error=abs(value - exact) / abs(exact))
        except Exception as err:  # noqa: BLE001 - e.g. out of memory: recorded, the stage goes on
            row["error"] = short_error(err)
        rows.append(row)
    return rows

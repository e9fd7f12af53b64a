"""Stage `profile`: where a training step's device time goes, kernel by kernel and by class.

The default variant (compiled per block, the recipe's micro-batch) is warmed up, timed over `steps` plain steps
(its tokens/s and MFU: the figure the `jax` stage compares with), then 3 steps (`Shapes.profiled_steps`; 1 in
`--smoke`) run under torch.profiler. On CUDA the tables hold device (kernel) time; elsewhere, CPU operator self
time, which exercises the same code in `--smoke` (where the eager variant is profiled: an inductor compile on a
CPU costs more than the whole stage).
"""

from __future__ import annotations

import re
import time
from dataclasses import replace
from statistics import median

import torch

from codeparrot.tools.gpu_check.config import GpuCheckConfig, Shapes
from codeparrot.tools.gpu_check.kernels import device_peak, sync
from codeparrot.tools.gpu_check.train_steps import StepRunner, variants_for
from codeparrot.training.mfu import mfu

TOP_KERNELS = 15
NAME_WIDTH = 80  # characters of a shortened kernel name in the tables

KERNEL_CLASSES = [  # first match wins; matched against lower-cased kernel / operator names
    ("attention", r"flash|fmha|attention|sdpa|cudnn.*(attn|mha)"),
    ("matmul (GEMM)", r"gemm|cutlass|xmma|matmul|\bmm\b|addmm|bmm|sm90|sm80|nvjet|cublas|aten::mm|aten::linear"),
    ("optimizer", r"multi_tensor|adam|foreach"),
    ("fused by inductor (triton)", r"^triton_|triton"),
    ("reduction / softmax / norm", r"reduce|softmax|norm|sum|amax|max_|logsumexp"),
    ("memory copy / fill", r"memcpy|memset|copy|fill|cat|clone|contiguous"),
    ("elementwise", r"elementwise|vectorized|unrolled|gelu|dropout|add|mul|exp|where|tanh|pow"),
]


def kernel_class(name: str) -> str:
    lowered = name.lower()
    for label, pattern in KERNEL_CLASSES:
        if re.search(pattern, lowered):
            return label
    return "other"


def short_kernel_name(name: str, width: int = NAME_WIDTH) -> str:
    """A CUDA kernel's demangled C++ name cut to what tells kernels apart: no `void`, no parameter lists, no
    lambda and operator() noise, no namespaces; the template arguments kept (they name the functor or tile
    shape), then cut to `width` characters. `void at::native::vectorized_elementwise_kernel<4,
    at::native::FillFunctor<float>, std::array<char*, 1ul> >(int, ...)` becomes
    `vectorized_elementwise_kernel<4, FillFunctor<float>, array<char*, 1ul>>`."""
    short = re.sub(r"^void\s+", "", name.strip()).replace("(anonymous namespace)::", "")
    while True:  # parameter lists, innermost first (they nest inside template arguments)
        shorter = re.sub(r"\([^()]*\)", "", short)
        if shorter == short:
            break
        short = shorter
    short = re.sub(r"::\{lambda#?\d*\}|\{lambda#?\d*\}::|::operator\s*const|::operator\b", "", short)
    short = re.sub(r"\b[A-Za-z_]\w*::", "", short)  # namespaces and enclosing classes
    short = re.sub(r"\s+", " ", short).replace(" >", ">").strip()
    return short if len(short) <= width else short[:width - 1] + "…"


def kernel_tables(events, steps: int, cuda: bool) -> dict:
    """By class and the top kernels from `prof.key_averages()`: device time of CUDA events on CUDA, CPU operator
    self time elsewhere. Shares are of the total of that time over all events."""
    times: dict[str, tuple[float, int]] = {}  # name: (microseconds, calls)
    for event in events:
        if cuda and event.device_type != torch.autograd.DeviceType.CUDA:
            continue
        us = event.self_device_time_total if cuda else event.self_cpu_time_total
        if us <= 0:
            continue
        total_us, calls = times.get(event.key, (0.0, 0))
        times[event.key] = (total_us + us, calls + event.count)
    total = sum(us for us, _ in times.values()) or 1.0
    by_class: dict[str, float] = {}
    for name, (us, _) in times.items():
        by_class[kernel_class(name)] = by_class.get(kernel_class(name), 0.0) + us
    top = sorted(times.items(), key=lambda kv: -kv[1][0])[:TOP_KERNELS]
    return {"ms_per_step": total / 1000 / steps, "kernels_seen": len(times),
            "classes": [{"class": k, "ms_per_step": v / 1000 / steps, "share": v / total}
                        for k, v in sorted(by_class.items(), key=lambda kv: -kv[1])],
            "top_kernels": [{"kernel": short_kernel_name(name), "name": name, "class": kernel_class(name),
                             "calls_per_step": calls / steps, "ms_per_step": us / 1000 / steps, "share": us / total}
                            for name, (us, calls) in top]}


def profile_stage(shapes: Shapes, device: torch.device, cfg: GpuCheckConfig) -> dict:
    from torch.profiler import ProfilerActivity, profile

    cuda = device.type == "cuda"
    variants = variants_for(replace(cfg, variants=[]), shapes)
    variant = variants[0] if cuda else next(v for v in variants if v.compile == "off" and v.attn != "sdpa")
    runner = StepRunner(variant, shapes, device)
    for _ in range(max(cfg.warmup_steps, 1)):
        runner.step()
    sync(device)
    times = []
    for _ in range(cfg.steps):  # plain steps first: the profiler's own overhead is in none of them
        t0 = time.perf_counter()
        runner.step()
        sync(device)
        times.append(time.perf_counter() - t0)
    tokens_per_s = runner.tokens_per_step / median(times)
    peak, _ = device_peak(device)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        for _ in range(shapes.profiled_steps):
            runner.step()
        sync(device)
    return {"variant": variant.name, "micro_batch": variant.micro_batch, "seq_length": shapes.seq_length,
            "tokens_per_s": tokens_per_s, "mfu": mfu(tokens_per_s, runner.flops_per_token, peak),
            "steps": shapes.profiled_steps, "time_kind": "device" if cuda else "cpu op self",
            **kernel_tables(prof.key_averages(), shapes.profiled_steps, cuda)}

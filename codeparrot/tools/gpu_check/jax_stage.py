"""Stage `jax`: this project's training step against a plain-JAX peer of the same model, on the same device.

The peer (jax_step.py) runs in a child process under `--jax-python` (default: this interpreter), with the
preset's shape and vocabulary, its dropout, the same micro-batch and sequence length, bf16 matmuls on a GPU:
the dtype every torch stage here uses on this device. The torch figure it is compared with is the `profile`
stage's timed steps of this call (the default variant: compiled per block, at the recipe's micro-batch), or,
when that stage did not run, the same variant measured here first (before JAX takes GPU memory).

The ratio reported is this project's tokens/s ÷ JAX's, per JAX variant: above 1, the recipe is faster.
Without jax where the child runs (the project's own environment: JAX is not a dependency), the stage is
skipped with that note; so is a jax that sees no GPU when torch does.
"""

from __future__ import annotations

import gc
import importlib.util
import json
import os
import subprocess
import sys
import time
from dataclasses import replace

import torch

from codeparrot.repository.model import count_parameters, gpt2_config
from codeparrot.tools.gpu_check.config import REPO_ROOT, GpuCheckConfig, Shapes
from codeparrot.tools.gpu_check.jax_step import MARK
from codeparrot.tools.gpu_check.kernels import device_peak
from codeparrot.tools.gpu_check.train_steps import measure_variant, variants_for
from codeparrot.training.mfu import mfu


def jax_spec(shapes: Shapes, preset, cfg: GpuCheckConfig, cuda: bool) -> dict:
    return {"vocab_size": shapes.vocab_size, "n_positions": preset.n_positions, "seq_length": shapes.seq_length,
            "n_layer": preset.n_layer, "n_embd": preset.n_embd, "n_head": preset.n_head,
            "dropout": preset.resid_pdrop, "micro_batch": shapes.micro_batches[0], "steps": cfg.steps,
            "warmup_steps": cfg.warmup_steps, "dtype": "bfloat16" if cuda else "float32",
            "attention": ["softmax", "fused"], "need_gpu": cuda, "seed": 0}


def run_peer(python: str, spec: dict, deadline: float) -> tuple[list[dict], str | None]:
    """(the child's `GPU_CHECK_JAX` entries, why it stopped early or None); killed at `deadline`, keeping the
    rows it printed by then."""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "XLA_PYTHON_CLIENT_PREALLOCATE": "false",  # JAX would take 75% of the GPU torch also holds memory on
           "TF_CPP_MIN_LOG_LEVEL": "2"}
    command = [python, "-m", "codeparrot.tools.gpu_check.jax_step", json.dumps(spec)]
    stopped = None
    try:
        done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=REPO_ROOT,
                              timeout=max(deadline - time.monotonic(), 1))
        out, err, code = done.stdout, done.stderr, done.returncode
    except FileNotFoundError:
        return [{"skipped": f"skipped: --jax-python {python} does not exist"}], None
    except subprocess.TimeoutExpired as expired:
        out = expired.stdout.decode(errors="replace") if isinstance(expired.stdout, bytes) else expired.stdout or ""
        err, code, stopped = "", 0, "time budget spent: the JAX process was killed"
    entries = [json.loads(line[len(MARK):]) for line in out.splitlines() if line.startswith(MARK)]
    if code != 0 and stopped is None:
        tail = [line for line in err.strip().splitlines() if line.strip()][-1:] or ["no output"]
        stopped = f"the JAX process exited {code}: {tail[0][:200]}"
    return entries, stopped


def torch_reference(results: dict, shapes: Shapes, device: torch.device, cfg: GpuCheckConfig) -> dict:
    """The torch figure at the JAX step's shape: the profile stage's of this call when it measured one."""
    prof = results.get("stages", {}).get("profile", {})
    fresh = prof.get("result") and prof.get("date") == results.get("run", {}).get("date")  # this call's
    if fresh and prof["result"].get("tokens_per_s") and prof["result"].get("micro_batch") == shapes.micro_batches[0]:
        return {"source": f"profile stage: {prof['result']['variant']}", "tokens_per_s": prof["result"]["tokens_per_s"],
                "mfu": prof["result"].get("mfu")}
    variant = variants_for(replace(cfg, variants=[]), shapes)[0]
    row = measure_variant(variant, shapes, device, cfg)
    return {"source": f"measured here: {variant.name}", "tokens_per_s": row.get("tokens_per_s"), "mfu": row.get("mfu"),
            **({"error": row["error"]} if "error" in row else {})}


def jax_stage(results: dict, shapes: Shapes, preset, device: torch.device, cfg: GpuCheckConfig,
              deadline: float) -> dict:
    cuda = device.type == "cuda"
    python = cfg.jax_python or sys.executable
    spec = jax_spec(shapes, preset, cfg, cuda)
    if python == sys.executable and importlib.util.find_spec("jax") is None:  # the project's own environment
        return {"skipped": f"skipped: jax is not importable by {python} (not a dependency of this project; "
                           "--jax-python names an interpreter that has it)"}
    reference = torch_reference(results, shapes, device, cfg)
    if cuda:
        gc.collect()
        torch.cuda.empty_cache()  # what torch's allocator keeps cached is JAX's to use
    entries, stopped = run_peer(python, spec, deadline)
    if entries and "skipped" in entries[0]:
        return {"skipped": entries[0]["skipped"]}
    peak, _ = device_peak(device)
    rows = []
    for entry in entries:
        if "row" not in entry:
            continue
        row = entry["row"]
        if "tokens_per_s" in row:
            row["mfu"] = mfu(row["tokens_per_s"], row["flops_per_token"], peak)
            row["loss_fell"] = row["last_loss"] < row["first_loss"]
            if reference.get("tokens_per_s"):
                row["torch_over_jax"] = reference["tokens_per_s"] / row["tokens_per_s"]
        rows.append(row)
    info = next((e["info"] for e in entries if "info" in e), {})
    torch_params = count_parameters(gpt2_config(preset, shapes.vocab_size, 0, 0, 0))
    return {"python": python, **info, "torch": reference, "torch_parameters": torch_params, "rows": rows,
            **({"stopped": stopped} if stopped else {})}

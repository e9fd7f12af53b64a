"""Run the chosen stages in order, each within its time budget, saving after every stage."""

from __future__ import annotations

import shlex
import sys
import tempfile
import time
from pathlib import Path

import torch

from codeparrot.tools.gpu_check.config import GpuCheckConfig, shapes_for
from codeparrot.tools.gpu_check.end_to_end import end_to_end_stage
from codeparrot.tools.gpu_check.kernels import attention_stage, ceilings_stage, device_stage, loss_stage, short_error
from codeparrot.tools.gpu_check.report import load_results, save_results
from codeparrot.tools.gpu_check.train_steps import measure_variant, profile_stage, variants_for


def run_gpu_check(cfg: GpuCheckConfig) -> dict:
    """Returns the merged results; a stage that fails is recorded with its error and the next one runs."""
    cfg.validate()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True  # as train() does
    elif not cfg.smoke:
        print("warning: no CUDA device: the full check on a CPU takes hours; use --smoke to check the tool",
              file=sys.stderr)
    shapes = shapes_for(cfg)
    from codeparrot.repository.model import load_model_config

    preset = load_model_config(str(shapes.model_preset))
    out = Path(cfg.output_dir)
    results = load_results(out)
    results["run"] = {"command": "python scripts/gpu_check.py " + shlex.join(sys.argv[1:]), "smoke": cfg.smoke,
                      "date": time.strftime("%Y-%m-%d %H:%M:%S")}
    results.setdefault("stages", {})
    for stage in cfg.stages:
        start = time.perf_counter()
        print(f"gpu_check: {stage} ...", file=sys.stderr, flush=True)
        try:
            if stage == "device":
                result = device_stage(device, shapes)
            elif stage == "ceilings":
                result = ceilings_stage(device, shapes)
            elif stage == "attention":
                result = attention_stage(device, shapes, preset.n_head, preset.n_embd // preset.n_head)
            elif stage == "loss":
                result = loss_stage(device, shapes, preset.n_embd)
            elif stage == "train_step":
                result = []
                for variant in variants_for(cfg, shapes):
                    if time.perf_counter() - start > 60 * cfg.stage_minutes:
                        result.append({"variant": variant.name, "skipped": "not run: stage time budget spent"})
                        continue
                    result.append(measure_variant(variant, shapes, device, cfg))
                    print(f"  {result[-1]}", file=sys.stderr, flush=True)
            elif stage == "profile":
                result = profile_stage(shapes, device, cfg)
            else:
                with tempfile.TemporaryDirectory(prefix="gpu_check_e2e_") as tmp:
                    deadline = time.monotonic() + 60 * cfg.stage_minutes - (time.perf_counter() - start)
                    result = end_to_end_stage(Path(tmp), shapes, deadline)
            results["stages"][stage] = {"result": result, "seconds": time.perf_counter() - start}
        except Exception as err:  # noqa: BLE001 - one stage's failure must not lose the others' figures
            results["stages"][stage] = {"error": short_error(err), "seconds": time.perf_counter() - start}
        save_results(out, results)
        print(f"gpu_check: {stage} done in {time.perf_counter() - start:.0f} s", file=sys.stderr, flush=True)
    print(f"results: {out / 'gpu_check.json'} and {out / 'gpu_check.md'}", file=sys.stderr)
    return results

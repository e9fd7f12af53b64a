"""Run the chosen stages in order within the call's time budget (`--minutes`), saving after every stage.

The budget: a stage starts only while more than its floor (config.STAGE_FLOOR_S: the least time it needs to
give any figure; none in `--smoke`) is left; otherwise it is recorded as "skipped: time budget spent", never
estimated, and an earlier call's figures for it are kept. A stage that starts gets the rest of the budget (at
most `--stage-minutes`) as its deadline: the training CLI runs and the JAX process are killed there, and the
stages that loop (training-step variants, the 1.5B search) start nothing new after it.

The budget counts from the start of the call (`started`: scripts/gpu_check.py's main(), before torch is imported)
and is a hard limit: work that no deadline check reaches (a compile, the profiled steps, a training-step variant
or 1.5B measurement started just before the end) is stopped ALARM_GRACE_S after it (`budget_alarm`: SIGALRM
raises `BudgetSpent` in the stage; the grace lets the stages that honour their deadline end on their own first),
the stage is recorded as skipped (or keeps the rows it has, where it records errors per row) and the call
ends: a `timeout` half a minute longer than --minutes around the call never has to kill it, which would lose
the stage under way and leave a training CLI run (its own process group) on the GPU.
"""

from __future__ import annotations

import contextlib
import gc
import shlex
import signal
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from codeparrot.tools.gpu_check.config import GpuCheckConfig, Shapes, shapes_for
from codeparrot.tools.gpu_check.end_to_end import end_to_end_stage, prepare
from codeparrot.tools.gpu_check.headline import headline_stage
from codeparrot.tools.gpu_check.jax_stage import jax_stage
from codeparrot.tools.gpu_check.kernel_profile import profile_stage
from codeparrot.tools.gpu_check.kernels import attention_stage, ceilings_stage, device_stage, loss_stage, short_error
from codeparrot.tools.gpu_check.large_model import large_model_stage
from codeparrot.tools.gpu_check.report import load_results, save_results
from codeparrot.tools.gpu_check.train_steps import measure_variant, variants_for

SKIPPED = "skipped: time budget spent"
ALARM_GRACE_S = 5.0  # after the budget's end: then a stage still running is stopped (`budget_alarm`)
ALARM_REPEAT_S = 5.0  # BudgetSpent again this often while a stage that caught it still runs


class BudgetSpent(RuntimeError):
    """The call's budget (--minutes) ran out while a stage was running (`budget_alarm`). A RuntimeError, so that
    the places that record a CLI run or a variant cut short by the budget (headline rows, training-step variants)
    record this one as such and go on to their own deadline checks."""


@contextlib.contextmanager
def budget_alarm(deadline: float):
    """While the block runs, SIGALRM at `deadline` (time.monotonic()) raises BudgetSpent in it, and again every
    ALARM_REPEAT_S seconds, should the stage catch it and go on. Main thread only (signals reach no other);
    an alarm set before (pytest-timeout's) is restored afterwards."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    armed = True

    def ring(signum, frame):
        if armed:  # a signal handled after the block ended raises nothing
            raise BudgetSpent(f"time budget spent (--minutes): stopped after {time.monotonic() - began:.0f} s")

    began = time.monotonic()
    previous = signal.signal(signal.SIGALRM, ring)
    before = signal.setitimer(signal.ITIMER_REAL, max(deadline - began, 1e-3), ALARM_REPEAT_S)
    try:
        yield
    finally:
        while True:  # an alarm landing before `armed` is cleared raises here: clean up all the same
            try:
                armed = False
                signal.setitimer(signal.ITIMER_REAL, 0)
                break
            except BudgetSpent:
                continue
        signal.signal(signal.SIGALRM, signal.SIG_DFL if previous is None else previous)
        if before[0] > 0:  # another alarm was pending: it keeps what was left of its delay
            signal.setitimer(signal.ITIMER_REAL, max(before[0] - (time.monotonic() - began), 1e-3), before[1])


@dataclass
class Context:
    """What the stages of one call share: the device, the shapes, the results so far, a scratch folder, and
    the tokenizer + model + tokens that the CLI stages train on (made once, by the first that needs them)."""

    cfg: GpuCheckConfig
    shapes: Shapes
    preset: Any  # the model preset's ModelConfig
    device: torch.device
    results: dict
    scratch: Path
    _prepared: tuple[Path, Path] | None = field(default=None, repr=False)

    def prepared(self) -> tuple[Path, Path]:
        if self._prepared is None:
            self._prepared = prepare(self.scratch / "data", self.shapes)
        return self._prepared


def train_step_stage(ctx: Context, deadline: float) -> list[dict]:
    rows = []
    for variant in variants_for(ctx.cfg, ctx.shapes):
        if time.monotonic() >= deadline:
            rows.append({"variant": variant.name, "skipped": "not run: stage time budget spent"})
            continue
        rows.append(measure_variant(variant, ctx.shapes, ctx.device, ctx.cfg))
        print(f"  {rows[-1]}", file=sys.stderr, flush=True)
    return rows


def stage_functions(ctx: Context) -> dict[str, Callable[[float], Any]]:
    """{stage: run(deadline) -> its result}; a result that is only {"skipped": reason} marks the stage skipped."""
    dev, shapes, cfg, preset = ctx.device, ctx.shapes, ctx.cfg, ctx.preset
    cuda = dev.type == "cuda"
    return {
        "device": lambda deadline: device_stage(dev, shapes),
        "headline": lambda deadline: headline_stage(ctx.scratch, shapes, ctx.prepared(), cuda, deadline),
        "profile": lambda deadline: profile_stage(shapes, dev, cfg),
        "model_1_5b": lambda deadline: large_model_stage(shapes, dev, cfg, deadline),
        "jax": lambda deadline: jax_stage(ctx.results, shapes, preset, dev, cfg, deadline),
        "ceilings": lambda deadline: ceilings_stage(dev, shapes),
        "attention": lambda deadline: attention_stage(dev, shapes, preset.n_head, preset.n_embd // preset.n_head),
        "loss": lambda deadline: loss_stage(dev, shapes, preset.n_embd),
        "train_step": lambda deadline: train_step_stage(ctx, deadline),
        "end_to_end": lambda deadline: end_to_end_stage(ctx.scratch, shapes, deadline, ctx.prepared()),
    }


def release(device: torch.device) -> None:
    """What a stage left behind, freed before the next: its models (an Accelerator holds them in reference
    cycles), dynamo's compiled graphs, and the blocks torch's allocator caches (the 1.5B stage leaves tens of GiB
    there, which the training CLI's process and JAX's would otherwise not get)."""
    torch._dynamo.reset()  # first: its caches may be what still reaches a model
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def skip(results: dict, stage: str, reason: str, date: str) -> None:
    """Record `stage` as skipped, unless an earlier call measured it: its figures stay (a budget-cut call never
    erases what a longer one found)."""
    earlier = results["stages"].get(stage, {})
    if "result" in earlier:
        print(f"gpu_check: {stage} {reason}; the figures of {earlier.get('date', 'an earlier call')} are kept",
              file=sys.stderr)
        return
    results["stages"][stage] = {"skipped": reason, "seconds": 0.0, "date": date}


def run_gpu_check(cfg: GpuCheckConfig, started: float | None = None) -> dict:
    """Returns the merged results; a stage that fails is recorded with its error and the next one runs. `started`:
    time.monotonic() when the call started (the budget counts from it; default: now)."""
    cfg.validate()
    run_deadline = (time.monotonic() if started is None else started) + 60 * cfg.minutes
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cuda":
        from codeparrot.training.fast_path import configure_cuda_allocator

        configure_cuda_allocator()  # as train() does, before the first CUDA allocation
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True  # as train() does
    elif not cfg.smoke:
        print("warning: no CUDA device: the full check on a CPU takes hours; use --smoke to check the tool",
              file=sys.stderr)
    shapes = shapes_for(cfg)
    if device.type == "cpu" and shapes.cpu_threads:
        torch.set_num_threads(shapes.cpu_threads)
    from codeparrot.repository.model import load_model_config

    out = Path(cfg.output_dir)
    results = load_results(out)
    date = time.strftime("%Y-%m-%d %H:%M:%S")
    results["run"] = {"command": "python scripts/gpu_check.py " + shlex.join(sys.argv[1:]), "smoke": cfg.smoke,
                      "date": date, "minutes": cfg.minutes}
    results.setdefault("stages", {})
    with tempfile.TemporaryDirectory(prefix="gpu_check_") as scratch:
        ctx = Context(cfg, shapes, load_model_config(str(shapes.model_preset)), device, results, Path(scratch))
        functions = stage_functions(ctx)
        for stage in cfg.stages:
            now = time.monotonic()
            left, floor = run_deadline - now, cfg.floor_seconds(stage)
            if left <= max(floor, 0.0):
                skip(results, stage, SKIPPED + (f" ({max(left, 0):.0f} s left of --minutes {cfg.minutes:g}; the stage "
                                                 f"needs at least {floor:.0f} s)" if floor else ""), date)
                save_results(out, results)
                print(f"gpu_check: {stage} {SKIPPED}", file=sys.stderr, flush=True)
                continue
            print(f"gpu_check: {stage} ... ({left:.0f} s of the budget left)", file=sys.stderr, flush=True)
            start = time.perf_counter()
            try:
                with budget_alarm(run_deadline + ALARM_GRACE_S):
                    result = functions[stage](min(run_deadline, now + 60 * cfg.stage_minutes))
                entry = {"skipped": result["skipped"]} if isinstance(result, dict) and set(result) == {"skipped"} \
                    else {"result": result}
            except Exception as err:  # noqa: BLE001 - one stage's failure must not lose the others' figures
                stopped = isinstance(err, BudgetSpent) or time.monotonic() >= run_deadline  # (maybe wrapped)
                why = "" if isinstance(err, BudgetSpent) else f": {short_error(err)}"  # what ended it, if not the alarm
                entry = {"skipped": f"{SKIPPED}: stopped after {time.perf_counter() - start:.0f} s of the stage "
                                    f"(--minutes {cfg.minutes:g}){why}"} if stopped else {"error": short_error(err)}
            entry.update(seconds=time.perf_counter() - start, date=date)
            if "skipped" in entry:
                skip(results, stage, entry["skipped"], date)
            else:
                results["stages"][stage] = entry
            save_results(out, results)
            release(device)
            print(f"gpu_check: {stage} done in {time.perf_counter() - start:.0f} s", file=sys.stderr, flush=True)
    print(f"results: {out / 'gpu_check.json'} and {out / 'gpu_check.md'}", file=sys.stderr)
    return results

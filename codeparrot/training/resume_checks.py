"""Where a resumed run starts: one checkpoint for every process, saved under a setup this run can load.

A resume starts every process from the checkpoint the main process chose (`choose_resume`), saved under a setup
this run can load (`check_resume_setup`); see their docstrings.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

from accelerate.utils import broadcast_object_list, gather_object

from codeparrot.errors import CodeParrotError, first_line
from codeparrot.training.checkpointing import (
    TRAINING_STATE,
    TrainerState,
    read_state,
    resolve_resume,
    verify_checkpoint,
)


class ResumePoint(NamedTuple):
    checkpoint: Path | None  # None: start at step 0
    state: TrainerState | None  # the checkpoint's
    finished: bool = False  # it reached max_steps and the run's final model exists: nothing left to train


def resume_point(resume: str | None, run_dir: str | os.PathLike, world: int, max_steps: int,
                 report: Callable[[str], Any] = print) -> ResumePoint:
    """Where this run starts (`resolve_resume`, then the checks on the chosen checkpoint), decided by one process."""
    checkpoint = resolve_resume(resume, run_dir, report=report)
    if checkpoint is None:
        return ResumePoint(None, None)
    state = read_state(checkpoint)
    if state.world_size != world:
        raise CodeParrotError(f"{checkpoint} was written by {state.world_size} processes; resume it with that many, "
                              f"not {world} (each process has its own data position)")
    return ResumePoint(checkpoint, state, state.step >= max_steps and (Path(run_dir) / "final").is_dir())


def choose_resume(resume: str | None, run_dir: str | os.PathLike, *, world: int, main: bool, max_steps: int,
                  report: Callable[[str], Any] = print, broadcast: Callable[[Any], Any] | None = None,
                  gather: Callable[[Any], list] | None = None) -> ResumePoint:
    """`resume_point` as the main process decides it, the same on every process.

    Processes that each resolved `--resume auto` themselves could pick different checkpoints (a shared
    filesystem's attribute cache, a checkpoint being published or pruned meanwhile) and train on from
    mismatched states without a word. So the main process decides alone and sends its decision (or its one-line
    error) to the others, which check that they can use that folder (`unusable_here`). Any problem is the same
    one-line error on every process, raised after the last collective: none is left waiting for another.
    `broadcast(obj)` returns the main process's obj, `gather(obj)` every process's (default: Accelerate's)."""
    if resume is None:
        return ResumePoint(None, None)
    if world == 1:
        return resume_point(resume, run_dir, world, max_steps, report)
    broadcast = broadcast or (lambda obj: broadcast_object_list([obj])[0])
    gather = gather or (lambda obj: gather_object([obj]))
    decision: ResumePoint | str | None = None
    if main:
        try:
            decision = resume_point(resume, run_dir, world, max_steps, report)
        except CodeParrotError as err:
            decision = str(err)
        except Exception as err:  # a bug: its traceback here, one line on the others (which must not wait)
            broadcast(f"the main process failed to choose the checkpoint to resume ({type(err).__name__}: "
                      f"{first_line(err)})")
            raise
    decision = broadcast(decision)
    if isinstance(decision, str):
        raise CodeParrotError(decision)
    if decision.checkpoint is None:
        return decision
    problem = None
    if not main:
        try:
            problem = unusable_here(decision.checkpoint, decision.state.step)
        except Exception as err:  # noqa: BLE001 - any reason: reported by every process, after the gather
            problem = f"{type(err).__name__}: {first_line(err)}"
    problems = [f"process {rank}: {text}" for rank, text in enumerate(gather(problem)) if text]
    if problems:
        raise CodeParrotError(f"cannot resume from {decision.checkpoint}, the checkpoint the main process chose: "
                              f"{'; '.join(problems)} (every process must see the run folder as the main process "
                              "does: one shared filesystem)")
    return decision


def unusable_here(checkpoint: Path, step: int) -> str | None:
    """Why this process cannot resume from `checkpoint`, which the main process verified as the checkpoint of
    `step` (None when it can): the folder, its trainer state or a file it needs missing here, another step, a
    file of another size. Sizes only: the main process checked the hashes."""
    try:
        seen = read_state(checkpoint).step
    except CodeParrotError as err:
        return str(err)
    if seen != step:
        return f"its trainer state says step {seen} here, step {step} on the main process"
    problems = verify_checkpoint(checkpoint, hashes=False)
    return f"{problems[0]}{f' (and {len(problems) - 1} more)' if len(problems) > 1 else ''}" if problems else None


def saved_setup(checkpoint: Path, state: TrainerState) -> dict:
    """The setup `checkpoint` was saved under (`checkpointing.run_setup`); for one saved before it was recorded,
    what its training_state/ files show (Accelerate's names: sharded or full FSDP model, DeepSpeed, scaler.pt)."""
    if state.setup:
        return state.setup
    folder = checkpoint / TRAINING_STATE
    names = {p.name for p in folder.iterdir()} if folder.is_dir() else set()
    kind, dict_type = None, None  # None: not sharded (NO, MULTI_GPU or MULTI_CPU; the files do not say which)
    if names & {"pytorch_model_fsdp_0", "optimizer_0"}:
        kind, dict_type = "FSDP", "SHARDED_STATE_DICT"
    elif "pytorch_model_fsdp.bin" in names:
        kind, dict_type = "FSDP", "FULL_STATE_DICT"
    elif any(name.startswith("pytorch_model_fsdp") for name in names):
        kind, dict_type = "FSDP", "LOCAL_STATE_DICT"
    elif "pytorch_model" in names:
        kind = "DEEPSPEED"
    return {"distributed_type": kind, "mixed_precision": None, "grad_scaler": "scaler.pt" in names,
            "fsdp_state_dict_type": dict_type}


def _sharding(setup: dict) -> str:
    """The distributed type as far as the files of training_state/ go: data-parallel types share one layout."""
    kind = setup.get("distributed_type")
    return kind if kind in ("FSDP", "DEEPSPEED") else "not sharded"


def check_resume_setup(checkpoint: Path, saved: dict, now: dict) -> list[str]:
    """One-line `CodeParrotError` when this run (`now`, `run_setup` of its Accelerator) cannot load the training
    state of `checkpoint`, saved under `saved` (`saved_setup`); else the settings that changed, in words.

    Refused, as Accelerate's `load_state` fails on them with a missing-file traceback: another sharding (DDP or
    one process <-> FSDP <-> DeepSpeed: the optimizer, and under FSDP the model, are stored per sharding) and
    another FSDP state-dict type (sharded folders vs full files), both seen with 2 CPU processes; fp16 from a
    checkpoint without a loss-scaler state (Accelerate loads scaler.pt for fp16; fp16 needs a GPU, not run).
    Allowed: the FSDP sharding strategy (torch.distributed.checkpoint reshards; resumed with 2 CPU processes),
    the FSDP version (recorded; not refused, as not tested), and other mixed-precision changes: weights and
    optimizer state are float32 under bf16 and no alike (resumed), an fp16 checkpoint's scaler state is unused."""
    fresh = (f"or start a new run from its weights (--model {checkpoint} --revision null --run_name NEW "
             "--checkpoint.push false: new optimizer)")
    was, has = _sharding(saved), _sharding(now)
    if was != has:
        saved_type = saved.get("distributed_type") or "not sharded (NO, MULTI_GPU or MULTI_CPU)"
        parts = "optimizer state and model" if "FSDP" in (was, has) else "optimizer state"
        raise CodeParrotError(f"cannot resume from {checkpoint}: it was saved under distributed type {saved_type}, "
                              f"this run is {now.get('distributed_type')}: the {parts} in its {TRAINING_STATE}/ "
                              "cannot be loaded under another; launch it with the Accelerate config it was saved "
                              f"with, {fresh}")
    if was == "FSDP" and saved.get("fsdp_state_dict_type") != now.get("fsdp_state_dict_type"):
        raise CodeParrotError(f"cannot resume from {checkpoint}: it was saved with fsdp_state_dict_type "
                              f"{saved.get('fsdp_state_dict_type')}, this run has {now.get('fsdp_state_dict_type')}: "
                              "its model and optimizer state are stored in that layout only; launch with "
                              f"fsdp_state_dict_type: {saved.get('fsdp_state_dict_type')} in the Accelerate config, "
                              f"{fresh}")
    if now.get("grad_scaler") and not saved.get("grad_scaler"):
        before = saved.get("mixed_precision")
        raise CodeParrotError(f"cannot resume from {checkpoint}: it was saved with mixed_precision "
                              f"{before or 'bf16 or no'}, this run has {now.get('mixed_precision')}, whose loss scaler "
                              "needs the state (scaler.pt) only an fp16 checkpoint holds; resume with "
                              f"--mixed_precision {before or 'bf16 (or no)'}, {fresh}")
    if saved.get("mixed_precision") and saved["mixed_precision"] != now.get("mixed_precision"):
        return [f"mixed_precision {saved['mixed_precision']} (the checkpoint's) -> {now.get('mixed_precision')} "
                "(this run's)"]
    return []

"""Training checkpoints: atomic `step-N/` folders that are both a loadable model and an exact resume point.

Layout of `<run dir>/checkpoints/step-N/`:

    config.json, model.safetensors,         the model as `save_pretrained` writes it (from_pretrained loads the
    generation_config.json, tokenizer*.json   folder itself) and its tokenizer: what is pushed to the run branch
    train_config.yaml                       the resolved TrainConfig of the run
    training_state/                         Accelerate's `save_state`: optimizer, scheduler, RNG states per
                                            process (+ the model itself under FSDP/DeepSpeed)
    training_state/data_rank{R}.pt          process R's DataLoader position (`state_dict()`)
    trainer_state.json                      step, tokens seen, processes, the non-finite guard's counters, the
                                            setup training_state/ depends on (`run_setup`)
    manifest.json                           size (and sha256, for files up to 256 MiB) of every other file;
                                            written LAST, after everything it describes

A checkpoint is written into `checkpoints/.step-N.partial` by every process, then renamed by the main process
once all have finished; `trainer_state.json` marks a complete folder and `manifest.json` lets a resume verify it
(`verify_checkpoint`: every file the resume needs, the sizes and hashes, a readable safetensors header). A kill at any moment therefore leaves
either the previous checkpoints untouched or a `.partial` folder that is ignored (and removed by the next save),
never a broken "latest". The model weights are stored once (in the Hugging Face format, not again by Accelerate).
All processes must see the same filesystem (one node, or a shared volume across nodes).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import yaml
from accelerate.utils import DistributedType, extract_model_from_parallel, load
from safetensors.torch import load_file

from codeparrot.atomic_io import (atomic_write_json, atomic_write_text, fsync_tree, publish_dir,
                                  remove_stale_temporaries)
from codeparrot.errors import CodeParrotError, first_line
from codeparrot.repository.model import save_model_folder
from codeparrot.safetensors_header import end_of_data, read_safetensors_header

STATE_FILE = "trainer_state.json"
MANIFEST_FILE = "manifest.json"
HASH_LIMIT = 256 * 2**20  # bytes: larger files (big weights, optimizer moments) are checked by size and header only
CONFIG_FILE = "train_config.yaml"
TRAINING_STATE = "training_state"
_STEP_RE = re.compile(r"^step-(\d+)$")
_LEFTOVER_RE = re.compile(r"^\.step-\d+\.(partial|deleting)$")  # of a killed save / prune


@dataclass
class TrainerState:
    """Where the run is: the loop continues at `step` with `tokens_seen` already consumed."""

    step: int
    tokens_seen: int
    world_size: int
    run_name: str
    saved_at: str = ""
    nonfinite: dict = field(default_factory=dict)  # the non-finite guard's counters (`NonFiniteGuard.state_dict`)
    setup: dict = field(default_factory=dict)  # `run_setup` of the saving run ({}: saved before it was recorded)


def run_setup(accelerator) -> dict:
    """What the layout of `training_state/` depends on besides the process count, recorded with every checkpoint and
    compared on resume (training/resume_checks.py: `check_resume_setup`): Accelerate stores the optimizer (and
    under FSDP the model) per distributed type and FSDP state-dict type, and a loss-scaler state only for fp16."""
    fsdp = accelerator.state.fsdp_plugin if accelerator.distributed_type == DistributedType.FSDP else None
    state_dict_type = None if fsdp is None else fsdp.state_dict_type
    return {"distributed_type": accelerator.distributed_type.name, "mixed_precision": accelerator.mixed_precision,
            "grad_scaler": accelerator.scaler is not None,
            "fsdp_state_dict_type": getattr(state_dict_type, "name", state_dict_type),
            "fsdp_version": None if fsdp is None else fsdp.fsdp_version}


def checkpoints_root(run_dir: str | os.PathLike) -> Path:
    return Path(run_dir) / "checkpoints"


def step_dir(run_dir: str | os.PathLike, step: int) -> Path:
    return checkpoints_root(run_dir) / f"step-{step}"


def list_checkpoints(run_dir: str | os.PathLike) -> list[tuple[int, Path]]:
    """Complete checkpoints of a run, oldest first, as (step, folder)."""
    root = checkpoints_root(run_dir)
    found = []
    if root.is_dir():
        for child in root.iterdir():
            match = _STEP_RE.match(child.name)
            if match and (child / STATE_FILE).is_file():
                found.append((int(match.group(1)), child))
    return sorted(found)


def read_state(path: str | os.PathLike) -> TrainerState:
    """The `TrainerState` of checkpoint folder `path`; a one-line error when it is not a complete checkpoint."""
    path = Path(path)
    if not path.is_dir():
        raise CodeParrotError(f"resume checkpoint {path} does not exist or is not a folder")
    state_file = path / STATE_FILE
    if not state_file.is_file() or not (path / TRAINING_STATE).is_dir():
        raise CodeParrotError(f"{path} is not a training checkpoint (no {STATE_FILE} and {TRAINING_STATE}/; "
                              "expected a step-N folder written by scripts/train.py)")
    try:
        data = json.loads(state_file.read_text())
        return TrainerState(**{k: data[k] for k in ("step", "tokens_seen", "world_size", "run_name")},
                            saved_at=data.get("saved_at", ""), nonfinite=dict(data.get("nonfinite") or {}),
                            setup=dict(data.get("setup") or {}))
    except (ValueError, KeyError, TypeError) as err:
        raise CodeParrotError(f"{state_file}: unreadable trainer state ({type(err).__name__}: {err})") from None


def resolve_resume(resume: str | None, run_dir: str | os.PathLike, report=print) -> Path | None:
    """`None` → start fresh; `"auto"` → the run's latest checkpoint that verifies (fresh when there is none);
    otherwise a checkpoint folder. Every candidate is verified now (`verify_checkpoint`), so a damaged one
    fails, or is skipped with a warning passed to `report`, before any compute."""
    if resume is None:
        return None
    if resume == "auto":
        root = checkpoints_root(run_dir)
        for aside in sorted(root.glob(".step-*.old-*")) if root.is_dir() else []:  # `publish_dir` cut between renames
            remove_stale_temporaries(root / aside.name[1:].split(".old-")[0])  # put back where step-N is missing
        found = list_checkpoints(run_dir)
        damaged = []
        for _, path in reversed(found):
            problems = verify_checkpoint(path)
            if not problems:
                if damaged:
                    report(f"warning: --resume auto: skipped {'; '.join(damaged)}; resuming from {path.name}")
                return path
            damaged.append(f"{path.name} ({problems[0]}{f' and {len(problems) - 1} more' if len(problems) > 1 else ''})")
        if damaged:
            raise CodeParrotError(f"--resume auto: no usable checkpoint in {checkpoints_root(run_dir)}: "
                                  f"{'; '.join(damaged)}")
        return None
    state = read_state(resume)
    later = [path.name for step, path in list_checkpoints(run_dir) if step > state.step]
    if later:  # its saves would interleave with them: `auto` would pick those, keep_last delete the new ones
        raise CodeParrotError(f"cannot resume from {resume}: {checkpoints_root(run_dir)} also holds later checkpoints "
                              f"of this run ({', '.join(later)}), which `--resume auto` would continue and keep_last "
                              "would keep over the new ones: move them out of that folder first")
    problems = verify_checkpoint(resume)
    if problems:
        raise CodeParrotError(f"cannot resume from {resume}: {'; '.join(problems[:3])}"
                              f"{f' (and {len(problems) - 3} more)' if len(problems) > 3 else ''}")
    return Path(resume)


# ---- verification: a manifest written last, checked before any resume ----
def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def write_manifest(folder: Path) -> None:
    """`manifest.json`: {relative path: {"size": bytes, "sha256": hex or null above HASH_LIMIT}} for every file."""
    files = {}
    for path in sorted(p for p in folder.rglob("*") if p.is_file() and p.name != MANIFEST_FILE):
        size = path.stat().st_size
        files[path.relative_to(folder).as_posix()] = {"size": size,
                                                      "sha256": _sha256(path) if size <= HASH_LIMIT else None}
    atomic_write_json(folder / MANIFEST_FILE, {"files": files})


def safetensors_problem(path: Path) -> str | None:
    """Why `path` is not a complete safetensors file (unreadable header, truncated data), or None."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            data, entries = read_safetensors_header(f, size)
    except OSError as err:
        return f"{path.name} has an unreadable header ({type(err).__name__})"
    except ValueError as err:
        return f"{path.name} {err}"
    if data + end_of_data(entries) != size:
        return f"{path.name} is truncated ({size} bytes, its header describes {data + end_of_data(entries)})"
    return None


def verify_checkpoint(path: str | os.PathLike, hashes: bool = True) -> list[str]:
    """Everything wrong with checkpoint `path` as a resume point (empty when it is complete): a missing
    trainer state, weights, optimizer, scheduler, RNG state or data position of any process, a weights file
    whose safetensors header is unreadable or which is shorter than it says, and any file whose size or
    hash differs from `manifest.json` (checkpoints written before manifests existed skip that last check).
    `hashes=False`: sizes only (cheap: what every other process checks of the folder the main process verified)."""
    path = Path(path)
    try:
        state = read_state(path)
    except CodeParrotError as err:
        return [str(err)]
    problems = []
    manifest_file = path / MANIFEST_FILE
    manifest: dict = {}
    if manifest_file.is_file():
        try:
            manifest = json.loads(manifest_file.read_text())["files"]
        except (ValueError, KeyError, TypeError):
            problems.append(f"{MANIFEST_FILE} is unreadable")
    ts = f"{TRAINING_STATE}/"
    listed = set(manifest)
    sharded_model = any(name.startswith(ts + "pytorch_model") or name.startswith(ts + "model") for name in listed)
    required = [f"{ts}data_rank{r}.pt" for r in range(state.world_size)]
    required += [f"{ts}random_states_{r}.pkl" for r in range(state.world_size)]
    if not any(name.startswith(ts + "optimizer") for name in listed):
        required.append(f"{ts}optimizer.bin")
    if not any(name.startswith(ts + "scheduler") for name in listed):
        required.append(f"{ts}scheduler.bin")
    index = path / "model.safetensors.index.json"
    weights = ["model.safetensors"]
    if index.is_file():
        try:
            weights = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (ValueError, KeyError, TypeError):
            problems.append(f"{index.name} is unreadable")
    if not sharded_model:
        required += weights
    for name in ["config.json", *required]:
        if not (path / name).is_file():
            problems.append(f"{name} is missing")
    for name in weights:
        if (path / name).is_file():
            problem = safetensors_problem(path / name)
            if problem:
                problems.append(problem)
    for name, entry in manifest.items():
        file = path / name
        if not file.is_file():
            if f"{name} is missing" not in problems:
                problems.append(f"{name} is missing")
        elif file.stat().st_size != entry.get("size"):
            problems.append(f"{name} has {file.stat().st_size} bytes, the manifest says {entry.get('size')}")
        elif hashes and entry.get("sha256") and _sha256(file) != entry["sha256"]:
            problems.append(f"{name} does not match its sha256 in the manifest")
    return list(dict.fromkeys(problems))


# ---- Accelerate hooks: store the model weights once, in the Hugging Face folder ----
def _skip_accelerate_weights(models: list, weights: list, output_dir: str) -> None:
    weights.clear()  # the model is saved with save_pretrained next to training_state/


def _load_weights_from_hf_folder(models: list, input_dir: str) -> None:
    if not models:  # FSDP / DeepSpeed: Accelerate restores its own sharded model files
        return

    folder = Path(input_dir).parent
    for model in models:
        load_hf_weights(extract_model_from_parallel(model), folder)
    models.clear()


def load_hf_weights(model: torch.nn.Module, folder: Path) -> None:
    """Load `save_pretrained` safetensors (single file or sharded) into `model`, exactly, in place.

    Keys missing from the files must be tied to a loaded parameter (GPT-2's LM head)."""

    index = folder / "model.safetensors.index.json"
    files = sorted(set(json.loads(index.read_text())["weight_map"].values())) if index.is_file() else ["model.safetensors"]
    state: dict[str, torch.Tensor] = {}
    for name in files:
        if not (folder / name).is_file():
            raise CodeParrotError(f"checkpoint {folder} is missing its weights file {name}")
        state.update(load_file(str(folder / name)))
    result = model.load_state_dict(state, strict=False)
    loaded_ids = {id(p) for n, p in model.named_parameters(remove_duplicate=False) if n in state}
    params = dict(model.named_parameters(remove_duplicate=False))
    untied = [k for k in result.missing_keys if k in params and id(params[k]) not in loaded_ids]
    if untied or result.unexpected_keys:
        raise CodeParrotError(f"checkpoint {folder} does not match the model: missing {untied[:3]}, "
                              f"unexpected {result.unexpected_keys[:3]}")


def full_state_dict(accelerator, model) -> dict[str, torch.Tensor]:
    """The full (unsharded) weights to `save_pretrained`, on the main process; a collective under FSDP/DeepSpeed
    (every process must call it). Tied duplicates are dropped (GPT-2's lm_head.weight is the token embedding):
    FSDP's gathered state dict holds them as separate tensors, which save_pretrained would store twice."""
    weights = accelerator.get_state_dict(model)
    unwrapped = accelerator.unwrap_model(model)
    kept = {name for name, _ in unwrapped.named_parameters()}
    tied = {name for name, _ in unwrapped.named_parameters(remove_duplicate=False)} - kept
    return {name: value for name, value in weights.items() if name not in tied}


def save_checkpoint(accelerator, model, tokenizer, run_dir: str | os.PathLike, state: TrainerState,
                    data_state: dict[str, Any], config: dict[str, Any], keep_last: int) -> Path:
    """Write `step-{state.step}` atomically (see module docstring); every process must call this.

    Returns the final folder. Older checkpoints beyond the `keep_last` most recent are removed."""
    final = step_dir(run_dir, state.step)
    tmp = final.parent / f".{final.name}.partial"
    if accelerator.is_main_process:
        shutil.rmtree(tmp, ignore_errors=True)  # left by a killed save
        (tmp / TRAINING_STATE).mkdir(parents=True)
    accelerator.wait_for_everyone()

    weights = full_state_dict(accelerator, model)  # a collective under FSDP/DeepSpeed: every process calls it
    if accelerator.is_main_process:
        save_model_folder(accelerator.unwrap_model(model), tmp, tokenizer, state_dict=weights)
        atomic_write_text(tmp / CONFIG_FILE, yaml.safe_dump(config, sort_keys=False))
    handle = accelerator.register_save_state_pre_hook(_skip_accelerate_weights)
    try:
        accelerator.save_state(str(tmp / TRAINING_STATE))
    finally:
        handle.remove()
    torch.save(data_state, tmp / TRAINING_STATE / f"data_rank{accelerator.process_index}.pt")
    fsync_tree(tmp / TRAINING_STATE)  # each process's own files flushed by that process (nodes of a shared volume)
    accelerator.wait_for_everyone()

    if accelerator.is_main_process:
        state.saved_at = time.strftime("%Y-%m-%dT%H:%M:%S")
        state.setup = state.setup or run_setup(accelerator)
        atomic_write_json(tmp / STATE_FILE, asdict(state))
        write_manifest(tmp)  # last: it describes every file above
        fsync_tree(tmp)  # on disk before it is published (and before pruning removes the previous checkpoints)
        publish_dir(tmp, final)  # re-saving a step (after resuming from it) exchanges the two folders atomically
        prune_checkpoints(run_dir, keep_last, state.step)
    accelerator.wait_for_everyone()
    return final


def prune_checkpoints(run_dir: str | os.PathLike, keep_last: int, saved_step: int | None = None) -> list[Path]:
    """Delete all but the `keep_last` most recent complete checkpoints up to `saved_step` (the one just written;
    default: all); returns the removed folders. Later ones are left alone: a damaged checkpoint `--resume auto`
    skipped would otherwise count as the newest and crowd out the run's new ones (it is replaced when the run
    saves that step again). Also removes what killed saves and deletes left (`.step-N.partial`, `.step-N.deleting`,
    each up to a checkpoint's size), also at steps that are never saved again (a SIGTERM save cut by the SIGKILL
    after it): call it after a save, by the one process that saves, when no other save is under way."""
    found = [(step, path) for step, path in list_checkpoints(run_dir) if saved_step is None or step <= saved_step]
    removed = [path for _, path in found[: max(0, len(found) - keep_last)]]
    for path in removed:
        # rename first so an interrupted delete never leaves a half-deleted folder that looks complete
        doomed = path.parent / f".{path.name}.deleting"
        os.rename(path, doomed)
        shutil.rmtree(doomed, ignore_errors=True)
    root = checkpoints_root(run_dir)
    for leftover in root.iterdir() if root.is_dir() else []:
        if _LEFTOVER_RE.match(leftover.name) and leftover.is_dir() and not leftover.is_symlink():
            shutil.rmtree(leftover, ignore_errors=True)
    return removed


def read_data_position(path: str | os.PathLike, process_index: int,
                       micro_batch_size: int | None = None) -> dict[str, Any]:
    """Process `process_index`'s DataLoader position saved in checkpoint `path`.

    With `micro_batch_size` (this run's), a one-line error where the position cannot continue exactly with it: a
    loader with workers restores the snapshot its workers last sent and replays the batches read since, in
    batches of the new size, so another micro-batch than the checkpoint's would skip or repeat sequences."""
    data_file = Path(path) / TRAINING_STATE / f"data_rank{process_index}.pt"
    if not data_file.is_file():
        raise CodeParrotError(f"{path} has no data position for process {process_index} ({data_file.name})")
    position = torch.load(data_file, weights_only=True)
    replayed = position.get("_steps_since_snapshot", 0) if isinstance(position, dict) else 0
    if micro_batch_size is not None and replayed:
        try:
            saved = yaml.safe_load((Path(path) / CONFIG_FILE).read_text(encoding="utf-8"))["batch"]["micro_batch_size"]
        except (OSError, yaml.YAMLError, KeyError, TypeError):
            saved = None  # not recorded: nothing to compare with
        if isinstance(saved, int) and saved != micro_batch_size:
            raise CodeParrotError(
                f"{path} was written with batch.micro_batch_size {saved}, this run has {micro_batch_size}: its data "
                f"position replays the {replayed} batch(es) read since the loader's last snapshot, which in batches "
                f"of {micro_batch_size} would {'skip' if micro_batch_size > saved else 'repeat'} "
                f"{replayed * abs(micro_batch_size - saved)} sequence(s): resume with --batch.micro_batch_size {saved}")
    return position


def restore_training_state(accelerator, path: str | os.PathLike) -> TrainerState:
    """Restore model, optimizer, scheduler and RNG states from checkpoint `path`; returns its trainer state. RNG
    states that cannot be restored are a one-line error (Accelerate would go on without them); Accelerate's
    micro-step counter restarts at 0 (a checkpoint is at an optimizer-step boundary), so another accumulation works.

    Call it last before the loop: anything drawing random numbers afterwards (e.g. starting DataLoader
    workers, which draws their base seed) would shift the restored RNG stream."""
    path = Path(path)
    state = read_state(path)
    if state.world_size != accelerator.num_processes:
        raise CodeParrotError(f"{path} was written by {state.world_size} processes; resume it with "
                              f"{state.world_size}, not {accelerator.num_processes} (each had its own data stream)")
    rng_file = path / TRAINING_STATE / f"random_states_{accelerator.process_index}.pkl"
    try:  # Accelerate's load_state logs a failure to restore them at info level and goes on, no longer exact
        saved_rng = load(rng_file)
    except Exception as err:  # noqa: BLE001 - any reason: the resume would not be exact
        # torch's weights-only refusal: the cause is its "WeightsUnpickler error" line (e.g. a pickle of another numpy)
        cause = next((line.strip().split(". Please")[0] for line in str(err).splitlines()
                      if "WeightsUnpickler error" in line), first_line(err))
        raise CodeParrotError(f"{rng_file}: the random number generator states cannot be restored "
                              f"({type(err).__name__}: {cause}); an exact resume needs them") from None
    handle = accelerator.register_load_state_pre_hook(_load_weights_from_hf_folder)
    try:
        accelerator.load_state(str(path / TRAINING_STATE))
    finally:
        handle.remove()
    _check_rng_restored(saved_rng, rng_file)
    # Accelerate restores its micro-step counter, N × the checkpoint's accumulation; a checkpoint is at an
    # optimizer-step boundary, i.e. at micro-step 0 of the next step whatever the accumulation now is (with
    # another one the raw count would put the gradient synchronization on the wrong micro-step).
    accelerator.step = 0
    return state


def _check_rng_restored(saved: dict, rng_file: Path) -> None:
    """One-line error unless this process's torch generators (CPU, and CUDA where saved) now hold `saved`'s states:
    Accelerate skips the rest quietly when one fails (e.g. CUDA states of more devices than this process sees)."""
    cpu_ok = torch.equal(torch.get_rng_state(), saved["torch_manual_seed"])
    cuda = saved.get("torch_cuda_manual_seed")
    if cuda is not None and torch.cuda.is_available():
        now = torch.cuda.get_rng_state_all()
        if len(now) != len(cuda) or not all(torch.equal(a.cpu(), b.cpu()) for a, b in zip(now, cuda)):
            raise CodeParrotError(f"{rng_file}: holds the CUDA random states of {len(cuda)} device(s), this process "
                                  f"sees {len(now)} and they could not all be restored: resume with the devices "
                                  "visible as when it was written (CUDA_VISIBLE_DEVICES) for an exact resume")
    if not cpu_ok:
        raise CodeParrotError(f"{rng_file}: the random number generator states were not restored; an exact "
                              "resume needs them")

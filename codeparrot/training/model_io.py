"""The training run's model, in and out: where it comes from (the repository, the tokenizer check, the
starting-weights report), how `train()` loads it, and where it goes (the checkpoint pusher, the files a push
sends, `<run dir>/final`)."""

from __future__ import annotations

import json
import sys
from functools import wraps
from pathlib import Path
from typing import Callable

import torch

from codeparrot.atomic_io import atomic_dir
from codeparrot.errors import CodeParrotError
from codeparrot.repository.model import check_model_tokenizer, load_pretrained_model, save_model_folder
from codeparrot.repository.pusher import CheckpointPusher, check_push_target
from codeparrot.repository.refs import open_repository, resolve_model_dir
from codeparrot.tokenizer import load_tokenizer
from codeparrot.training.causal_attention import CAUSAL_SDPA, register_causal_attention
from codeparrot.training.checkpointing import full_state_dict
from codeparrot.training.config import TrainConfig


def load_tokenizer_checked(cfg: TrainConfig):
    """(tokenizer, model folder) with the model/tokenizer/sequence-length consistency checked from config.json,
    before any weights are loaded."""
    if not cfg.model:
        raise CodeParrotError("model is not set: give the model repository (--model PATH_OR_HUB_ID)")
    model_dir = resolve_model_dir(cfg.model, cfg.revision)
    config_file = model_dir / "config.json"
    if not config_file.is_file():
        raise CodeParrotError(f"{cfg.model}@{cfg.revision} holds no model (no config.json)")
    model_cfg = json.loads(config_file.read_text(encoding="utf-8"))
    tokenizer = load_tokenizer(cfg.data.tokenizer or str(model_dir))
    check_model_tokenizer(model_cfg, tokenizer, str(cfg.data.tokenizer or model_dir), seq_length=cfg.data.seq_length)
    return tokenizer, model_dir


def model_source_lines(cfg: TrainConfig) -> list[str]:
    """Where the starting weights come from: the repository, revision and commit (for a repository), plus a
    warning when the revision's newest commit is a promotion, i.e. already-trained weights, not an initial
    model. Best effort: a repository that cannot be listed (offline Hub) only gets the first line."""
    line = f"starting weights: {cfg.model}" + (f" @ {cfg.revision}" if cfg.revision else " (a model folder)")
    if not cfg.revision:
        return [line]
    try:
        repo = open_repository(cfg.model)
        commit = repo.resolve_revision(cfg.revision)
        tip = next((c for c in repo.list_commits(cfg.revision)), None) if cfg.revision != commit else None
    except Exception:  # noqa: BLE001 - a plain folder, an offline Hub: nothing more to say
        return [line]
    lines = [f"{line} (commit {commit[:12]}{f', {tip.message!r}' if tip is not None else ''})"]
    if tip is not None and tip.message.startswith("promote "):
        lines.append(f"warning: {cfg.model}@{cfg.revision} holds a promoted, already-trained model ({tip.message}); "
                     "this run continues from those weights. For a fresh run start from the initial model "
                     "(--revision <commit of 'initial model'>, see `scripts/checkpoints.py log`)")
    return lines


def load_model(cfg: TrainConfig, model_dir: Path):
    """The fp32 master model with the configured attention kernel, loss type and gradient checkpointing."""

    if cfg.attn_implementation == CAUSAL_SDPA:
        register_causal_attention()  # whole unpadded sequences, no cache: SDPA is_causal=True, no mask built
    model = load_pretrained_model(str(model_dir), attn_implementation=cfg.attn_implementation, dtype=torch.float32)
    # A fixed loss type: otherwise transformers resolves it on every forward (a graph break under torch.compile).
    model.loss_type = model.config.loss_type = "ForCausalLM"
    if cfg.gradient_checkpointing:
        kwargs = {"use_reentrant": False}  # the non-reentrant variant works with DDP and torch.compile
        if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.x name
            model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    return model


_PUSHERS: list[CheckpointPusher] = []  # made by the `train` that runs now (`finishes_pushes`)


def check_push_target_of(cfg: TrainConfig) -> None:
    """With `checkpoint.push` on: a model repository the pushes could not write is a one-line error now, before
    any training (`check_push_target`), not warnings after the first checkpoint interval."""
    if cfg.checkpoint.push:
        check_push_target(cfg.model)


def make_pusher(cfg: TrainConfig):
    if not cfg.checkpoint.push:
        return None
    pusher = CheckpointPusher(cfg.model, cfg.run_name, from_revision=cfg.revision)  # the branch follows its parent
    _PUSHERS.append(pusher)
    return pusher


def report_push_errors(errors: list[str]) -> None:
    """A run's failed pushes, once more at its end (each was logged when it failed), as `warning:` lines."""
    for error in errors:
        print(f"warning: {error}", file=sys.stderr, flush=True)


def push_outcome(pusher: CheckpointPusher | None, errors: list[str]) -> str:
    """What the run's last line adds about its pushes: the commit pushed last, and whether pushes failed (before,
    a run whose every push failed ended on its final model's path alone, as if nothing was wrong)."""
    if pusher is None:
        return ""
    pushed = (f"; pushed to {pusher.repo_ref} branch {pusher.branch}, commit {pusher.commits[-1][:12]}"
              if pusher.commits else "")
    failed = (f"; {len(errors)} push(es) to {pusher.repo_ref}@{pusher.branch} FAILED (warnings above; the checkpoints "
              "are kept on disk)" if errors else "")
    return pushed + failed


def finishes_pushes(job: Callable) -> Callable:
    """Decorator for `train`: when it fails, the checkpoint pushes it had queued are finished before the error goes
    on (the pusher's thread is a daemon: the process's end would drop them, and the checkpoint a failed run pushed
    last is the one its user wants on the branch); Ctrl-C does not wait, it names what it leaves unpushed."""
    @wraps(job)
    def run(*args, **kwargs):
        try:
            return job(*args, **kwargs)
        except KeyboardInterrupt:
            for pusher in _PUSHERS:
                for message in pusher.pending():
                    print(f"warning: checkpoint {message!r} was not pushed (interrupted); it is still on disk",
                          file=sys.stderr, flush=True)
            raise
        except BaseException:
            for pusher in _PUSHERS:
                if pusher.pending():
                    print(f"the run failed: finishing its queued push(es) to {pusher.repo_ref}@{pusher.branch} "
                          f"first ({', '.join(pusher.pending())})", file=sys.stderr, flush=True)
                report_push_errors(pusher.wait())
            raise
        finally:
            _PUSHERS.clear()
    return run


def save_final_model(accelerator, model, tokenizer, folder: Path) -> None:
    """<run dir>/final: the last weights, config and tokenizer, a stable path that pruning never removes."""

    weights = full_state_dict(accelerator, model)  # collective under FSDP/DeepSpeed
    if accelerator.is_main_process:
        with atomic_dir(folder) as tmp:
            save_model_folder(accelerator.unwrap_model(model), tmp, tokenizer, state_dict=weights)
    accelerator.wait_for_everyone()


def model_files(folder: Path) -> list[str]:
    """What a checkpoint push sends without the training state: the top-level files (weights, config,
    tokenizer, train_config.yaml, trainer_state.json), not training_state/."""
    return sorted(p.name for p in folder.iterdir() if p.is_file())

"""AdamW with CodeParrot's weight-decay groups, and the warmup + cosine learning-rate schedule.

Weight decay applies to every weight that multiplies an activation (linear/Conv1D kernels and the token
embedding, which is also the tied LM head) and never to biases or normalization weights: decaying a LayerNorm
gain towards 0 or a bias towards 0 is a constraint on the function, not a regularizer of its scale.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from codeparrot.training.config import OptimConfig, ScheduleConfig

# Normalization layers are recognized by type and, for custom implementations (RMSNorm, LlamaRMSNorm...), by name.
_NORM_TYPES = (nn.LayerNorm, nn.GroupNorm, nn.BatchNorm1d, nn.BatchNorm2d) + (
    (nn.RMSNorm,) if hasattr(nn, "RMSNorm") else ())


def _is_norm(module: nn.Module) -> bool:
    name = type(module).__name__.lower()
    return isinstance(module, _NORM_TYPES) or "layernorm" in name or "rmsnorm" in name


def split_decay(model: nn.Module) -> tuple[list[str], list[str]]:
    """(names with weight decay, names without): biases and normalization parameters go without.

    Each parameter appears once even when tied (GPT-2's LM head is the token embedding)."""
    no_decay_ids: set[int] = set()
    for module in model.modules():
        for pname, param in module.named_parameters(recurse=False):
            if pname == "bias" or pname.endswith("_bias") or _is_norm(module):
                no_decay_ids.add(id(param))
    decay, no_decay = [], []
    for name, param in model.named_parameters():  # de-duplicates tied parameters
        if not param.requires_grad:
            continue
        (no_decay if id(param) in no_decay_ids else decay).append(name)
    return decay, no_decay


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Two AdamW parameter groups: decayed weights and the rest (weight_decay 0)."""
    params = dict(model.named_parameters())
    decay, no_decay = split_decay(model)
    return [
        {"params": [params[n] for n in decay], "weight_decay": weight_decay},
        {"params": [params[n] for n in no_decay], "weight_decay": 0.0},
    ]


def build_optimizer(model: nn.Module, cfg: OptimConfig, device: torch.device) -> torch.optim.AdamW:
    """AdamW over `param_groups`; the fused kernel where the device supports it (CUDA) unless disabled."""
    fused = cfg.fused
    if fused is None:
        fused = device.type == "cuda"
    kwargs = {"fused": True} if fused else {}
    return torch.optim.AdamW(param_groups(model, cfg.weight_decay), lr=cfg.lr, betas=tuple(cfg.betas), eps=cfg.eps,
                             **kwargs)


def lr_factor(step: int, max_steps: int, cfg: ScheduleConfig) -> float:
    """Multiplier of the peak lr used by optimizer step `step` (0-based).

    Warmup: (step + 1) / warmup_steps, so the first step already learns and step warmup_steps - 1 uses the
    peak. Then `cfg.name` decays from 1 (at step warmup_steps) to min_lr_ratio (reached at step max_steps,
    one past the last step).
    """
    if step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    if cfg.name == "constant":
        return 1.0
    span = max(1, max_steps - cfg.warmup_steps)
    progress = min(1.0, (step - cfg.warmup_steps) / span)
    shape = 0.5 * (1.0 + math.cos(math.pi * progress)) if cfg.name == "cosine" else 1.0 - progress
    return cfg.min_lr_ratio + (1.0 - cfg.min_lr_ratio) * shape


def build_scheduler(optimizer: torch.optim.Optimizer, max_steps: int, cfg: ScheduleConfig) -> torch.optim.lr_scheduler.LambdaLR:
    """A `LambdaLR` over `lr_factor`; it must be stepped exactly once per optimizer step."""
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_factor(step, max_steps, cfg))


def apply_on_resume(optimizer: torch.optim.Optimizer, scheduler, cfg: OptimConfig) -> list[str]:
    """After a resume restored `optimizer` and `scheduler` (built by `build_optimizer`/`build_scheduler`): the
    config's lr, betas, eps and weight decay, and the rate of the next step from the config's schedule. Restoring
    their state dicts brings back the values the checkpoint was written with (the base lr, each group's
    hyperparameters, the next step's rate of the old schedule), which would silently override a changed
    `--optim.lr` (e.g. after a loss spike) or, for one step, a raised `--max_steps`, while the logged config says
    otherwise. Moments and step counts are kept; with an unchanged config nothing changes. Returns the optim
    changes, e.g. ["optim.lr 0.001 (the checkpoint's) -> 0.0005 (the config's)"]."""
    inner = getattr(scheduler, "scheduler", scheduler)  # Accelerate's wrapper holds the torch scheduler
    if not isinstance(inner, torch.optim.lr_scheduler.LambdaLR):  # not `build_scheduler`'s (e.g. DeepSpeed's own)
        return []
    groups = getattr(optimizer, "optimizer", optimizer).param_groups
    wanted = {"lr": cfg.lr, "betas": tuple(cfg.betas), "eps": cfg.eps, "weight_decay": cfg.weight_decay}
    changes = []
    for key, value in wanted.items():
        before = groups[0]["initial_lr" if key == "lr" else key]
        if (tuple(before) if key == "betas" else before) != value:
            changes.append(f"optim.{key} {list(before) if key == 'betas' else before} (the checkpoint's) -> "
                           f"{list(value) if key == 'betas' else value} (the config's)")
    for i, group in enumerate(groups):
        group["betas"], group["eps"] = wanted["betas"], wanted["eps"]
        if i == 0:  # param_groups: the decayed weights first, then biases and norms (weight_decay 0)
            group["weight_decay"] = cfg.weight_decay
        group["initial_lr"] = inner.base_lrs[i] = cfg.lr
        group["lr"] = cfg.lr * inner.lr_lambdas[i](inner.last_epoch)  # as LambdaLR computes the next step's rate
    inner._last_lr = [group["lr"] for group in groups]
    return changes

"""Steps whose loss or gradient is not finite are not applied; a run that keeps producing them stops.

One NaN/inf in a gradient, applied by AdamW, turns every weight it touches (and the optimizer's moments) into NaN
for good; a checkpoint then saves, and a push publishes, a dead model. So before each optimizer step
`NonFiniteGuard.check` decides, identically on every process:

- the decision uses the gradient norm `clip_grad_norm_` returns, which is already all-reduced (the same number on
  every rank), plus this step's loss summed over the ranks (one scalar all-reduce): NaN/inf in any rank's loss or
  gradient makes the step bad everywhere, so the replicas (DDP) or shards (FSDP) never disagree;
- a bad step is skipped: no `optimizer.step()` (weights and moments untouched), but the step counter, the
  learning-rate schedule and the data position advance as for any step: step N always consumes batch N and uses
  lr(N), so a resumed run and an uninterrupted one agree whatever was skipped;
- each skip is a warning (console and `<run>/logs/rank-N.log`) and a `metrics.jsonl` entry naming the step and
  the data of its batch; the log line counts them;
- `max_bad_steps` bad steps in a row stop the run with one line naming the first of them and its data.

On the device (fused AdamW, the CUDA default; not under fp16's gradient scaler, which has its own skip) the
decision never reaches the host inside the step: a host read per step would stall the GPU's queue every step
(the CPU could no longer run ahead). `check` then hands the fused kernel the "skip" flag it already understands
(`found_inf`, as torch's GradScaler does: weights, moments and the Adam step count stay untouched when set) and
returns the flag as a 0-dim tensor; `flush`, called at each log step (a host sync there anyway), before each
checkpoint and at the end, reads the flags of the steps since, and warns, records and stops exactly as above.
The stop can thus come up to `logging.log_steps` steps after the `max_bad_steps`-th bad step: those were all
skipped too, and the data named for them is the position at the flush.

`check_finite_weights` runs before every checkpoint: a checkpoint (and so a push or the final model) never holds
non-finite weights, also when an absurd learning rate made a finite gradient overflow the weights.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import torch

from codeparrot.errors import CodeParrotError
from codeparrot.training.datasets.loader import dataset_states


def describe_position(loader_state: dict) -> str:
    """The data-loader position in words: per reader (DataLoader worker) its epoch and place in the epoch."""
    parts = []
    for reader, state in enumerate(dataset_states(loader_state)):
        if not state:
            continue
        if state.get("kind") == "pretokenized":
            where = f"sequence {state.get('pos')}"
        else:
            stream = state.get("stream") or {}
            where = (f"file {stream['file_pos']} of the epoch's order, line {stream['line']}" if "file_pos" in stream
                     else f"{state.get('records_in_epoch')} records into the epoch")
        parts.append(f"reader {reader}: epoch {state.get('epoch')}, {where}")
    lag = loader_state.get("_steps_since_snapshot", 0)
    note = f" (as of {lag} batch(es) earlier: workers report every few batches)" if lag else ""
    return ("; ".join(parts) or "start of the data") + note


class NonFiniteGuard:
    """`check(step, grad_norm, step_loss)` before each optimizer step: True = apply it (module docstring)."""

    def __init__(self, accelerator, max_bad_steps: int, rank: int, accum: int, data: str, loader, metrics,
                 optimizer=None):
        self.accelerator, self.max_bad_steps = accelerator, max_bad_steps
        self.rank, self.accum, self.data, self.loader, self.metrics = rank, accum, data, loader, metrics
        self.skipped = 0  # skipped steps of the run so far (logged with every log line; restored on resume)
        self.in_a_row = 0
        self.first_bad: str | None = None  # the first step of the current run of bad steps, described
        inner = getattr(optimizer, "optimizer", optimizer)  # Accelerate's wrapper holds the torch optimizer
        self.fused = inner if (inner is not None and getattr(inner, "defaults", {}).get("fused")
                               and accelerator.mixed_precision != "fp16") else None
        self.pending: list[tuple[int, torch.Tensor, torch.Tensor, torch.Tensor]] = []  # device mode, unread

    def state_dict(self) -> dict[str, Any]:
        """The counters a checkpoint keeps (call `flush` first), so that a resumed run stops where an
        uninterrupted one would: a run of bad steps goes on counting across the resume."""
        return {"skipped": self.skipped, "in_a_row": self.in_a_row, "first_bad": self.first_bad}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.skipped, self.in_a_row = int(state.get("skipped", 0)), int(state.get("in_a_row", 0))
        self.first_bad = state.get("first_bad")

    def check(self, step: int, grad_norm: torch.Tensor, step_loss: torch.Tensor) -> bool | torch.Tensor:
        """`step`: the 1-based step about to be applied; `step_loss`: this process's summed micro-batch losses.
        Returns whether to apply the step; in device mode a 0-dim bool tensor, and the step must still be called
        (the fused kernel skips it by itself)."""
        loss = self.accelerator.reduce(step_loss.detach().float().reshape(1), reduction="sum")
        if self.fused is not None:
            norm = torch.as_tensor(grad_norm, device=loss.device).float().reshape(1)
            bad = torch.logical_not(torch.isfinite(norm) & torch.isfinite(loss)).reshape(())
            self.fused.found_inf = bad.float()  # read by the fused AdamW kernel: skip when 1
            self.pending.append((step, bad, loss, norm))
            return torch.logical_not(bad)
        return self._decide(step, float(grad_norm), float(loss))  # one device sync per step: decided on the host

    def flush(self) -> int:
        """Device mode: read the flags of the steps since the last flush (one sync), record them as `check` does
        on the host; returns how many of them were skipped (0 in host mode, where `check` decided already)."""
        if not self.pending:
            return 0
        pending, self.pending = self.pending, []
        flags = torch.stack([bad for _, bad, _, _ in pending]).tolist()
        skipped = 0
        for (step, _, loss, norm), bad in zip(pending, flags):
            if not bad:
                self.in_a_row, self.first_bad = 0, None
                continue
            skipped += 1
            self._decide(step, float(norm), float(loss))  # records and warns; raises after max_bad_steps
        return skipped

    def _decide(self, step: int, norm: float, loss_value: float) -> bool:
        if math.isfinite(norm) and math.isfinite(loss_value):
            self.in_a_row, self.first_bad = 0, None
            return True
        self.skipped += 1
        self.in_a_row += 1
        where = self._data_of(step)
        if self.first_bad is None:
            self.first_bad = f"step {step} ({where})"
        self.metrics.append({"step": step, "skipped_update": True, "loss_sum": _jsonable(loss_value),
                             "grad_norm": _jsonable(norm), "data": where})
        warnings.warn(f"step {step}: loss {loss_value} / gradient norm {norm} not finite: update skipped "
                      f"({self.in_a_row} in a row, {self.skipped} in all); its data: {where}", stacklevel=2)
        if self.in_a_row >= self.max_bad_steps:
            raise CodeParrotError(
                f"{self.in_a_row} steps in a row had a non-finite loss or gradient norm (max_bad_steps "
                f"{self.max_bad_steps}), the first at {self.first_bad}; none was applied and no checkpoint holds "
                "them: lower optim.lr or check that data, then `--resume auto` from the last checkpoint")
        return False

    def _data_of(self, step: int) -> str:
        first, last = (step - 1) * self.accum + 1, step * self.accum
        try:
            position = describe_position(self.loader.state_dict())
        except Exception as err:  # noqa: BLE001 - naming the data must never hide the skip itself
            position = f"position unavailable: {err}"
        return (f"rank {self.rank}'s micro-batches {first}-{last} of data.train {self.data}; position after them: "
                f"{position}")


def _jsonable(value: float) -> Any:
    """NaN/inf as strings: metrics.jsonl stays valid JSON."""
    return value if math.isfinite(value) else str(value)


def check_finite_weights(accelerator, model: torch.nn.Module, step: int) -> None:
    """One-line `CodeParrotError` (on every rank) when any weight is NaN/inf: such a model is never saved."""
    shards = [p.to_local() if hasattr(p, "to_local") else p for p in model.parameters()]  # FSDP2: this rank's part
    finite = [torch.isfinite(t).all() for t in shards if t.numel()]
    bad = torch.logical_not(torch.stack(finite).all()).float().reshape(1).to(accelerator.device) if finite else \
        torch.zeros(1, device=accelerator.device)
    if float(accelerator.reduce(bad, reduction="sum")) > 0:  # one sync, the same answer on every rank
        raise CodeParrotError(f"the weights after step {step} are not finite (an update overflowed: optim.lr too "
                              "large?); the checkpoint was not written, the last one is the resume point")

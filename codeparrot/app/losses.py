"""Validation loss against tokens seen, for one or several branches on one plot.

Two sources: the metrics a run logged (`<runs dir>/<branch>/metrics.jsonl`, the run folder of the run that pushed
the branch: `val_loss` with `tokens_seen` per evaluation, read by `codeparrot.tools.plots.read_metrics`), or
computed on demand like `scripts/checkpoints.py plot`: `validation_loss` of every "step N" commit of the branch on
a chosen validation folder, with tokens seen from the commit's `trainer_state.json` (when pushed with it).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from codeparrot.app.workspace import Workspace
from codeparrot.errors import CodeParrotError
from codeparrot.repository.refs import resolve_model_dir
from codeparrot.tools.plots import BLUE, GREEN, ORANGE, PURPLE, RED, STYLE, read_metrics

COLOURS = [BLUE, ORANGE, GREEN, RED, PURPLE]


@dataclass
class LossPoint:
    branch: str
    step: int
    tokens_seen: int | None  # None when the source does not say
    loss: float
    commit: str = ""  # the checkpoint, for losses computed on demand


def logged_losses(ws: Workspace, branch: str) -> list[LossPoint]:
    """The evaluations the run of `branch` logged, or a one-line error saying where it looked."""
    if ws.runs_dir is None:
        raise CodeParrotError("no run folders given (start the app with --runs-dir) and no validation folder "
                              "chosen; give a validation folder to compute the losses")
    metrics = ws.runs_dir / branch / "metrics.jsonl"
    if not metrics.is_file():
        raise CodeParrotError(f"no logged metrics for branch {branch!r} ({metrics} is missing); give a validation "
                              f"folder to compute them")
    _, evals = read_metrics(metrics)
    return [LossPoint(branch, int(e["step"]), e.get("tokens_seen"), float(e["val_loss"])) for e in evals
            if isinstance(e.get("val_loss"), (int, float)) and math.isfinite(e["val_loss"])]


def computed_losses(ws: Workspace, branch: str, dataset: str, max_eval_steps: int,
                    progress: Callable[[float, str], None]) -> list[LossPoint]:
    """Validation loss of every "step N" commit of `branch` on `dataset` (same batches for each)."""
    from codeparrot.training.validation import validation_loss

    if not Path(dataset).exists():
        raise CodeParrotError(f"validation folder {dataset} does not exist")
    commits = sorted((c for c in ws.repository().list_commits(branch) if c.step is not None), key=lambda c: c.step)
    if not commits:
        raise CodeParrotError(f"branch {branch!r} has no 'step N' checkpoints to evaluate")
    points = []
    for i, c in enumerate(commits):
        progress(i / len(commits), f"{branch}: step {c.step} ({i + 1}/{len(commits)})")
        result = validation_loss(ws.ref, dataset, revision=c.commit_id, max_eval_steps=max_eval_steps, batch_size=8)
        points.append(LossPoint(branch, c.step, _tokens_seen(ws.ref, c.commit_id), result["loss"], c.commit_id))
    return points


def _tokens_seen(ref: str, commit: str) -> int | None:
    state = resolve_model_dir(ref, commit) / "trainer_state.json"
    try:
        return int(json.loads(state.read_text(encoding="utf-8"))["tokens_seen"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def plot_losses(points: list[LossPoint], png: Path, title: str) -> Path:
    """One line per branch: validation loss against tokens seen (against step when any point lacks the count)."""
    from matplotlib import rc_context
    from matplotlib.figure import Figure

    if not points:
        raise CodeParrotError("no validation losses to plot")
    by_tokens = all(p.tokens_seen is not None for p in points)
    with rc_context(STYLE):
        fig = Figure(figsize=(9, 4.8), layout="constrained")
        ax = fig.add_subplot()
        branches = list(dict.fromkeys(p.branch for p in points))
        for i, branch in enumerate(branches):
            pts = sorted((p for p in points if p.branch == branch), key=lambda p: p.step)
            xs = [p.tokens_seen if by_tokens else p.step for p in pts]
            best = min(pts, key=lambda p: p.loss)
            ax.plot(xs, [p.loss for p in pts], marker="o", lw=2, color=COLOURS[i % len(COLOURS)],
                    label=f"{branch} (best {best.loss:.3f} at step {best.step:,})")
        ax.set(title=title, xlabel="tokens seen" if by_tokens else "training step",
               ylabel="validation loss (nats/token)")
        ax.legend(loc="upper right")
        png.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(png, format="png")
    return png

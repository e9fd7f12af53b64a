"""Validation loss against tokens seen, for one or several branches on one plot.

Three sources, each naming what the losses were measured on (sequences x length: losses on other data are not
comparable): the metrics pushed with the checkpoints (`metrics.json` of every "step N" commit, written by the
pusher: the repository alone is enough), else the metrics a run logged (`<runs dir>/<branch>/metrics.jsonl`),
or computed on demand like `scripts/checkpoints.py plot`: `validation_loss` of every "step N" commit of the
branch on a chosen validation folder (under the app's --data-dir), with tokens seen from the commit's metrics or
`trainer_state.json`. A computation stops before its next checkpoint or batch once asked to (`should_stop`: the
request's client cancelled or left).
"""

from __future__ import annotations

import json
import math
from typing import Callable

from codeparrot.app.access import bounded_steps, confined_folder
from codeparrot.app.workspace import Workspace
from codeparrot.errors import CodeParrotError
from codeparrot.repository.metrics import branch_checkpoints, describe_eval, pushed_losses, read_pushed_metrics
from codeparrot.repository.refs import resolve_model_dir
from codeparrot.tools.plots import LossPoint, read_metrics


def logged_losses(ws: Workspace, branch: str) -> tuple[list[LossPoint], str]:
    """(the evaluations pushed with `branch`'s checkpoints, else logged by its run; what they were measured
    on), or a one-line error saying where it looked."""
    pushed = pushed_losses(ws.repository(), branch)
    if pushed:
        points = [LossPoint(branch, int(m.get("step", c.step)), m.get("tokens_seen"), float(m["val_loss"]),
                            c.commit_id) for c, m in pushed]
        return points, describe_eval(pushed[-1][1])
    if ws.runs_dir is None:
        raise CodeParrotError(f"no validation losses pushed with the checkpoints of {branch!r} and no run folders "
                              "given (--runs-dir); give a validation folder to compute them")
    metrics = ws.runs_dir / branch / "metrics.jsonl"
    if not metrics.is_file():
        raise CodeParrotError(f"no logged metrics for branch {branch!r} (none pushed with its checkpoints, {metrics} "
                              f"is missing); give a validation folder to compute them")
    _, evals = read_metrics(metrics)
    evals = [e for e in evals if isinstance(e.get("val_loss"), (int, float)) and math.isfinite(e["val_loss"])]
    points = [LossPoint(branch, int(e["step"]), e.get("tokens_seen"), float(e["val_loss"])) for e in evals]
    return points, describe_eval(evals[-1]) if evals else ""


def computed_losses(ws: Workspace, branch: str, dataset: str, max_eval_steps: int,
                    progress: Callable[[float, str], None],
                    should_stop: Callable[[], bool] | None = None) -> tuple[list[LossPoint], str]:
    """(validation loss of every "step N" commit of `branch` on `dataset`, same batches for each; what they
    were measured on). `should_stop` is asked before every checkpoint and every batch (`EvaluationStopped`):
    the request's client cancelled or left, and the remaining forward passes would be for nobody."""
    from codeparrot.training.validation import EvaluationStopped, validation_loss

    dataset = str(confined_folder(ws.data_dir, dataset))  # only under --data-dir (codeparrot/app/access.py)
    max_eval_steps = bounded_steps(max_eval_steps)
    repo = ws.repository()
    commits = branch_checkpoints(repo, branch)
    if not commits:
        raise CodeParrotError(f"branch {branch!r} has no 'step N' checkpoints to evaluate")
    points, measured_on = [], ""
    for i, c in enumerate(commits):
        if should_stop is not None and should_stop():  # before loading the next checkpoint
            raise EvaluationStopped(f"the losses of {branch!r} were stopped after {i} of {len(commits)} checkpoints")
        progress(i / len(commits), f"{branch}: step {c.step} ({i + 1}/{len(commits)})")
        result = validation_loss(ws.ref, dataset, revision=c.commit_id, max_eval_steps=max_eval_steps, batch_size=8,
                                 should_stop=should_stop)
        pushed = read_pushed_metrics(repo, c.commit_id) or {}
        tokens = pushed.get("tokens_seen") if pushed.get("step") == c.step else None
        points.append(LossPoint(branch, c.step, tokens if tokens is not None else _tokens_seen(ws.ref, c.commit_id),
                                result["loss"], c.commit_id))
        measured_on = result["measured_on"]
    progress(1.0, f"{branch}: {len(commits)} checkpoint(s) evaluated")
    return points, measured_on


def _tokens_seen(ref: str, commit: str) -> int | None:
    state = resolve_model_dir(ref, commit) / "trainer_state.json"
    try:
        return int(json.loads(state.read_text(encoding="utf-8"))["tokens_seen"])
    except (OSError, ValueError, KeyError, TypeError):
        return None

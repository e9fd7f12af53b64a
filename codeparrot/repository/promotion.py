"""Promote a checkpoint to `main`, choosing the best one of a branch by its pushed validation loss.

`scripts/checkpoints.py promote REPO --revision REV`:
- REV names a branch (an experiment): the branch's "step N" checkpoint with the lowest validation loss in its
  pushed `metrics.json` is promoted (ties: the earlier step); the report says which, its loss, what it was
  measured on, and how many checkpoints it beat. A branch without pushed losses promotes its newest
  checkpoint, and the report says that no loss was available to choose by.
- REV names a commit or tag: exactly that commit is promoted.
Either way the report shows what `main` held before (commit and message) and what it holds now.
"""

from __future__ import annotations

from dataclasses import dataclass

from codeparrot.errors import CodeParrotError
from codeparrot.repository.base import CheckpointRepository
from codeparrot.repository.metrics import describe_eval, pushed_losses, read_pushed_metrics


@dataclass
class PromotionChoice:
    commit: str  # full commit id to promote
    reason: str  # one line: which checkpoint and why


def choose_checkpoint(repo: CheckpointRepository, revision: str) -> PromotionChoice:
    """The commit `revision` stands for: a branch's best checkpoint by pushed validation loss, else `revision`."""
    branches = {b.name: b for b in repo.list_branches()}
    if revision in branches and revision != "main":
        losses = pushed_losses(repo, revision)
        if losses:
            best_commit, best = min(losses, key=lambda cm: (cm[1]["val_loss"], cm[0].step))
            newest = max(losses, key=lambda cm: cm[0].step)[0]
            why = (f"lowest pushed validation loss of its {len(losses)} checkpoint(s) with one: "
                   f"{best['val_loss']:.4f} at step {best_commit.step} (measured on {describe_eval(best)})")
            if best_commit.commit_id != newest.commit_id:
                why += f"; the newest, step {newest.step}, has {read_pushed_metrics(repo, newest.commit_id)['val_loss']:.4f}"
            return PromotionChoice(best_commit.commit_id,
                                   f"{revision}: step {best_commit.step} ({best_commit.commit_id[:12]}), {why}")
        commit = branches[revision].commit_id
        step = branches[revision].latest_step
        return PromotionChoice(commit, f"{revision}: its newest checkpoint{f' (step {step})' if step else ''} "
                                       f"{commit[:12]}; no validation loss was pushed with its checkpoints to "
                                       f"choose the best by")
    commit = repo.resolve_revision(revision)
    metrics = read_pushed_metrics(repo, commit)
    loss = (f", validation loss {metrics['val_loss']:.4f} (measured on {describe_eval(metrics)})"
            if metrics else "")
    return PromotionChoice(commit, f"{revision}: commit {commit[:12]} as given{loss}")


def promote_best(repo: CheckpointRepository, revision: str) -> list[str]:
    """Promote what `revision` stands for (see the module docstring); the report lines."""
    choice = choose_checkpoint(repo, revision)
    return promote_commit(repo, choice.commit, [f"chosen: {choice.reason}"])


def promote_commit(repo: CheckpointRepository, commit: str, lines: list[str] | None = None) -> list[str]:
    """Promote exactly `commit`; report lines saying what main held before and holds now."""
    try:
        before = repo.list_commits("main")[:1]
    except CodeParrotError:
        before = []  # no main yet
    new = repo.promote(commit)
    after = repo.list_commits("main")[:1]
    lines = list(lines or [])
    lines.append(f"main before: {before[0].commit_id[:12]} {before[0].message!r}" if before else
                 "main before: (none)")
    lines.append(f"main now:    {new[:12]} {after[0].message if after else ''!r}")
    return lines

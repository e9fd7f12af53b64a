"""Promote a checkpoint to `main`, choosing the best one of a branch by its pushed validation loss.

`scripts/checkpoints.py promote REPO --revision REV`:
- REV names a branch (an experiment): the branch's "step N" checkpoint with the lowest validation loss in its
  pushed `metrics.json` is promoted (ties: the earlier step); the report says which, its loss, what it was
  measured on, and how many checkpoints it beat. Only the branch's own checkpoints compete: not those of an
  experiment it was started from (`metrics.branch_checkpoints`). A branch without pushed losses promotes its
  newest checkpoint, and the report says that no loss was available to choose by.
- REV names a commit or tag: exactly that commit is promoted.
Either way the report shows what `main` held before (commit and message) and what it holds now.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from codeparrot.errors import CodeParrotError
from codeparrot.repository.base import CheckpointRepository
from codeparrot.repository.metrics import branch_checkpoints, describe_eval, read_pushed_metrics


@dataclass
class PromotionChoice:
    commit: str  # full commit id to promote
    reason: str  # one line: which checkpoint and why
    notes: list[str] = field(default_factory=list)  # what the choice could not tell (e.g. unmarked checkpoints)


def choose_checkpoint(repo: CheckpointRepository, revision: str) -> PromotionChoice:
    """The commit `revision` stands for: a branch's best checkpoint by pushed validation loss, else `revision`."""
    branches = {b.name: b for b in repo.list_branches()}
    if revision in branches and revision != "main":
        notes: list[str] = []
        checkpoints = branch_checkpoints(repo, revision, notes)
        losses = [(c, m) for c in checkpoints if (m := read_pushed_metrics(repo, c.commit_id)) is not None]
        if losses:
            best_commit, best = min(losses, key=lambda cm: (cm[1]["val_loss"], cm[0].step))
            newest, newest_metrics = max(losses, key=lambda cm: cm[0].step)
            why = (f"lowest pushed validation loss of its {len(losses)} checkpoint(s) with one: "
                   f"{best['val_loss']:.4f} at step {best_commit.step} (measured on {describe_eval(best)})")
            if best_commit.commit_id != newest.commit_id:
                why += f"; the newest, step {newest.step}, has {newest_metrics['val_loss']:.4f}"
            return PromotionChoice(best_commit.commit_id,
                                   f"{revision}: step {best_commit.step} ({best_commit.commit_id[:12]}), {why}", notes)
        head = branches[revision]
        if checkpoints and head.commit_id not in {c.commit_id for c in checkpoints}:
            commit, step = checkpoints[-1].commit_id, checkpoints[-1].step  # not another run's head
        else:  # its head; without a checkpoint of its own, what it was started from (as before marks)
            commit, step = head.commit_id, head.latest_step
        return PromotionChoice(commit, f"{revision}: its newest checkpoint{f' (step {step})' if step else ''} "
                                       f"{commit[:12]}; no validation loss was pushed with its checkpoints to "
                                       f"choose the best by", notes)
    commit = repo.resolve_revision(revision)
    metrics = read_pushed_metrics(repo, commit)
    loss = (f", validation loss {metrics['val_loss']:.4f} (measured on {describe_eval(metrics)})"
            if metrics else "")
    return PromotionChoice(commit, f"{revision}: commit {commit[:12]} as given{loss}")


def promote_best(repo: CheckpointRepository, revision: str) -> list[str]:
    """Promote what `revision` stands for (see the module docstring); the report lines."""
    choice = choose_checkpoint(repo, revision)
    return promote_commit(repo, choice.commit, [f"chosen: {choice.reason}"] + [f"note: {n}" for n in choice.notes])


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
    if before and new == before[0].commit_id:
        lines.append("main now:    unchanged: it holds exactly these files already (nothing to promote)")
    else:
        lines.append(f"main now:    {new[:12]} {after[0].message if after else ''!r}")
    return lines

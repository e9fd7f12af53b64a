"""`metrics.json`: what a pushed checkpoint carries about its validation loss, so curves come from the repository.

The pusher writes it into every "step N" commit from the run's `metrics.jsonl` (`<run>/checkpoints/step-N`:
the run folder is the checkpoint folder's grandparent): the latest evaluation at or before step N, with the
tokens seen then and what the loss was measured on. Shape:

    {"step": 120, "tokens_seen": 983040, "val_loss": 5.49, "perplexity": 242.3,
     "val_tokens": 40920, "val_sequences": 40, "val_seq_length": 1024}

(`val_sequences`/`val_seq_length` only when the run logged them.) `scripts/checkpoints.py plot` and the app's
Experiments tab read it back with `pushed_losses`, for a local git repository or a Hub repository alike.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from codeparrot.errors import CodeParrotError
from codeparrot.repository.base import CheckpointRepository, CommitInfo

METRICS_FILE = "metrics.json"
# the keys of an evaluation entry in metrics.jsonl that travel with the checkpoint
EVAL_KEYS = ("val_loss", "perplexity", "val_tokens", "val_sequences", "val_seq_length")


def checkpoint_metrics(run_dir: Path, step: int) -> dict | None:
    """The latest evaluation logged in `run_dir/metrics.jsonl` at or before `step`, as `metrics.json` holds it."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        return None
    latest = None
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue  # a line cut by a kill
        loss = entry.get("val_loss") if isinstance(entry, dict) else None
        if isinstance(loss, (int, float)) and math.isfinite(loss) and isinstance(entry.get("step"), int) \
                and entry["step"] <= step and (latest is None or entry["step"] >= latest["step"]):
            latest = entry
    if latest is None:
        return None
    return {"step": latest["step"], "tokens_seen": latest.get("tokens_seen"),
            **{k: latest[k] for k in EVAL_KEYS if k in latest}}


def read_pushed_metrics(repo: CheckpointRepository, commit: str) -> dict | None:
    """`metrics.json` of `commit`, or None when the commit has none (pushed before it existed, or no eval)."""
    from codeparrot.repository.hub import HubRepository
    from codeparrot.repository.local import LocalGitRepository

    text = None
    if isinstance(repo, LocalGitRepository):
        # ask for the type first: `git show` of a path the commit lacks is an error, not an empty answer
        if repo._git("cat-file", "-t", f"{commit}:{METRICS_FILE}", check=False).strip() == "blob":
            text = repo._git("show", f"{commit}:{METRICS_FILE}")
    elif isinstance(repo, HubRepository):
        from huggingface_hub import hf_hub_download

        try:
            text = Path(hf_hub_download(repo.repo_id, METRICS_FILE, revision=commit)).read_text(encoding="utf-8")
        except Exception:  # noqa: BLE001 - missing file, offline cache miss: no pushed metrics for this commit
            text = None
    if text is None:
        return None
    try:
        data = json.loads(text)
    except ValueError:
        return None
    loss = data.get("val_loss") if isinstance(data, dict) else None
    return data if isinstance(loss, (int, float)) and math.isfinite(loss) else None


def branch_checkpoints(repo: CheckpointRepository, branch: str) -> list[CommitInfo]:
    """The "step N" commits of `branch` itself, oldest first: not those it inherited from `main` (a branch
    starts from main, whose history may hold other experiments' promoted checkpoints)."""
    inherited = set()
    if branch != "main":
        try:
            inherited = {c.commit_id for c in repo.list_commits("main")}
        except CodeParrotError:
            inherited = set()  # no main
    return sorted((c for c in repo.list_commits(branch) if c.step is not None and c.commit_id not in inherited),
                  key=lambda c: c.step)


def pushed_losses(repo: CheckpointRepository, branch: str) -> list[tuple[CommitInfo, dict]]:
    """(checkpoint, its metrics.json) for every "step N" commit of `branch` that carries one, oldest first."""
    out = []
    for commit in branch_checkpoints(repo, branch):
        metrics = read_pushed_metrics(repo, commit.commit_id)
        if metrics is not None:
            out.append((commit, metrics))
    return out


def describe_eval(metrics: dict) -> str:
    """What a loss was measured on, e.g. '40 sequences x 1,024 tokens (40,920 predicted tokens)'."""
    seqs, length, tokens = metrics.get("val_sequences"), metrics.get("val_seq_length"), metrics.get("val_tokens")
    parts = []
    if seqs is not None and length is not None:
        parts.append(f"{seqs:,} sequences x {length:,} tokens")
    if tokens is not None:
        parts.append(f"({tokens:,} predicted tokens)" if parts else f"{tokens:,} predicted tokens")
    return " ".join(parts) or "unknown size"

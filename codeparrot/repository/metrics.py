"""`metrics.json`: what a pushed checkpoint carries about its validation loss, so curves come from the repository.

The pusher writes it into every "step N" commit from the run's `metrics.jsonl` (`<run>/checkpoints/step-N`:
the run folder is the checkpoint folder's grandparent): the latest evaluation at or before step N, with the
tokens seen then and what the loss was measured on. Shape:

    {"step": 120, "tokens_seen": 983040, "val_loss": 5.49, "perplexity": 242.3,
     "val_tokens": 40920, "val_sequences": 40, "val_seq_length": 1024}

(`val_sequences`/`val_seq_length` only when the run logged them.) `scripts/checkpoints.py plot` and the app's
Experiments tab read it back with `pushed_losses`, for a local git repository or a Hub repository alike.

Which commits are a branch's own checkpoints (`branch_checkpoints`): the pusher marks each commit with the run
that pushed it (a `CodeParrot-Run: NAME` trailer, NAME being the branch); a branch started from another
experiment's branch also holds that experiment's "step N" commits (with the same step numbers), which the mark
excludes. Commits pushed before marks existed are kept, as they always were, with a note saying so.
"""

from __future__ import annotations

import json
import math
import sys
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
    from codeparrot.repository.hub import HubRepository, hub_error
    from codeparrot.repository.local import LocalGitRepository

    text = None
    if isinstance(repo, LocalGitRepository):
        # ask for the type first: `git show` of a path the commit lacks is an error, not an empty answer
        if repo._git("cat-file", "-t", f"{commit}:{METRICS_FILE}", check=False).strip() == "blob":
            text = repo._git("show", f"{commit}:{METRICS_FILE}")
    elif isinstance(repo, HubRepository):
        try:
            path = repo.api.hf_hub_download(repo_id=repo.repo_id, filename=METRICS_FILE, revision=commit,
                                            repo_type=repo.repo_type)
            text = Path(path).read_text(encoding="utf-8")
        except Exception as err:  # noqa: BLE001 - sorted out below
            # Only the file missing from the commit means "no metrics": a 5xx, a rate limit or an offline cache
            # miss skipped here would silently change which checkpoint `promote` chooses.
            if not _file_missing(err):
                raise hub_error(err, f"reading {METRICS_FILE} of", repo.repo_id, commit) from None
    if text is None:
        return None
    try:
        data = json.loads(text)
    except ValueError:
        return None
    loss = data.get("val_loss") if isinstance(data, dict) else None
    return data if isinstance(loss, (int, float)) and math.isfinite(loss) else None


def _file_missing(err: BaseException) -> bool:
    """Whether a failed Hub download says the file is not in that revision (404 for the file itself), as opposed
    to the repository or revision missing, the server failing, or an offline cache miss."""
    from huggingface_hub import errors

    if isinstance(err, errors.LocalEntryNotFoundError):  # an EntryNotFoundError too, but only "not cached"
        return False
    if isinstance(err, errors.EntryNotFoundError):
        return True
    status = getattr(getattr(err, "response", None), "status_code", None)
    return (isinstance(err, errors.HfHubHTTPError) and status == 404
            and not isinstance(err, (errors.RepositoryNotFoundError, errors.RevisionNotFoundError)))


def branch_checkpoints(repo: CheckpointRepository, branch: str, notes: list[str] | None = None) -> list[CommitInfo]:
    """The "step N" commits of `branch` itself, oldest first: not those it inherited from `main` (a branch
    starts from main, whose history may hold other experiments' promoted checkpoints), nor those of another
    run it was started from (marked with that run's name; everything below the newest of them is that run's
    history). Commits without a mark (pushed before marks existed) are kept, and a note says so: appended to
    `notes`, or printed to stderr when no list is given."""
    inherited = set()
    if branch != "main":
        try:
            inherited = {c.commit_id for c in repo.list_commits("main")}
        except CodeParrotError:
            inherited = set()  # no main
    own, unmarked = [], 0
    for commit in repo.list_commits(branch):  # newest first, along the branch's own line
        if commit.run is not None and commit.run != branch:
            break  # the experiment this branch was started from: it and everything older is that run's
        if commit.step is None or commit.commit_id in inherited:
            continue
        own.append(commit)
        unmarked += commit.run is None
    if unmarked:
        note = (f"{unmarked} checkpoint(s) of {branch!r} carry no run mark (pushed before runs marked theirs): "
                "taken as its own, though where it was started from another experiment's branch some are that one's")
        if notes is None:
            print(f"note: {note}", file=sys.stderr, flush=True)
        else:
            notes.append(note)
    return sorted(own, key=lambda c: c.step)


def pushed_losses(repo: CheckpointRepository, branch: str,
                  notes: list[str] | None = None) -> list[tuple[CommitInfo, dict]]:
    """(checkpoint, its metrics.json) for every "step N" commit of `branch` that carries one, oldest first
    (`notes`: as for `branch_checkpoints`)."""
    out = []
    for commit in branch_checkpoints(repo, branch, notes):
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

"""Which weights a run samples, pinned so that what it made can be reproduced: the commit a revision names
(`pinned_commit`) and the dtype the weights were loaded in (`weights_dtype`). The tokenizer is loaded from the same
folder as the model, so the commit pins it too. HumanEval records both with its samples (and a resumed run never
mixes the samples of two checkpoints); scripts/generate.py records them in its --output.

A branch name is not enough: a local repository's branch moves as training pushes checkpoints, a Hub branch moves
with every upload. So the commit is resolved once, before anything loads, the run loads exactly it
(`loads_as_checked_out` says where the files are loaded in place instead), and records it.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from typing import Any

from codeparrot.errors import CodeParrotError
from codeparrot.repository.base import is_hub_ref, strip_scheme
from codeparrot.repository.local import LocalGitRepository, is_git_repository

FULL_COMMIT = re.compile(r"[0-9a-f]{40}")


def pinned_commit(model: str, revision: str | None, api: Any = None) -> str | None:
    """The commit that `revision` (default main) of the repository `model` names now, which the run loads and
    records. None where there is no commit to pin: a plain folder, a worktree whose files are not exactly a
    commit's (`worktree_commit`), a Hub revision offline and not in the local cache, or a path that does not
    exist (loading the model says why). `api`: the `HfApi` asked about Hub revisions (tests pass a stand-in)."""
    if is_hub_ref(model):
        return hub_commit(strip_scheme(model), revision, api)
    path = Path(strip_scheme(model)).expanduser()
    if not path.exists() or not is_git_repository(path):
        return None
    if revision is None and (path / ".git").exists():  # a worktree used as checked out
        return worktree_commit(path)
    return LocalGitRepository(path).resolve_revision(revision or "main")


def loads_as_checked_out(model: str, revision: str | None) -> bool:
    """Whether `model` is a worktree used as checked out (no --revision): it is loaded in place even where its
    commit is pinned (its files are that commit's), not copied out of the repository into the cache."""
    if revision is not None or is_hub_ref(model):
        return False
    return (Path(strip_scheme(model)).expanduser() / ".git").exists()


def hub_commit(repo_id: str, revision: str | None, api: Any = None) -> str | None:
    """The commit `revision` (default main) of the Hub repository `repo_id` names: a full commit id as given; online,
    what the Hub answers (one request, without downloading anything); offline (HF_HUB_OFFLINE=1), the commit the
    local Hub cache records for the revision, which is what loading will use, or None when it has no record."""
    from huggingface_hub import HfApi, constants, try_to_load_from_cache

    from codeparrot.repository.hub import hub_error

    revision = revision or "main"
    if FULL_COMMIT.fullmatch(revision):
        return revision
    if constants.HF_HUB_OFFLINE:
        # The cache's snapshots are folders named by commit; config.json is in every model snapshot.
        cached = try_to_load_from_cache(repo_id, "config.json", revision=revision)
        return Path(cached).parent.name if isinstance(cached, str) else None
    try:
        sha = (api or HfApi()).model_info(repo_id, revision=revision).sha
    except Exception as err:  # HTTP, network, unknown repository or revision: a one-line error naming them
        raise hub_error(err, "resolving", repo_id, revision) from None
    return sha if isinstance(sha, str) and FULL_COMMIT.fullmatch(sha) else None


def worktree_commit(path: Path) -> str | None:
    """HEAD of the git worktree at `path` when its files are exactly that commit's, else None: with a changed,
    untracked or ignored file (weights can be any of them), or no commit at all, a commit id would pin nothing."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}  # the worktree's own repository
    try:
        status = subprocess.run(["git", "-C", str(path), "status", "--porcelain", "--ignored"], capture_output=True,
                                env={**env, "LC_ALL": "C"}, timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if status.returncode != 0 or status.stdout.strip():
        return None
    try:
        return LocalGitRepository(path).resolve_revision("HEAD")
    except CodeParrotError:  # no commit yet
        return None


def weights_dtype(model) -> str:
    """The dtype the weights were loaded in ("float32" on CPU; the saved one, e.g. "bfloat16", on a GPU): the same
    commit sampled in another dtype gives other samples."""
    return str(next(model.parameters()).dtype).removeprefix("torch.")

"""Which weights a run samples, pinned so that what it made can be reproduced: the commit a revision names
(`pinned_commit`) and the dtype the weights were loaded in (`weights_dtype`). The tokenizer is loaded from the same
folder as the model, so the commit pins it too. HumanEval records both with its samples (and a resumed run never
mixes the samples of two checkpoints); scripts/generate.py records them in its --output.

A branch name is not enough: a local repository's branch moves as training pushes checkpoints, a Hub branch moves
with every upload. So the commit is resolved once, before anything loads, the run loads exactly it
(`load_revision` says what is loaded), and records it.
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


def load_revision(model: str, revision: str | None, commit: str | None) -> str | None:
    """What to load for `model` at `revision`, whose files `commit` (`pinned_commit`) names: that commit, so every
    process loads the weights recorded even after the branch moves; except a worktree used as checked out (no
    --revision), loaded in place (its files are that commit's), not copied out of the repository into the cache."""
    in_place = revision is None and not is_hub_ref(model) and (Path(strip_scheme(model)).expanduser() / ".git").exists()
    return revision if in_place else commit or revision


def hub_commit(repo_id: str, revision: str | None, api: Any = None) -> str | None:
    """The commit `revision` (default main) of the Hub repository `repo_id` names: a full commit id as given; online,
    what the Hub answers (one request, without downloading anything); offline (HF_HUB_OFFLINE=1), or online with
    the Hub out of reach, the commit the local Hub cache records for the revision, which is what loading will use
    then too (None offline when it has no record)."""
    from huggingface_hub import HfApi, constants, errors

    from codeparrot.repository.hub import hub_error

    revision = revision or "main"
    if FULL_COMMIT.fullmatch(revision):
        return revision
    if constants.HF_HUB_OFFLINE:
        return _cached_commit(repo_id, revision)
    try:
        sha = (api or HfApi()).model_info(repo_id, revision=revision).sha
    except Exception as err:  # HTTP, network, unknown repository or revision: a one-line error naming them
        # no answer at all (no network, a timeout): loading falls back to the cache, so the pin does too
        cached = None if isinstance(err, errors.HfHubHTTPError) else _cached_commit(repo_id, revision)
        if cached is None:
            raise hub_error(err, "resolving", repo_id, revision) from None
        return cached
    return sha if isinstance(sha, str) and FULL_COMMIT.fullmatch(sha) else None


def _cached_commit(repo_id: str, revision: str) -> str | None:
    """The commit the local Hub cache records for `revision` (its snapshots are folders named by commit;
    config.json is in every model snapshot), or None."""
    from huggingface_hub import try_to_load_from_cache

    cached = try_to_load_from_cache(repo_id, "config.json", revision=revision)
    return Path(cached).parent.name if isinstance(cached, str) else None


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

"""Which repository or model folder a reference names: `open_repository` and `resolve_model_dir`.

How a reference is read: `hf://...` is the Hub, `file://...` or anything starting with `/`, `.` or `~` is a
path, an existing path is a path; otherwise `owner/name` (one slash, Hub-legal characters) is the Hub when
no directory `owner` exists here, and anything else is a path. Other URLs are refused (`base.check_reference`).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from codeparrot.atomic_io import atomic_dir, writable_dir_problem
from codeparrot.errors import CodeParrotError
from codeparrot.repository.base import CheckpointRepository, check_reference, is_hub_ref, strip_scheme
from codeparrot.repository.hub import HubRepository, hub_snapshot
from codeparrot.repository.local import LocalGitRepository, check_no_lfs_pointers, is_git_repository, lfs_pointers


def open_repository(ref: str, create: bool = False, repo_type: str = "model") -> CheckpointRepository:
    """The repository `ref` names; `create=True` creates it when missing (a Hub repo, or a bare git repo).
    `repo_type="dataset"`: a Hub dataset repository (`OWNER/NAME` or `hf://datasets/OWNER/NAME`).

    A path that exists but is not a git repository, or a missing one without `create`, is a one-line error.
    """
    ref = str(ref)
    if is_hub_ref(ref):
        repo_id = strip_scheme(ref)
        if repo_type == "dataset" and ref.startswith("hf://datasets/"):
            repo_id = repo_id[len("datasets/"):]  # the Hub's own URL form of a dataset
        return HubRepository(repo_id, create=create, repo_type=repo_type, path_too=could_be_path(ref))
    return LocalGitRepository(Path(strip_scheme(ref)).expanduser(), create=create)


def could_be_path(ref: str) -> bool:
    """Whether a Hub reference `ref` was read as one only because no such folder exists here (`owner/name`
    without `hf://`): its errors then name the missing folder too (`hub.hub_error`)."""
    return not check_reference(ref).startswith("hf://")


def cache_root() -> Path:
    """Where local-repository revisions are materialized: `$CODEPARROT_CACHE` or ~/.cache/codeparrot."""
    root = os.environ.get("CODEPARROT_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "codeparrot")
    return Path(root) / "revisions"


def resolve_model_dir(ref: str, revision: str | None = None) -> Path:
    """A folder `from_pretrained` can load for `ref` at `revision`.

    - a plain folder (config.json/tokenizer files, not a repository): itself (`revision` must be None);
    - a local git repository: the revision (default `main`) materialized once per commit id in the cache
      (commit ids name content, so a cached folder never goes stale; git-lfs pointers in place of files are an
      error, never cached); a non-bare repository without a revision is used as checked out;
    - a Hub id: `snapshot_download` (uses the local Hub cache when offline).
    """
    ref = str(ref)
    if is_hub_ref(ref):
        return hub_snapshot(strip_scheme(ref), revision, path_too=could_be_path(ref))
    path = Path(strip_scheme(ref)).expanduser()
    if not path.exists():
        raise CodeParrotError(f"not found: {path} (neither a folder, a local repository nor a Hub id)")
    if not is_git_repository(path):
        if not path.is_dir():
            raise CodeParrotError(f"{path} is not a folder or a repository")
        if revision is not None:
            raise CodeParrotError(f"{path} is a plain folder, not a repository: it has no revision {revision!r}")
        return path
    if revision is None and (path / ".git").exists():
        check_no_lfs_pointers(path, str(path))  # a clone made without git-lfs holds pointers, not weights
        return path  # a git worktree (e.g. a cloned model) without a revision: the files as checked out
    repo = LocalGitRepository(path)
    commit = repo.resolve_revision(revision or "main")
    target = cache_root() / commit
    if not target.is_dir() or lfs_pointers(target):
        materialize(repo, commit, target)
    return target


def materialize(repo: LocalGitRepository, commit: str, target: Path) -> None:
    """Write the files of `commit` into the cache folder `target`; a cache that cannot be written (read-only, a
    full or over-quota home, a file in the way) is a one-line error naming it and CODEPARROT_CACHE, which
    moves it."""
    cache = target.parent
    problem = writable_dir_problem(cache)
    if problem is None:
        try:
            if target.is_dir():
                shutil.rmtree(target)  # cached by an older version that did not check for git-lfs pointers
            with atomic_dir(target) as tmp:  # a concurrent materialization of the same commit is identical
                repo.checkout_into(commit, tmp)
            return
        except OSError as err:
            problem = err.strerror or str(err)
    raise CodeParrotError(f"cannot write {repo.ref} at {commit[:12]} into the revision cache {cache}: {problem}; "
                          "set CODEPARROT_CACHE to a folder you can write to")

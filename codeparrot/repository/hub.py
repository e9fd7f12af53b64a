"""Hugging Face Hub checkpoint repository, through `huggingface_hub.HfApi`.

The token comes from huggingface_hub's usual sources (`HF_TOKEN`, `hf auth login`); this module never reads,
prints or logs it, and scrubs anything token-shaped from the error messages it raises.

Commits replace the branch's files with the folder's (`upload_folder(..., delete_patterns="*")`, which
keeps the Hub's `.gitattributes`). `commit_folder_async` uses `upload_folder(run_as_future=True)`, so the
upload runs on HfApi's background thread; `promote` copies files server-side (`CommitOperationCopy`), so
promoting a 6 GB checkpoint downloads nothing.
"""

from __future__ import annotations

import os
import shutil
from concurrent.futures import Future
from pathlib import Path
from typing import Any, Callable

from huggingface_hub import CommitOperationCopy, CommitOperationDelete, HfApi, constants, errors, snapshot_download

import codeparrot.repository.base as base
from codeparrot.errors import CodeParrotError, first_line
from codeparrot.redaction import scrub_secrets
from codeparrot.repository.base import BranchInfo, CheckpointRepository, CommitInfo

scrub = scrub_secrets  # error messages from the Hub client may echo a token or a credentialed URL


def hub_error(err: BaseException, what: str, repo_id: str, revision: str | None = None,
              path_too: bool = False) -> CodeParrotError:
    """A one-line `CodeParrotError` for an exception raised by huggingface_hub. `path_too`: `repo_id` was read
    as a Hub id only because no such folder exists here (no `hf://`), so a missing repository names both
    readings: a mistyped or not yet created folder must not read as a Hub failure only."""

    at = f"{repo_id}@{revision}" if revision else repo_id
    no_folder = f"{repo_id}: no such folder, and " if path_too else ""
    if isinstance(err, errors.RevisionNotFoundError):
        return CodeParrotError(f"revision {revision!r} not found in Hub repository {repo_id}")
    if isinstance(err, errors.RepositoryNotFoundError):
        return CodeParrotError(f"{no_folder}Hub repository {repo_id} not found or not accessible "
                               "(log in with `hf auth login` or set HF_TOKEN)")
    if isinstance(err, errors.OfflineModeIsEnabled) or (
            isinstance(err, errors.LocalEntryNotFoundError) and constants.HF_HUB_OFFLINE):
        if path_too:
            return CodeParrotError(f"{no_folder}{at} is not in the local Hub cache either (the Hub is offline: "
                                   "HF_HUB_OFFLINE=1)")
        return CodeParrotError(f"{what} {at}: the Hub is offline (HF_HUB_OFFLINE=1) and {at} is not in the "
                               "local cache")
    return CodeParrotError(scrub(f"{what} {at} failed: {type(err).__name__}: {first_line(err, '')}"))


def hub_snapshot(repo_id: str, revision: str | None = None, local_dir: str | os.PathLike | None = None,
                 repo_type: str = "model", path_too: bool = False) -> Path:
    """`snapshot_download` of `repo_id` at `revision` (the local cache when offline), as a folder path.
    `path_too`: see `hub_error`."""

    try:
        return Path(snapshot_download(repo_id, revision=base.validate_revision(revision) if revision else None,
                                      local_dir=local_dir, repo_type=repo_type))
    except CodeParrotError:
        raise
    except Exception as err:  # HTTP, network, offline cache miss, bad id: a one-line error naming the repo
        raise hub_error(err, "downloading", repo_id, revision, path_too=path_too) from None


class HubRepository(CheckpointRepository):
    """A repository `repo_id` on the Hugging Face Hub (or any server behind `HF_ENDPOINT`): a model repository
    (checkpoints), or with `repo_type="dataset"` a dataset repository (`codeparrot.repository.datasets`)."""

    def __init__(self, repo_id: str, create: bool = False, api: Any = None, private: bool | None = None,
                 repo_type: str = "model", path_too: bool = False):

        self.repo_id = self.ref = repo_id
        self.path_too = path_too  # `hub_error`
        self.repo_type = repo_type
        self.api = api if api is not None else HfApi()
        self._known_branches: set[str] = set()
        if create:
            self._call("creating", self.api.create_repo, repo_id=repo_id, repo_type=repo_type, exist_ok=True,
                       private=private)

    def _call(self, what: str, fn: Callable, at: str | None = None, **kwargs):
        """`fn(repo_type=self.repo_type, **kwargs)` (an HfApi method) with its failures turned into one-line errors
        naming the repository (`at`: a revision). Anything an HfApi call raises - HTTP errors, network errors, or a
        KeyError from a server (a mirror) that answers an endpoint in an unexpected shape - is a Hub failure."""
        try:
            return fn(**{"repo_type": self.repo_type, **kwargs})
        except Exception as err:
            raise hub_error(err, what, self.repo_id, at, path_too=self.path_too) from None

    def _head(self, revision: str):
        """The newest `GitCommitInfo` of `revision`."""
        base.validate_revision(revision)
        commits = self._call("reading", self.api.list_repo_commits, revision, repo_id=self.repo_id,
                             revision=revision)
        if not commits:
            raise CodeParrotError(f"revision {revision!r} not found in Hub repository {self.repo_id}")
        return commits[0]

    def resolve_revision(self, revision: str) -> str:
        return self._head(revision).commit_id

    def create_branch(self, branch: str, from_revision: str = "main") -> None:
        base.validate_branch_name(branch)
        if branch in self._known_branches or branch == "main":
            return
        self._call("creating a branch in", self.api.create_branch, from_revision, repo_id=self.repo_id,
                   branch=branch, revision=from_revision, exist_ok=True)
        self._known_branches.add(branch)

    def _upload(self, folder: str | os.PathLike, branch: str, message: str, run_as_future: bool,
                parent: str | None = None):
        folder = base.check_commit_folder(folder)
        self.create_branch(branch)  # a new experiment branches off main
        subject, _, body = message.strip().partition("\n")  # the Hub keeps a commit's title and description apart
        # the Hub's compare-and-swap: with parent_commit it refuses the commit (412) once the branch has moved
        only_if = {"parent_commit": parent} if parent else {}
        return self._call("uploading to", self.api.upload_folder, branch, repo_id=self.repo_id,
                          folder_path=str(folder), revision=branch, commit_message=subject,
                          commit_description=body.strip() or None,
                          delete_patterns="*",  # the folder becomes the whole tree (.gitattributes is kept)
                          run_as_future=run_as_future, **only_if)

    def commit_folder(self, folder: str | os.PathLike, branch: str, message: str, parent: str | None = None) -> str:
        """`parent`: commit only if `branch` still points at this commit (another writer's commit since then makes
        this one fail instead of landing on top of it: the Hub has no lock to check and commit under)."""
        return self._upload(folder, branch, message, run_as_future=False, parent=parent).oid

    def commit_folder_async(self, folder: str | os.PathLike, branch: str, message: str) -> Future:
        """Upload on HfApi's background thread; a future of the commit id (failures raise on `.result()`)."""
        upload = self._upload(folder, branch, message, run_as_future=True)
        result: Future = Future()

        def done(fut: Future) -> None:
            err = fut.exception()
            if err is None:
                result.set_result(fut.result().oid)
            else:
                result.set_exception(hub_error(err, "uploading to", self.repo_id, branch))

        upload.add_done_callback(done)
        return result

    def list_branches(self) -> list[BranchInfo]:
        refs = self._call("listing branches of", self.api.list_repo_refs, repo_id=self.repo_id)
        branches = []
        for ref in refs.branches:
            try:
                commits = self._call("reading", self.api.list_repo_commits, ref.name, repo_id=self.repo_id,
                                     revision=ref.name)
            except CodeParrotError:  # a mirror without the commits endpoint (olah): branches without dates
                commits = []
            date = commits[0].created_at.isoformat() if commits else ""
            step = next((s for s in (base.parse_step(c.title) for c in commits) if s is not None), None)
            branches.append(BranchInfo(name=ref.name, commit_id=ref.target_commit, date=date, latest_step=step))
        return base.main_then_newest(branches)

    def list_commits(self, branch: str) -> list[CommitInfo]:
        base.validate_branch_name(branch)
        commits = self._call("reading", self.api.list_repo_commits, branch, repo_id=self.repo_id, revision=branch)
        return [CommitInfo(commit_id=c.commit_id, message=c.title, date=c.created_at.isoformat(),
                           step=base.parse_step(c.title), run=base.run_mark(getattr(c, "message", None)))
                for c in commits]

    def _write_revision(self, revision: str, folder: Path) -> None:
        if not constants.HF_HUB_OFFLINE:  # straight into the folder: the files on disk once, not in ~/.cache too
            hub_snapshot(self.repo_id, revision, local_dir=folder, repo_type=self.repo_type)
            shutil.rmtree(folder / ".cache", ignore_errors=True)  # huggingface_hub's download metadata
            return
        # Offline, through the Hub cache, then copied: `snapshot_download(local_dir=...)` offline looks only at the
        # folder's own download metadata, so a revision the cache holds reads as "not cached". Copies, not links:
        # the output is the user's to change, the cache's files are shared.
        snapshot = hub_snapshot(self.repo_id, revision, repo_type=self.repo_type)
        try:
            shutil.copytree(snapshot, folder, dirs_exist_ok=True)  # the cache's symlinks copied as their files
        except OSError as err:
            raise CodeParrotError(f"copying {self.repo_id}@{revision} from the Hub cache into {folder}: "
                                  f"{err.strerror or err}") from None

    def promote(self, revision: str) -> str:

        head = self._head(revision)
        source, title = head.commit_id, head.title
        src_files = set(self._call("listing files of", self.api.list_repo_files, source, repo_id=self.repo_id,
                                   revision=source))
        main_files = set(self._call("listing files of", self.api.list_repo_files, "main", repo_id=self.repo_id,
                                    revision="main"))
        operations: list = [CommitOperationCopy(src_path_in_repo=f, path_in_repo=f, src_revision=source)
                            for f in sorted(src_files) if f != ".gitattributes"]
        operations += [CommitOperationDelete(path_in_repo=f) for f in sorted(main_files - src_files)
                       if f != ".gitattributes"]
        subject, body = base.promotion_message(revision, source, title)
        info = self._call("committing to", self.api.create_commit, "main", repo_id=self.repo_id,
                          operations=operations, commit_message=subject, commit_description=body, revision="main")
        return info.oid

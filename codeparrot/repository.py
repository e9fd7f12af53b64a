"""Checkpoint repositories: one interface, two backends chosen by the reference.

- `user/name` (or `hf://user/name`): a Hugging Face Hub model repository (`repository_hub.py`, `HfApi`).
- a filesystem path (or `file://PATH`): a local git repository (`repository_local.py`), the offline default.

Every experiment is a branch; every checkpoint is one commit ("step N") holding the files needed to use or
resume the model; `main` holds the "initial model" and, later, the promoted best checkpoint.

How a reference is read: `hf://...` is the Hub, `file://...` or anything starting with `/`, `.` or `~` is a
path, an existing path is a path; otherwise `owner/name` (one slash, Hub-legal characters) is the Hub when
no directory `owner` exists here, and anything else is a path.
"""

from __future__ import annotations

import abc
import fnmatch
import logging
import os
import queue
import re
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from codeparrot.errors import CodeParrotError

_STEP_RE = re.compile(r"\bstep[ _-]?(\d+)\b", re.IGNORECASE)
_HUB_ID_RE = re.compile(r"^[A-Za-z0-9][\w.-]{0,95}/[A-Za-z0-9][\w.-]{0,95}$")
INITIAL_MESSAGE = "initial model"
logger = logging.getLogger(__name__)


def parse_step(message: str) -> int | None:
    """The training step a commit message names ("step 1200", "promote run@abc (step 1200)"), else None."""
    first_line = message.strip().splitlines()[0] if message.strip() else ""
    match = _STEP_RE.search(first_line)
    return int(match.group(1)) if match else None


@dataclass
class CommitInfo:
    """One checkpoint: a commit on a branch."""

    commit_id: str
    message: str  # first line
    date: str  # ISO 8601
    step: int | None  # parsed from the message; None for "initial model" and other non-step commits


@dataclass
class BranchInfo:
    """One experiment: a branch and its newest checkpoint."""

    name: str
    commit_id: str
    date: str  # ISO 8601 date of the newest commit
    latest_step: int | None  # step of the newest commit that names one; None if none does


class CheckpointRepository(abc.ABC):
    """The operations both backends provide. Errors are `CodeParrotError` naming the repository/branch."""

    ref: str

    @abc.abstractmethod
    def create_branch(self, branch: str, from_revision: str = "main") -> None:
        """Create `branch` at `from_revision`; nothing happens if it exists (idempotent)."""

    @abc.abstractmethod
    def commit_folder(self, folder: str | os.PathLike, branch: str, message: str) -> str:
        """One commit on `branch` whose tree is exactly the files of `folder`; returns the commit id.
        A missing branch is created from `main` first."""

    @abc.abstractmethod
    def list_branches(self) -> list[BranchInfo]:
        """Every branch, `main` first, then newest first."""

    @abc.abstractmethod
    def list_commits(self, branch: str) -> list[CommitInfo]:
        """Commits on `branch`, newest first."""

    def download(self, revision: str, output_dir: str | os.PathLike) -> Path:
        """Materialize `revision` (branch, tag or commit id) as a new folder that `from_pretrained` loads
        (written atomically; an existing non-empty `output_dir` is refused)."""
        from codeparrot.atomic_io import atomic_dir

        output_dir = Path(output_dir)
        if output_dir.exists() and (not output_dir.is_dir() or any(output_dir.iterdir())):
            raise CodeParrotError(f"output directory {output_dir} already exists and is not empty")
        with atomic_dir(output_dir) as tmp:
            self._write_revision(revision, tmp)
        return output_dir

    @abc.abstractmethod
    def _write_revision(self, revision: str, folder: Path) -> None:
        """Write the files of `revision` into the existing, empty `folder`."""

    @abc.abstractmethod
    def promote(self, revision: str) -> str:
        """A new commit on `main` with exactly the files of `revision`, its message naming the source."""

    def resolve_revision(self, revision: str) -> str:
        """The full commit id of `revision`; `CodeParrotError` if it does not exist."""
        raise NotImplementedError

    def commit_folder_async(self, folder: str | os.PathLike, branch: str, message: str):
        """`commit_folder` returning a `concurrent.futures.Future` of the commit id (default: run inline)."""
        from concurrent.futures import Future

        future: Future = Future()
        try:
            future.set_result(self.commit_folder(folder, branch, message))
        except BaseException as err:  # noqa: BLE001 - handed to the caller through the future
            future.set_exception(err)
        return future

    def latest_step_message(self, branch: str) -> int | None:
        """The step of the newest commit on `branch` that names one (None if none does)."""
        for commit in self.list_commits(branch):
            if commit.step is not None:
                return commit.step
        return None


def check_commit_folder(folder: str | os.PathLike) -> Path:
    """`folder` as a Path when it can be committed: a folder holding at least one file."""
    folder = Path(folder)
    if not folder.is_dir():
        raise CodeParrotError(f"cannot commit {folder}: not a folder")
    if not any(p.is_file() for p in folder.rglob("*")):
        raise CodeParrotError(f"cannot commit {folder}: it holds no files")
    return folder


def main_then_newest(branches: list[BranchInfo]) -> list[BranchInfo]:
    """`list_branches` order: `main` first, then the others newest first."""
    newest_first = sorted(branches, key=lambda b: b.date, reverse=True)
    return sorted(newest_first, key=lambda b: b.name != "main")  # stable: keeps newest first after main


def promotion_message(revision: str, source: str, source_message: str) -> tuple[str, str]:
    """(subject, body) of the commit that promotes `revision` (resolved to commit `source`) onto main."""
    step = parse_step(source_message)
    subject = f"promote {revision}@{source[:12]} ({f'step {step}' if step is not None else source_message})"
    return subject, f"Source commit: {source}\nSource message: {source_message}"


def validate_branch_name(branch: str) -> str:
    """Reject names git and the Hub both refuse (or that would read as options), with a one-line error."""
    bad = (not branch or branch.startswith(("-", "/", ".")) or branch.endswith(("/", ".", ".lock"))
           or ".." in branch or "//" in branch or "@{" in branch or any(c in branch for c in " ~^:?*[\\\t\n")
           or any(ord(c) < 32 or ord(c) == 127 for c in branch))
    if bad:
        raise CodeParrotError(f"invalid branch name {branch!r} (no spaces, '..', '~^:?*[\\', leading '-' or '.')")
    return branch


def validate_revision(revision: str) -> str:
    """A revision must not look like a command-line option or contain control characters."""
    if not revision or revision.startswith("-") or any(ord(c) < 32 for c in revision):
        raise CodeParrotError(f"invalid revision {revision!r}")
    return revision


def is_hub_ref(ref: str) -> bool:
    """Whether `ref` names a Hub repository rather than a local path (see the module docstring)."""
    if ref.startswith("hf://"):
        return True
    if ref.startswith(("file://", "/", ".", "~")) or os.path.exists(ref):
        return False
    return bool(_HUB_ID_RE.match(ref)) and not os.path.isdir(ref.split("/", 1)[0])


def _strip_scheme(ref: str) -> str:
    for scheme in ("hf://", "file://"):
        if ref.startswith(scheme):
            return ref[len(scheme):]
    return ref


def open_repository(ref: str, create: bool = False) -> CheckpointRepository:
    """The repository `ref` names; `create=True` creates it when missing (a Hub repo, or a bare git repo).

    A path that exists but is not a git repository, or a missing one without `create`, is a one-line error.
    """
    ref = str(ref)
    if is_hub_ref(ref):
        from codeparrot.repository_hub import HubRepository

        return HubRepository(_strip_scheme(ref), create=create)
    from codeparrot.repository_local import LocalGitRepository

    return LocalGitRepository(Path(_strip_scheme(ref)).expanduser(), create=create)


def cache_root() -> Path:
    """Where local-repository revisions are materialized: `$CODEPARROT_CACHE` or ~/.cache/codeparrot."""
    root = os.environ.get("CODEPARROT_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "codeparrot")
    return Path(root) / "revisions"


def resolve_model_dir(ref: str, revision: str | None = None) -> Path:
    """A folder `from_pretrained` can load for `ref` at `revision`.

    - a plain folder (config.json/tokenizer files, not a repository): itself (`revision` must be None);
    - a local git repository: the revision (default `main`) materialized once per commit id in the cache
      (commit ids name content, so a cached folder never goes stale); a non-bare repository without a
      revision is used as checked out;
    - a Hub id: `snapshot_download` (uses the local Hub cache when offline).
    """
    ref = str(ref)
    if is_hub_ref(ref):
        from codeparrot.repository_hub import hub_snapshot

        return hub_snapshot(_strip_scheme(ref), revision)
    from codeparrot.atomic_io import atomic_dir
    from codeparrot.repository_local import LocalGitRepository, is_git_repository

    path = Path(_strip_scheme(ref)).expanduser()
    if not path.exists():
        raise CodeParrotError(f"not found: {path} (neither a folder, a local repository nor a Hub id)")
    if not is_git_repository(path):
        if not path.is_dir():
            raise CodeParrotError(f"{path} is not a folder or a repository")
        if revision is not None:
            raise CodeParrotError(f"{path} is a plain folder, not a repository: it has no revision {revision!r}")
        return path
    if revision is None and (path / ".git").exists():
        return path  # a git worktree (e.g. a cloned model) without a revision: the files as checked out
    repo = LocalGitRepository(path)
    commit = repo.resolve_revision(revision or "main")
    target = cache_root() / commit
    if not target.is_dir():
        target.parent.mkdir(parents=True, exist_ok=True)
        with atomic_dir(target) as tmp:  # a concurrent materialization of the same commit is identical
            repo.checkout_into(commit, tmp)
    return target


class CheckpointPusher:
    """Pushes checkpoint folders to a branch in the background: training never waits and never crashes.

    `push` stages the files in a hidden sibling folder `.codeparrot-push/` (hard links, so instant and without
    extra disk; copies across filesystems; the checkpoint folder itself is never touched) and returns; one
    background thread commits staged pushes in order, retrying failures with exponential backoff. A push that still fails is logged as a warning with its reason and returned
    by `wait`, never raised. Contract for hard links: files of a pushed folder are not modified in place
    afterwards (checkpoints are written once, into fresh files).
    """

    def __init__(self, repo_ref: str, branch: str, max_retries: int = 3, backoff_s: float = 2.0):
        self.repo_ref, self.branch = str(repo_ref), validate_branch_name(branch)
        self.max_retries, self.backoff_s = max_retries, backoff_s
        self.commits: list[str] = []  # commit ids of successful pushes, in order
        self._errors: list[str] = []
        self._repo: CheckpointRepository | None = None
        self._queue: queue.Queue = queue.Queue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def push(self, folder: str | os.PathLike, message: str, include: list[str] | None = None) -> None:
        """Stage the files of `folder` (those matching the `include` globs, default all) and queue a commit."""
        try:
            staged = self._stage(Path(folder), include)
        except (OSError, CodeParrotError) as err:
            self._fail(f"push {message!r} to {self.repo_ref}@{self.branch} not staged: {err}")
            return
        self._queue.put((staged, message))
        with self._lock:
            if self._thread is None:  # one long-lived worker keeps the pushes in order
                self._thread = threading.Thread(target=self._worker, name="codeparrot-pusher", daemon=True)
                self._thread.start()

    def wait(self) -> list[str]:
        """Block until every queued push has finished; the error messages of the pushes that failed."""
        self._queue.join()
        return list(self._errors)

    def _stage(self, folder: Path, include: list[str] | None) -> Path:
        if not folder.is_dir():
            raise CodeParrotError(f"{folder} is not a folder")
        root = folder.resolve().parent / ".codeparrot-push"  # same filesystem as the checkpoint: hard links work
        root.mkdir(exist_ok=True)
        staged = Path(tempfile.mkdtemp(prefix=f"{folder.name}-", dir=root))
        count = 0
        for path in sorted(folder.rglob("*")):
            rel = path.relative_to(folder).as_posix()
            if path.is_symlink() or not path.is_file() or (
                    include and not any(fnmatch.fnmatch(rel, pat) for pat in include)):
                continue
            target = staged / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.link(path, target)  # instant, no extra disk; the data survives deletion of the original
            except OSError:
                shutil.copy2(path, target)
            count += 1
        if count == 0:
            self._remove_staged(staged)
            raise CodeParrotError(f"no files in {folder} match {include}")
        return staged

    @staticmethod
    def _remove_staged(staged: Path) -> None:
        shutil.rmtree(staged, ignore_errors=True)
        try:
            staged.parent.rmdir()  # the last staged push removes the hidden staging folder
        except OSError:
            pass

    def _fail(self, message: str) -> None:
        self._errors.append(message)
        logger.warning(message)

    def _worker(self) -> None:
        while True:
            staged, message = self._queue.get()
            try:
                self._push_with_retries(staged, message)
            finally:
                self._remove_staged(staged)
                self._queue.task_done()

    def _push_with_retries(self, staged: Path, message: str) -> None:
        last = ""
        for attempt in range(self.max_retries + 1):
            try:
                if self._repo is None:
                    self._repo = open_repository(self.repo_ref, create=True)
                self._repo.create_branch(self.branch)
                self.commits.append(self._repo.commit_folder_async(staged, self.branch, message).result())
                return
            except Exception as err:  # noqa: BLE001 - a failed push must never reach the training loop
                last = f"{type(err).__name__}: {err}" if not isinstance(err, CodeParrotError) else str(err)
                if attempt < self.max_retries:
                    delay = self.backoff_s * 2**attempt
                    logger.warning("push %r to %s@%s failed (attempt %d/%d, retrying in %.0fs): %s", message,
                                   self.repo_ref, self.branch, attempt + 1, self.max_retries + 1, delay, last)
                    time.sleep(delay)
        self._fail(f"push {message!r} to {self.repo_ref}@{self.branch} failed after {self.max_retries + 1} "
                   f"attempts (the local checkpoint is kept): {last}")

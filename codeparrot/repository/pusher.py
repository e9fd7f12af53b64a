"""Pushing checkpoint folders to a repository branch in the background, with retries.

Staging: each push's files are hard-linked into `<checkpoint's parent>/.codeparrot-push/NAME-XXXX/`, beside
which `NAME-XXXX.lock` is held (flock) by the pushing process until that folder is removed again. A folder
whose lock is free (or missing) was left by a process that died with pushes queued: the first push into a
staging root removes those (`remove_stale_staging`, which a trainer may also call when it starts). The empty
root is removed after the last push, under the same lock that creates it, and staging retries where another
process removed it in between.
"""

from __future__ import annotations

import collections
import fnmatch
import logging
import os
import shutil
import tempfile
import threading
import time
from pathlib import Path

from codeparrot.atomic_io import atomic_write_json, writable_dir_problem
from codeparrot.errors import CodeParrotError
from codeparrot.repository.base import (
    CheckpointRepository,
    is_hub_ref,
    parse_step,
    strip_scheme,
    validate_branch_name,
    with_run_mark,
)
from codeparrot.repository.local import LocalGitRepository
from codeparrot.repository.metrics import METRICS_FILE, checkpoint_metrics
from codeparrot.repository.refs import open_repository

try:
    import fcntl
except ImportError:  # not POSIX: staging folders are not locked, and none is ever taken for stale
    fcntl = None

logger = logging.getLogger(__name__)
STAGING_DIR = ".codeparrot-push"
_LOCK, _NEW_LOCK = ".lock", ".lock-new"


def _lock_is_free(path: Path) -> bool:
    """Whether nobody holds the flock on the existing file `path` (False where it is missing or held)."""
    try:
        fd = os.open(path, os.O_RDWR)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return False
    finally:
        os.close(fd)  # releases the lock, if taken
    return True


def remove_stale_staging(parent: str | os.PathLike) -> list[Path]:
    """Remove what pushes from processes that are gone left in `parent/.codeparrot-push` (a run killed with
    pushes queued: hard links, so the space of checkpoints it has since rotated away): staging folders whose lock
    is free or missing (folders of an earlier version have none), and their lock files. Returns what was
    removed. Folders of live pushers, in this process or others (another machine on a shared filesystem too,
    where it supports flock), keep their lock held and are left alone."""
    root = Path(parent) / STAGING_DIR
    if fcntl is None or not root.is_dir():
        return []
    removed = []
    for entry in sorted(root.iterdir()):
        if entry.is_dir() and not entry.is_symlink():
            lock = root / f"{entry.name}{_LOCK}"
            if lock.exists() and not _lock_is_free(lock):
                continue  # a live push (its lock is made, and held, before its folder)
            shutil.rmtree(entry, ignore_errors=True)
            lock.unlink(missing_ok=True)
            removed.append(entry)
        elif entry.name.endswith((_LOCK, _NEW_LOCK)) and not (root / entry.name.rsplit(".lock", 1)[0]).is_dir() \
                and _lock_is_free(entry):
            entry.unlink(missing_ok=True)
            removed.append(entry)
    if removed:
        logger.warning("removed %d stale push staging folder(s) from %s (left by a process that stopped with "
                       "pushes queued)", len(removed), root)
    return removed


def check_push_target(repo_ref: str) -> None:
    """Refuse, before a run trains, a local repository its checkpoint pushes could not write: a read-only
    repository (its git folder, objects, branch refs or writers' lock file) or a folder that is not a repository.
    Found only at the first push, it cost the first checkpoint interval of training, then retries and warnings.
    A missing path is left to the first push, which creates the repository; a Hub repository is not checked
    here (whether the token may write is the Hub's to say)."""
    ref = str(repo_ref)
    if is_hub_ref(ref) or not Path(strip_scheme(ref)).expanduser().exists():
        return
    advice = "make it writable, or train without pushing (--checkpoint.push false)"
    try:
        git_dir = LocalGitRepository(Path(strip_scheme(ref)).expanduser()).git_dir
    except CodeParrotError as err:  # a plain model folder: nothing to push to
        raise CodeParrotError(f"checkpoints cannot be pushed to {ref}: {err}; train from a checkpoint repository, "
                              "or without pushing (--checkpoint.push false)") from None
    for folder in (git_dir, git_dir / "objects", git_dir / "refs" / "heads"):
        problem = writable_dir_problem(folder) if folder.is_dir() else None
        if problem is not None:
            raise CodeParrotError(f"checkpoints cannot be pushed to {ref}: {problem}; {advice}")
    lock = git_dir / "codeparrot.lock"  # opened for writing by every push (`LocalGitRepository.locked`)
    try:
        os.close(os.open(lock, os.O_RDWR))
    except FileNotFoundError:
        pass
    except OSError as err:
        raise CodeParrotError(f"checkpoints cannot be pushed to {ref}: {lock} is not writable "
                              f"({err.strerror or err}); {advice}") from None


class CheckpointPusher:
    """Pushes checkpoint folders to a branch in the background: training never waits and never crashes.

    `push` stages the files in a hidden sibling folder `.codeparrot-push/` (hard links, so instant and without
    extra disk; copies across filesystems; the checkpoint folder itself is never touched) and returns; one
    background thread commits staged pushes in order, retrying failures with exponential backoff. A push that
    still fails is logged as a warning with its reason and returned by `wait`, never raised. Contract for hard
    links: files of a pushed folder are not modified in place afterwards (checkpoints are written once, into
    fresh files).

    Each commit's message gets a `CodeParrot-Run: BRANCH` trailer (its subject stays as given): which run pushed
    it, so a branch started from another run's branch tells its own checkpoints apart (`metrics.py`).

    At most `max_waiting` pushes wait behind the one in flight: a staged push holds hard links to its checkpoint,
    so pushes that queue up faster than the repository takes them (a slow upload, a long outage) would keep every
    checkpoint keep_last has since deleted on disk. Past the bound the oldest waiting push is dropped with a
    warning (`superseded` names it); the newest, e.g. the final checkpoint, is never the one dropped.

    The worker is a daemon thread: a process that exits without `wait()` loses the pushes still queued
    (`pending()` names them; their staging folders are removed by the next pusher, `remove_stale_staging`).
    """

    def __init__(self, repo_ref: str, branch: str, max_retries: int = 3, backoff_s: float = 2.0,
                 from_revision: str = "main", max_waiting: int = 2):
        """`from_revision`: where `branch` starts when it does not exist yet (the revision the run started from,
        so the branch's history shows which model it continues). `max_waiting` (≥ 1): pushes kept waiting behind
        the one in flight."""
        if max_waiting < 1:
            raise CodeParrotError(f"max_waiting must be at least 1, got {max_waiting}")
        self.repo_ref, self.branch = str(repo_ref), validate_branch_name(branch)
        self.from_revision = str(from_revision)
        self.max_retries, self.backoff_s, self.max_waiting = max_retries, backoff_s, max_waiting
        self.commits: list[str] = []  # commit ids of successful pushes, in order
        self.superseded: list[str] = []  # messages of the pushes dropped for newer ones (`max_waiting`)
        self._errors: list[str] = []
        self._repo: CheckpointRepository | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)  # notified whenever a push finishes or is dropped
        self._work = threading.Condition(self._lock)  # notified whenever a push is queued
        self._pending: list[tuple[Path, str]] = []  # (staged folder, message) queued or in flight, in order
        self._waiting: collections.deque[tuple[Path, str]] = collections.deque()  # queued, not yet in flight
        self._staging_lock = threading.Lock()  # creating a staging root and removing it never interleave
        self._staging_fds: dict[Path, int] = {}  # staged folder -> the fd holding its lock file's flock
        self._cleaned_roots: set[Path] = set()

    def push(self, folder: str | os.PathLike, message: str, include: list[str] | None = None) -> None:
        """Stage the files of `folder` (those matching the `include` globs, default all) and queue a commit."""
        staged = None
        try:
            staged = self._stage(Path(folder), include)
            self._add_metrics(staged, Path(folder), message)
        except (OSError, CodeParrotError) as err:
            if staged is not None:
                self._remove_staged(staged)
            self._fail(f"push {message!r} to {self.repo_ref}@{self.branch} not staged: {err}")
            return
        dropped = []
        with self._lock:
            self._pending.append((staged, message))
            self._waiting.append((staged, message))
            while len(self._waiting) > self.max_waiting:
                dropped.append(self._waiting.popleft())
                self._pending.remove(dropped[-1])
                self.superseded.append(dropped[-1][1])
            self._work.notify()
            if self._thread is None:  # one long-lived worker keeps the pushes in order
                self._thread = threading.Thread(target=self._worker, name="codeparrot-pusher", daemon=True)
                self._thread.start()
        for old, old_message in dropped:  # outside the lock: removing a large staged folder takes a while
            self._remove_staged(old)
            logger.warning("push %r to %s@%s dropped: %d newer push(es) queued behind one still in flight (a slow "
                           "or failing repository); its checkpoint stays local", old_message, self.repo_ref,
                           self.branch, self.max_waiting)
        if dropped:
            with self._idle:
                self._idle.notify_all()

    def wait(self, timeout: float | None = None) -> list[str]:
        """Block until every queued push has finished, or `timeout` seconds have passed (then `pending()` names
        those still queued); the error messages of every push that failed so far (staging or committing), in
        order."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._idle:
            while self._pending:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    break
                self._idle.wait(left)
            return list(self._errors)

    def pending(self) -> list[str]:
        """The messages of the pushes queued or in flight (oldest first); empty once `wait()` returned."""
        with self._lock:
            return [message for _, message in self._pending]

    def _new_staging_folder(self, root: Path, name: str) -> Path:
        """A new, empty `root/NAME-XXXX` whose lock file `root/NAME-XXXX.lock` this process holds (made first, and
        published by a rename once locked, so no cleaner ever sees the folder unlocked)."""
        with self._staging_lock:  # the worker's removal of the empty root waits for this
            if root not in self._cleaned_roots:
                self._cleaned_roots.add(root)
                try:
                    remove_stale_staging(root.parent)
                except OSError as err:  # tidying up must not cost this push
                    logger.warning("cannot remove stale push staging folders in %s: %s", root, err)
            for _ in range(5):
                root.mkdir(exist_ok=True)
                try:
                    fd, new_lock = tempfile.mkstemp(prefix=f"{name}-", suffix=_NEW_LOCK, dir=root)
                except FileNotFoundError:  # another process removed the empty root right after our mkdir
                    continue
                try:
                    if fcntl is not None:
                        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    staged = Path(new_lock[:-len(_NEW_LOCK)])
                    os.rename(new_lock, f"{staged}{_LOCK}")  # the flock stays with the file
                    staged.mkdir()
                except (FileNotFoundError, BlockingIOError):  # a cleaner took the new lock file for stale
                    os.close(fd)
                    Path(new_lock).unlink(missing_ok=True)
                    continue
                except BaseException:
                    os.close(fd)
                    raise
                self._staging_fds[staged] = fd
                return staged
        raise CodeParrotError(f"cannot make a staging folder in {root}: it keeps disappearing")

    def _stage(self, folder: Path, include: list[str] | None) -> Path:
        if not folder.is_dir():
            raise CodeParrotError(f"{folder} is not a folder")
        root = folder.resolve().parent / STAGING_DIR  # same filesystem as the checkpoint: hard links work
        staged = self._new_staging_folder(root, folder.name)
        try:
            self._link_files(folder, staged, include)
        except BaseException:
            self._remove_staged(staged)
            raise
        return staged

    def _link_files(self, folder: Path, staged: Path, include: list[str] | None) -> None:
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
            raise CodeParrotError(f"no files in {folder} match {include}")

    @staticmethod
    def _add_metrics(staged: Path, folder: Path, message: str) -> None:
        """`metrics.json` beside the staged files: the run's latest validation loss at the pushed step (from
        `<run>/metrics.jsonl`; training saves checkpoints as `<run>/checkpoints/step-N`, so the run folder is
        the checkpoint folder's grandparent; a folder directly inside a run folder works too), so loss curves
        can be drawn from the repository alone. Nothing when the message names no step or the run logged no
        evaluation by then."""
        step = parse_step(message)
        try:
            parents = folder.resolve().parents
            run_dir = next((p for p in parents[:2] if (p / "metrics.jsonl").is_file()), None)
            metrics = checkpoint_metrics(run_dir, step) if step is not None and run_dir is not None else None
            if metrics is not None and not (staged / METRICS_FILE).exists():
                atomic_write_json(staged / METRICS_FILE, metrics)
        except OSError as err:  # the checkpoint itself still goes out
            logger.warning("push %r: no %s (%s)", message, METRICS_FILE, err)

    def _remove_staged(self, staged: Path) -> None:
        shutil.rmtree(staged, ignore_errors=True)
        with self._staging_lock:  # not while push() is between making the root and making its folder in it
            Path(f"{staged}{_LOCK}").unlink(missing_ok=True)
            fd = self._staging_fds.pop(staged, None)
            if fd is not None:
                os.close(fd)  # releases the flock
            try:
                staged.parent.rmdir()  # the last staged push removes the hidden staging folder
            except OSError:
                pass

    def _fail(self, message: str) -> None:
        self._errors.append(message)
        logger.warning(message)

    def _worker(self) -> None:
        while True:
            with self._work:
                while not self._waiting:
                    self._work.wait()
                staged, message = self._waiting.popleft()
            try:
                self._push_with_retries(staged, message)
            finally:
                self._remove_staged(staged)
                with self._idle:
                    self._pending.remove((staged, message))
                    self._idle.notify_all()

    def _push_with_retries(self, staged: Path, message: str) -> None:
        last = ""
        for attempt in range(self.max_retries + 1):
            try:
                if self._repo is None:
                    self._repo = open_repository(self.repo_ref, create=True)
                self._repo.create_branch(self.branch, self.from_revision)
                marked = with_run_mark(message, self.branch)  # the branch is the run's name (training)
                self.commits.append(self._repo.commit_folder_async(staged, self.branch, marked).result())
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

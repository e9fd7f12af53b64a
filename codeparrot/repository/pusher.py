"""Pushing checkpoint folders to a repository branch in the background, with retries."""

from __future__ import annotations

import fnmatch
import logging
import os
import queue
import shutil
import tempfile
import threading
import time
from pathlib import Path

from codeparrot.atomic_io import atomic_write_json
from codeparrot.errors import CodeParrotError
from codeparrot.repository.base import CheckpointRepository, parse_step, validate_branch_name
from codeparrot.repository.metrics import METRICS_FILE, checkpoint_metrics
from codeparrot.repository.refs import open_repository

logger = logging.getLogger(__name__)


class CheckpointPusher:
    """Pushes checkpoint folders to a branch in the background: training never waits and never crashes.

    `push` stages the files in a hidden sibling folder `.codeparrot-push/` (hard links, so instant and without
    extra disk; copies across filesystems; the checkpoint folder itself is never touched) and returns; one
    background thread commits staged pushes in order, retrying failures with exponential backoff. A push that still fails is logged as a warning with its reason and returned
    by `wait`, never raised. Contract for hard links: files of a pushed folder are not modified in place
    afterwards (checkpoints are written once, into fresh files).
    """

    def __init__(self, repo_ref: str, branch: str, max_retries: int = 3, backoff_s: float = 2.0,
                 from_revision: str = "main"):
        """`from_revision`: where `branch` starts when it does not exist yet (the revision the run started from,
        so the branch's history shows which model it continues)."""
        self.repo_ref, self.branch = str(repo_ref), validate_branch_name(branch)
        self.from_revision = str(from_revision)
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
            self._add_metrics(staged, Path(folder), message)
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
                self._repo.create_branch(self.branch, self.from_revision)
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

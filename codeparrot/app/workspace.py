"""What every tab shares: the repository reference, the model cache, limits, and turning failures into one line.

A request never raises into Gradio: `CodeParrotError` becomes its own message, anything else a one-line
"internal error" (the traceback goes to the server's log, not the page), and the app keeps serving.
"""

from __future__ import annotations

import atexit
import functools
import inspect
import logging
import shutil
import tempfile
import threading
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from codeparrot.app.models import ModelCache
from codeparrot.errors import CodeParrotError, first_line
from codeparrot.repository.base import CheckpointRepository, validate_branch_name, validate_revision
from codeparrot.repository.refs import open_repository

logger = logging.getLogger("codeparrot.app")
LATEST = "latest"  # the checkpoint choice meaning "the branch's newest commit"


@dataclass
class Workspace:
    ref: str  # the repository: a local git repository path or a Hub id
    revision: str | None = None  # the branch the pickers start on (default: main)
    data_dir: Path | None = None  # a preprocess output folder (stats.json) for the Data tab
    runs_dir: Path | None = None  # run folders named by branch, each with metrics.jsonl (pushed-metrics plot)
    max_upload_bytes: int = 1_000_000  # pasted or uploaded code larger than this is refused
    cache: ModelCache = field(default_factory=lambda: ModelCache(4 << 30))

    def repository(self) -> CheckpointRepository:
        """Opened per request (cheap), so an unreachable repository is a message, never a dead app."""
        return open_repository(self.ref)

    def resolve(self, branch: str | None, checkpoint: str | None) -> tuple[str, str]:
        """(branch, full commit id) of a picker's choice; checkpoint empty or "latest" = the branch tip."""
        branch = (branch or "").strip() or "main"
        validate_branch_name(branch)
        checkpoint = (checkpoint or "").strip()
        revision = branch if checkpoint in ("", LATEST) else validate_revision(checkpoint)
        return branch, self.repository().resolve_revision(revision)

    def model(self, branch: str | None, checkpoint: str | None):
        """(model, tokenizer, label) for a picker's choice, from the cache when already loaded."""
        branch, commit = self.resolve(branch, checkpoint)
        model, tokenizer = self.cache.get(self.ref, commit)
        return model, tokenizer, f"{branch}@{commit[:12]}"

    def check_text(self, text: str | None, what: str) -> str:
        """Non-empty text within the size limit, else a one-line error naming `what`."""
        if text is None or not text.strip():
            raise CodeParrotError(f"the {what} is empty; type or paste some code first")
        return self.check_size(text, what)

    def check_size(self, text: str | None, what: str) -> str:
        """Text (empty or blank too) within the size limit, else a one-line error naming `what`."""
        text = text or ""
        size = len(text.encode("utf-8", errors="surrogatepass"))
        if size > self.max_upload_bytes:
            raise CodeParrotError(f"the {what} is {size:,} bytes, over the limit of {self.max_upload_bytes:,} bytes")
        return text


class ChartFiles:
    """Fresh paths for the charts the page shows (`new(name)`), all in one folder of this process that is removed
    when it exits. Gradio copies a returned file into its own cache as the request ends, so only the newest
    `keep` are kept: a long-running app does not leave a file per page load behind in the temp folder."""

    def __init__(self, keep: int = 32):
        self.keep = keep
        self._lock = threading.Lock()
        self._root: Path | None = None
        self._made: deque[Path] = deque()
        self._count = 0

    def new(self, name: str) -> Path:
        with self._lock:
            if self._root is None:
                self._root = Path(tempfile.mkdtemp(prefix="codeparrot-app-"))
                atexit.register(shutil.rmtree, self._root, True)
            self._count += 1
            folder = self._root / f"{self._count:08d}"  # the file keeps its own name (the page's download name)
            folder.mkdir()
            self._made.append(folder)
            while len(self._made) > self.keep:
                shutil.rmtree(self._made.popleft(), ignore_errors=True)
            return folder / name


CHARTS = ChartFiles()


def error_line(err: BaseException) -> str:
    """The one line a page shows for a failed request."""
    if isinstance(err, CodeParrotError):
        return f"error: {err}"
    first = first_line(err, "")
    return f"error: internal error ({type(err).__name__}{': ' + first[:200] if first else ''}); the app keeps serving"


def guarded(on_error: Callable[[str], Any]):
    """Decorate a handler (function or generator) so that any failure returns/yields `on_error(line)`."""

    def wrap(fn):
        if inspect.isgeneratorfunction(fn):
            @functools.wraps(fn)
            def gen(*args, **kwargs):
                try:
                    yield from fn(*args, **kwargs)
                except Exception as err:  # noqa: BLE001 - one request's failure must not stop the app
                    _log(err)
                    yield on_error(error_line(err))
            return gen

        @functools.wraps(fn)
        def call(*args, **kwargs):
            try:
                return fn(*args, **kwargs)
            except Exception as err:  # noqa: BLE001 - one request's failure must not stop the app
                _log(err)
                return on_error(error_line(err))
        return call

    return wrap


def _log(err: BaseException) -> None:
    if isinstance(err, CodeParrotError):
        logger.info("request refused: %s", err)
    else:
        logger.exception("request failed")

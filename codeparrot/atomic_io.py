"""Atomic outputs: write into a temporary sibling, then rename, so a crash never leaves half a result.

`atomic_dir(final)` yields a temporary folder next to `final`; on success everything in it is flushed to disk
(fsync) and the old `final` (if any) is replaced by it in two renames, on failure the temporary folder is
removed. `atomic_write_text` does the same for one file with `os.replace`, which is atomic on POSIX when source
and target share a filesystem.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Iterator

from codeparrot.errors import CodeParrotError


def _umask() -> int:
    """The process umask (read by setting and restoring it; there is no getter)."""
    mask = os.umask(0)
    os.umask(mask)
    return mask


def ensure_writable_dir(path: str | os.PathLike) -> Path:
    """Create `path` (and parents) and check we can write there; one-line error otherwise."""
    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".write-test-"):
            pass
    except OSError as err:
        raise CodeParrotError(f"output directory {path} is not writable: {err.strerror or err}") from None
    return path


@contextlib.contextmanager
def atomic_dir(final: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary directory that becomes `final` only if the block finishes without an exception."""
    final = Path(final)
    ensure_writable_dir(final.parent if str(final.parent) else Path("."))
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))
    os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp makes 0700; the result should look like any new folder
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    try:
        fsync_tree(tmp)  # what the renames publish is on disk first: a power loss never leaves a "complete" empty file
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    old = None
    if final.exists():
        old = final.parent / f".{final.name}.old-{os.getpid()}"
        os.rename(final, old)
    os.rename(tmp, final)
    fsync_path(final.parent)  # the renames themselves
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def fsync_path(path: Path) -> None:
    """Flush one file's or folder's data and metadata to disk (a folder: the entries renamed into it)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(root: Path) -> None:
    """`fsync_path` of every file and folder under `root` (files first, folders bottom-up), `root` included."""
    for folder, _, files in os.walk(root, topdown=False):
        for name in files:
            path = Path(folder) / name
            if not path.is_symlink():
                fsync_path(path)
        fsync_path(Path(folder))


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write `text` to `path` through a temporary file and `os.replace`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.tmp-", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~_umask())  # mkstemp makes 0600; the result should look like any new file
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def atomic_write_json(path: str | os.PathLike, obj: Any) -> None:
    """`atomic_write_text` of `obj` as indented JSON."""
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=False) + "\n")

"""Atomic outputs: write into a temporary sibling, then rename, so a crash never leaves half a result.

`atomic_dir(final)` yields a temporary folder next to `final`; on success everything in it is flushed to disk
(fsync) and it takes the place of the old `final` (if any) in one atomic exchange of the two names, so `final` is
always a complete folder, the old one or the new one; on failure the temporary folder is removed.
`atomic_write_text` does the same for one file with `os.replace`, which is atomic on POSIX when source and target
share a filesystem.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import functools
import glob
import json
import os
import shutil
import socket
import sys
import tempfile
from pathlib import Path
from typing import Any, Iterator

from codeparrot.errors import CodeParrotError, OutputWriteError


def process_umask() -> int:
    """The process umask: from /proc/self/status where Linux has it (no window in which another thread creates
    files under umask 0), else by setting and restoring it (there is no getter)."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0)
    os.umask(mask)
    return mask


def ensure_writable_dir(path: str | os.PathLike) -> Path:
    """Create `path` (and parents) and check we can write there; one-line error otherwise."""
    path = Path(path)
    problem = _dir_problem(path)
    if problem is not None:
        folder, reason = problem
        where = "" if folder == path else f": {folder}"
        raise CodeParrotError(f"output directory {path}{where} {reason}")
    return path


def ensure_writable_file(path: str | os.PathLike, flag: str = "--output", what: str = "file") -> Path:
    """Check, before the work whose result goes to the file `path` (`what`: "JSON file", "PNG"...), that it can be
    written there: not a directory, its folder made (with parents) where missing and writable. One-line error
    naming `flag` otherwise, so that a typo or a read-only folder costs nothing instead of the work (a generation,
    a sandboxed evaluation)."""
    path = Path(path)
    if path.is_dir():
        raise CodeParrotError(f"{flag} {path} is a directory; give the path of the {what} to write")
    problem = writable_dir_problem(path.parent)
    if problem is not None:
        raise CodeParrotError(f"cannot write {flag} {path}: {problem}; give a path in a folder you can write to")
    return path


def writable_dir_problem(path: str | os.PathLike) -> str | None:
    """Why no file can be created in the folder `path` (made, with its parents, where missing), as "FOLDER
    REASON" (e.g. "out is not writable (Permission denied)"), or None."""
    problem = _dir_problem(Path(path))
    return None if problem is None else f"{problem[0]} {problem[1]}"


def _dir_problem(path: Path) -> tuple[Path, str] | None:
    """(the folder at fault, why) where no file can be created in `path`: a file where a folder should be, or the
    system's reason (permission denied, read-only file system, ...) for making it or writing in it."""
    blocker = _file_in_the_way(path)
    if blocker is not None:
        return blocker, "is a file, not a directory"
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        return Path(err.filename or path), f"cannot be made ({err.strerror or err})"
    try:
        with tempfile.NamedTemporaryFile(dir=path, prefix=".write-test-"):
            pass
    except OSError as err:
        return path, f"is not writable ({err.strerror or err})"
    return None


def _file_in_the_way(folder: Path) -> Path | None:
    """The nearest existing one of `folder` and its parents, where that is not a directory (else None)."""
    for candidate in (folder, *folder.parents):
        if candidate.exists():
            return None if candidate.is_dir() else candidate
    return None


def cannot_write(path: str | os.PathLike, err: OSError) -> OutputWriteError:
    """The one-line error for `err`, raised while writing the file `path`: the path the user gave (not a
    temporary sibling's) and why (a file in the way of its folder, or the system's reason)."""
    path = Path(path)
    blocker = _file_in_the_way(path.parent)
    if path.is_dir():
        reason = "it is a directory"
    elif blocker is not None:
        reason = f"{blocker} is a file, not a directory"
    else:
        reason = err.strerror or str(err)
    return OutputWriteError(f"cannot write {path}: {reason}", err)


@contextlib.contextmanager
def atomic_dir(final: str | os.PathLike, replace: bool = True) -> Iterator[Path]:
    """Yield a temporary directory that becomes `final` only if the block finishes without an exception.
    `replace=False`: only if `final` does not exist by then either (FileExistsError: another process made it
    first, e.g. two runs creating the same repository; theirs is kept)."""
    final = Path(final)
    ensure_writable_dir(final.parent if str(final.parent) else Path("."))
    remove_stale_temporaries(final)
    tmp = Path(tempfile.mkdtemp(prefix=f"{_tmp_prefix(final)}{_owner()}-", dir=final.parent))
    os.chmod(tmp, 0o777 & ~process_umask())  # mkdtemp makes 0700; the result should look like any new folder
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
    try:
        publish_dir(tmp, final, replace)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)  # unpublished (or, after an exchange, the old folder it replaced)
        raise


def publish_dir(tmp: str | os.PathLike, final: str | os.PathLike, replace: bool = True) -> None:
    """Make the finished folder `tmp` (on disk already) `final` (`_publish`), the renames flushed, the replaced
    folder removed: `atomic_dir`'s end, and for folders that several processes write before one publishes them
    (a training checkpoint)."""
    tmp, final = Path(tmp), Path(final)
    replaced = _publish(tmp, final, replace)
    fsync_path(final.parent)  # the renames themselves
    if replaced is not None:
        shutil.rmtree(replaced, ignore_errors=True)  # a crash before this: the next run removes it (our name)


def _publish(tmp: Path, final: Path, replace: bool) -> Path | None:
    """Rename the folder `tmp` to `final`; where `final` exists, return where the old one went (to be removed).

    Replacing is one exchange of the two names (Linux `renameat2(RENAME_EXCHANGE)`): no moment without `final`, the
    old folder ends up at `tmp`'s name. Where the filesystem or system cannot exchange (NFS, macOS), two renames, the
    old folder first moved aside: a crash between the two leaves it at `.NAME.old-HOST-PID`, where the next run puts
    it back (`remove_stale_temporaries`). Without `replace`, a rename that fails where `final` exists
    (RENAME_NOREPLACE; elsewhere a check just before)."""
    if not replace:
        if not _renameat2(tmp, final, _RENAME_NOREPLACE):
            if final.exists():
                raise FileExistsError(errno.EEXIST, "exists already", str(final))
            os.rename(tmp, final)
        return None
    if not final.exists():
        os.rename(tmp, final)
        return None
    if _renameat2(tmp, final, _RENAME_EXCHANGE):
        return tmp
    old = final.parent / f"{_old_prefix(final)}{_owner()}"  # the host too: NFS is where this runs, shared
    os.rename(final, old)
    os.rename(tmp, final)
    return old


_AT_FDCWD = -100
_RENAME_NOREPLACE = 1
_RENAME_EXCHANGE = 2


def _renameat2(a: Path, b: Path, flags: int) -> bool:
    """Linux `renameat2` (3.15+, glibc 2.28+): RENAME_EXCHANGE swaps the names `a` and `b` atomically,
    RENAME_NOREPLACE renames `a` to `b` unless `b` exists (FileExistsError). False where the system or the
    filesystem does not offer the flag."""
    renameat2 = _libc_renameat2()
    if renameat2 is None:
        return False
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), flags) == 0:
        return True
    err = ctypes.get_errno()
    # not offered here (EPERM: a container's seccomp filter that predates the call; a real permission problem
    # comes back from the plain rename)
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EPERM):
        return False
    raise OSError(err, os.strerror(err), str(b))  # FileExistsError for EEXIST


@functools.lru_cache(maxsize=1)
def _libc_renameat2():
    """The C library's `renameat2`, or None (not Linux, or a C library older than glibc 2.28)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return None
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    return renameat2


def _tmp_prefix(final: Path) -> str:
    return f".{final.name}.tmp-"


def _old_prefix(final: Path) -> str:
    return f".{final.name}.old-"


def _owner() -> str:
    """Who makes a temporary folder: this machine and process (a shared filesystem may hold other machines')."""
    return f"{socket.gethostname().replace('-', '_')}-{os.getpid()}"


def remove_stale_temporaries(final: Path) -> list[Path]:
    """Remove the temporary folders that runs killed without a chance to clean up (SIGKILL, the out-of-memory
    killer, a stall watchdog's exit) left next to `final`: those made on this machine by a process that no longer
    runs. A preprocess spool in one can be tens of GB. The same for a replaced `final` such a run left at
    `.NAME.old-HOST-PID` (`_publish` without the exchange), except where `final` is missing (killed between the two
    renames): that one is the last version published, and is renamed back to `final`. Returns what was removed."""
    removed = []
    for old in _of_dead_owners(final, _old_prefix(final)):
        if not os.path.lexists(final):
            with contextlib.suppress(OSError):  # e.g. another run put back this one, or another, meanwhile
                os.rename(old, final)
        if old.is_dir() and os.path.lexists(final):  # never the only copy of the output
            shutil.rmtree(old, ignore_errors=True)
            removed.append(old)
    for candidate in _of_dead_owners(final, _tmp_prefix(final)):
        shutil.rmtree(candidate, ignore_errors=True)
        removed.append(candidate)
    return removed


def _of_dead_owners(final: Path, prefix: str) -> list[Path]:
    """The folders `PREFIX` + `HOST-PID` (+ anything) beside `final` of processes of this machine no longer running."""
    host, _ = _owner().split("-", 1)
    found = []
    for candidate in sorted(final.parent.glob(f"{glob.escape(prefix)}{glob.escape(host)}-*")):
        pid = candidate.name[len(prefix) + len(host) + 1:].split("-", 1)[0]
        if pid.isdigit() and candidate.is_dir() and not _running(int(pid)):
            found.append(candidate)
    return found


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: running
        return True
    return True


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
    """Write `text` to `path` through a temporary file and `os.replace`. A failed write raises `OutputWriteError`
    (`cannot_write`): one line for the user, still an OSError for callers that handle it."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.tmp-", dir=path.parent)
    except OSError as err:
        raise cannot_write(path, err) from err
    try:
        os.fchmod(fd, 0o666 & ~process_umask())  # mkstemp makes 0600; the result should look like any new file
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as err:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        if isinstance(err, OSError):
            raise cannot_write(path, err) from err
        raise


def atomic_write_json(path: str | os.PathLike, obj: Any) -> None:
    """`atomic_write_text` of `obj` as indented JSON."""
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=False) + "\n")

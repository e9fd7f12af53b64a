"""One writer at a time: an exclusive `flock` on a lock file whose holder writes who it is into it.

Why flock: the kernel releases it however the holder ends (exit, exception, SIGKILL, the out-of-memory killer), so
a lock file a dead process left behind never blocks anyone; it is merely reused. Why the holder's identity: a
process that has to wait says for whom (a host and a pid), once, before it blocks, instead of hanging silently.
"""

from __future__ import annotations

import contextlib
import errno
import os
import sys
from typing import Callable, Iterator

from codeparrot.errors import CodeParrotError

try:
    import fcntl
except ImportError:  # not POSIX: no lock (the callers' other guards, e.g. git's compare-and-swap, remain)
    fcntl = None


# What flock raises where the filesystem offers no locks (NFS without its lock daemon, some FUSE mounts).
NO_LOCKS = frozenset({errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOTSUP, errno.ENOSYS})


@contextlib.contextmanager
def exclusive_lock(path: str | os.PathLike, holder: str, waiting: Callable[[str], str], remove: bool = False,
                   unsupported: Callable[[OSError], None] | None = None) -> Iterator[None]:
    """Hold an exclusive flock on `path` (created if missing) for the block, `holder` written into it. Where another
    process holds it, print `waiting(its holder line, "" if none)` on stderr, then wait. `remove`: unlink the file at
    the end, while still locked (a waiter then sees that it locked a removed file, and locks the new one). On a
    filesystem without locks (`NO_LOCKS`: some NFS mounts) the error goes to `unsupported` (which says so) and the
    block runs unlocked; any other failure to lock is a one-line error."""
    try:
        fd = _acquire(path, holder, waiting) if fcntl else None
    except OSError as err:
        if unsupported is None or err.errno not in NO_LOCKS:
            raise CodeParrotError(f"cannot lock {path}: {err.strerror or err}") from None
        unsupported(err)
        fd = None
    try:
        yield
    finally:
        if fd is not None:
            if remove:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
            os.close(fd)  # releases the lock


def _acquire(path: str | os.PathLike, holder: str, waiting: Callable[[str], str]) -> int:
    """The descriptor of `path`, exclusively locked, holding `holder`."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                text = os.pread(fd, 200, 0).decode("utf-8", "replace").strip()
                print(waiting(text.splitlines()[0] if text else ""), file=sys.stderr, flush=True)
                fcntl.flock(fd, fcntl.LOCK_EX)
            with contextlib.suppress(FileNotFoundError):  # not the file there now: its holder removed it as it ended
                if os.path.samestat(os.fstat(fd), os.stat(path)):
                    os.ftruncate(fd, 0)
                    os.pwrite(fd, f"{holder}\n".encode(), 0)
                    return fd
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)

"""The harness's sandbox folders, `$TMPDIR/codeparrot-sandbox-<pid>-*/`, and removing those of dead harnesses.

Each Sandbox holds an flock on its folder's `owner.lock` while it lives (the kernel releases it however the
harness dies). A harness killed with SIGKILL cannot remove its folder; `remove_stale_roots`, called by the next
Sandbox started by the same user, removes every such folder whose lock nobody holds and that is older than a
minute (never one being created).
"""

from __future__ import annotations

import fcntl
import os
import tempfile
import time
from pathlib import Path

from codeparrot.sandbox.cleanup import remove_tree

ROOT_PREFIX, OWNER_LOCK = "codeparrot-sandbox-", "owner.lock"
STALE_AFTER_S = 60.0  # an unlocked folder younger than this may be one whose creator has not locked it yet


def remove_stale_roots(tmp: str | None = None, min_age_s: float = STALE_AFTER_S) -> list[Path]:
    """Remove the sandbox folders of dead harnesses (SIGKILLed: their `finally` never ran): ours, unlocked,
    not modified for `min_age_s`. Folders without an owner lock (older versions) are left alone."""
    removed = []
    for root in Path(tmp or tempfile.gettempdir()).glob(ROOT_PREFIX + "*"):
        try:
            info = root.lstat()
            if not root.is_dir() or root.is_symlink() or info.st_uid != os.geteuid():
                continue
            if time.time() - info.st_mtime < min_age_s:
                continue
            fd = os.open(root / OWNER_LOCK, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # its owner holds LOCK_EX while alive
        except OSError:
            continue
        else:
            remove_tree(str(root))
            removed.append(root)
        finally:
            os.close(fd)
    return removed

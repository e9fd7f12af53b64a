"""Remove a folder tree that a program built, whatever its shape (stdlib only).

`shutil.rmtree` and `os.walk` (Python 3.11) recurse once per level: a 2,000-deep directory chain raises
RecursionError, and paths that long exceed PATH_MAX. `remove_tree` walks with an explicit stack of open
directory descriptors and removes entries relative to them (`dir_fd`), so neither depth nor path length
matters, and never follows a symlink. Errors on single entries are skipped; the caller learns whether
the tree is gone.
"""

import os
import stat


def remove_tree(path: str) -> bool:
    """Remove `path` and everything below it; True when it no longer exists."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        top = os.open(path, flags)
    except FileNotFoundError:
        return True
    except OSError:
        try:
            os.unlink(path)
        except OSError:
            pass
        return not os.path.lexists(path)
    stuck = set()  # (st_dev, st_ino) of folders we emptied as far as we could but could not remove
    stack = [(top, None)]  # (directory fd, its name in the folder below it on the stack)
    while stack:
        fd = stack[-1][0]
        descend = None
        try:
            with os.scandir(fd) as entries:
                for entry in entries:
                    try:
                        info = entry.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    if not stat.S_ISDIR(info.st_mode):
                        try:
                            os.unlink(entry.name, dir_fd=fd)
                        except OSError:
                            pass
                    elif (info.st_dev, info.st_ino) not in stuck:
                        try:
                            descend = os.open(entry.name, flags, dir_fd=fd), entry.name
                            break
                        except OSError:
                            stuck.add((info.st_dev, info.st_ino))
        except OSError:
            pass
        if descend is not None:
            stack.append(descend)
            continue
        fd, name = stack.pop()
        info = os.fstat(fd)
        os.close(fd)
        if stack:
            try:
                os.rmdir(name, dir_fd=stack[-1][0])
            except OSError:
                stuck.add((info.st_dev, info.st_ino))
    try:
        os.rmdir(path)
    except OSError:
        pass
    return not os.path.lexists(path)

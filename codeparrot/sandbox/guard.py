"""The audit-hook guard every sandboxed program runs under (stdlib only): `install_guard`.

Installed by the program's process (`zygote._program`) after its limits, namespaces, seccomp filter and
uid are in place and before any program code runs; `child.py` then runs the program.

The guard's lines. The audit hook writes on the result pipe (fd 3): `D <nonce> <event>` when it refuses an
event, `F <nonce> <exception>` for a failure detail (raised as the event `codeparrot.fail` by `child._fail`,
called from the frame that raised the first `codeparrot.start`, before any program code ran), and, in the
in-process fallback only, `P <nonce>` for a pass (the event `codeparrot.report`, accepted only from
`child._after_program` called directly by that frame, after `check(candidate)` returned). The
32-hex-digit nonce is read from a pipe the server fills after the fork and kept only in the hook's closure
(never in argv, env, files, globals, or a frame program code can reach without frame walking), so lines the
program writes are only output; in isolated mode the server ignores `P` lines altogether.

Events refused always ("integrity"): ctypes, gc introspection (get_objects/referrers/referents),
function/code construction, sys.settrace/setprofile/_current_frames/addaudithook, sub-interpreters,
opening /proc/*/mem. Refused with `contain=True` ("containment"): sockets, fork/exec/spawn/subprocess/
system, signals to other processes, rlimit changes, writes/removals/renames outside the workspace,
symlinks/hardlinks, any path under /proc (opened, listed or scanned), non-string paths, sqlite URIs
(`file:...?mode=rwc` names any file), chmod/utime/chown through a descriptor (its file could be any file the
program may read: as root in guard-only mode, `os.chmod(os.open('/usr/bin/python3', O_RDONLY), 0o4755)`),
opening or listing the answer key's files (`answer_key`, from answers.survey: by resolved real path, and by
inode, so a hard link or another mount of them is refused too), opening a block device (as root, the disk
read raw holds every file) and, where the guard is the last barrier (`last_barrier`: no read-only view),
every sqlite connection (SQL's `ATTACH` creates files without any audit event) and the import of the
extension modules whose C functions create, write or remove files by name without one (`UNAUDITED_FILES`:
readline's history files, POSIX shared memory and named semaphores in /dev/shm, dbm files, Tcl; guard-only
mode does not preload them, so the import is the only way in). Paths are
resolved the way the kernel does (symlinks followed, `..` after them, with `os.lstat`/`os.readlink` bound
before program code runs), so `/dev/fd/../../<pid>/environ` is a /proc path and
`/dev/fd/../../self/cwd/../../../x` is outside the workspace; a path that passes through /proc on the way
counts as /proc.

Descriptors. An audit event names a path but not the descriptor it is relative to (`os.open(path,
dir_fd=fd)` raises `open` with the bare path), so the guard keeps programs from holding a descriptor of a
folder outside the workspace at all: `os.open` of such a folder (any flags, O_PATH included) is refused,
and so is a relative `os.open` with `..` (relative to an unseen descriptor it could climb out). Every
other event that takes a `dir_fd` (`os.rename`'s source and destination, `os.mkdir`, `os.remove`, ...)
is refused with a real one. Listing an open descriptor (`os.listdir(fd)`) is then always a listing inside
the workspace. A refused event ends the process at once (`D <nonce> <event>` on the result pipe): no
exception that program code could catch, and no traceback holding the hook's frame.

Advisory, not a boundary. An audit hook sees what CPython chooses to announce: C code that opens files
without an event (sqlite's ATTACH above; extension modules rebuilt from the interpreter's cache) and any
native code are invisible to it. Where the kernel layers hold (namespaces, the read-only view, the private
uid, the seccomp allowlist), they are the boundary and the guard only names what it saw; where they are
absent the guard is the last barrier, and the sandbox refuses to run there without an explicit opt-in
(`SandboxConfig.allow_guard_only`, or `allow_root` as root; `kernel.refusal`).
"""

import os
import sys

_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC
_INTEGRITY = frozenset({
    "gc.get_objects", "gc.get_referrers", "gc.get_referents", "function.__new__", "code.__new__",
    "sys.settrace", "sys.setprofile", "sys._current_frames", "sys.addaudithook",
    "cpython.PyInterpreterState_New", "cpython.run_command", "cpython.run_file", "cpython.run_module",
})
_CONTAIN = frozenset({
    "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork", "os.forkpty", "subprocess.Popen",
    "os.killpg", "signal.pthread_kill", "os.symlink", "os.link", "resource.setrlimit", "resource.prlimit",
    "syslog.openlog", "syslog.syslog", "os.chroot", "webbrowser.open", "os.startfile", "pty.spawn",
    "os.mkfifo", "os.mknod", "os.chflags", "os.lchflags", "os.setxattr", "os.removexattr",
})
# Path-taking events: (indexes of the path arguments, indexes of their dir_fd arguments). Checked after
# resolving symlinks; the last component is followed except for these (they act on the link itself).
_NO_FOLLOW = frozenset({"os.remove", "os.rmdir", "os.mkdir", "os.rename", "shutil.rmtree", "shutil.move"})
_PATH_EVENTS = {
    "os.remove": ((0,), (1,)), "os.rmdir": ((0,), (1,)), "os.mkdir": ((0,), (2,)),
    "os.rename": ((0, 1), (2, 3)),  # os.rename and os.replace: (src, dst, src_dir_fd, dst_dir_fd)
    "os.truncate": ((0,), ()), "os.chmod": ((0,), (2,)), "os.chown": ((0,), (3,)), "os.utime": ((0,), (3,)),
    "os.chdir": ((0,), ()), "shutil.rmtree": ((0,), (1,)), "shutil.move": ((0, 1), ()),
    "shutil.copyfile": ((1,), ()), "shutil.copytree": ((1,), ()), "sqlite3.connect": ((0,), ()),
}
_FOLDER = 0o040000
# Events that may name a descriptor instead of a path: ftruncate needs one open for writing, fchdir one of a
# folder, and the guard lets neither be opened outside the workspace. chmod/utime/chown of a descriptor are
# refused: one opened read-only may name any file the program can read.
_BY_DESCRIPTOR = frozenset({"os.truncate", "os.chdir"})
# A fresh import of posix/_signal would bring back the functions zygote.py removed.
_NO_IMPORT = frozenset({"_posixsubprocess", "_xxsubinterpreters", "_xxinterpchannels", "posix", "_signal"})
# Extension modules whose C functions create, write or remove files by name without an audit event
# (readline.write_history_file, _posixshmem.shm_open, _multiprocessing.SemLock's sem_open, dbm.*.open, Tcl's
# `open`): refused where the guard is the last barrier (no read-only view), and not preloaded there (zygote.py).
UNAUDITED_FILES = ("readline", "_posixshmem", "_multiprocessing", "_dbm", "_gdbm", "_tkinter")


def install_guard(nonce_fd: int, result_fd: int, workspace: str, contain: bool, reporter, failer,
                  last_barrier: bool = False, answer_key=((), (), ())) -> None:
    """Read the nonce from `nonce_fd` and install the audit hook. Everything the hook touches is bound to
    a local here, so patching builtins or modules later cannot change what the hook does. `last_barrier`:
    no read-only view holds writes outside the workspace (guard-only mode): also refuse what writes files
    where the guard cannot see it (sqlite, the modules of `UNAUDITED_FILES`). `answer_key`: (folders, files,
    (st_dev, st_ino) pairs) of the host's answer key (answers.survey), never to be opened or listed."""
    _read, _close, _write, _exit, _getpid = os.read, os.close, os.write, os._exit, os.getpid
    _getcwd, _getframe, _type, _str, _bytes, _int, _len = os.getcwd, sys._getframe, type, str, bytes, int, len
    _lstat, _readlink, _item, _OSError = os.lstat, os.readlink, tuple.__getitem__, OSError  # stat_result is patchable
    _stat = os.stat
    _BaseException = BaseException
    integrity, contain_events, path_events, no_import = _INTEGRITY, _CONTAIN, _PATH_EVENTS, _NO_IMPORT
    by_descriptor = _BY_DESCRIPTOR
    unaudited_files = frozenset(UNAUDITED_FILES) if last_barrier else frozenset()
    no_follow, write_flags, folder = _NO_FOLLOW, _WRITE_FLAGS, _FOLDER
    key_folders, key_files = tuple(_str(f) for f in answer_key[0]), frozenset(_str(f) for f in answer_key[1])
    key_inodes = frozenset((_int(dev), _int(ino)) for dev, ino in answer_key[2])
    nonce = b""
    while _len(nonce) < 32:
        chunk = _read(nonce_fd, 32 - _len(nonce))
        if not chunk:
            break
        nonce += chunk
    _close(nonce_fd)
    me = _getpid()
    state = [None, False]  # [checker frame, reported]

    def deny(event):
        try:
            _write(result_fd, b"D " + nonce + b" " + event.encode("ascii", "replace")[:120] + b"\n")
        finally:
            _exit(252)

    def absolute(path):
        """An exact str/bytes path made absolute against the working directory (as a str), or None."""
        if _type(path) is _bytes:
            path = path.decode("utf-8", "surrogateescape")
        elif _type(path) is not _str:
            return None
        if not path.startswith("/"):
            path = _getcwd() + "/" + path
        return path

    def resolve(path, follow_last):
        """(resolved path, passed through /proc) of an absolute path, the way the kernel walks it: each
        symlink replaced by its target, `..` applied to what it resolved to. A component that does not
        exist (or cannot be examined) is kept as written, like the kernel creating or failing there."""
        todo = path.split("/")
        todo.reverse()
        done, proc, links = "", False, 0
        while todo:
            part = todo.pop()
            if part == "" or part == ".":
                continue
            if part == "..":
                done = done[:done.rfind("/")] if done else ""
                continue
            candidate = done + "/" + part
            if candidate == "/proc" or candidate.startswith("/proc/"):
                proc = True
            if not todo and not follow_last:
                done = candidate
                break
            try:
                mode = _item(_lstat(candidate), 0)
            except _OSError:
                done = candidate
                continue
            if mode & 0o170000 != 0o120000:  # not a symlink
                done = candidate
                continue
            links += 1
            if links > 40:  # the kernel's ELOOP
                return candidate, proc
            target = _readlink(candidate)
            if target.startswith("/"):
                done = ""
            more = target.split("/")
            more.reverse()
            todo.extend(more)
        return done or "/", proc

    ws = resolve(workspace, True)[0]

    def inside(path):
        return path is not None and (path == ws or path.startswith(ws + "/"))

    def exact(value, kind):
        return _type(value) is kind  # identity: never calls program code (no __eq__/__hash__ of a subclass)

    def is_folder(path):
        try:
            return _item(_stat(path), 0) & 0o170000 == folder
        except _OSError:
            return False

    def secret(real):
        """Why a program may not read the resolved path `real` ("" when it may): one of the answer key's files
        or below its folders, by path, or by inode (a hard link to it elsewhere, another mount of its
        filesystem); or a block device (a disk read raw, as root, holds every file)."""
        if real in key_files:
            return "the answer key " + real
        for f in key_folders:  # a loop, not any(): builtins are the program's to patch
            if real == f or real.startswith(f + "/"):
                return "the answer key " + real
        try:
            info = _stat(real)
        except _OSError:
            return ""
        if (_item(info, 2), _item(info, 1)) in key_inodes:
            return "the answer key " + real
        return "a block device " + real if _item(info, 0) & 0o170000 == 0o060000 else ""

    def check(event, args):
        if event in integrity or event.startswith("ctypes."):
            deny(event)
        if event == "open":
            path, mode, flags = args
            if exact(path, _int):
                return
            full = absolute(path)
            if full is None:
                deny("open of a non-string path")
            real, proc = resolve(full, True)
            tail = real.rsplit("/", 1)[-1]
            if (proc and tail == "mem") or (mode is None and full.rsplit("/", 1)[-1] == "mem"):
                deny("open " + real)
            if contain:
                if proc:
                    deny("open " + real)
                why = secret(real)  # fd-relative opens: a descriptor of a folder outside the workspace is refused
                if why:
                    deny("open of " + why)
                relative = not (path.startswith("/") if exact(path, _str) else path.startswith(b"/"))
                if mode is None and relative and ".." in full.split("/"):  # os.open with an unseen dir_fd
                    deny("os.open of a relative path with ..")
                if mode is None and not inside(real) and is_folder(real):  # a dir_fd the guard could not follow
                    deny("os.open of a folder outside the workspace " + real)
                writing = exact(flags, _int) and flags & write_flags
                if writing and (not inside(real) or (mode is None and relative)):
                    deny("open for writing " + real)
        elif event == "codeparrot.start":
            if state[0] is None:
                state[0] = _getframe(2)
        elif event == "codeparrot.report":  # from `reporter`'s code, called directly by the registered frame
            frame = _getframe(2)
            if state[0] is not None and not state[1] and frame.f_code is reporter and frame.f_back is state[0]:
                state[1] = True
                _write(result_fd, b"P " + nonce + b"\n")
        elif event == "codeparrot.fail":  # from `failer`'s code, called by the registered frame or `reporter`
            frame = _getframe(2)
            caller = frame.f_back
            if (state[0] is not None and frame.f_code is failer and exact(args[0], _str)
                    and (caller is state[0] or (caller.f_code is reporter and caller.f_back is state[0]))):
                _write(result_fd, b"F " + nonce + b" " + args[0].encode("utf-8", "replace") + b"\n")
        elif not contain:
            return
        elif event in contain_events or event.startswith("socket."):
            deny(event)
        elif event == "import":
            # By the last part of the name too: `_imp.create_dynamic` raises the event with the name it is given,
            # and initializes the library's module from its last part (`x._posixsubprocess`).
            last = args[0].rpartition(".")[2] if exact(args[0], _str) else None
            if last is None or last in no_import or last in unaudited_files:
                deny("import of " + (args[0] if exact(args[0], _str) else "a non-string name"))
        elif event == "os.kill":
            if not exact(args[0], _int) or args[0] != me:
                deny(event)
        elif event == "os.listdir" or event == "os.scandir":
            target = args[0]
            if target is None or exact(target, _int):  # the working directory, or an fd opened through us
                return
            full = absolute(target)
            if full is None:
                deny(event + " of a non-string path")
            real, proc = resolve(full, True)
            if proc or secret(real):
                deny(event + " " + real)
        elif event in path_events:
            where, dir_fds = path_events[event]
            for at in dir_fds:
                dir_fd = args[at] if _len(args) > at else None
                if not (dir_fd is None or (exact(dir_fd, _int) and (dir_fd == -1 or dir_fd == -100))):
                    deny(event + " with dir_fd")
            if event == "sqlite3.connect":
                name = args[0]
                if last_barrier:  # SQL ATTACH writes any file, without an audit event
                    deny("sqlite3.connect (no read-only filesystem: the guard is the last barrier)")
                if (exact(name, _str) and name.startswith("file:")) or \
                        (exact(name, _bytes) and name.startswith(b"file:")):
                    deny("sqlite3.connect of a URI")
            for i in where:
                if exact(args[i], _int):
                    if event not in by_descriptor:
                        deny(event + " of a descriptor")
                    continue
                if exact(args[i], _str) and event == "sqlite3.connect" and args[i] == ":memory:":
                    continue
                full = absolute(args[i])
                if full is None or not inside(resolve(full, event not in no_follow)[0]):
                    deny(event + " outside the workspace")

    def hook(event, args):
        try:
            check(event, args)
        except _BaseException as err:  # never let an exception (and its traceback to our frames) escape
            deny("guard error " + _type(err).__name__)

    sys.addaudithook(hook)

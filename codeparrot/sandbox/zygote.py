"""The program's side of a job in the sandbox worker: the zygote, the watchdog and the program's process
(stdlib only).

Imported by `server.py` (with this folder on `sys.path`, so the stdlib-only siblings below load by their plain
names), which calls `warm_up` and then `start_zygote` once, before the first job; its docstring tells the whole
story. Everything here runs in the zygote or below it, so it never holds any job's text but the program's
own: per job the zygote receives the job number, timeout and the program's pipes and forks the watchdog
(`_watchdog`), which forks the program (`_program`): its /proc, workspace, rlimits, uid, seccomp allowlist and
audit-hook guard, then `child.serve_candidate` or `child.run_program`. The server's side of the job (its
pipes, the checker, the deadline, the verdict) is `job.py`.
"""

import fcntl
import marshal
import os
import resource
import select
import signal
import socket
import sys

import channel
import child
import guard
import seccomp
from cgroup import oom_score_adj
from kernel import (
    CLONE_NEWIPC,
    CLONE_NEWNS,
    CLONE_NEWPID,
    MS_BIND,
    MS_NODEV,
    MS_NOEXEC,
    MS_NOSUID,
    MS_RDONLY,
    MS_REMOUNT,
    PR_SET_DUMPABLE,
    PR_SET_NO_NEW_PRIVS,
    PR_SET_PDEATHSIG,
    drop_capabilities,
    mount,
    prctl,
    program_filter,
    unshare,
    workspace_options,
)
from rootfs import extension_modules
from verdict import SETUP_ERROR, WATCHDOG_ERROR

_PREBUILT = [None]  # the program's seccomp filter when it does not name the program's pid (see warm_up)
PRELOAD = ("typing", "math", "random", "copy", "string", "hashlib", "heapq", "bisect")  # see warm_up
# Without a read-only root (guard-only mode) the seccomp allowlist refuses all executable memory, so every
# extension module is loaded before the zygote forks, but these, which a program then cannot load at all:
# CPython's own test helpers (raw memory access, crash triggers), `_posixsubprocess` (its fork_exec spawns
# without an audit event: `subprocess` announces the spawn from Python, through a `sys.audit` the program can
# replace) and the modules whose C functions write files by name without one (guard.UNAUDITED_FILES).
# Preloaded, they would be in sys.modules: no import event would give the guard the chance to refuse them;
# even dropped from sys.modules afterwards, their library would stay mapped, and `_imp.create_dynamic` builds
# a module from a mapped library without mapping anything, under a name of the program's choosing. So none
# is loaded at all, not even by another preloaded module (`_asyncio` imports asyncio, which imports
# subprocess): `_Refuse`.
NOT_PRELOADED = ("_test", "_xx", "xx", "_ctypes_test", "_posixsubprocess") + guard.UNAUDITED_FILES
# Functions that act on other processes without raising an audit event: removed before the guard installs
# (kill and killpg raise events and are refused by the guard). A program can rebuild the modules (e.g.
# `_imp.create_builtin`), so this is a speed bump; the seccomp filter is the barrier in guard-only mode.
UNAUDITED = {"os": ("pidfd_open", "setpriority", "sched_setaffinity", "sched_setscheduler", "sched_setparam"),
             "posix": ("pidfd_open", "setpriority", "sched_setaffinity", "sched_setscheduler", "sched_setparam"),
             "signal": ("pidfd_send_signal",), "_signal": ("pidfd_send_signal",)}


def _watchdog(cfg, layers, job, fds, stop_r, status_w, unused) -> None:
    """Child of the zygote: start the program in a new PID namespace, wait until it ends or the server
    closes `stop_r` (verdict in, or the deadline), then kill it through a pidfd of our own, still unreaped
    child (never a pid that may have been reused), reap it and write `W` + its wait status (4 bytes) on
    `status_w`, which the server reads; our own failure is `E` + why on the same pipe, which the program
    never holds (never an exit status: the program chooses its own). Never returns."""
    try:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # the zygote ignores it (auto-reaping): we must not
        for fd in unused:
            os.close(fd)
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # the zygote dies -> we die -> the program dies
        os.setsid()
        if layers["pid_namespace"]:  # + its own SysV/POSIX IPC and mounts: both die with the program
            unshare(CLONE_NEWPID | (CLONE_NEWIPC if layers["ipc_namespace"] else 0)
                    | (CLONE_NEWNS if layers["fresh_proc"] else 0))
        pid = os.fork()
        if pid == 0:
            os.close(stop_r)
            os.close(status_w)
            _program(cfg, layers, job, fds)
        for fd in fds:
            os.close(fd)
        pidfd = os.pidfd_open(pid)
        poller = select.poll()
        poller.register(pidfd, select.POLLIN)
        poller.register(stop_r, select.POLLIN)
        # Backstop for a server that stopped answering: never wait much beyond the deadline.
        poller.poll((float(job["timeout"]) + 15.0) * 1000)
        signal.pidfd_send_signal(pidfd, signal.SIGKILL)  # as init of its PID namespace: the whole tree
        if not layers["pid_namespace"]:
            _kill_group(pid)  # its process group (pid: it called setsid); the group id is ours until reaped
        os.write(status_w, b"W" + os.waitpid(pid, 0)[1].to_bytes(4, "little"))
        os._exit(0)
    except BaseException as err:
        try:
            os.write(status_w, f"E{type(err).__name__}: {err}".encode("utf-8", "replace")[:500])
        finally:
            os._exit(WATCHDOG_ERROR)


def _zygote(cfg, layers, control) -> None:
    """The process every program descends from: forked before the first job, it never holds a job's text.

    Per job it receives from the server only the job number, timeout and mode, and the program's pipes
    (SCM_RIGHTS over `control`, a unix socket pair), and forks the watchdog; nothing goes back (the
    watchdog reports on a pipe of the server's, and is reaped by the kernel: SIGCHLD ignored), so a job
    costs the zygote one wake-up. The program reads its own code (prompt + completion, and the test only
    in the in-process fallback) from a pipe the server fills; the test, the other jobs and the server's
    heap (where freed job text lingers) are never in its memory. Never returns."""
    try:
        devnull = os.open("/dev/null", os.O_RDWR)
        for fd in (0, 1):  # the harness's protocol pipes stay the server's alone
            os.dup2(devnull, fd)
        os.close(devnull)
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        signal.signal(signal.SIGCHLD, signal.SIG_IGN)
        while True:
            message, fds, _flags, _addr = socket.recv_fds(control, 4096, 16)
            if not message:
                os._exit(0)
            header = marshal.loads(message)
            program_fds, (code_r, stop_r, status_w) = fds[:-3], fds[-3:]
            if os.fork() == 0:
                _watchdog(cfg, layers, header, program_fds[:3] + [code_r] + program_fds[3:], stop_r, status_w,
                          unused=[control.fileno()])
            for fd in fds:
                os.close(fd)
    except BaseException:
        os._exit(WATCHDOG_ERROR)


def start_zygote(cfg, layers):
    """Fork the zygote (before any job is read); return (its pid, our end of the control socket)."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    pid = os.fork()
    if pid == 0:
        ours.close()
        _zygote(cfg, layers, theirs)
    theirs.close()
    return pid, ours


def _program(cfg, layers, job, fds) -> None:
    """The program's process: its code, workspace, limits, privileges, guard, then run it. Never returns.
    `fds`: result pipe, nonce, sandbox errors, its code, and (isolated check only) the call and reply
    pipes; they become fds 3, 4, 5, 6, 7 (the code pipe is read and closed first)."""
    err_fd = fds[2]
    try:
        code = channel.receive(fds[3], limit=1 << 62)  # the trusted server wrote it: no size limit
        os.close(fds[3])
        job = {**job, **marshal.loads(code)}
        fds = fds[:3] + fds[4:]
        high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 100) for fd in fds]
        err_fd = high[2]
        devnull = os.open("/dev/null", os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)
        for target, fd in enumerate(high, start=3):
            os.dup2(fd, target)
        err_fd = 5
        os.closerange(3 + len(fds), max(65536, resource.getrlimit(resource.RLIMIT_NOFILE)[0]))
        os.setsid()
        workdir = os.path.join(cfg["workspace"], f"job-{job['_n']}")
        os.mkdir(workdir, 0o700)
        if layers["fresh_proc"]:  # our own /proc (no host process visible) and a workspace that dies with us
            # subset=pid: only process folders, none of the host-wide files (locks, meminfo, stat, loadavg,
            # sys/...), whose counters another program could move (kernel.PROC_OPTIONS)
            mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, layers["proc_options"])
            # noexec: no shared library or binary the program writes can be loaded or run from there;
            # its pages and its inodes bounded (kernel.workspace_options)
            mount("tmpfs", workdir, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC,
                  workspace_options(cfg["workspace_mb"], "0700"))
            # The worker's workspace, read-only in our mount namespace: in user-namespace mode the program
            # keeps the uid that owns it and could leave files there for the worker's next program.
            mount(None, cfg["workspace"], None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC)
        oom_score_adj(1000)  # the OOM killer's first choice in its cgroup (the worker, zygote, watchdog: -1000)
        uid = layers["uid"]
        if uid is not None:
            os.chown(workdir, uid, uid)
        os.chdir(workdir)
        cpu = int(-(-float(job["timeout"]) // 1)) + 1  # ceil without importing math
        limits = [(resource.RLIMIT_CPU, cpu, cpu + 1), (resource.RLIMIT_CORE, 0, 0)]
        for name, key in (("RLIMIT_AS", "memory_mb"), ("RLIMIT_FSIZE", "file_mb")):
            limits.append((getattr(resource, name), int(cfg[key]) << 20, int(cfg[key]) << 20))
        limits.append((resource.RLIMIT_NOFILE, int(cfg["max_open_files"]), int(cfg["max_open_files"])))
        if uid is not None:  # per-uid count: meaningful only for our private uid (root ignores it)
            limits.append((resource.RLIMIT_NPROC, int(cfg["max_processes"]), int(cfg["max_processes"])))
        for which, soft, hard in limits:
            resource.setrlimit(which, (soft, hard))
        if uid is not None:
            os.setgroups([])
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)
        elif layers["user_namespace"]:
            drop_capabilities()
        # After any uid change (which resets it), in every mode (user-namespace mode included, where the
        # program keeps the harness's uid): its /proc/self/mem (writing there ignores page protections:
        # native code without executable mmap), auxv, environ... become root's, and no other process of
        # the same uid may ptrace it or read its memory. (An exec, with allow_processes, resets it.)
        prctl(PR_SET_DUMPABLE, 0)
        prctl(PR_SET_NO_NEW_PRIVS, 1)
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # after the uid change, which clears it
        if layers["seccomp"] or layers["program_seccomp"]:
            # Always: no new user namespace, no spawning unless allowed; without a PID namespace and a
            # private uid also no signals/ptrace to other processes.
            program_filter(os.getpid(), foreign_signals=layers["seccomp"], spawning=layers["spawning"],
                           exec_files=layers["readonly_root"], built=None if layers["seccomp"] else _PREBUILT[0])
        if cfg["guard"]:
            for module_name, names in UNAUDITED.items():
                module = sys.modules.get(module_name)
                for name in names:
                    if module is not None and hasattr(module, name):
                        delattr(module, name)
        os.environ.clear()
        os.environ.update({"HOME": workdir, "TMPDIR": workdir, "LANG": "C.UTF-8"})
        sys.dont_write_bytecode = True  # no .pyc writes into a user-owned stdlib (refused outside the workspace)
        sys.modules["__main__"] = type(sys)("__main__")
        for name in ("child", "guard", "kernel", "checker", "channel", "cleanup", "rootfs", "verdict", "seccomp",
                     "cgroup", "zygote", "job", "rewrite", "answers"):  # ours: not for it
            sys.modules.pop(name, None)
        sys.path[:] = layers["sys_path"]
        sys.path_importer_cache.clear()
        _remap_packages(layers["path_map"])
        key = cfg.get("answer_key") or {}
        guard.install_guard(4, 3, workdir, contain=bool(cfg["guard"]), reporter=child.REPORTER_CODE,
                            failer=child.FAILER_CODE, last_barrier=not layers["readonly_root"],
                            answer_key=(key.get("folders", ()), key.get("files", ()), key.get("inodes", ())))
        os.close(5)  # the sandbox-error channel: never open while program code runs
    except BaseException as err:
        try:
            os.write(err_fd, f"E program setup: {type(err).__name__}: {err}\n".encode())
        finally:
            os._exit(SETUP_ERROR)
    if len(fds) == 5:
        child.serve_candidate(job, 6, 7, channel)
    child.run_program(job, 3)


def _remap_packages(path_map: list) -> None:
    """Imported packages keep their original `__path__`; point it at the stdlib binds (submodule imports)."""
    if not path_map:
        return
    for module in list(sys.modules.values()):
        paths = getattr(module, "__path__", None)
        if isinstance(paths, list):
            for i, path in enumerate(paths):
                for source, target in path_map:
                    if path == source or path.startswith(source + "/"):
                        paths[i] = target + path[len(source):]
                        break


def _kill_group(pgid: int) -> None:
    """SIGKILL a process group whose leader is our unreaped child (so the id cannot name anyone else)."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def warm_up(layers: dict) -> None:
    """Do once here what every forked program and checker would otherwise redo: the compiler's AST types
    (built by the first `compile()` in a process, ~1.5 ms), the seccomp filter (when it does not depend on
    the program's pid), the modules HumanEval prompts and tests import (`typing` alone ~3 ms) and, where
    programs may not map any, every extension module of the interpreter but those of NOT_PRELOADED. Programs
    still get their own copies (fork); `random` reseeds in each child (its at-fork hook), so the checker's
    random test inputs are not the program's."""
    compile("pass", "<warm-up>", "exec")
    if layers["program_seccomp"] and not layers["seccomp"]:
        _PREBUILT[0] = seccomp.build(0, foreign_signals=False, spawning=layers["spawning"],
                                     exec_files=layers["readonly_root"])
    # Without a read-only root the allowlist refuses all executable memory: load the interpreter's own
    # extension modules now (with one, a program maps them itself, and forks stay small).
    native = [] if layers["readonly_root"] else [m for m in extension_modules() if not m.startswith(NOT_PRELOADED)]
    sys.meta_path.insert(0, _Refuse)
    try:
        for name in PRELOAD + tuple(native):
            before = set(sys.modules)
            try:
                __import__(name)
            except Exception:  # noqa: BLE001 - a module that cannot load here cannot load for a program either
                _forget(before)  # what a refused import left half-done (asyncio's first submodules)
    finally:
        sys.meta_path.remove(_Refuse)
    # Loaded before the warm-up (by the worker's own imports), one would be in every program: a bug of ours.
    loaded = [name for name in sys.modules if _refused(name)]
    with open("/proc/self/maps") as maps:
        loaded += [path for path in {line.split()[-1] for line in maps} if _refused(os.path.basename(path))
                   and os.path.basename(os.path.dirname(path)) == "lib-dynload"]
    if loaded:
        raise RuntimeError(f"loaded before any program, where none may: {', '.join(sorted(loaded))}")


def _refused(name: str) -> bool:
    """Is `name` (a module, or the file name of an extension module) one of NOT_PRELOADED?"""
    return name.partition(".")[0].startswith(NOT_PRELOADED)


class _Refuse:
    """First on sys.meta_path during the warm-up: a module of NOT_PRELOADED cannot be found, whoever imports
    it, so the import that wants it fails before its library is mapped."""

    @staticmethod
    def find_spec(name, path=None, target=None):
        if _refused(name):
            raise ImportError(f"{name} is not preloaded (zygote.NOT_PRELOADED)", name=name)
        return None


def _forget(before: set) -> None:
    """Drop the modules imported since `before` from sys.modules, and from the packages that stay (a package
    holds its imported submodules as attributes), so no program finds them."""
    for name in set(sys.modules) - before:
        module = sys.modules.pop(name)
        parent, _, child = name.rpartition(".")
        if parent in before and getattr(sys.modules.get(parent), child, None) is module:
            delattr(sys.modules[parent], child)

"""The sandbox worker: a small `python -I -S` process that runs untrusted programs one at a time (stdlib only).

`codeparrot.sandbox.Sandbox` starts one per worker with an empty environment:

    python -I -S server.py <settings: marshal, hex>

It enters its namespaces once (`kernel.setup`: network; mount, pivoting into the minimal filesystem view of
`rootfs.py`, everything read-only but a size-limited tmpfs workspace; a user namespace first when not
root), answers `{"hello": {layer: active}}`, then reads one job per frame on stdin and writes one result
per frame on stdout (frames: 8-byte length + `marshal`).

Before the first job it forks the zygote (in guard-only mode, having loaded every extension module of
the interpreter first: there the program's seccomp allowlist refuses all executable memory). Per job
there is no exec, only forks (about 2 ms instead of about 15 ms for a fresh interpreter):

    server ──fork (once, before any job)──> zygote ──fork──> watchdog: setsid, unshare(PID | IPC | mount)
                                                               ──fork──> program: pid 1 there
           ──fork──> checker: the trusted process that runs the test (jobs with an entry point)

The answer key. The server holds every job (test included) and, in its heap, the text of earlier ones;
the program does not descend from it. The zygote receives only the job number, timeout and the program's
pipes (SCM_RIGHTS); the program reads its own prompt and completion from a pipe (the test too only in the
in-process fallback). So no frame, object or page of the program holds the test or another job's text.

The zygote joins the worker's memory cgroup (so every program is born in it). The program mounts its
own /proc and tmpfs workspace, sets its rlimits, drops to an unprivileged uid (or all capabilities in a
user namespace), installs its seccomp allowlist (`seccomp.py`) and the audit-hook guard, then runs
`child.serve_candidate` (isolated check) or `child.run_program` (in-process fallback). When the verdict is in or the wall-clock deadline passes, the
server closes the watchdog's stop pipe; the watchdog SIGKILLs the program through a pidfd of its own
unreaped child (never a pid that may have been reused) and, without a PID namespace, its process group
before reaping it. As the init of its PID namespace the program's death makes the kernel kill every
process it started, grandchildren and `setsid` escapees included, and free its IPC objects and mounts.
The server signals nothing there: it only closes the stop pipe, and reads the program's wait status from
a pipe the watchdog writes.

The verdict. With an entry point the checker (`checker.py`) decides it: it runs the prompt and the test in
its own interpreter and calls the candidate over two pipes (call: checker -> program, fd 6; reply: program
-> checker, fd 7) carrying plain data only (`channel.py`), then writes one verdict line (`P`, `F`, `X`,
`N`) on a pipe only the server reads. Nothing the program writes anywhere can produce a pass.

Three more pipes serve both modes. The result pipe (fd 3 in the program) carries the audit hook's lines,
`D <nonce> <event>` (a refusal) and `F <nonce> <exception>` (why the program ended before the check); the
nonce (fd 4, read and closed while the guard installs) tells them from program output. Only in-process
(no entry point; or, only with `in_process_fallback`, a test passing non-plain arguments, otherwise the
sample's failure, since the program could provoke it) is a pass, `P <nonce>`, read there, and marked as
such in the result. Sandbox errors go through fd 5, which the watchdog and the program's setup write to
and which is closed before program code runs.
"""

import fcntl
import gc
import marshal
import os
import resource
import select
import signal
import socket
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cgroup  # noqa: E402  (stdlib-only siblings; -I leaves the script's folder off sys.path)
import channel  # noqa: E402
import checker  # noqa: E402
import seccomp  # noqa: E402
import child  # noqa: E402
from cleanup import remove_tree  # noqa: E402
from kernel import (  # noqa: E402
    CLONE_NEWIPC,
    CLONE_NEWNS,
    CLONE_NEWPID,
    MS_NODEV,
    MS_NOEXEC,
    MS_NOSUID,
    PR_SET_CHILD_SUBREAPER,
    PR_SET_DUMPABLE,
    PR_SET_NO_NEW_PRIVS,
    PR_SET_PDEATHSIG,
    drop_capabilities,
    mount,
    prctl,
    probe,
    program_filter,
    refusal,
    setup,
    unshare,
)
from rootfs import enter_minimal_root, extension_modules  # noqa: E402
from verdict import SETUP_ERROR, WATCHDOG_ERROR, classify  # noqa: E402

sys.path.pop(0)
_PREBUILT = [None]  # the program's seccomp filter when it does not name the program's pid (see warm_up)
_MEMORY_GROUP = {}  # "procs": fd of its cgroup.procs, "dir": fd of its folder, "kind": "v1"/"v2" (see main)
PRELOAD = ("typing", "math", "random", "copy", "string", "hashlib", "heapq", "bisect")  # see warm_up
# Without a read-only root (guard-only mode) the seccomp allowlist refuses all executable memory, so every
# extension module is loaded before the zygote forks, but these: CPython's own test helpers (raw memory
# access, crash triggers), which a program then cannot load at all.
NOT_PRELOADED = ("_test", "_xx", "xx", "_ctypes_test")
# Functions that act on other processes without raising an audit event: removed before the guard installs
# (kill and killpg raise events and are refused by the guard). A program can rebuild the modules (e.g.
# `_imp.create_builtin`), so this is a speed bump; the seccomp filter is the barrier in guard-only mode.
UNAUDITED = {"os": ("pidfd_open", "setpriority", "sched_setaffinity", "sched_setscheduler", "sched_setparam"),
             "posix": ("pidfd_open", "setpriority", "sched_setaffinity", "sched_setscheduler", "sched_setparam"),
             "signal": ("pidfd_send_signal",), "_signal": ("pidfd_send_signal",)}


# ------------------------------------------------------------------------------------------------ per job
def _watchdog(cfg, layers, job, fds, stop_r, status_w, unused) -> None:
    """Child of the zygote: start the program in a new PID namespace, wait until it ends or the server
    closes `stop_r` (verdict in, or the deadline), then kill it through a pidfd of our own, still unreaped
    child (never a pid that may have been reused), reap it and write its wait status (4 bytes) on
    `status_w`, which the server reads. Never returns."""
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
        os.write(status_w, os.waitpid(pid, 0)[1].to_bytes(4, "little"))
        os._exit(0)
    except BaseException as err:
        try:
            os.write(fds[2], f"E watchdog: {err}\n".encode())
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
        if "procs" in _MEMORY_GROUP:
            # Into the worker's memory cgroup once: every watchdog and program is then born in it (moving
            # each program there would cost a cgroup migration, milliseconds, per job).
            os.write(_MEMORY_GROUP["procs"], b"0")
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


def _start_zygote(cfg, layers):
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
            mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
            # noexec: no shared library or binary the program writes can be loaded or run from there
            mount("tmpfs", workdir, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC,
                  f"size={int(cfg['workspace_mb'])}m,mode=0700")
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
        for name in ("child", "kernel", "checker", "channel", "cleanup", "rootfs", "verdict", "seccomp", "cgroup"):  # ours: not for it
            sys.modules.pop(name, None)
        sys.path[:] = layers["sys_path"]
        sys.path_importer_cache.clear()
        _remap_packages(layers["path_map"])
        child.install_guard(4, 3, workdir, contain=bool(cfg["guard"]),
                           reporter=child.REPORTER_CODE, failer=child.FAILER_CODE)
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


def _reap_orphans() -> None:
    """We are a child subreaper: processes orphaned below us become our children; collect their exits."""
    while True:
        try:
            if os.waitpid(-1, os.WNOHANG)[0] == 0:
                return
        except ChildProcessError:
            return


def _drain(fd: int) -> bytes:
    os.set_blocking(fd, False)
    chunks = []
    while True:
        try:
            chunk = os.read(fd, 65536)
        except BlockingIOError:
            break
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks)


def _kill_group(pgid: int) -> None:
    """SIGKILL a process group whose leader is our unreaped child (so the id cannot name anyone else)."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _sweep_uid(uid: int) -> None:
    """No PID namespace: kill every process of the program's private uid (setsid escapees included).
    kill(-1) reaches all processes this uid may signal; three passes catch children forked meanwhile."""
    def killer():
        os.setresuid(uid, uid, uid)
        for _ in range(3):
            try:
                os.kill(-1, signal.SIGKILL)  # never the caller itself
            except ProcessLookupError:
                return
            time.sleep(0.002)
    probe(killer)


def _checker(cfg: dict, job: dict, call_w: int, reply_r: int, verdict_w: int, unused) -> None:
    """Child of the server: the trusted checker (see checker.py), with limits. Never returns."""
    try:
        for fd in unused:
            os.close(fd)
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        prctl(PR_SET_DUMPABLE, 0)  # not ptrace-able nor /proc/<pid>/mem-readable by a same-uid program
        os.setsid()
        devnull = os.open("/dev/null", os.O_RDWR)
        for fd in (0, 1, 2):  # fd 1 is the server's protocol pipe: a test's print() must not land there
            os.dup2(devnull, fd)
        os.close(devnull)
        limit = int(cfg["memory_mb"]) << 20
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        cpu = int(-(-float(job["timeout"]) // 1)) + 1
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    except BaseException as err:
        try:
            os.write(verdict_w, f"E checker setup: {err}".encode())
        finally:
            os._exit(WATCHDOG_ERROR)
    checker.run(job, call_w, reply_r, verdict_w)


def _wait_readable(fd: int, deadline: float) -> bool:
    """Is `fd` readable (for a pidfd: has its process ended) before `deadline` (monotonic seconds)?"""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(max(0.0, deadline - time.monotonic()) * 1000))


def run_job(cfg: dict, layers: dict, job: dict, zygote) -> dict:
    """Run one program. With an entry point the check is isolated: the trusted checker (its own process)
    runs the test and calls the candidate over plain-data pipes; the program's process, a descendant of
    the zygote, only answers calls and never receives the test. Without one (the test is the program) the
    in-process check runs and the result says so (`checker`). A test passing arguments that are not plain
    data (verdict `N`) fails the sample with that reason; only with `in_process_fallback` is it rerun
    in-process (marked)."""
    start = time.monotonic()
    timeout = float(job["timeout"])
    isolated = bool(job.get("entry_point")) and job.get("_mode") != "in-process"
    nonce_r, nonce_w = os.pipe()
    res_r, res_w = os.pipe()
    err_r, err_w = os.pipe()
    code_r, code_w = os.pipe()
    stop_r, stop_w = os.pipe()
    status_r, status_w = os.pipe()
    program_fds, ours = [res_w, nonce_r, err_w], [nonce_w, res_r, err_r]
    if isolated:
        call_r, call_w = os.pipe()
        reply_r, reply_w = os.pipe()
        verdict_r, verdict_w = os.pipe()
        program_fds += [call_r, reply_w]
    _zygote_pid, control = zygote
    oom_before = cgroup.oom_kills(_MEMORY_GROUP["dir"], _MEMORY_GROUP["kind"]) if _MEMORY_GROUP else 0
    header = {"_n": job["_n"], "timeout": timeout}
    socket.send_fds(control, [marshal.dumps(header)], program_fds + [code_r, stop_r, status_w])
    for fd in program_fds[:3] + [code_r, stop_r, status_w]:
        os.close(fd)
    code = {"prompt": job["prompt"], "completion": job["completion"], "entry_point": job.get("entry_point")}
    if not isolated:
        code["test"] = job["test"]  # the in-process fallback: the test runs beside the program (marked)
    check_pid = None
    if isolated:
        check_pid = os.fork()
        if check_pid == 0:
            _checker(cfg, job, call_w, reply_r, verdict_w,
                     unused=ours + [call_r, reply_w, verdict_r, code_w, stop_w, status_r, control.fileno()])
        for fd in (call_r, reply_w, call_w, reply_r, verdict_w):
            os.close(fd)
    try:
        channel.send(code_w, marshal.dumps(code))
    except OSError:  # the program ended during its setup: the error pipe says why
        pass
    os.close(code_w)
    nonce = os.urandom(16).hex().encode()  # made after the fork: no copy of it in the program's memory
    try:
        os.write(nonce_w, nonce)
    except OSError:
        pass
    os.close(nonce_w)
    deadline = start + timeout
    verdict = ("", "")
    if isolated:
        check_fd = os.pidfd_open(check_pid)
        checked = _wait_readable(check_fd, deadline)
        if not checked:
            signal.pidfd_send_signal(check_fd, signal.SIGKILL)
        os.waitpid(check_pid, 0)
        os.close(check_fd)
        text = _drain(verdict_r).decode("utf-8", "replace")
        os.close(verdict_r)
        if checked and text[:1] in ("P", "F", "N", "E"):  # the answer is in: the program is not needed
            verdict = (text[:1], text[2:])
            os.close(stop_w)  # the watchdog kills it (its own unreaped child, through a pidfd)
            stop_w = None
        elif checked:
            verdict = ("X", text[2:])
    # The watchdog writes the program's wait status when it has reaped it (and EOF follows as it exits).
    timed_out = not _wait_readable(status_r, deadline if verdict[0] in ("", "X") else time.monotonic() + 10)
    if stop_w is not None:
        os.close(stop_w)  # the deadline: the watchdog kills the program (and the kernel, its whole namespace)
    if timed_out:
        if not _wait_readable(status_r, time.monotonic() + 10):
            raise RuntimeError("the watchdog did not end the program")  # the worker is replaced
        timed_out = verdict[0] in ("", "X")
    reply = _drain(status_r)
    os.close(status_r)
    status = int.from_bytes(reply[:4], "little") if len(reply) >= 4 else WATCHDOG_ERROR << 8
    if not layers["pid_namespace"] and layers["uid"] is not None:
        _sweep_uid(layers["uid"])  # setsid escapees outside the program's group: by uid, not by pid
    data, errors = _drain(res_r), _drain(err_r)
    os.close(res_r)
    os.close(err_r)
    code = 128 + os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
    remove_tree(os.path.join(cfg["workspace"], f"job-{job['_n']}"))
    _reap_orphans()
    mode = job.get("_mode_detail", "in-process" + ("" if job.get("entry_point") else " (the test is the program)"))
    if errors.strip():
        state, detail = classify(data, errors, nonce, code, timed_out, timeout)
    elif verdict[0] == "P":
        state, detail = "passed", ""
    elif verdict[0] == "F" and verdict[1].startswith("MemoryError"):  # the candidate hit RLIMIT_AS
        state, detail = "killed", "memory limit (MemoryError)"
    elif verdict[0] == "F":
        state, detail = "failed", verdict[1]
    elif verdict[0] == "E":
        state, detail = "error", verdict[1]
    elif verdict[0] == "N" and cfg.get("in_process_fallback"):  # asked for: the test beside the program, marked
        return run_job(cfg, layers, {**job, "_mode": "in-process", "_mode_detail": f"in-process ({verdict[1]})"},
                       zygote)
    elif verdict[0] == "N":
        # Rerunning in-process would hand the test (the answer key) to the program, and the program can
        # provoke this verdict itself (a return value the test passes back that cannot cross the channel):
        # never a pass it could earn that way.
        state, detail = "failed", (f"not checked: {verdict[1]}; the in-process fallback (the test in the "
                                   f"program's process) is off (SandboxConfig.in_process_fallback)")
    else:
        state, detail = classify(data, errors, nonce, code, timed_out, timeout, accept_pass=not isolated)
        if isolated and state == "failed" and detail.startswith("exited with code") and verdict[1]:
            detail = verdict[1]
    if state in ("killed", "failed") and _MEMORY_GROUP and \
            cgroup.oom_kills(_MEMORY_GROUP["dir"], _MEMORY_GROUP["kind"]) > oom_before:
        state, detail = "killed", f"memory limit (cgroup, {int(cfg['memory_mb'])} MiB)"
    return {"status": state, "detail": detail, "seconds": round(time.monotonic() - start, 4),
            "checker": "isolated" if isolated else mode}


def warm_up(layers: dict) -> None:
    """Do once here what every forked program and checker would otherwise redo: the compiler's AST types
    (built by the first `compile()` in a process, ~1.5 ms), the seccomp filter (when it does not depend on
    the program's pid), the modules HumanEval prompts and tests import (`typing` alone ~3 ms) and every
    extension module of the interpreter but its test helpers where programs may not map any (see
    NOT_PRELOADED). Programs
    still get their own copies (fork); `random` reseeds in each child (its at-fork hook), so the checker's
    random test inputs are not the program's."""
    compile("pass", "<warm-up>", "exec")
    if layers["program_seccomp"] and not layers["seccomp"]:
        _PREBUILT[0] = seccomp.build(0, foreign_signals=False, spawning=layers["spawning"],
                                     exec_files=layers["readonly_root"])
    # Without a read-only root the allowlist refuses all executable memory: load the interpreter's own
    # extension modules now (with one, a program maps them itself, and forks stay small).
    native = [] if layers["readonly_root"] else [m for m in extension_modules() if not m.startswith(NOT_PRELOADED)]
    for name in PRELOAD + tuple(native):
        try:
            __import__(name)
        except Exception:  # noqa: BLE001 - a module that cannot load here cannot load for a program either
            pass


def _send(obj: dict) -> None:
    """One frame: 8-byte little-endian length, then `marshal` of `obj` (same interpreter on both ends)."""
    payload = marshal.dumps(obj)
    data = len(payload).to_bytes(8, "little") + payload
    while data:
        data = data[os.write(1, data):]


def _receive():
    """The next frame from stdin (the trusted harness: no size limit), or None at end of input."""
    body = channel.receive(0, limit=1 << 62)
    return None if body is None else marshal.loads(body)


def _open_memory_group(cfg: dict) -> str:
    """Open the worker's memory cgroup (made by the harness) while /sys is still visible; "" or why not."""
    path, kind = cfg.get("memory_cgroup") or (None, "not requested")
    if path is None:
        return kind
    try:
        _MEMORY_GROUP["dir"] = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        _MEMORY_GROUP["procs"] = os.open(os.path.join(path, "cgroup.procs"), os.O_WRONLY | os.O_CLOEXEC)
        _MEMORY_GROUP["kind"] = kind
        cgroup.oom_kills(_MEMORY_GROUP["dir"], kind)
    except OSError as err:
        _MEMORY_GROUP.clear()
        return f"cannot open {path} ({err})"
    return ""


def main() -> None:
    cfg = marshal.loads(bytes.fromhex(sys.argv[1]))
    prctl(PR_SET_CHILD_SUBREAPER, 1)  # orphans of a killed watchdog come to us, not to the system's init
    no_group = _open_memory_group(cfg)
    layers = setup(cfg, enter_root=enter_minimal_root)
    layers["memory_cgroup"] = _MEMORY_GROUP.get("kind")
    if no_group:
        layers["notes"].append(f"no memory cgroup ({no_group}): a program's memory is bounded by its address-space "
                               "limit, the workspace size and the syscall allowlist (no shared memory, memfd or "
                               "io_uring), not by one counter of everything it holds")
    refused = refusal(cfg, layers)
    if refused:
        _send({"error": refused})
        return
    warm_up(layers)
    gc.freeze()  # forked children then do not touch (copy) the server's objects when they collect
    zygote = _start_zygote(cfg, layers)  # before the first job: it never holds any job's text
    _send({"hello": layers})
    n = 0
    while True:
        job = _receive()
        if job is None:  # the harness is done: the zygote sees EOF, exits, and we reap it
            zygote[1].close()
            os.waitpid(zygote[0], 0)
            return
        n += 1
        try:
            job["_n"] = n
            job.setdefault("timeout", cfg["timeout"])
            result = run_job(cfg, layers, job, zygote)
        except Exception as err:  # a bug here must not look like a program's verdict
            result = {"status": "error", "detail": f"sandbox server: {type(err).__name__}: {err}", "seconds": 0.0}
        _send(result)


if __name__ == "__main__":
    main()

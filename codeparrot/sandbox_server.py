"""The sandbox worker: a small `python -I -S` process that runs untrusted programs one at a time (stdlib only).

`codeparrot.sandbox.Sandbox` starts one per worker with an empty environment:

    python -I -S sandbox_server.py <settings: marshal, hex>

It enters its namespaces once (network; mount with everything read-only except a size-limited tmpfs
workspace; a user namespace first when not root), answers `{"hello": {layer: active}}`, then reads one
job per frame on stdin and writes one result per frame on stdout (frames: 8-byte length + `marshal`).

Per job there is no exec, only forks of this small process (about 2 ms instead of about 15 ms for a fresh
interpreter):

    server ──fork──> watchdog: setsid, unshare(CLONE_NEWPID) ──fork──> program: pid 1 of a new PID namespace

The program process creates its workspace folder, sets its rlimits, drops to an unprivileged uid (or drops
all capabilities in a user namespace), installs the audit-hook guard and runs `sandbox_child.run_program`.
On the wall-clock deadline the server SIGKILLs it; as the init of its PID namespace its death makes the
kernel kill every process it started, grandchildren and `setsid` escapees included, before the watchdog's
wait returns. Without PID namespaces the program's process group is killed (the guard refuses fork then).
"""

import ctypes
import fcntl
import gc
import marshal
import os
import resource
import select
import signal
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sandbox_child  # noqa: E402  (stdlib-only sibling; -I leaves the script's folder off sys.path)

sys.path.pop(0)

CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x00020000, 0x10000000, 0x20000000, 0x40000000
MS_NOSUID, MS_NODEV, MS_BIND, MS_REC, MS_PRIVATE = 2, 4, 4096, 16384, 1 << 18
AT_FDCWD, AT_RECURSIVE, MOUNT_ATTR_RDONLY, SYS_MOUNT_SETATTR = -100, 0x8000, 1, 442  # 442 on every arch
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_SET_CHILD_SUBREAPER, PR_SET_NO_NEW_PRIVS = 1, 4, 36, 38
WATCHDOG_ERROR, SETUP_ERROR = 250, 251

_libc = ctypes.CDLL(None, use_errno=True)


class _MountAttr(ctypes.Structure):
    _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64),
                ("propagation", ctypes.c_uint64), ("userns_fd", ctypes.c_uint64)]


def _ok(ret: int, what: str) -> None:
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _enc(value):
    return None if value is None else value.encode()


def unshare(flags: int) -> None:
    _ok(_libc.unshare(ctypes.c_int(flags)), f"unshare({flags:#x})")


def mount(source, target, fstype, flags: int, data=None) -> None:
    _ok(_libc.mount(_enc(source), _enc(target), _enc(fstype), ctypes.c_ulong(flags), _enc(data)), f"mount {target}")


def set_readonly(path: str, readonly: bool, recursive: bool) -> None:
    """mount_setattr(2): make the mount at `path` (and every mount below it) read-only, or writable."""
    attr = _MountAttr(MOUNT_ATTR_RDONLY if readonly else 0, 0 if readonly else MOUNT_ATTR_RDONLY, 0, 0)
    ret = _libc.syscall(ctypes.c_long(SYS_MOUNT_SETATTR), ctypes.c_int(AT_FDCWD), path.encode(),
                        ctypes.c_uint(AT_RECURSIVE if recursive else 0), ctypes.byref(attr),
                        ctypes.c_size_t(ctypes.sizeof(attr)))
    _ok(ret, f"mount_setattr {path}")


def prctl(option: int, arg: int) -> None:
    _ok(_libc.prctl(ctypes.c_int(option), ctypes.c_ulong(arg), ctypes.c_ulong(0), ctypes.c_ulong(0),
                    ctypes.c_ulong(0)), f"prctl({option})")


def drop_capabilities() -> None:
    """capset(2) with empty effective/permitted/inheritable sets (user-namespace mode, where the program
    keeps our uid but must not keep the namespace's capabilities that would let it remount things)."""
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this process
    data = (ctypes.c_uint32 * 6)()
    _ok(_libc.capset(ctypes.byref(header), ctypes.byref(data)), "capset")


def _probe(fn) -> bool:
    """Run `fn` in a throwaway child: does the kernel let us do it?"""
    pid = os.fork()
    if pid == 0:
        try:
            fn()
            os._exit(0)
        except BaseException:
            os._exit(1)
    return os.waitpid(pid, 0)[1] == 0


def _can_read_stdlib(uid: int) -> bool:
    """Can `uid` import from the interpreter's stdlib folders? (Not when they live under /root, 0700.)"""
    folders = [path for path in sys.path if os.path.isdir(path)]  # as root: isdir is False when unreachable

    def check():
        os.setresuid(uid, uid, uid)
        for path in folders:
            os.listdir(path)
    return _probe(check)


def _stdlib_binds(ws: str) -> list[tuple[str, str]]:
    """(stdlib folder, its read-only bind inside the workspace tmpfs) for every folder on sys.path."""
    return [(path, os.path.join(ws, f".python-{i}")) for i, path in enumerate(sys.path) if os.path.isdir(path)]


def setup(cfg: dict) -> dict:
    """Enter the namespaces the kernel allows; return which layers are active (probed, never assumed)."""
    layers = {"user_namespace": False, "network_namespace": False, "mount_namespace": False,
              "readonly_root": False, "workspace_tmpfs": False, "pid_namespace": False, "uid": None,
              "guard": bool(cfg["guard"]), "sys_path": list(sys.path), "path_map": [], "notes": []}
    root, ws = os.geteuid() == 0, cfg["workspace"]
    uid = int(cfg["uid"]) if root and cfg.get("uid") is not None else None
    if uid is not None and not _probe(lambda: (os.setgroups([]), os.setresgid(uid, uid, uid),
                                               os.setresuid(uid, uid, uid))):
        layers["notes"].append(f"cannot switch to uid {uid}: programs run as root")
        uid = None
    binds = _stdlib_binds(ws) if uid is not None and not _can_read_stdlib(uid) else []
    if cfg["namespaces"]:
        if not root:
            me, group = os.getuid(), os.getgid()
            try:
                unshare(CLONE_NEWUSER)
                for name, text in (("setgroups", "deny"), ("uid_map", f"{me} {me} 1"), ("gid_map", f"{group} {group} 1")):
                    with open(f"/proc/self/{name}", "w") as f:
                        f.write(text)
                layers["user_namespace"] = True
            except OSError as err:
                layers["notes"].append(f"no user namespace ({err}): namespaces need root or user namespaces")
        if root or layers["user_namespace"]:
            try:
                unshare(CLONE_NEWNET)
                layers["network_namespace"] = True
            except OSError as err:
                layers["notes"].append(f"no network namespace ({err})")
            try:
                unshare(CLONE_NEWNS)
                layers["mount_namespace"] = True
                mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing we mount leaks to the host
                try:
                    mount("tmpfs", ws, "tmpfs", MS_NOSUID | MS_NODEV, f"size={int(cfg['workspace_mb'])}m,mode=0711")
                    layers["workspace_tmpfs"] = True
                except OSError:
                    mount(ws, ws, None, MS_BIND)  # the workspace as its own mount, so it can stay writable
                for source, target in binds:  # a stdlib the private uid cannot reach (e.g. under /root)
                    os.mkdir(target, 0o755)
                    mount(source, target, None, MS_BIND)
                    layers["sys_path"][sys.path.index(source)] = target
                    layers["path_map"].append((source, target))
                binds = []
                set_readonly("/", readonly=True, recursive=True)
                set_readonly(ws, readonly=False, recursive=False)  # its stdlib binds stay read-only
                layers["readonly_root"] = True
            except OSError as err:
                layers["notes"].append(f"mount namespace incomplete ({err}): writes are confined by uid/guard only")
            layers["pid_namespace"] = _probe(lambda: unshare(CLONE_NEWPID))
    if binds:
        layers["notes"].append(f"uid {uid} cannot read the stdlib and there is no mount namespace: programs run as root")
        uid = None
    layers["uid"] = uid
    layers["sys_path"] = [p for p in layers["sys_path"] if os.path.isdir(p)]
    return layers


# ------------------------------------------------------------------------------------------------ per job
def _watchdog(cfg, layers, job, nonce_r, res_w, pid_w, unused) -> None:
    """Child of the server: start the program in a new PID namespace, report its pid, wait, exit with its
    status (exit code 0..127, or 128 + signal). Never returns."""
    try:
        for fd in unused:
            os.close(fd)
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # the server dies -> we die -> the program dies
        os.setsid()
        if layers["pid_namespace"]:
            unshare(CLONE_NEWPID)
        pid = os.fork()
        if pid == 0:
            _program(cfg, layers, job, nonce_r, res_w)
        os.close(nonce_r)
        os.close(res_w)
        os.write(pid_w, str(pid).encode())
        os.close(pid_w)
        status = os.waitpid(pid, 0)[1]
        if os.WIFSIGNALED(status):
            os._exit(128 + os.WTERMSIG(status))
        os._exit(min(os.WEXITSTATUS(status), 127))
    except BaseException as err:
        try:
            os.write(res_w, f"E watchdog: {err}\n".encode())
        finally:
            os._exit(WATCHDOG_ERROR)


def _program(cfg, layers, job, nonce_r, res_w) -> None:
    """The program's process: workspace, limits, privileges, guard, then run it. Never returns."""
    try:
        high_res, high_nonce = fcntl.fcntl(res_w, fcntl.F_DUPFD, 100), fcntl.fcntl(nonce_r, fcntl.F_DUPFD, 100)
        devnull = os.open("/dev/null", os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)
        os.dup2(high_res, 3)
        os.dup2(high_nonce, 4)
        os.closerange(5, max(65536, resource.getrlimit(resource.RLIMIT_NOFILE)[0]))
        os.setsid()
        workdir = os.path.join(cfg["workspace"], f"job-{job['_n']}")
        os.mkdir(workdir, 0o700)
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
            prctl(PR_SET_DUMPABLE, 0)  # /proc/self/* becomes root-owned: no /proc/self/mem, fd reopening
        elif layers["user_namespace"]:
            drop_capabilities()
        prctl(PR_SET_NO_NEW_PRIVS, 1)
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # after the uid change, which clears it
        os.environ.clear()
        os.environ.update({"HOME": workdir, "TMPDIR": workdir, "LANG": "C.UTF-8"})
        sys.modules["__main__"] = type(sys)("__main__")
        sys.modules.pop("sandbox_child", None)
        sys.path[:] = layers["sys_path"]
        sys.path_importer_cache.clear()
        _remap_packages(layers["path_map"])
        sandbox_child.install_guard(4, 3, workdir, contain=bool(cfg["guard"]),
                                    reporter=sandbox_child.REPORTER_CODE)
    except BaseException as err:
        try:
            os.write(3, f"E program setup: {err}\n".encode())
        finally:
            os._exit(SETUP_ERROR)
    sandbox_child.run_program(job, 3)


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


def _rmtree(path: str) -> None:
    """Remove the job's folder (we are root or own it; errors are ignored: the tmpfs dies with us)."""
    for root, dirs, files in os.walk(path, topdown=False):
        for name in files + [d for d in dirs if os.path.islink(os.path.join(root, d))]:
            try:
                os.unlink(os.path.join(root, name))
            except OSError:
                pass
        for name in dirs:
            try:
                os.rmdir(os.path.join(root, name))
            except OSError:
                pass
    try:
        os.rmdir(path)
    except OSError:
        pass


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


def _kill(pid: int, group: bool = False) -> None:
    try:
        (os.killpg if group else os.kill)(pid, signal.SIGKILL)
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
    _probe(killer)


_SIGNAL_DETAIL = {signal.SIGXCPU: "CPU time limit (SIGXCPU)", signal.SIGXFSZ: "file size limit (SIGXFSZ)",
                  signal.SIGKILL: "killed by SIGKILL (a limit, or the program killed itself)",
                  signal.SIGSEGV: "SIGSEGV (stack overflow or memory limit)"}


def classify(data: bytes, nonce: bytes, code: int, timed_out: bool, timeout: float) -> tuple[str, str]:
    """(status, detail) from the result pipe and the watchdog's exit code. Only `P <nonce>` is a pass."""
    lines = data.split(b"\n")
    if b"P " + nonce in lines:
        return "passed", ""
    if timed_out:
        return "timed out", f"wall-clock limit of {timeout:g}s"
    text = {tag: line[2:].decode("utf-8", "replace") for line in lines for tag in ("E", "D", "F")
            if line.startswith(tag.encode() + b" ")}
    if "E" in text:
        return "error", text["E"]
    if "D" in text:
        return "killed", f"sandbox refused {text['D']}"
    if "F" in text:
        if text["F"].startswith("MemoryError") or ": MemoryError" in text["F"]:
            return "killed", "memory limit (MemoryError)"
        return "failed", text["F"]
    if code == WATCHDOG_ERROR:
        return "error", "watchdog failed"
    if code >= 128:
        sig = code - 128
        return "killed", _SIGNAL_DETAIL.get(sig, f"killed by signal {sig}")
    return "failed", f"exited with code {code} before the check finished"


def run_job(cfg: dict, layers: dict, job: dict) -> dict:
    start = time.monotonic()
    timeout = float(job["timeout"])
    nonce_r, nonce_w = os.pipe()
    res_r, res_w = os.pipe()
    pid_r, pid_w = os.pipe()
    watchdog = os.fork()
    if watchdog == 0:
        _watchdog(cfg, layers, job, nonce_r, res_w, pid_w, unused=(nonce_w, res_r, pid_r, 0, 1))
    for fd in (nonce_r, res_w, pid_w):
        os.close(fd)
    nonce = os.urandom(16).hex().encode()  # made after the fork: no copy of it in the program's memory
    try:
        os.write(nonce_w, nonce)
    except OSError:
        pass
    os.close(nonce_w)
    pidfd = os.pidfd_open(watchdog)
    program = int(os.read(pid_r, 32) or 0)
    os.close(pid_r)
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    timed_out = not poller.poll(max(0.0, start + timeout - time.monotonic()) * 1000)
    if timed_out:
        if program:
            _kill(program)  # init of its PID namespace: the kernel kills all it started
            _kill(program, group=True)
        # The watchdog's wait returns once the namespace is torn down: wait for it (bounded).
        if not program or not poller.poll(10_000):
            _kill(watchdog)
    status = os.waitpid(watchdog, 0)[1]
    os.close(pidfd)
    if program and not layers["pid_namespace"]:
        _kill(program, group=True)
        if layers["uid"] is not None:
            _sweep_uid(layers["uid"])
    data = _drain(res_r)
    os.close(res_r)
    code = 128 + os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
    state, detail = classify(data, nonce, code, timed_out, timeout)
    _rmtree(os.path.join(cfg["workspace"], f"job-{job['_n']}"))
    _reap_orphans()
    return {"status": state, "detail": detail, "seconds": round(time.monotonic() - start, 4)}


def _refusal(cfg: dict, layers: dict) -> str:
    """Why these layers are not enough to run anything ("" when they are). Root without the private uid
    could undo every namespace and kill every process on the machine: never without an explicit opt-in."""
    notes = "; ".join(layers["notes"])
    if os.geteuid() == 0 and layers["uid"] is None and not cfg.get("allow_root"):
        return ("programs would run as root (" + (notes or "drop_privileges is off") + "); fix that, or "
                "accept the audit-hook guard as the only barrier with allow_root")
    if layers["uid"] is None and not layers["user_namespace"] and not cfg["guard"]:
        return "no isolation layer is active and the guard is off: refusing to run programs unsandboxed"
    return ""


def _send(obj: dict) -> None:
    """One frame: 8-byte little-endian length, then `marshal` of `obj` (same interpreter on both ends)."""
    payload = marshal.dumps(obj)
    data = len(payload).to_bytes(8, "little") + payload
    while data:
        data = data[os.write(1, data):]


def _receive():
    """The next frame from stdin, or None at end of input."""
    def exactly(n):
        chunks, got = [], 0
        while got < n:
            chunk = os.read(0, min(n - got, 1 << 20))
            if not chunk:
                return None
            chunks.append(chunk)
            got += len(chunk)
        return b"".join(chunks)
    head = exactly(8)
    if head is None:
        return None
    body = exactly(int.from_bytes(head, "little"))
    return None if body is None else marshal.loads(body)


def main() -> None:
    cfg = marshal.loads(bytes.fromhex(sys.argv[1]))
    prctl(PR_SET_CHILD_SUBREAPER, 1)  # orphans of a killed watchdog come to us, not to the system's init
    layers = setup(cfg)
    refusal = _refusal(cfg, layers)
    if refusal:
        _send({"error": refusal})
        return
    gc.freeze()  # forked children then do not touch (copy) the server's objects when they collect
    _send({"hello": layers})
    n = 0
    while True:
        job = _receive()
        if job is None:
            return
        n += 1
        try:
            job["_n"] = n
            job.setdefault("timeout", cfg["timeout"])
            result = run_job(cfg, layers, job)
        except Exception as err:  # a bug here must not look like a program's verdict
            result = {"status": "error", "detail": f"sandbox server: {type(err).__name__}: {err}", "seconds": 0.0}
        _send(result)


if __name__ == "__main__":
    main()

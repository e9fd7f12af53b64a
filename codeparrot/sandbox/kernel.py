"""Kernel layers of the sandbox worker: namespaces, read-only mounts, capabilities (stdlib + ctypes only).

`setup(cfg)` runs once in each sandbox worker (`server.py`) before any program: it enters a user namespace
when not root, then a network namespace (no interface up: no network, loopback included) and a mount
namespace in which it pivots into the minimal filesystem view of `rootfs.py` (the interpreter, its
standard library and shared libraries, device nodes, /proc and a size-limited tmpfs workspace; no host
path beyond those), everything read-only (mount_setattr(2), recursive) except the workspace. It probes,
never assumes: PID and IPC namespaces (one per program, made by the watchdog), a fresh /proc, the
seccomp filters and the switch to the private uid are tried in throwaway children. The returned `layers`
dict is reported to the harness; `refusal` says when they are not enough to run anything.

Where the minimal view cannot be built (no pivot_root, a library that cannot be bound), the view is the
host's tree, read-only, with the home folders (the harness's $HOME, the user's home, /root, /home)
covered by an empty tmpfs, so tokens (~/.cache/huggingface/token, ~/.netrc, ~/.ssh) are unreadable even
by a program that keeps our uid (user-namespace mode). What must stay reachable below them (the
interpreter's prefix and sys.path when Python lives under $HOME, e.g. pyenv; the workspace) is
bind-mounted back at its own path from a descriptor opened before the cover went on. In either view the
answer key's files (`answers.py`) are covered before `/` is made read-only and the stdlib is bound into the
workspace (recursively: the covers come along), and checked after: none is expected in the minimal view;
`layers["answer_key"]` says what hides them, or why nothing does (then `refusal`, unless accepted).

Every program gets the seccomp allowlist of `seccomp.py` (`program_filter`); where processes outside the
program's own are visible and signalable (no PID namespace and no private uid: the guard-only mode), its
signal rule also limits kill/tgkill to the program itself, whatever Python or native code issues them.
"""

import ctypes
import os
import sys

import seccomp

CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x00020000, 0x10000000, 0x20000000, 0x40000000
CLONE_NEWIPC, MS_NOEXEC, MNT_DETACH = 0x08000000, 8, 2
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 1, 2, 4, 32, 4096, 16384, 1 << 18
# The program's own /proc shows process folders only (Linux 5.8+): none of the host-wide files (/proc/locks,
# meminfo, stat, loadavg, sys/...) whose counters another program could move to signal to it.
PROC_OPTIONS = "subset=pid"
AT_FDCWD, AT_RECURSIVE, MOUNT_ATTR_RDONLY, SYS_MOUNT_SETATTR = -100, 0x8000, 1, 442  # 442 on every arch
MOUNT_ATTR_NOEXEC = 8
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_SET_SECCOMP, PR_SET_CHILD_SUBREAPER, PR_SET_NO_NEW_PRIVS = 1, 4, 22, 36, 38
# Never covered, even when $HOME names one (HOME=/ or HOME=/usr would hide the system): these folders, their
# ancestors, and anything inside the system trees.
SYSTEM_DIRS = ("/", "/bin", "/boot", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/proc", "/run", "/sbin", "/sys",
               "/tmp", "/usr", "/var")
SYSTEM_TREES = ("/bin", "/boot", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/proc", "/sbin", "/sys", "/usr")

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


def workspace_options(megabytes: int, mode: str) -> str:
    """tmpfs options of a workspace: `megabytes` of file data and 1,024 inodes per MiB. An empty file or
    folder takes no page but ~1 KiB of kernel memory (inode + dentry; tmpfs counts each hard link as one
    more inode), which `size=` alone leaves unbounded (~150 MiB a second of mkdir). So what a workspace
    pins is about twice `megabytes` at most, with or without a memory cgroup."""
    return f"size={int(megabytes)}m,nr_inodes={int(megabytes) * 1024},mode={mode}"


def umount(target: str, flags: int = 0) -> None:
    _ok(_libc.umount2(target.encode(), ctypes.c_int(flags)), f"umount {target}")


def pivot_root(new_root: str, put_old: str) -> None:
    """pivot_root(2) (no libc wrapper): `new_root` becomes `/`, the old root is mounted at `put_old`."""
    number = {"x86_64": 155, "aarch64": 41}.get(os.uname().machine)
    if number is None:
        raise OSError(f"pivot_root: no syscall number for {os.uname().machine}")
    _ok(_libc.syscall(ctypes.c_long(number), new_root.encode(), put_old.encode()), "pivot_root")


def set_readonly(path: str, readonly: bool, recursive: bool, noexec: bool = False) -> None:
    """mount_setattr(2): make the mount at `path` (and every mount below it) read-only, or writable; with
    `noexec`, also not executable (nothing on it can be mapped to run)."""
    extra = MOUNT_ATTR_NOEXEC if noexec else 0
    attr = _MountAttr((MOUNT_ATTR_RDONLY if readonly else 0) | extra, 0 if readonly else MOUNT_ATTR_RDONLY, 0, 0)
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


def program_filter(pid: int, foreign_signals: bool, spawning: bool, exec_files: bool, built=None) -> None:
    """Install the program's seccomp allowlist (`seccomp.py`; needs PR_SET_NO_NEW_PRIVS), inherited by its
    children. `built`: the same filter from `seccomp.build`, made once before the fork (saves ~0.3 ms)."""
    fprog = built if built is not None else seccomp.build(pid, foreign_signals, spawning, exec_files)
    seccomp.install(fprog, _libc)


def _program_filter_works() -> bool:
    """In a throwaway child: with the allowlist (no spawning), a thread starts, while fork, exec and
    unshare(CLONE_NEWUSER) fail."""
    def check():
        import threading
        prctl(PR_SET_NO_NEW_PRIVS, 1)
        program_filter(os.getpid(), foreign_signals=False, spawning=False, exec_files=False)
        thread = threading.Thread(target=lambda: None)
        thread.start()
        thread.join()
        for attempt in (os.fork, lambda: os.execv("/bin/true", ["true"]), lambda: unshare(CLONE_NEWUSER)):
            try:
                pid = attempt()
            except OSError:  # EPERM (fork, clone) or ENOSYS (not on the allowlist)
                continue
            if pid == 0:
                os._exit(0)
            raise RuntimeError("the filter let a process or namespace through")
    return probe(check)


def _seccomp_works() -> bool:
    """In a throwaway child: install the filter, then kill(parent, 0) (sends nothing) must fail with EPERM
    while kill(self, 0) succeeds."""
    def check():
        prctl(PR_SET_NO_NEW_PRIVS, 1)
        program_filter(os.getpid(), foreign_signals=True, spawning=True, exec_files=True)
        os.kill(os.getpid(), 0)
        try:
            os.kill(os.getppid(), 0)
        except PermissionError:
            return
        raise RuntimeError("the filter let a signal through")
    return probe(check)


def _fresh_proc_works(options=None) -> bool:
    """Can a program, as pid 1 of a new PID + mount namespace, mount its own /proc (with `options`)?"""
    def check():
        unshare(CLONE_NEWPID | CLONE_NEWNS)
        pid = os.fork()
        if pid == 0:
            try:
                mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, options)
                os._exit(0 if os.listdir("/proc/1") and not (options and os.path.exists("/proc/meminfo")) else 1)
            except BaseException:
                os._exit(1)
        if os.waitpid(pid, 0)[1] != 0:
            raise RuntimeError("no fresh /proc")
    return probe(check)


def probe(fn) -> bool:
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
    return probe(check)


def _bind_stdlib(ws: str) -> list[tuple[str, str]]:
    """Bind every folder on sys.path inside the workspace tmpfs (read-only once `/` is made so); return
    [(folder, its bind)]. MS_REC: what is mounted inside a folder comes along, the answer key's covers
    (answers.cover) among them; without it a bind shows the files they cover."""
    binds = [(path, os.path.join(ws, f".python-{i}")) for i, path in enumerate(sys.path) if os.path.isdir(path)]
    for source, target in binds:
        os.mkdir(target, 0o755)
        mount(source, target, None, MS_BIND | MS_REC)
    return binds


def _covered(path: str, folders) -> bool:
    return any(path == f or path.startswith(f.rstrip("/") + "/") for f in folders)


def _outermost(paths) -> list[str]:
    """Real, existing folders among `paths`, without those inside another one of them."""
    real = sorted({os.path.realpath(p) for p in paths if p and os.path.isdir(p)})
    return [p for i, p in enumerate(real) if not _covered(p, real[:i])]


def _home_folders(folders) -> list[str]:
    """The outermost existing `folders` that are neither system folders nor hold one."""
    return [home for home in _outermost(folders)
            if not _covered(home, SYSTEM_TREES) and not any(_covered(d, [home]) for d in SYSTEM_DIRS)]


def _hide_homes(folders, keep) -> list[str]:
    """Cover each home folder with an empty tmpfs (read-only once `/` is made so); bind every `keep` folder
    below it back at its own path. Returns the folders covered."""
    hidden = []
    for home in _home_folders(folders):
        below = [k for k in _outermost(keep) if _covered(k, [home])]
        # Opened before the cover goes on: afterwards these paths name the empty tmpfs.
        fds = [(k, os.open(k, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)) for k in below]
        try:
            mount("tmpfs", home, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=0755")
            for k, fd in fds:
                path = home
                for part in k[len(home):].strip("/").split("/"):
                    path = os.path.join(path, part)
                    if not os.path.isdir(path):
                        os.mkdir(path)
                        os.chmod(path, 0o755)  # whatever the umask: a private uid must traverse it
                mount(f"/proc/self/fd/{fd}", k, None, MS_BIND | MS_REC)
        finally:
            for _, fd in fds:
                os.close(fd)
        hidden.append(home)
    return hidden


def setup(cfg: dict, enter_root=None) -> dict:
    """Enter the namespaces the kernel allows; return which layers are active (probed, never assumed).
    `enter_root(workspace, workspace_mb)`: builds and pivots into the minimal filesystem view (rootfs.py),
    returning what it holds, or raises OSError having changed nothing (then: the host's tree, read-only)."""
    layers = {"minimal_root": None, "user_namespace": False, "network_namespace": False, "mount_namespace": False,
              "readonly_root": False, "workspace_tmpfs": False, "pid_namespace": False, "uid": None,
              "hidden_homes": [], "seccomp": False, "ipc_namespace": False, "fresh_proc": False,
              "program_seccomp": False, "spawning": False, "guard": bool(cfg["guard"]), "sys_path": list(sys.path),
              "proc_options": None, "answer_key": {"covered": []},
              "path_map": [], "notes": []}
    root, ws = os.geteuid() == 0, cfg["workspace"]
    import answers  # here: it imports from this module

    key = cfg.get("answer_key") or answers.survey([], [])
    mounts = ""  # the mount namespace's layer that hides the answer key, once it does
    uid = int(cfg["uid"]) if root and cfg.get("uid") is not None else None
    if uid is not None and not probe(lambda: (os.setgroups([]), os.setresgid(uid, uid, uid),
                                               os.setresuid(uid, uid, uid))):
        layers["notes"].append(f"cannot switch to uid {uid}: programs run as root")
        uid = None
    stdlib_unreadable = uid is not None and not _can_read_stdlib(uid)
    if cfg["namespaces"]:
        if not root:
            me, group = os.getuid(), os.getgid()
            try:
                unshare(CLONE_NEWUSER)
                maps = (("setgroups", "deny"), ("uid_map", f"{me} {me} 1"), ("gid_map", f"{group} {group} 1"))
                for name, text in maps:
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
                view, homes = None, _home_folders(cfg.get("hide", []))  # (as the host has them)
                if enter_root is not None and cfg.get("minimal_root", True):
                    try:  # the interpreter, its libraries, a tmpfs workspace: no host path at all
                        view = enter_root(ws, int(cfg["workspace_mb"]))
                    except OSError as err:
                        layers["notes"].append(f"no minimal filesystem view ({err}): the host's, read-only")
                if view is not None:
                    sys.executable = sys._base_executable = view["executable"]  # the path that exists now
                    layers["minimal_root"], layers["workspace_tmpfs"] = view, True
                    layers["hidden_homes"] = homes  # absent from the view but for the interpreter's folders
                else:
                    try:  # noexec: nothing a program writes there can be mapped to run
                        mount("tmpfs", ws, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC,
                              workspace_options(cfg["workspace_mb"], "0711"))
                        layers["workspace_tmpfs"] = True
                    except OSError:
                        mount(ws, ws, None, MS_BIND)  # the workspace as its own mount, so it can stay writable
                    keep = [ws, sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix, *sys.path]
                    try:
                        layers["hidden_homes"] = _hide_homes(cfg.get("hide", []), keep)
                    except OSError as err:
                        layers["notes"].append(f"home folders not hidden ({err})")
                covered = None
                try:  # before `/` is made read-only (the covers with it) and the stdlib binds; answers.py
                    covered = answers.cover(key, view["folders"] if view is not None else None)
                    layers["answer_key"]["covered"] = covered
                except OSError as err:
                    layers["notes"].append(f"answer key not covered ({err})")
                # The private uid may still be unable to read a stdlib outside the home folders (a 0700 parent).
                if stdlib_unreadable and not _can_read_stdlib(uid):
                    layers["path_map"] = _bind_stdlib(ws)
                    for source, target in layers["path_map"]:
                        layers["sys_path"][sys.path.index(source)] = target
                stdlib_unreadable = False
                if covered is not None:  # after the last mount that could show a covered path again (the binds)
                    left = answers.still_readable(key, covered, layers["path_map"])
                    if left:
                        layers["notes"].append(f"answer key still readable under its mount cover: {', '.join(left)}")
                    else:
                        mounts = "minimal view" if view is not None else "mounts"
                set_readonly("/", readonly=True, recursive=True)
                set_readonly(ws, readonly=False, recursive=False, noexec=True)  # its stdlib binds: read-only
                layers["readonly_root"] = True
            except OSError as err:
                layers["notes"].append(f"mount namespace incomplete ({err}): writes are confined by uid/guard only")
            layers["pid_namespace"] = probe(lambda: unshare(CLONE_NEWPID))
    if stdlib_unreadable:
        layers["notes"].append(f"uid {uid} cannot read the stdlib and there is no mount namespace: "
                               f"programs run as root")
        uid = None
    layers["uid"] = uid
    layers["sys_path"] = [p for p in layers["sys_path"] if os.path.isdir(p)]
    # Always, whatever else is active: no new user namespace, and no process spawning unless allowed.
    layers["program_seccomp"] = _program_filter_works()
    # Spawning needs the read-only view (seccomp.build: `spawning` needs `exec_files`): there everything a
    # spawned process can exec or map is the interpreter's own (every writable mount is noexec). Without it
    # (guard-only mode) a binary or library the program wrote could run, and `_posixsubprocess.fork_exec`
    # spawns without an audit event: the guard, the last barrier there, would never see the process.
    layers["spawning"] = bool(cfg.get("allow_processes")) and layers["readonly_root"]
    if cfg.get("allow_processes") and not layers["spawning"]:
        layers["notes"].append("allow_processes refused: no read-only filesystem view, so a spawned process could "
                               "run what the program wrote, outside the guard")
    if not layers["program_seccomp"]:
        layers["notes"].append("no seccomp filter for programs: user namespaces and spawning not refused by the kernel")
    if layers["pid_namespace"]:
        layers["ipc_namespace"] = probe(lambda: unshare(CLONE_NEWPID | CLONE_NEWIPC))
        layers["fresh_proc"] = layers["readonly_root"] and _fresh_proc_works()
        if layers["fresh_proc"]:
            layers["proc_options"] = PROC_OPTIONS if _fresh_proc_works(PROC_OPTIONS) else None
            if layers["proc_options"] is None:
                layers["notes"].append(f"no /proc {PROC_OPTIONS} (kernel < 5.8): programs see host-wide /proc files "
                                       "(meminfo, stat, loadavg, sys/...) another program can move")
    # Without a PID namespace and a private uid the program could signal or ptrace our processes.
    if not layers["pid_namespace"] and uid is None:
        layers["seccomp"] = _seccomp_works()
        if not layers["seccomp"]:
            layers["notes"].append("no seccomp filter: only the guard stops signals to other processes")
    # Covers count when a program cannot get past them: a root program (allow_root) could unmount them without
    # the allowlist, and in the host's tree read the disk's block device.
    undone = root and uid is None and (mounts == "mounts" or not layers["program_seccomp"])
    # The guard alone hides them only where no code it cannot see runs: no process spawned outside it, and no
    # native code but the interpreter's own, loaded before the fork (guard-only mode: no executable mapping at
    # all). In the host's tree a program may load any extension module there (pyarrow's CSV and JSON readers
    # open files by name without an audit event).
    blind = ("the audit-hook guard is off" if not cfg["guard"] else
             "allow_processes runs processes outside the audit-hook guard" if layers["spawning"] else
             "the audit-hook guard does not see what native code of the host's tree opens" if layers["readonly_root"]
             else "no seccomp allowlist keeps native code the audit-hook guard cannot see from running"
             if not layers["program_seccomp"] else "")
    layers["answer_key"].update(answers.verdict(key, "" if undone else mounts, bool(cfg["guard"]), blind))
    if layers["answer_key"]["reachable"]:
        layers["notes"].append(f"answer key readable by programs: {layers['answer_key']['reachable']}")
    return layers


def refusal(cfg: dict, layers: dict) -> str:
    """Why these layers are not enough to run anything ("" when they are). Root without the private uid
    could undo every namespace and kill every process on the machine, and without namespaces and a private
    uid the audit-hook guard (advisory: it sees only what CPython announces) is the last barrier: neither
    without an explicit opt-in; nor where programs could read the answer key (answers.py)."""
    notes = "; ".join(layers["notes"])
    if os.geteuid() == 0 and layers["uid"] is None and not cfg.get("allow_root"):
        return ("programs would run as root (" + (notes or "drop_privileges is off") + "); fix that, or "
                "accept the audit-hook guard as the only barrier with allow_root")
    if layers["uid"] is None and not layers["user_namespace"] and not cfg["guard"]:
        return "no isolation layer is active and the guard is off: refusing to run programs unsandboxed"
    if layers["uid"] is None and not layers["user_namespace"] and not (cfg.get("allow_guard_only")
                                                                       or cfg.get("allow_root")):
        return ("no namespaces and no private uid (" + (notes or "namespaces off") + "): the audit-hook guard "
                "would be the last barrier, and it is advisory; fix that, or accept it with "
                "SandboxConfig(allow_guard_only=True) or CODEPARROT_SANDBOX_ALLOW_GUARD_ONLY=1")
    if layers["answer_key"]["reachable"] and not cfg.get("allow_reachable_answers"):
        return (f"programs could read the answer key ({layers['answer_key']['reachable']}); fix that (the minimal "
                "view holds none of it), or accept it with SandboxConfig(allow_reachable_answers=True) or "
                "CODEPARROT_SANDBOX_ALLOW_REACHABLE_ANSWERS=1: the results then say so")
    return ""

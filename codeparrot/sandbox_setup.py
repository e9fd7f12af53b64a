"""Kernel layers of the sandbox worker: namespaces, read-only mounts, capabilities (stdlib + ctypes only).

`setup(cfg)` runs once in each `sandbox_server.py` process before any program: it enters a user namespace
when not root, then a network namespace (no interface up: no network, loopback included) and a mount
namespace where `/` and everything below it is read-only (mount_setattr(2), recursive) except the
worker's workspace, a size-limited tmpfs. It probes, never assumes: PID namespaces (one per program, made
by the watchdog) and the switch to the private uid are tried in throwaway children. The returned `layers`
dict is reported to the harness; `refusal` says when they are not enough to run anything.
"""

import ctypes
import os
import sys

CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x00020000, 0x10000000, 0x20000000, 0x40000000
MS_NOSUID, MS_NODEV, MS_BIND, MS_REC, MS_PRIVATE = 2, 4, 4096, 16384, 1 << 18
AT_FDCWD, AT_RECURSIVE, MOUNT_ATTR_RDONLY, SYS_MOUNT_SETATTR = -100, 0x8000, 1, 442  # 442 on every arch
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_SET_CHILD_SUBREAPER, PR_SET_NO_NEW_PRIVS = 1, 4, 36, 38

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
    if uid is not None and not probe(lambda: (os.setgroups([]), os.setresgid(uid, uid, uid),
                                               os.setresuid(uid, uid, uid))):
        layers["notes"].append(f"cannot switch to uid {uid}: programs run as root")
        uid = None
    binds = _stdlib_binds(ws) if uid is not None and not _can_read_stdlib(uid) else []
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
            layers["pid_namespace"] = probe(lambda: unshare(CLONE_NEWPID))
    if binds:
        layers["notes"].append(f"uid {uid} cannot read the stdlib and there is no mount namespace: "
                               f"programs run as root")
        uid = None
    layers["uid"] = uid
    layers["sys_path"] = [p for p in layers["sys_path"] if os.path.isdir(p)]
    return layers


def refusal(cfg: dict, layers: dict) -> str:
    """Why these layers are not enough to run anything ("" when they are). Root without the private uid
    could undo every namespace and kill every process on the machine: never without an explicit opt-in."""
    notes = "; ".join(layers["notes"])
    if os.geteuid() == 0 and layers["uid"] is None and not cfg.get("allow_root"):
        return ("programs would run as root (" + (notes or "drop_privileges is off") + "); fix that, or "
                "accept the audit-hook guard as the only barrier with allow_root")
    if layers["uid"] is None and not layers["user_namespace"] and not cfg["guard"]:
        return "no isolation layer is active and the guard is off: refusing to run programs unsandboxed"
    return ""

"""A memory cgroup per sandbox worker, holding its programs one at a time (stdlib only).

`RLIMIT_AS` bounds a process's address space, not the memory it makes the kernel hold for it: tmpfs pages
(its workspace), shared memory, pipe and socket buffers, page tables. A memory cgroup counts all of that.
The harness (`client.py`, which still sees the host's /sys) creates one per worker below its own cgroup:
cgroup v2 (`memory.max`, `memory.swap.max` 0) where the memory controller can be delegated there, else
cgroup v1's memory controller (`memory.limit_in_bytes`, and `memory.memsw.limit_in_bytes` when swap is
accounted). The worker (`server.py`) opens the group's `cgroup.procs` before it pivots away from /sys
(`open_memory_group`) and joins it before it forks anything that runs a job (`join_memory_group`): the
zygote, each program and everything it starts, and each trusted checker are then born in it (a migration
per job would wait for an RCU grace period: about 10 ms on a loaded machine), so they share `memory_mb`,
whatever kind of memory they use; over it the kernel's OOM killer ends the program first (its
`oom_score_adj` is 1000) and the result says "memory limit (cgroup)".

Where neither is writable (no root, no delegation), `create` raises OSError with the reason, the layers
line says so, and memory is bounded by `RLIMIT_AS`, the workspace size and the seccomp allowlist (no
SysV/POSIX shared memory, memfd or io_uring).
"""

import errno
import os
import time

PREFIX = "codeparrot-sandbox-"


def _own_cgroups() -> dict:
    """{"v2": path} and/or {"v1": path} of the memory hierarchy this process is in (paths inside each)."""
    found = {}
    with open("/proc/self/cgroup") as f:
        for line in f:
            number, controllers, path = line.rstrip("\n").split(":", 2)
            if number == "0" and controllers == "":
                found["v2"] = path
            elif "memory" in controllers.split(","):
                found["v1"] = path
    return found


def _mounts() -> dict:
    """{"v2": (mount point, root), "v1": (mount point, root)} of the cgroup file systems (memory for v1)."""
    found = {}
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, right = line.rstrip("\n").split(" - ", 1)
            fields, (fstype, _source, options) = left.split(), right.split(" ", 2)
            root, point = fields[3], fields[4].replace("\\040", " ")
            if fstype == "cgroup2" and "v2" not in found:
                found["v2"] = (point, root)
            elif fstype == "cgroup" and "memory" in options.split(",") and "v1" not in found:
                found["v1"] = (point, root)
    return found


def _inside(point: str, root: str, path: str) -> str:
    relative = path[len(root):] if root != "/" and path.startswith(root) else path
    return point.rstrip("/") + "/" + relative.strip("/")


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def remove_stale(parent: str) -> None:
    """Remove empty groups of harnesses that are gone (SIGKILLed: their cleanup never ran)."""
    try:
        names = os.listdir(parent)
    except OSError:
        return
    for name in names:
        if name.startswith(PREFIX):
            owner = name[len(PREFIX):].split("-", 1)[0]
            if owner.isdigit() and not os.path.exists(f"/proc/{owner}"):
                try:
                    os.rmdir(os.path.join(parent, name))
                except OSError:
                    pass


def create(name: str, limit_bytes: int) -> tuple[str, str]:
    """Create the group `PREFIX + name` below ours with a hard memory limit; return (path, "v2" or "v1").
    Raises OSError naming why neither hierarchy can be used."""
    reasons = []
    own, mounts = _own_cgroups(), _mounts()
    for kind in ("v2", "v1"):
        if kind not in own or kind not in mounts:
            reasons.append(f"no cgroup {kind} memory hierarchy")
            continue
        parent = _inside(*mounts[kind], own[kind])
        path = os.path.join(parent, PREFIX + name)
        try:
            if kind == "v2":
                with open(os.path.join(parent, "cgroup.subtree_control")) as f:
                    if "memory" not in f.read().split():
                        _write(os.path.join(parent, "cgroup.subtree_control"), "+memory")
            remove_stale(parent)
            os.mkdir(path, 0o755)
        except OSError as err:
            reasons.append(f"cgroup {kind} not writable at {parent} ({err.strerror or err})")
            continue
        try:
            if kind == "v2":
                _write(os.path.join(path, "memory.max"), str(limit_bytes))
                if os.path.exists(os.path.join(path, "memory.swap.max")):
                    _write(os.path.join(path, "memory.swap.max"), "0")
            else:
                _write(os.path.join(path, "memory.limit_in_bytes"), str(limit_bytes))
                if os.path.exists(os.path.join(path, "memory.memsw.limit_in_bytes")):
                    _write(os.path.join(path, "memory.memsw.limit_in_bytes"), str(limit_bytes))
        except OSError as err:
            remove(path)
            reasons.append(f"cgroup {kind}: cannot set the limit ({err.strerror or err})")
            continue
        return path, kind
    raise OSError("; ".join(reasons))


def remove(path: str, wait_s: float = 2.0) -> None:
    """Remove the group; while its last processes are still exiting (EBUSY) retry for up to `wait_s`.
    One left behind is removed by the next Sandbox once its owner is gone (`remove_stale`)."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            os.rmdir(path)
            return
        except OSError as err:
            if err.errno != errno.EBUSY or time.monotonic() > deadline:
                return
            time.sleep(0.02)


def peak_bytes(path: str, kind: str) -> int:
    """The most memory the group has held (v2 `memory.peak`, v1 `memory.max_usage_in_bytes`)."""
    with open(os.path.join(path, "memory.peak" if kind == "v2" else "memory.max_usage_in_bytes")) as f:
        return int(f.read().split()[0])


def oom_kills(dir_fd: int, kind: str) -> int:
    """How many processes the kernel's OOM killer has ended in the group (`dir_fd`: the group's folder)."""
    fd = os.open("memory.events" if kind == "v2" else "memory.oom_control", os.O_RDONLY, dir_fd=dir_fd)
    try:
        text = os.read(fd, 4096).decode()
    finally:
        os.close(fd)
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key == "oom_kill":
            return int(value)
    return 0


# The worker's group, opened by `open_memory_group` (server.py's main): "procs": fd of its cgroup.procs, "dir": fd
# of its folder, "kind": "v1"/"v2". Joined by the worker before its zygote, read for OOM kills after each job.
MEMORY_GROUP = {}


def open_memory_group(cfg: dict) -> str:
    """Open the worker's memory cgroup (made by the harness) while /sys is still visible; "" or why not."""
    path, kind = cfg.get("memory_cgroup") or (None, "not requested")
    if path is None:
        return kind
    try:
        MEMORY_GROUP["dir"] = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        MEMORY_GROUP["procs"] = os.open(os.path.join(path, "cgroup.procs"), os.O_WRONLY | os.O_CLOEXEC)
        MEMORY_GROUP["kind"] = kind
        oom_kills(MEMORY_GROUP["dir"], kind)
    except OSError as err:
        MEMORY_GROUP.clear()
        return f"cannot open {path} ({err})"
    return ""


def join_memory_group() -> None:
    """Move this process (the worker) into its memory cgroup, once: every process it forks from now on is
    born there. Its memory allocated so far stays charged where it was."""
    if "procs" in MEMORY_GROUP:
        os.write(MEMORY_GROUP["procs"], b"0")


def oom_score_adj(value: int) -> None:
    """Set this process's OOM-killer bias (-1000: never chosen, 1000: chosen first; inherited by children).
    Lowering it needs CAP_SYS_RESOURCE (root); raising it as root also stops the (then unprivileged) program
    from lowering it again. Where it cannot be set, the value stays."""
    try:
        fd = os.open("/proc/self/oom_score_adj", os.O_WRONLY)
        try:
            os.write(fd, str(value).encode())
        finally:
            os.close(fd)
    except OSError:
        pass

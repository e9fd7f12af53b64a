"""The filesystem a sandbox worker and its programs see: the interpreter and nothing else (stdlib + ctypes only).

`enter_minimal_root(workspace, workspace_mb)` runs once in each sandbox worker, inside its private mount
namespace, before any program. It builds a new root on a small tmpfs and `pivot_root`s into it, so the
host's tree (the project, /etc, /home, /run and /tmp with their unix sockets, other users' files) no longer
exists for the worker, its trusted checker or its programs. The new root holds, read-only:

- every folder on `sys.path` (the standard library and `lib-dynload`), bind-mounted at its own path;
- the interpreter's executable, and every shared library the dynamic loader maps once each extension
  module of `lib-dynload` is imported (found from `/proc/self/maps` of a throwaway child, so the list is
  what the loader really opens: libpython, libc, libcrypto for `hashlib`, libmpdec for `decimal`, ...),
  each bound as a single file at its real path, plus the symlinks that name it (`/lib -> usr/lib`,
  sonames, the ELF interpreter `/lib64/ld-linux-x86-64.so.2`) recreated as the same symlinks, and
  `/etc/ld.so.cache` (so `dlopen` finds them the usual way);
- `/dev/null`, `/dev/zero`, `/dev/full`, `/dev/random`, `/dev/urandom` (noexec), and the symlinks `/dev/fd`,
  `/dev/stdin`, `/dev/stdout`, `/dev/stderr` into `/proc/self`;
- `/proc` (the worker's; each program mounts a fresh one over it in its own PID namespace);

and, writable, the worker's workspace: a size-limited tmpfs at the same path as on the host, mounted
nosuid, nodev and noexec (a program cannot load a shared library or run a binary it wrote there). Empty
folders on the way to these paths (e.g. `/root` for an interpreter under `/root/.pyenv`) are plain 0755
folders of the new root, listing only what is bound below them.

Left out on purpose: `_tkinter`'s libraries (X11, Tcl/Tk: a sandboxed program has no display), locale and
zoneinfo data, /etc (no passwd, resolv.conf, ssl certificates), /dev/shm (POSIX shared memory cannot be
created), every other binary (with `allow_processes` a program can exec only the interpreter).
"""

import os
import re
import stat
import sys

from kernel import (
    MNT_DETACH,
    MS_BIND,
    MS_NODEV,
    MS_NOEXEC,
    MS_NOSUID,
    MS_REC,
    mount,
    pivot_root,
    set_readonly,
    umount,
    workspace_options,
)

DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom")
DEVICE_LINKS = {"/dev/fd": "/proc/self/fd", "/dev/stdin": "/proc/self/fd/0", "/dev/stdout": "/proc/self/fd/1",
                "/dev/stderr": "/proc/self/fd/2"}  # the usual ones, into the program's own (fresh) /proc
LD_CACHE = "/etc/ld.so.cache"
SKIP_MODULES = frozenset({"_tkinter"})  # X11 and Tcl/Tk libraries, for windows no sandboxed program can open
MAX_LINKS = 40  # symlinks followed per path, like the kernel's ELOOP limit


def extension_modules() -> list[str]:
    """Names of the extension modules the interpreter ships (`lib-dynload`), `_tkinter` left out."""
    names = []
    for folder in sys.path:
        if os.path.basename(folder) == "lib-dynload" and os.path.isdir(folder):
            names += [name.split(".", 1)[0] for name in sorted(os.listdir(folder)) if name.endswith(".so")]
    return [name for name in names if name not in SKIP_MODULES]


def loaded_libraries() -> list[str]:
    """Real paths of the ELF files this interpreter maps once every extension module in `lib-dynload` is
    imported: the executable, libpython, libc, the libraries behind `_ssl`, `_decimal`, `zlib`, ... Found
    in a throwaway child (the imports and their side effects stay there); standard streams on /dev/null."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(read_end)
            devnull = os.open("/dev/null", os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(devnull, fd)
            for module in extension_modules():
                try:
                    __import__(module)
                except BaseException:  # noqa: BLE001 - a module that cannot load is not needed
                    pass
            with open("/proc/self/maps") as maps:
                paths = {line.split(None, 5)[5].strip() for line in maps if len(line.split(None, 5)) == 6}
            data = "\n".join(sorted(p for p in paths if p.startswith("/"))).encode()
            while data:
                data = data[os.write(write_end, data):]
        finally:
            os._exit(0)
    os.close(write_end)
    chunks = []
    while True:
        chunk = os.read(read_end, 1 << 16)
        if not chunk:
            break
        chunks.append(chunk)
    os.close(read_end)
    os.waitpid(pid, 0)
    executable = os.path.realpath(sys.executable)
    found = []
    for path in b"".join(chunks).decode("utf-8", "surrogateescape").splitlines():
        if (".so" in os.path.basename(path) or path == executable) and os.path.isfile(path):
            found.append(path)
    return found


def elf_interpreter(path: str):
    """The PT_INTERP path of a 64-bit ELF executable (the dynamic loader the kernel starts), or None."""
    try:
        with open(path, "rb") as f:
            head = f.read(64)
            if head[:4] != b"\x7fELF" or head[4] != 2:
                return None
            order = "little" if head[5] == 1 else "big"
            phoff = int.from_bytes(head[32:40], order)
            size, count = int.from_bytes(head[54:56], order), int.from_bytes(head[56:58], order)
            for i in range(count):
                f.seek(phoff + i * size)
                header = f.read(size)
                if int.from_bytes(header[0:4], order) == 3:  # PT_INTERP
                    f.seek(int.from_bytes(header[8:16], order))
                    return f.read(int.from_bytes(header[32:40], order)).rstrip(b"\0").decode()
    except (OSError, UnicodeDecodeError):
        return None
    return None


def library_names(libraries: list[str]) -> list[str]:
    """Paths that name one of `libraries` through symlinks: the entries of /etc/ld.so.cache (what `dlopen`
    opens, e.g. /lib/x86_64-linux-gnu/libz.so.1) and the symlinks beside each library (its soname)."""
    wanted = set(libraries)
    candidates = set()
    try:
        with open(LD_CACHE, "rb") as f:
            candidates.update(m.decode() for m in re.findall(rb"/[\x21-\x7e]+", f.read()))
    except OSError:
        pass
    for folder in {os.path.dirname(p) for p in libraries}:
        try:
            candidates.update(os.path.join(folder, name) for name in os.listdir(folder))
        except OSError:
            pass
    return sorted(c for c in candidates if c not in wanted and os.path.islink(c) and os.path.realpath(c) in wanted)


def mirror(root: str, path: str) -> bool:
    """Reproduce the host's `path` below `root`: each symlink on the way as the same symlink (same target
    text), each folder as an empty 0755 folder, and what it finally names bind-mounted read-only at its
    real path. Nothing is created where something is already visible (e.g. inside a bound folder).
    False when the path does not exist on the host."""
    todo = [p for p in path.split("/") if p][::-1]
    done, links = "", 0
    while todo:
        part = todo.pop()
        if part == ".":
            continue
        if part == "..":
            done = os.path.dirname(done) if done else ""
            continue
        host = done + "/" + part
        inner = root + host
        try:
            info = os.lstat(host)
        except OSError:
            return False
        if stat.S_ISLNK(info.st_mode):
            links += 1
            if links > MAX_LINKS:
                return False
            target = os.readlink(host)
            if not os.path.lexists(inner):
                os.symlink(target, inner)
            if target.startswith("/"):
                done = ""
            todo.extend([p for p in target.split("/") if p][::-1])
            continue
        if todo:  # a folder on the way
            if not stat.S_ISDIR(info.st_mode):
                return False
            if not os.path.lexists(inner):
                os.mkdir(inner, 0o755)
                os.chmod(inner, 0o755)  # whatever the umask: a private uid must traverse it
            done = host
            continue
        if os.path.lexists(inner):  # already visible: bound before, or inside a bound folder
            return True
        if stat.S_ISDIR(info.st_mode):
            os.mkdir(inner, 0o755)
            mount(host, inner, None, MS_BIND | MS_REC)
            set_readonly(inner, readonly=True, recursive=True)
        else:
            os.close(os.open(inner, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
            mount(host, inner, None, MS_BIND)
            set_readonly(inner, readonly=True, recursive=False)
    return True


def enter_minimal_root(workspace: str, workspace_mb: int) -> dict:
    """Build the minimal root and pivot into it (call inside a private mount namespace, `/` made private).
    Returns what is visible: {"folders": [...], "files": count of files bound one by one (the executable
    and shared libraries outside those folders), "executable": real path}.
    On a failure before the pivot the partial tree is unmounted and OSError raised (nothing changed)."""
    executable = os.path.realpath(sys.executable)
    # Outer folders first (lib-dynload is then already visible inside the stdlib's bind); each by the path
    # sys.path names it, so symlinks on the way are recreated and the same names work after the pivot.
    folders = sorted({p for p in sys.path if p and os.path.isdir(p)}, key=lambda p: len(os.path.realpath(p)))
    libraries = loaded_libraries()
    if executable not in libraries:
        libraries.append(executable)
    names = library_names(libraries)
    interpreter = elf_interpreter(executable)
    root = workspace  # the new root's tmpfs sits on the workspace folder until the pivot
    mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=0755")
    try:
        for folder in folders:
            if not mirror(root, folder):
                raise OSError(f"cannot bind {folder}")
        for path in libraries:
            if not mirror(root, path):
                raise OSError(f"cannot bind {path}")
        for path in names + ([interpreter] if interpreter else []) + [LD_CACHE]:
            mirror(root, path)  # optional: a name the loader may use
        for device in DEVICES:
            if os.path.exists(device) and stat.S_ISCHR(os.stat(device).st_mode) and mirror(root, device):
                # /dev/zero mapped executable would be fresh executable memory: the binds are noexec
                set_readonly(root + device, readonly=True, recursive=False, noexec=True)
        os.makedirs(root + "/dev", 0o755, exist_ok=True)
        for link, target in DEVICE_LINKS.items():
            os.symlink(target, root + link)
        os.mkdir(root + "/proc", 0o555)
        mount("/proc", root + "/proc", None, MS_BIND | MS_REC)
        os.makedirs(root + workspace, 0o755)
        mount("tmpfs", root + workspace, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC,
              workspace_options(workspace_mb, "0711"))
        os.chdir(root)
        # pivot_root(2)'s own recipe: the old root ends up stacked on `.`, then detached with all below it.
        pivot_root(".", ".")
    except BaseException:
        os.chdir("/")
        umount(root, MNT_DETACH)
        raise
    try:
        umount(".", MNT_DETACH)
    except OSError as err:  # the host's tree would still be there, writable: never carry on like that
        raise RuntimeError(f"pivot_root done but the old root stays mounted ({err})") from err
    os.chdir("/")
    real = [os.path.realpath(f) for f in folders]
    bound = [p for p in libraries if not any(p.startswith(f + "/") for f in real)]  # not inside lib-dynload
    return {"folders": real, "files": len(bound), "executable": executable}

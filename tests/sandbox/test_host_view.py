"""What of the host a program can reach: its filesystem view and the IPC objects it leaves behind.

The minimal view (rootfs.py) holds the interpreter, its standard and shared libraries, a few devices,
/proc and the workspace: a unix socket or a file on a host path does not exist for the program, whatever
else (seccomp, the guard) would stop it, while the standard library and the canonical HumanEval
solutions still run. SysV and POSIX IPC objects a program creates (from native code, here a fresh
interpreter without the audit hook) are checked from the host after the run.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import socket
import sys
import tempfile
import time
from pathlib import Path

import pytest

from codeparrot.errors import CodeParrotError
from codeparrot.humaneval.problems import load_problems
from codeparrot.sandbox import Program, Sandbox, SandboxConfig

PROJECT = Path(__file__).resolve().parents[2]
CONFIGS = {
    "full": SandboxConfig(timeout=3.0),
    "kernel-only": SandboxConfig(timeout=3.0, guard=False),
}


def _start(config: SandboxConfig, workers: int) -> Sandbox:
    box = Sandbox(config, num_workers=workers)
    try:
        box.start()
    except CodeParrotError as err:
        box.close()
        pytest.skip(str(err))
    if not box.layers.get("minimal_root"):
        box.close()
        pytest.skip(f"no minimal filesystem view on this machine: {box.layers['notes']}")
    return box


@pytest.fixture(scope="module", params=list(CONFIGS))
def box(request):
    sandbox = _start(CONFIGS[request.param], workers=2)
    sandbox.kind = request.param
    yield sandbox
    sandbox.close()


@pytest.fixture
def canary():
    """A unix socket listening on a host path anyone may connect to, and a world-readable file beside it, in
    a world-searchable folder (so only the sandbox can hide them from a private uid).
    Yields (socket path, file path, number of connections accepted since the last call)."""
    folder = Path(tempfile.mkdtemp(prefix="codeparrot-canary-"))
    folder.chmod(0o777)
    path, text = folder / "canary.sock", folder / "canary.txt"
    text.write_text("canary")
    text.chmod(0o644)
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(path))
    path.chmod(0o777)
    listener.listen(4)
    listener.setblocking(False)

    def accepted() -> int:
        count = 0
        while True:
            try:
                listener.accept()[0].close()
                count += 1
            except BlockingIOError:
                return count

    try:
        yield str(path), str(text), accepted
    finally:
        listener.close()
        shutil.rmtree(folder, ignore_errors=True)


LOOK = """import os, stat
def f(paths, skip):
    seen = {p: os.path.lexists(p) for p in paths}
    found = []
    for top, dirs, files in os.walk('/'):
        dirs[:] = [d for d in dirs if os.path.join(top, d) not in skip]
        for name in files + dirs:
            full = os.path.join(top, name)
            mode = os.lstat(full).st_mode
            kind = ('socket' if stat.S_ISSOCK(mode) else 'link' if stat.S_ISLNK(mode) else 'dir' if stat.S_ISDIR(mode)
                    else 'file' if stat.S_ISREG(mode) else 'device' if stat.S_ISCHR(mode) else 'other')
            if kind != 'dir':
                found.append([full, kind])
    return seen, found
"""
# Trusted side: every path the program named is absent; everything in the view (outside /proc, the standard
# library folders and the workspace) is a shared library, the interpreter, the loader's cache, a device
# node under /dev or a symlink; there is no socket at all.
LOOK_CHECK = """import re
def check(candidate):
    seen, found = candidate({paths!r}, {skip!r})
    assert not any(seen.values()), [p for p, there in seen.items() if there]
    unexpected = [(p, kind) for p, kind in found if not (
        kind == 'link' or (kind == 'device' and p.startswith('/dev/')) or p in ({executable!r}, '/etc/ld.so.cache')
        or (kind == 'file' and re.search(r'[.]so([.]|$)', p)))]
    assert not unexpected, unexpected[:10]
    assert len(found) < 1000, len(found)
"""


def test_only_the_interpreter_and_its_libraries_are_visible(box, canary):
    """No host path outside the interpreter exists for the program: the canary socket and file, the
    project tree, /etc/passwd, the harness's home; the harness's home lists only the folders on the way
    to the interpreter (pyenv)."""
    sock_path, text_path, accepted = canary
    view = box.layers["minimal_root"]
    home = os.path.realpath(os.environ.get("HOME", "/root"))
    hidden = [sock_path, text_path, str(PROJECT / "README.md"), str(PROJECT / "pyproject.toml"), "/etc/passwd",
              "/etc/hostname", "/run", "/var", "/home", "/tmp/.X11-unix", os.path.join(home, ".cache"),
              os.path.join(home, ".netrc"), os.path.join(home, ".ssh"), sys.executable]
    hidden = [p for p in hidden if not any(p == f or p.startswith(f + "/") for f in view["folders"])]
    skip = ["/proc", *view["folders"], str(box._root)]
    check = LOOK_CHECK.format(paths=hidden, skip=skip, executable=view["executable"])
    connect = (f"import socket\ndef f():\n    s = socket.socket(socket.AF_UNIX)\n    s.connect({sock_path!r})\n"
               f"    return 1\n")
    look, reach = box.run([Program("", LOOK, check, "f"),
                           Program("", connect, "def check(candidate):\n    assert candidate() == 1\n", "f")])
    assert look.passed, look
    assert not reach.passed and accepted() == 0, reach


STDLIB = """import bisect, bz2, collections, datetime, decimal, fractions, functools, hashlib, heapq, itertools, json
import lzma, math, random, re, sqlite3, statistics, string, tempfile, typing, unicodedata, uuid, zlib
def f():
    db = sqlite3.connect(':memory:')
    db.execute('create table t (x)')
    db.execute('insert into t values (41)')
    with tempfile.TemporaryFile() as scratch:
        scratch.write(b'x')
    return [hashlib.md5(b'parrot').hexdigest()[:8], str(decimal.Decimal(1) / 8), json.dumps({'a': [1]}),
            re.sub('a+', 'b', 'caaat'), collections.Counter('abca').most_common(1)[0][0], math.comb(5, 2),
            zlib.decompress(zlib.compress(b'zz')).decode(), lzma.decompress(lzma.compress(b'l')).decode(),
            bz2.decompress(bz2.compress(b'b')).decode(), db.execute('select x + 1 from t').fetchone()[0],
            unicodedata.name('a'), str(fractions.Fraction(1, 3) * 3), statistics.median([3, 1, 2])]
"""
STDLIB_CHECK = """def check(candidate):
    assert candidate() == ['68238cd7', '0.125', '{"a": [1]}', 'cbt', 'a', 10, 'zz', 'l', 'b', 42,
                           'LATIN SMALL LETTER A', '1', 2]
"""


def test_the_standard_library_and_canonical_solutions_still_run(box):
    problems = load_problems()
    programs = [Program("", STDLIB, STDLIB_CHECK, "f")]
    programs += [Program(p["prompt"], p["canonical_solution"], p["test"], p["entry_point"]) for p in problems]
    results = box.run(programs)
    assert results[0].passed, results[0]
    failed = [(p["task_id"], r) for p, r in zip(problems, results[1:]) if not r.passed]
    assert not failed, failed[:3]


# A fresh interpreter (no audit hook: native code, as a crafted extension would run) creates one of each
# IPC object under `key`; it prints what it got (an id >= 0, or -errno).
NATIVE_IPC = r"""
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
key, name = int(sys.argv[1]), ("/codeparrot-" + sys.argv[1]).encode()
def call(fn, *args):
    value = fn(*args)
    return value if value >= 0 else -ctypes.get_errno()
IPC_CREAT = 0o1000
got = {"shm": call(libc.shmget, key, 4096, IPC_CREAT | 0o666), "msg": call(libc.msgget, key, IPC_CREAT | 0o666),
       "sem": call(libc.semget, key, 1, IPC_CREAT | 0o666),
       "mq": call(libc.mq_open, name, os.O_CREAT | os.O_RDWR, 0o600, None),
       "posix_shm": call(libc.shm_open, name, os.O_CREAT | os.O_RDWR, 0o600)}
print(repr(got))
"""


def _host_ipc_keys() -> set[int]:
    keys = set()
    for kind in ("shm", "msg", "sem"):
        with open(f"/proc/sysvipc/{kind}") as table:
            keys.update(int(line.split()[0]) for line in table.read().splitlines()[1:] if line.strip())
    return keys


def test_ipc_objects_a_program_creates_do_not_outlive_it():
    """SysV shared memory, message queues and semaphores and a POSIX message queue, asked for from native code
    inside the program (a spawned interpreter without audit hook), are refused by the syscall allowlist
    (ENOSYS) and in none of the host's tables after the run; POSIX shared memory (a file in /dev/shm) cannot
    be created either (no /dev/shm in the view)."""
    if not os.path.exists("/proc/sysvipc/shm"):
        pytest.skip("no SysV IPC in this kernel")
    box = _start(SandboxConfig(timeout=10.0, guard=False, allow_processes=True), workers=1)
    try:
        if not box.layers["ipc_namespace"]:
            pytest.skip(f"no IPC namespace: {box.layers['notes']}")
        key = int.from_bytes(os.urandom(3), "little") + 1
        spawn = (f"import subprocess, sys\nCODE = {NATIVE_IPC!r}\ndef f():\n"
                 f"    out = subprocess.run([sys.executable, '-c', CODE, '{key}'], capture_output=True, text=True)\n"
                 f"    return out.stdout + out.stderr\n")
        check = ("def check(candidate):\n    out = candidate()\n    got = eval(out)\n"
                 "    assert all(got[k] == -38 for k in ('shm', 'msg', 'sem', 'mq')), out\n    assert got['posix_shm'] < 0, out\n")
        result = box.run([Program("", spawn, check, "f")])[0]
    finally:
        box.close()
    assert result.passed, result  # each was refused inside the program
    name = f"codeparrot-{key}"
    deadline = time.monotonic() + 5  # an IPC namespace is freed asynchronously (a kernel work item)
    while key in _host_ipc_keys() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert key not in _host_ipc_keys()
    assert not os.path.exists(f"/dev/shm/{name}")
    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.mq_open(f"/{name}".encode(), os.O_RDONLY) == -1 and ctypes.get_errno() == 2  # ENOENT

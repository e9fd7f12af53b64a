"""Memory is bounded whatever its kind: a program that fills its tmpfs workspace, asks for SysV shared
memory (attach, touch, detach, repeat) from native code, fills a memfd or grows a bytearray never makes the
host hold more than `memory_mb` plus a small margin, measured from outside (the host's Shmem in
/proc/meminfo, sampled while it runs, and its cgroup's peak). And the kill paths of the worker signal only
processes it still owns (pidfds, or a group whose leader it has not reaped)."""

from __future__ import annotations

import ast
import errno
import threading
import time
from pathlib import Path

import pytest

from codeparrot.sandbox import Program, SandboxConfig, cgroup

MEMORY_MB, MARGIN_MB = 128, 48  # the margin: the interpreter's own pages and other agents' noise
CHECK = "def check(candidate):\n    got = candidate()\n    assert got == 'done', got\n"
ROUTES = {
    # 30 files x 15 MiB = 450 MiB of tmpfs pages (the workspace allows 512 MiB)
    "tmpfs workspace": "def f():\n    chunk = b'x' * (1 << 20)\n    for i in range(30):\n"
                       "        with open('f%d' % i, 'wb') as out:\n            for _ in range(15):\n"
                       "                out.write(chunk)\n    return 'done'\n",
    "memfd": "import os\ndef f():\n    fd = os.memfd_create('x')\n    for _ in range(450):\n"
             "        os.write(fd, b'x' * (1 << 20))\n    return 'done'\n",
    "bytearray": "def f():\n    held = []\n    for _ in range(450):\n        held.append(bytearray(1 << 20))\n"
                 "    return 'done'\n",
    # from a spawned interpreter without audit hook: 40 segments of 16 MiB, each attached, touched, detached
    "SysV shm loop": "import subprocess, sys\nCODE = '''\nimport ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
                     "libc.shmat.restype = ctypes.c_void_p\nfor _ in range(40):\n"
                     "    sid = libc.shmget(0, 16 << 20, 0o1000 | 0o600)\n    if sid < 0:\n"
                     "        raise SystemExit('shmget refused: errno %d' % ctypes.get_errno())\n"
                     "    addr = libc.shmat(sid, None, 0)\n    ctypes.memset(addr, 1, 16 << 20)\n    libc.shmdt(ctypes.c_void_p(addr))\n"
                     "print('done')\n'''\ndef f():\n"
                     "    out = subprocess.run([sys.executable, '-c', CODE], capture_output=True, text=True)\n"
                     "    return out.stdout.strip() or out.stderr.strip()[-80:]\n",
}


def _shmem_kib() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("Shmem:"):
                return int(line.split()[1])
    raise AssertionError("no Shmem line in /proc/meminfo")


def test_no_kind_of_memory_exceeds_memory_mb(start_box):
    config = SandboxConfig(timeout=10.0, memory_mb=MEMORY_MB, workspace_mb=512, file_mb=64, guard=False,
                           allow_processes=True)
    box = start_box(config)
    layers = box.layers
    try:
        if not layers.get("memory_cgroup"):
            pytest.skip("weaker mode (documented): no memory cgroup, the tmpfs workspace is bounded by "
                        f"workspace_mb only: {layers['notes']}")
        baseline, peak, done = _shmem_kib(), [0], threading.Event()

        def sample():
            while not done.is_set():
                peak[0] = max(peak[0], _shmem_kib() - baseline)
                time.sleep(0.005)

        sampler = threading.Thread(target=sample)
        sampler.start()
        try:
            results = dict(zip(ROUTES, box.run([Program("", code, CHECK, "f") for code in ROUTES.values()])))
        finally:
            done.set()
            sampler.join()
        group_peak = cgroup.peak_bytes(*box.memory_groups[0])
    finally:
        box.close()
    for name, result in results.items():
        assert not result.passed, (name, result)  # none got to hold its 450 MiB (or 640 MiB of segments)
    assert results["tmpfs workspace"].detail.startswith("memory limit"), results["tmpfs workspace"]
    assert "refused" in results["SysV shm loop"].detail, results["SysV shm loop"]
    assert peak[0] < (MEMORY_MB + MARGIN_MB) << 10, f"host Shmem grew by {peak[0] >> 10} MiB"
    assert group_peak <= MEMORY_MB << 20


def test_the_workspace_bounds_how_many_files_it_holds_not_only_their_bytes(start_box):
    """Empty files and folders take no tmpfs pages but about 1 KiB of kernel memory each (inode + dentry): a
    program making them for its whole time limit pinned up to ~150 MiB a second, which only a memory cgroup
    bounded. The workspace holds at most `workspace_mb` x 1024 of them (here 1 MiB: 1,024)."""
    box = start_box(SandboxConfig(timeout=5.0, workspace_mb=1))
    if not box.layers.get("workspace_tmpfs"):
        pytest.skip(f"no tmpfs workspace (no mount namespace): {box.layers['notes']}")
    code = ("import os\ndef f():\n    for i in range(5000):\n        try:\n            os.mkdir(str(i))\n"
            "        except OSError as err:\n            return i, err.errno\n    return 5000, 0\n")
    check = "def check(candidate):\n    raise RuntimeError(repr(candidate()))\n"
    result = box.run([Program("", code, check, "f")])[0]
    made, error = ast.literal_eval(result.detail.split("RuntimeError: ", 1)[1])
    assert made < 1024 and error == errno.ENOSPC, result


def test_the_worker_signals_only_processes_it_still_owns():
    """Every signal the worker sends goes through a pidfd, or to the process group of a child it has not
    reaped yet (in the watchdog, before waitpid), or as the private uid to everything that uid owns: never
    to a bare pid that may have been reaped and reused."""
    sandbox = Path(__file__).parents[2] / "codeparrot" / "sandbox"  # the worker: server.py and the files it runs
    tree = ast.Module([node for name in ("server.py", "zygote.py", "job.py", "cgroup.py")
                       for node in ast.parse((sandbox / name).read_text()).body], [])
    raw = {}
    for function in [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)]:
        for node in ast.walk(function):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                    node.func.attr in ("kill", "killpg") and getattr(node.func.value, "id", "") == "os":
                raw.setdefault(function.name, []).append(node.func.attr)
    assert raw == {"_kill_group": ["killpg"], "_sweep_uid": ["kill"], "killer": ["kill"]}, raw  # killer: in _sweep_uid
    watchdog = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "_watchdog")
    calls = [n for n in ast.walk(watchdog) if isinstance(n, ast.Call)]
    names = [getattr(c.func, "attr", getattr(c.func, "id", "")) for c in sorted(calls, key=lambda c: c.lineno)]
    assert names.index("_kill_group") < names.index("waitpid")  # the group's leader is still unreaped
    callers = [n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)
               and any(isinstance(c, ast.Call) and getattr(c.func, "id", "") == "_kill_group" for c in ast.walk(n))]
    assert callers == ["_watchdog"]

"""The execution sandbox: hostile programs are contained, the harness survives, verdicts cannot be faked.

Each hostile case runs under three configurations:
- "full": every layer the kernel offers + the audit-hook guard (the default);
- "os-only": the guard's containment rules off, so what is checked is the kernel's work (namespaces,
  private uid, rlimits); skipped where the kernel does not offer those layers;
- "guard-only": no namespaces, no private uid (what a machine without them gets): the guard alone.
  Cases that could hurt the machine if the guard failed there (kill(-1) as root) are not run in it, and its
  fork bomb is smaller.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from codeparrot.errors import CodeParrotError
from codeparrot.sandbox import Program, Sandbox, SandboxConfig
from codeparrot.sandbox.stale_roots import remove_stale_roots

CHECK_ONE = "def check(candidate):\n    assert candidate() == 1\n"
CONFIGS = {
    "full": SandboxConfig(timeout=1.5),
    "os-only": SandboxConfig(timeout=1.5, guard=False),
    "guard-only": SandboxConfig(timeout=1.5, namespaces=False, drop_privileges=False, allow_root=True),
}
ALLOWED = {"passed", "failed", "timed out", "killed"}


@pytest.fixture(scope="module", params=list(CONFIGS))
def sandbox(request):
    config = CONFIGS[request.param]
    box = Sandbox(config, num_workers=2)
    try:
        layers = box.start()
    except CodeParrotError as err:
        box.close()
        pytest.skip(f"{request.param}: {err}")
    if request.param == "os-only" and not (layers["uid"] is not None and layers["pid_namespace"]
                                           and layers["network_namespace"] and layers["readonly_root"]):
        box.close()
        pytest.skip(f"the kernel offers too few layers to test them without the guard: {layers}")
    box.kind = request.param
    yield box
    box.close()


def _sandbox_uids(box: Sandbox) -> set[int]:
    return set(range(box.uid_base, box.uid_base + box.num_workers)) if box.layers.get("uid") is not None else set()


def _processes_of(uids: set[int]) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.stat(f"/proc/{entry}").st_uid in uids:
                    found.append(int(entry))
            except OSError:
                pass
    return found


@pytest.fixture
def listener():
    """A TCP listener on 127.0.0.1 that records every connection it accepts."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    server.settimeout(0.05)
    accepted, stop = [], threading.Event()

    def loop():
        while not stop.is_set():
            try:
                accepted.append(server.accept()[0])
            except (socket.timeout, OSError):
                pass

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    yield server.getsockname()[1], accepted
    stop.set()
    thread.join()
    server.close()


@pytest.fixture
def bait():
    """A process of ours (same uid as the guard-only programs) holding a token in its real environment: the
    target for reading /proc/<pid>/environ and for signals. Returns (pid, token, is_alive)."""
    token = "hf_bait_token_" + os.urandom(6).hex()
    proc = subprocess.Popen(["sleep", "60"], env={"HF_TOKEN": token, "PATH": os.environ.get("PATH", "/usr/bin")})
    yield proc.pid, token, lambda: proc.poll() is None
    proc.kill()
    proc.wait()


def test_hostile_programs_are_contained(sandbox, tmp_path, listener, monkeypatch):
    port, accepted = listener
    keep = tmp_path / "keep.txt"
    keep.write_text("precious")
    keep.chmod(0o666)
    tmp_path.chmod(0o777)  # world-writable: only the sandbox, not file permissions, may stop the writes
    created = tmp_path / "created.txt"
    monkeypatch.setenv("HF_TOKEN", "hf_secret_token_123")
    private_uid = sandbox.layers["uid"] is not None  # then RLIMIT_NPROC bounds a fork bomb
    bomb_depth = 11 if private_uid else 4  # at most 2**depth processes, all asleep
    cases = {
        "infinite loop": "def f():\n    while True:\n        pass\n",
        "fork bomb": f"import os, time\ndef f():\n    for _ in range({bomb_depth}):\n        try:\n"
                     f"            os.fork()\n        except OSError:\n            pass\n    time.sleep(60)\n",
        "memory hog": "def f():\n    blocks = []\n    while True:\n        blocks.append(bytearray(64 << 20))\n",
        "huge allocation": "def f():\n    return len(bytearray(64 << 30))\n",
        "delete outside": f"import os\ndef f():\n    os.remove({str(keep)!r})\n    return 1\n",
        "overwrite outside": f"def f():\n    open({str(keep)!r}, 'w').write('gone')\n    return 1\n",
        "create outside (posix)": f"import posix\ndef f():\n"
                                  f"    posix.open({str(created)!r}, posix.O_WRONLY | posix.O_CREAT)\n    return 1\n",
        "network": f"import socket\ndef f():\n    socket.create_connection(('127.0.0.1', {port}), timeout=1).close()\n"
                   f"    return 1\n",
        "read env": "import os\ndef f():\n    return 1 if os.environ.get('HF_TOKEN') == 'hf_secret_token_123' else 0\n",
        "read /proc environ": "import os\ndef f():\n    for pid in os.listdir('/proc'):\n        try:\n"
                              "            if b'hf_secret_token_123' in open(f'/proc/{pid}/environ', 'rb').read():\n"
                              "                return 1\n        except Exception:\n            pass\n    return 0\n",
        "kill parent": "import os, signal\ndef f():\n    os.kill(os.getppid(), signal.SIGKILL)\n    return 0\n",
        "sys.exit before check": "import sys\nsys.exit(0)\ndef f():\n    return 1\n",
        "os._exit before check": "import os\nos._exit(0)\ndef f():\n    return 1\n",
        "forged report": "import sys, os\nsys.audit('codeparrot.report')\nos._exit(0)\ndef f():\n    return 1\n",
        "settrace skips asserts": "import sys\ndef f():\n    sys.settrace(lambda *a: None)\n    return 2\n",
    }
    if private_uid or sandbox.layers["pid_namespace"]:  # else a guard failure here would kill the machine
        cases["kill everything"] = "import os, signal\ndef f():\n    os.kill(-1, signal.SIGKILL)\n    return 0\n"
    start = time.monotonic()
    results = dict(zip(cases, sandbox.run([Program("", code, CHECK_ONE, "f") for code in cases.values()])))
    assert time.monotonic() - start < 30
    for name, result in results.items():
        assert result.status in ALLOWED and not result.passed, (name, result)
    assert results["infinite loop"].status == "timed out"
    assert results["memory hog"].status in {"killed", "timed out"}
    assert results["huge allocation"].status == "killed" and "memory" in results["huge allocation"].detail
    assert keep.read_text() == "precious" and not created.exists()
    assert accepted == []
    # Nothing outlives its program: no process of the sandbox uids remains (the fork bomb's included).
    deadline = time.monotonic() + 5
    while _processes_of(_sandbox_uids(sandbox)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _processes_of(_sandbox_uids(sandbox)) == []
    # The workers survived everything above: a normal program still runs, on both workers.
    after = sandbox.run([Program("", "def f():\n    return 1\n", CHECK_ONE, "f")] * 4)
    assert all(r.passed for r in after), after


def test_writes_the_guard_sees_no_path_for_never_land(sandbox, tmp_path):
    """Writes outside the workspace by calls whose audit event names no path (C functions that open files
    themselves: readline's history, POSIX shared memory and named semaphores in /dev/shm; chmod and utime
    of a descriptor opened for reading) leave the host's files as they were; in guard-only mode, where the
    guard is the last barrier (here as root), it refuses each of them."""
    tmp_path.chmod(0o777)
    keep = tmp_path / "keep.txt"
    keep.write_text("precious")
    keep.chmod(0o666)
    before = keep.stat()
    shm, sem = f"/codeparrot-test-{os.urandom(4).hex()}", f"/codeparrot-test-{os.urandom(4).hex()}"
    shm_files = [Path("/dev/shm" + shm), Path("/dev/shm/sem." + sem[1:])]
    module = "import os, sys\ndef load(name):\n    return sys.modules.get(name) or __import__(name)\ndef f():\n"
    cases = {
        "readline history": f"    rl = load('readline')\n    rl.add_history('gone')\n"
                            f"    rl.write_history_file({str(keep)!r})\n",
        "chmod of a descriptor": f"    os.chmod(os.open({str(keep)!r}, os.O_RDONLY), 0o4777)\n",
        "utime of a descriptor": f"    os.utime(os.open({str(keep)!r}, os.O_RDONLY), (0, 0))\n",
        "shm_open": f"    fd = load('_posixshmem').shm_open({shm!r}, os.O_CREAT | os.O_RDWR, 0o600)\n"
                    "    os.ftruncate(fd, 1 << 20)\n",
        "sem_open": f"    load('_multiprocessing').SemLock(1, 1, 1, {sem!r}, False)\n",
    }
    try:
        results = dict(zip(cases, sandbox.run([Program("", module + body + "    return 1\n", CHECK_ONE, "f")
                                               for body in cases.values()])))
        created = [str(p) for p in shm_files if p.exists()]
    finally:
        for path in shm_files:
            path.unlink(missing_ok=True)
    for name, result in results.items():
        assert result.status in ALLOWED and not result.passed, (name, result)
        if sandbox.kind == "guard-only":
            assert result.detail.startswith("sandbox refused"), (name, result)
    after = keep.stat()
    assert keep.read_text() == "precious" and (after.st_mode, after.st_mtime) == (before.st_mode, before.st_mtime)
    assert created == []


def test_symlinked_proc_paths_and_signals_to_other_processes_are_refused(sandbox, bait, tmp_path):
    """/proc reached through symlinks (/dev/fd -> /proc/self/fd) or an unseen dir_fd, writes escaping through
    /proc/self/cwd, and signals by pidfd (removed functions, rebuilt modules) or ctypes never reach another
    process; in guard-only mode the seccomp filter backs the guard."""
    pid, token, alive = bait
    tmp_path.chmod(0o777)
    escaped = tmp_path / "escaped.txt"
    leak = f"    return 1 if {token!r}.encode() in data else 0\n"
    cases = {
        "environ via /dev/fd/../..": f"def f():\n    data = open('/dev/fd/../../{pid}/environ', 'rb').read()\n" + leak,
        "environ via dir_fd": f"import os\ndef f():\n    d = os.open('/dev', os.O_RDONLY)\n"
                              f"    data = os.read(os.open('fd/../../{pid}/environ', os.O_RDONLY, dir_fd=d), 1 << 20)\n"
                              + leak,
        "list /proc via /dev/fd": "import os\ndef f():\n    return 1 if any(p.isdigit() for p in "
                                  "os.listdir('/dev/fd/../..')) else 0\n",
        "scan /proc": "import os\ndef f():\n    return 1 if any(e.name.isdigit() for e in os.scandir('/proc')) "
                      "else 0\n",
        "write via /proc/self/cwd": f"def f():\n    open('/dev/fd/../../self/cwd' + '/..' * 16 + {str(escaped)!r}, "
                                    f"'w').write('x')\n    return 1\n",
        "os.kill": f"import os\ndef f():\n    os.kill({pid}, 9)\n    return 1\n",
        "pidfd": f"import os, signal\ndef f():\n    signal.pidfd_send_signal(os.pidfd_open({pid}), 9)\n    return 1\n",
        "pidfd from rebuilt modules": "import _imp, importlib.machinery as m\ndef f():\n"
                                      "    posix = _imp.create_builtin(m.ModuleSpec('posix', None))\n"
                                      "    sig = _imp.create_builtin(m.ModuleSpec('_signal', None))\n"
                                      f"    sig.pidfd_send_signal(posix.pidfd_open({pid}), 9)\n    return 1\n",
        "ctypes kill": f"import ctypes\ndef f():\n    ctypes.CDLL(None).kill({pid}, 9)\n    return 1\n",
    }
    if sandbox.kind == "os-only":  # listing pids is the guard's rule; the kernel protects what is behind them
        del cases["list /proc via /dev/fd"], cases["scan /proc"]
    results = dict(zip(cases, sandbox.run([Program("", code, CHECK_ONE, "f") for code in cases.values()])))
    for name, result in results.items():
        assert result.status in ALLOWED and not result.passed, (name, result)
    assert alive() and not escaped.exists()
    if sandbox.kind != "os-only":  # the guard names what it refused, after resolving the path
        assert "refused open /proc/" in results["environ via /dev/fd/../.."].detail
        assert "refused os.listdir /proc" in results["list /proc via /dev/fd"].detail
    if sandbox.kind == "guard-only" and sandbox.layers["seccomp"]:  # the functions are back; the kernel says no
        assert "Function not implemented" in results["pidfd from rebuilt modules"].detail  # not on the allowlist


def test_program_lines_on_the_result_pipe_are_only_output(sandbox):
    """A program writing the sandbox's line formats (error, refusal, failure, pass) to any descriptor is only
    writing output: it fails or passes on its own merits and never turns into a sandbox error."""
    forge = ("import os\nfor fd in range(3, 6):\n    try:\n        os.write(fd, b'E boom\\nD fake refusal\\n"
             "F MemoryError\\nP ' + b'0' * 32 + b'\\n')\n    except OSError:\n        pass\n")
    cases = [Program("", forge + "def f():\n    return 2\n", CHECK_ONE, "f"),
             Program("", forge + "os._exit(0)\n", CHECK_ONE, "f"),
             Program("", forge + "def f():\n    return 1\n", CHECK_ONE, "f")]
    results = sandbox.run(cases)
    assert [r.status for r in results] == ["failed", "failed", "passed"], results
    assert results[0].detail.startswith("AssertionError")
    assert "ended before the check" in results[1].detail


def test_home_folders_are_hidden(sandbox, monkeypatch):
    """A token under the harness's $HOME is not readable by the program, while a file just as readable
    outside it is (the control); the interpreter keeps working wherever it lives."""
    base = Path(tempfile.mkdtemp(prefix="codeparrot-home-test-"))
    try:
        base.chmod(0o755)
        home = base / "home"
        (home / ".cache" / "huggingface").mkdir(parents=True)
        for folder in (home, home / ".cache", home / ".cache" / "huggingface"):
            folder.chmod(0o755)
        (home / ".cache" / "huggingface" / "token").write_text("hf_home_secret")
        (home / ".netrc").write_text("machine example.com password hf_home_secret")
        (base / "outside.txt").write_text("hf_home_secret")
        for f in (home / ".cache" / "huggingface" / "token", home / ".netrc", base / "outside.txt"):
            f.chmod(0o644)
        monkeypatch.setenv("HOME", str(home))
        probe = ("import json, decimal\ndef f(path):\n    try:\n        return open(path).read()\n"
                 "    except OSError as err:\n        return type(err).__name__\n")
        check = "def check(candidate):\n    raise RuntimeError(repr([candidate(p) for p in {paths!r}]))\n"
        paths = [str(home / ".cache" / "huggingface" / "token"), str(home / ".netrc"), str(base / "outside.txt")]
        with Sandbox(sandbox.config, num_workers=1) as box:
            layers = box.start()
            result = box.run([Program("", probe, check.format(paths=paths), "f")])[0]
        if not layers["mount_namespace"]:
            assert str(home) not in layers["hidden_homes"]
            pytest.skip("no mount namespace: home folders stay readable (documented)")
        assert str(home) in layers["hidden_homes"]
        token, netrc, outside = eval(result.detail.split("RuntimeError: ", 1)[1])
        assert token == netrc == "FileNotFoundError"
        # The control: readable through the host's read-only tree, absent from the minimal view.
        assert outside == ("FileNotFoundError" if layers["minimal_root"] else "hf_home_secret")
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_os_layers_refuse_what_the_guard_would(sandbox):
    """Without the guard the kernel answers: read-only filesystem, unreachable network, private uid."""
    if sandbox.kind != "os-only":
        pytest.skip("checks the kernel's layers alone")
    probe = ("import os, socket\ndef f():\n    errors = []\n"
             "    for action in (lambda: open('/etc/codeparrot-probe', 'w'),\n"
             "                   lambda: open('/tmp/codeparrot-sandbox-probe.txt', 'w'),\n"
             "                   lambda: socket.create_connection(('127.0.0.1', 9), timeout=1)):\n"
             "        try:\n            action()\n"
             "        except OSError as err:\n            errors.append(err.errno)\n"
             "    return errors, os.getuid()\n")
    check = "def check(candidate):\n    errors, uid = candidate()\n    raise RuntimeError(repr((errors, uid)))\n"
    result = sandbox.run([Program("", probe, check, "f")])[0]
    errors, uid = eval(result.detail.split("RuntimeError: ", 1)[1])
    import errno

    # socket(): refused by the syscall allowlist; without it, the empty network namespace answers
    network = errno.ENOSYS if sandbox.layers["program_seccomp"] else errno.ENETUNREACH
    assert errors == [errno.EROFS, errno.EROFS, network]
    assert uid == sandbox.layers["uid"] != 0


def test_builtins_and_helpers_patched_by_the_completion_do_not_fool_the_checker(sandbox):
    from codeparrot.humaneval.problems import load_problems

    find_zero = next(p for p in load_problems() if p["task_id"] == "HumanEval/32")
    cases = [
        # Shadow builtins at module level and in `builtins`, patch math and the prompt's helper `poly`.
        Program(find_zero["prompt"], "    return 12345.0\n\nimport builtins, math\nmath.fabs = lambda x: 0.0\n"
                                     "builtins.abs = lambda x: 0\nbuiltins.round = lambda x, n=0: 0\n"
                                     "def poly(xs, x):\n    return 0.0\n", find_zero["test"], "find_zero"),
        Program("", "import builtins\nbuiltins.isinstance = lambda *a: True\nbuiltins.abs = lambda x: 0\n"
                    "def f():\n    return 'wrong'\n",
                "def check(candidate):\n    assert isinstance(candidate(), int)\n    assert abs(candidate()) < 1\n",
                "f"),
        Program("", "def abs(x):\n    return 0\ndef len(x):\n    return 3\ndef f():\n    return -5\n",
                "def check(candidate):\n    assert abs(candidate()) < 1 and len([candidate()]) == 3\n", "f"),
        Program("", "class AssertionError(Exception):\n    pass\nimport builtins\nbuiltins.AssertionError = "
                    "Exception\ndef f():\n    return 2\n", CHECK_ONE, "f"),
        Program("", "import atexit, os\natexit.register(lambda: os._exit(0))\ndef f():\n    raise SystemExit(0)\n",
                CHECK_ONE, "f"),
        # A module the worker had loaded before the program ran (functools), patched to fake the product.
        Program("", "import functools\nfunctools.reduce = lambda *args: 24\ndef f():\n    return [1, 2, 3]\n",
                "import functools\ndef check(candidate):\n    assert functools.reduce(lambda a, b: a * b, candidate()) "
                "== 24\n", "f"),
    ]
    assert [r.passed for r in sandbox.run(cases)] == [False] * len(cases)
    # ...and the canonical solution still passes with the same machinery.
    canonical = Program(find_zero["prompt"], find_zero["canonical_solution"], find_zero["test"], "find_zero")
    assert sandbox.run([canonical])[0].passed


def test_verdict_channel_cannot_be_forged(sandbox):
    """Attempts to reach the guard's nonce or to report a pass from program code never pass."""
    steal = ("import sys\ndef steal(tb):\n    while tb:\n        for v in tb.tb_frame.f_locals.values():\n"
             "            if isinstance(v, bytes) and len(v) == 32:\n"
             "                import os; os.write(3, b'P ' + v + b'\\n'); os._exit(0)\n"
             "        tb = tb.tb_next\n")
    attempts = [
        steal + "try:\n    sys.audit('open', 1)\nexcept Exception as e:\n    steal(e.__traceback__)\n",
        steal + "class Evil(str):\n    def __hash__(self):\n        f = sys._getframe(1)\n        while f:\n"
                "            for v in f.f_locals.values():\n                if isinstance(v, bytes) and len(v) == 32:\n"
                "                    import os; os.write(3, b'P ' + v + b'\\n'); os._exit(0)\n"
                "            f = f.f_back\n        return 0\nsys.audit('import', Evil('x'), None, None, None, None)\n",
        "import gc\nfor o in gc.get_objects():\n    pass\n",
        "import types\ndef g():\n    pass\ntypes.FunctionType(g.__code__, {})()\n",
        "import os\nfor fd in range(3, 20):\n    try:\n        os.write(fd, b'P ' + b'0' * 32 + b'\\n')\n"
        "    except OSError:\n        pass\nos._exit(0)\n",
    ]
    results = sandbox.run([Program("", code + "def f():\n    return 2\n", CHECK_ONE, "f") for code in attempts])
    assert not any(r.passed for r in results), results


def test_legitimate_programs_work(sandbox):
    """Writing in the workspace, tempfile, threads, recursion and stdlib imports are allowed."""
    code = ("import tempfile, os, threading, json, collections, hashlib\n"
            "def f():\n    with open('scratch.txt', 'w') as fh:\n        fh.write('ok')\n"
            "    with tempfile.NamedTemporaryFile('w', delete=False) as t:\n        t.write('x')\n"
            "    th = threading.Thread(target=lambda: None)\n    th.start()\n    th.join()\n"
            "    return 1 if open('scratch.txt').read() == 'ok' and os.path.exists(t.name) else 0\n")
    assert sandbox.run([Program("", code, CHECK_ONE, "f")])[0].passed


def test_guard_hook_reads_no_global_names():
    """The guard and the post-program checker bind everything before the program runs: their code may
    only name attributes, never a global or builtin the program could have replaced."""
    import builtins

    from codeparrot.sandbox import child as sandbox_child
    from codeparrot.sandbox import guard as sandbox_guard
    module_names = set(vars(sandbox_child)) | set(vars(sandbox_guard)) | set(dir(builtins))
    nested = [c for c in sandbox_guard.install_guard.__code__.co_consts if hasattr(c, "co_names")]
    assert {c.co_name for c in nested} >= {"hook", "check", "exact", "deny", "absolute", "inside", "is_folder"}
    assert "resolve" in {c.co_name for c in nested}  # the path resolver too: os.lstat/readlink bound up front
    for code in [*nested, sandbox_child._after_program.__code__, sandbox_child._fail.__code__]:
        reads = {ins.argval for ins in __import__("dis").get_instructions(code)
                 if ins.opname in ("LOAD_GLOBAL", "LOAD_NAME")}
        assert not reads & module_names, (code.co_name, reads)


def test_unsandboxed_configurations_are_refused():
    """Root without the private uid, or no isolation at all without the guard, never runs a program."""
    if os.geteuid() != 0:
        pytest.skip("the root-specific refusal")
    with pytest.raises(CodeParrotError, match="run as root"):
        with Sandbox(SandboxConfig(namespaces=False, drop_privileges=False), num_workers=1) as box:
            box.start()
    with pytest.raises(CodeParrotError, match="unsandboxed"):
        with Sandbox(SandboxConfig(namespaces=False, drop_privileges=False, guard=False, allow_root=True),
                     num_workers=1) as box:
            box.start()


def test_a_killed_harness_leaves_no_sandbox_folder_behind(scripts_env):
    """A harness killed with SIGKILL cannot clean up; the next Sandbox removes its folder (unlocked), never
    the folder of a live one (locked)."""
    code = ("import time\nfrom codeparrot.sandbox import Sandbox\nbox = Sandbox(num_workers=1)\nbox.start()\n"
            "print(box._root, flush=True)\ntime.sleep(60)\n")
    harness = subprocess.Popen([sys.executable, "-c", code], env=scripts_env, stdout=subprocess.PIPE, text=True)
    try:
        dead_root = Path(harness.stdout.readline().strip())
    finally:
        harness.send_signal(signal.SIGKILL)
        harness.wait()
        harness.stdout.close()
    assert dead_root.is_dir() and dead_root.name.startswith(f"codeparrot-sandbox-{harness.pid}-")
    with Sandbox(num_workers=1) as live:
        old = time.time() - 3600  # both look old: only the lock tells them apart
        for root in (dead_root, live._root):
            os.utime(root, (old, old))
        removed = remove_stale_roots(str(dead_root.parent))
        assert dead_root in removed and not dead_root.exists()
        assert live._root.is_dir() and live._root not in removed

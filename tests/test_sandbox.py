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
import socket
import sys
import threading
import time
from pathlib import Path

import pytest

from codeparrot.errors import CodeParrotError
from codeparrot.sandbox import Program, Sandbox, SandboxConfig

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

    assert errors == [errno.EROFS, errno.EROFS, errno.ENETUNREACH]
    assert uid == sandbox.layers["uid"] != 0


def test_builtins_and_helpers_patched_by_the_completion_do_not_fool_the_checker(sandbox):
    from codeparrot.humaneval import load_problems

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

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "codeparrot"))
    try:
        import sandbox_child
    finally:
        sys.path.pop(0)
    module_names = set(vars(sandbox_child)) | set(dir(builtins))
    nested = [c for c in sandbox_child.install_guard.__code__.co_consts if hasattr(c, "co_names")]
    assert {c.co_name for c in nested} >= {"hook", "check", "exact", "deny", "absolute", "inside"}
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

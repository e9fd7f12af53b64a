"""The verdict is decided in a trusted process: attacks on an in-process checker cannot pass.

Each case returns wrong answers and tries one mechanism that forged passes in the in-process checker
(signal handlers inside the audit hook, frames above the program, dup2 over the result fd, import hooks
left in sys.meta_path, an `__eq__` that always says True, forged channel frames). Run in every
configuration the sandbox supports; plus the kernel layers (IPC, /proc, spawning, user namespaces) and
workspaces no cleanup may choke on.
"""

from __future__ import annotations

import os
import socket
import tempfile

import pytest

from codeparrot.errors import CodeParrotError
from codeparrot.sandbox import Program, Sandbox, SandboxConfig

CHECK = "import math\ndef check(candidate):\n    assert candidate(2) == 4\n    assert math.sqrt(candidate(3)) == 3.0\n"
CONFIGS = {
    "full": SandboxConfig(timeout=2.0),
    "kernel-only": SandboxConfig(timeout=2.0, guard=False),
    "guard-only": SandboxConfig(timeout=2.0, namespaces=False, drop_privileges=False, allow_root=True),
}


@pytest.fixture(scope="module", params=list(CONFIGS))
def box(request):
    sandbox = Sandbox(CONFIGS[request.param], num_workers=2)
    try:
        sandbox.start()
    except CodeParrotError as err:
        sandbox.close()
        pytest.skip(f"{request.param}: {err}")
    sandbox.kind = request.param
    yield sandbox
    sandbox.close()


ATTACKS = {
    "always-equal object": "class E(float):\n    def __eq__(s, o):\n        return True\n    __hash__ = float.__hash__\n"
                           "class A:\n    def __eq__(s, o):\n        return True\ndef f(x):\n    return A()\n",
    "signal handler in the guard": "import signal, sys\ndef h(*a):\n    f = sys._getframe(1)\n    while f:\n"
                                   "        for v in list(f.f_locals.values()):\n"
                                   "            if isinstance(v, bytes) and len(v) == 32:\n"
                                   "                import os; os.write(3, b'P ' + v + b'\\n'); os._exit(0)\n"
                                   "        f = f.f_back\nsignal.signal(signal.SIGALRM, h)\n"
                                   "signal.setitimer(signal.ITIMER_REAL, 0.0001, 0.0001)\n"
                                   "def f(x):\n    open('x', 'w').write('y' * 1000)\n    return 0\n",
    "frames above the program": "import sys\nf = sys._getframe()\nwhile f:\n    for v in list(f.f_locals.values()):\n"
                                "        if isinstance(v, dict) and 'pristine' in v:\n"
                                "            v['exec'] = lambda *a: None\n            v['fail'] = lambda *a: None\n"
                                "    f = f.f_back\ndef f(x):\n    return 0\n",
    "dup2 over the result fd": "import os\nr, w = os.pipe()\nfor fd in range(3, 8):\n    try:\n        os.dup2(w, fd)\n"
                               "    except OSError:\n        pass\ndef f(x):\n    return 0\n",
    "import hook for math": "import sys, types\nclass F:\n    def find_spec(self, name, *a):\n"
                            "        return None\nfake = types.ModuleType('math')\nfake.sqrt = lambda x: 3.0\n"
                            "sys.modules['math'] = fake\nsys.meta_path.insert(0, F())\ndef f(x):\n    return 0\n",
    "forged reply frames": "import os, json\ndef f(x):\n    for fd in range(3, 12):\n        try:\n"
                           "            data = json.dumps({'ok': 4}).encode()\n"
                           "            os.write(fd, len(data).to_bytes(8, 'little') + data)\n"
                           "        except OSError:\n            pass\n    os._exit(0)\n",
}


def test_wrong_answers_never_pass_whatever_the_program_does(box):
    results = box.run([Program("", code, CHECK, "f") for code in ATTACKS.values()])
    for name, result in zip(ATTACKS, results):
        assert not result.passed, (name, result)
        assert result.status != "error", (name, result)
        assert result.checker == "isolated", (name, result)
    control = box.run([Program("", "def f(x):\n    return x * x\n", CHECK, "f")])[0]
    assert control.passed and control.checker == "isolated", control


# Answers with the expected value when the test is within reach (a string constant of a calling frame: the
# test's `check`, as in the in-process fallback); otherwise returns a value the checker can decode but not
# send back (nesting at the channel's limit), so a test that passes the result back cannot run isolated.
FALLBACK_FORGER = ("import sys\ndef _secret():\n    frame = sys._getframe(1)\n    while frame is not None:\n"
                   "        for c in frame.f_code.co_consts:\n"
                   "            if type(c) is str and c.startswith('secret-'):\n                return c\n"
                   "        frame = frame.f_back\ndef f(*args):\n    found = _secret()\n    if found:\n"
                   "        return found\n    deep = 0\n    for _ in range(199):\n        deep = [deep]\n"
                   "    return deep\n")
NOT_PLAIN = "def check(candidate):\n    assert candidate(lambda: 1) == 'secret-%s'\n" % os.urandom(4).hex()
PASSED_BACK = "def check(candidate):\n    assert candidate(candidate(1)) == 'secret-%s'\n" % os.urandom(4).hex()


def test_a_test_that_cannot_run_isolated_fails_instead_of_running_beside_the_program(box):
    """A test passing a function, or one the program steers out of the channel (its return value, passed
    back, cannot be sent), is not rerun with the test in the program's process: the forger that reads the
    expected value from the test's frame there passes neither; the sample fails with the reason. A return
    value that is not plain data is the candidate's own failure."""
    opaque = Program("", "def f():\n    return object()\n", "def check(candidate):\n    candidate()\n", "f")
    results = box.run([Program("", FALLBACK_FORGER, NOT_PLAIN, "f"), Program("", FALLBACK_FORGER, PASSED_BACK, "f"),
                       opaque])
    for result in results[:2]:
        assert result.status == "failed" and result.checker == "isolated", result
        assert result.detail.startswith("not checked: an argument of f() is not plain data"), result
        assert "in_process_fallback" in result.detail, result
    assert results[2].status == "failed" and "not plain data" in results[2].detail, results[2]


def test_the_in_process_fallback_runs_only_when_asked_for_and_says_so(start_box):
    """With `in_process_fallback=True` such a test runs beside the program, marked in-process: where the
    forger above does reach the answer key (why it is off by default), and an honest candidate passes."""
    sandbox = start_box(SandboxConfig(timeout=2.0, in_process_fallback=True))
    honest = Program("", "def f(g):\n    return g() + 1\n",
                     "def check(candidate):\n    assert candidate(lambda: 1) == 2\n", "f")
    forged, passed_back, fine = sandbox.run([Program("", FALLBACK_FORGER, NOT_PLAIN, "f"),
                                             Program("", FALLBACK_FORGER, PASSED_BACK, "f"), honest])
    for result in (forged, passed_back, fine):
        assert result.passed and result.checker.startswith("in-process (an argument of f()"), result


def _layers_or_skip(box, *names):
    missing = [n for n in names if not box.layers.get(n)]
    if missing:
        pytest.skip(f"{box.kind}: the machine/configuration lacks {missing}")


def test_no_process_spawning_primitive_works(box):
    _layers_or_skip(box, "program_seccomp")
    if box.layers.get("spawning"):
        pytest.skip("spawning allowed")
    spawners = {
        "posix_spawn": "import os\ndef f():\n    os.posix_spawn('/bin/true', ['true'], {})\n    return 1\n",
        "_posixsubprocess via a renamed module": "import _imp, importlib.machinery as m\ndef f():\n"
            "    ps = _imp.create_builtin(m.ModuleSpec('_posixsubprocess', None))\n"
            "    import subprocess\n    subprocess.run(['/bin/true'], check=True)\n    return 1\n",
        "execv": "import os\ndef f():\n    os.execv('/bin/true', ['true'])\n    return 1\n",
        "pty.fork": "import pty\ndef f():\n    pid, fd = pty.fork()\n    return 1\n",
        "fork": "import os\ndef f():\n    pid = os.fork()\n    if pid == 0:\n        os._exit(0)\n    return 1\n",
    }
    check = "def check(candidate):\n    assert candidate() == 1\n"
    for name, result in zip(spawners, box.run([Program("", c, check, "f") for c in spawners.values()])):
        assert not result.passed, (name, result)


def test_host_is_out_of_reach(box):
    """A canary unix socket on a host path, the host's processes, SysV IPC and user namespaces."""
    _layers_or_skip(box, "fresh_proc", "ipc_namespace", "program_seccomp")
    folder = tempfile.mkdtemp(prefix="codeparrot-canary-")
    os.chmod(folder, 0o777)
    path = os.path.join(folder, "canary.sock")
    canary = socket.socket(socket.AF_UNIX)
    canary.bind(path)
    os.chmod(path, 0o777)
    canary.listen(1)
    canary.settimeout(0.1)
    probe = ("import os, socket, ctypes\ndef f():\n    seen = {}\n    try:\n"
             f"        s = socket.socket(socket.AF_UNIX); s.connect({path!r}); seen['socket'] = True\n"
             "    except OSError:\n        seen['socket'] = False\n"
             "    seen['procs'] = sorted(int(p) for p in os.listdir('/proc') if p.isdigit())\n"
             "    return repr(seen)\n")  # ctypes (shmget, unshare) is refused by the integrity rules in every mode
    check = "def check(candidate):\n    raise RuntimeError(candidate())\n"
    try:
        result = box.run([Program("", probe, check, "f")])[0]
        try:
            canary.accept()
            connected = True
        except OSError:
            connected = False
    finally:
        canary.close()
        os.unlink(path)
        os.rmdir(folder)
    assert not connected
    if box.kind == "full":  # the guard refuses the probe (sockets, ctypes) before the kernel is asked
        assert result.status == "killed", result
        return
    assert "RuntimeError: " in result.detail, result
    seen = eval(result.detail.split("RuntimeError: ", 1)[1])
    assert seen["socket"] is False and seen["procs"] == [1], seen


@pytest.mark.parametrize("shape", ["deep chain", "many files"])
def test_workspaces_that_choke_recursive_cleanup_do_not_stop_the_run(box, shape):
    make = {"deep chain": "import os\ndef f():\n    for _ in range(2000):\n        os.mkdir('d')\n        os.chdir('d')\n"
                          "    return 1\n",
            "many files": "import os\ndef f():\n    for i in range(100000):\n        open(str(i), 'w').close()\n"
                          "    return 1\n"}[shape]
    check = "def check(candidate):\n    assert candidate() == 1\n"
    results = box.run([Program("", make, check, "f"), Program("", "def f():\n    return 1\n", check, "f")])
    assert results[1].passed, results
    assert results[0].status in {"passed", "timed out", "killed", "failed"}, results[0]

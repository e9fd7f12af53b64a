"""What each process may touch of its own and of others: the program's memory files in /proc are not its
own in any mode (user-namespace mode included), and the harness never signals a worker it has already
reaped.

Both run in a child interpreter set up for the case: a user namespace in which the harness is not root
(what an unprivileged user gets), and a PID namespace of its own where pid numbers can be steered, so a
reaped worker's pid is given to an unrelated process before the harness reacts.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from .program_preludes import AS_UNPRIVILEGED

# The program (guard off: what the kernel allows, as for code past the audit hook) looks at what a
# dumpable process owns: its /proc/self/mem (writes there ignore page protections: a way to native code
# without any executable mmap; the guard refuses that name, the kernel must too) and /proc/self/auxv, which
# the kernel opens by the same rule (owner only, memory access checked) under a name no guard looks for.
DUMPABLE_PROBE = r'''
import os
def f():
    got = {"mem owned by the program": os.stat("/proc/self/mem").st_uid == os.getuid()}
    try:
        with open("/proc/self/auxv", "rb") as auxv:
            got["auxv opened"] = len(auxv.read()) > 0
    except PermissionError:
        got["auxv opened"] = "refused"
    return repr(got)
'''

USER_NAMESPACE_RUN = AS_UNPRIVILEGED + r'''
from codeparrot.humaneval.problems import load_problems
from codeparrot.sandbox import Program, Sandbox, SandboxConfig
probe = sys.stdin.read()
with Sandbox(SandboxConfig(timeout=5.0, guard=False), num_workers=2) as box:
    layers = box.start()
    if not layers["user_namespace"]:
        print(json.dumps({"skip": "the sandbox did not take user-namespace mode: %s" % layers["notes"]})); sys.exit()
    probed = box.run([Program("", probe, "def check(candidate):\n    raise RuntimeError(candidate())\n", "f")])[0]
    problems = load_problems()
    canonical = box.run([Program(p["prompt"], p["canonical_solution"], p["test"], p["entry_point"]) for p in problems])
print(json.dumps({"probe": probed.detail, "canonical": [[r.status, r.checker, r.detail] for r in canonical]}))
'''


def _run(script: str, stdin: str = "") -> dict:
    out = subprocess.run([sys.executable, "-c", script], input=stdin, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    reply = json.loads(out.stdout.strip().splitlines()[-1])
    if "skip" in reply:
        pytest.skip(reply["skip"])
    return reply


def test_a_program_in_user_namespace_mode_does_not_own_its_proc_entries():
    """In user-namespace mode the program keeps the harness's uid; made non-dumpable before its code runs,
    its /proc/self/mem and the other memory files belong to root: not openable by it (before: its own). The
    164 canonical solutions still pass there, each checked isolated."""
    reply = _run(USER_NAMESPACE_RUN, DUMPABLE_PROBE)
    assert reply["probe"].startswith("RuntimeError: "), reply["probe"]
    got = eval(reply["probe"][len("RuntimeError: "):])
    assert got == {"mem owned by the program": False, "auxv opened": "refused"}, got
    failed = [r for r in reply["canonical"] if r[:2] != ["passed", "isolated"]]
    assert len(reply["canonical"]) == 164 and not failed, failed[:3]


# In a PID namespace of our own (we are its init, nothing else allocates pids there): start a worker, let it
# die and be reaped the way the harness's read reaps it (poll() after EOF), give its pid to an unrelated
# process leading its own session (so its group id is that pid too), then let the harness kill the worker.
REUSED_PID_RUN = r'''
import ctypes, json, os, signal, subprocess, sys, time
libc = ctypes.CDLL(None, use_errno=True)
if libc.unshare(0x20000000) != 0:
    print(json.dumps({"skip": "no PID namespace: " + os.strerror(ctypes.get_errno())})); sys.exit()
child = os.fork()
if child:
    sys.exit(os.waitstatus_to_exitcode(os.waitpid(child, 0)[1]))
from codeparrot.sandbox import Sandbox, SandboxConfig
box = Sandbox(SandboxConfig(timeout=2.0), num_workers=1)
box.start()
server = box._servers[0]
worker = server.proc.pid
os.kill(worker, signal.SIGKILL)
while server.proc.poll() is None:  # what _read does on EOF: the worker is reaped here
    time.sleep(0.01)
deadline = time.monotonic() + 5
while time.monotonic() < deadline:  # its zygote dies with it (PDEATHSIG); as init we reap it: the group is gone
    try:
        if os.waitpid(-1, os.WNOHANG)[0] == 0:
            time.sleep(0.05)
    except ChildProcessError:
        break
with open("/proc/sys/kernel/ns_last_pid", "w") as f:
    f.write(str(worker - 1))
victim = subprocess.Popen(["sleep", "60"], start_new_session=True)
if victim.pid != worker:
    victim.kill()
    print(json.dumps({"skip": "could not give pid %d to another process (got %d)" % (worker, victim.pid)})); sys.exit()
server.kill()
time.sleep(0.2)
alive = victim.poll() is None
victim.kill()
victim.wait()
box.close()
print(json.dumps({"victim alive": alive, "victim pgid was the worker's pid": True}))
'''


def test_killing_a_reaped_worker_signals_nobody_else():
    """A worker that died and was reaped by poll() is not signalled: its pid, given to an unrelated
    process group leader meanwhile, is not killpg'd (before: the unrelated process was SIGKILLed)."""
    if os.geteuid() != 0:
        pytest.skip("steering pid numbers (a PID namespace, ns_last_pid) needs root")
    reply = _run(REUSED_PID_RUN)
    assert reply["victim alive"], reply

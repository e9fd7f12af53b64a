"""Samples that run at the same time cannot teach each other the answers (issue 29, attacks 1 and 2).

The attack, rebuilt from its description: samples of one boolean-output HumanEval task, each a different
completion that computes nothing, run side by side. Each answers the checker's calls one by one, counting
them. Before answering call i it looks, on byte ranges of a file every worker sees (the standard library's
`os.py`, bound read-only into each view), for record locks other samples hold: "the answer to call i is
v" (someone was called again after answering v: the checker accepted it), or "someone is trying v at call
i" (then it tries the other value at the same time; a tryer that vanishes without confirming was ended by
its wrong answer, so the other value is right). The last call cannot be confirmed that way, so it is
guessed (by sample parity). Before this issue's fixes the checker stopped at the first wrong answer and the
program was ended (the oracle) and the locks crossed workers (the channel): with 2 workers about half the
samples passed. Now every call runs whatever the answers and no lock can be taken: nothing passes.
"""

from __future__ import annotations

import os

import pytest

from codeparrot.humaneval.problems import load_problems
from codeparrot.sandbox import Program, SandboxConfig

TASKS = ("HumanEval/3", "HumanEval/52", "HumanEval/154")  # boolean results only, 6 calls each
SAMPLES = 16

ATTACKER = r'''
import fcntl, os, struct, time
_NONCE, _SAMPLE, _CALLS = {nonce}, {sample}, {calls}
_state = {{"i": 0, "pending": None, "fd": None}}
def _fd():
    if _state["fd"] is None:
        _state["fd"] = os.open(os.__file__, os.O_RDONLY)
    return _state["fd"]
def _off(i, kind, v):  # kind 0: "the answer to call i is v" (confirmed); 1: "someone is trying v"
    return _NONCE * 64 + 4 * i + 2 * kind + v
def _held(off):  # does another process hold a lock on this byte?
    try:
        got = fcntl.fcntl(_fd(), fcntl.F_GETLK, struct.pack("hhqqi4x", fcntl.F_WRLCK, 0, off, 1, 0))
        return struct.unpack("hhqqi4x", got)[0] != fcntl.F_UNLCK
    except OSError:
        return False
def _take(off):
    try:
        fcntl.lockf(_fd(), fcntl.LOCK_SH | fcntl.LOCK_NB, 1, off)
        return True
    except OSError:
        return False
def _drop(off):
    try:
        fcntl.lockf(_fd(), fcntl.LOCK_UN, 1, off)
    except OSError:
        pass
def _wait(condition, seconds):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not condition():
        time.sleep(0.0005)
def _answer(i):
    pending = _state["pending"]
    if pending is not None:  # called again: the previous guess was accepted
        _take(_off(pending[0], 0, pending[1]))
        _drop(_off(pending[0], 1, pending[1]))
        _state["pending"] = None
    for v in (0, 1):
        if _held(_off(i, 0, v)):
            _take(_off(i, 0, v))
            return v
    tried = [v for v in (0, 1) if _held(_off(i, 1, v))]
    guess = 1 - tried[0] if len(tried) == 1 else (_SAMPLE >> i) & 1
    if not _take(_off(i, 1, guess)):
        return guess  # no locks here: nothing to learn from, nobody to teach
    other = _off(i, 1, 1 - guess)
    if i < _CALLS - 1:
        if not tried:  # wait for a partner to try the other value: one of us will be confirmed
            _wait(lambda: _held(other), 0.2)
        _state["pending"] = (i, guess)
        return guess
    # The last call is never confirmed: keep the knowledge alive (our locks) until the next sample has
    # learned it and tries the other value here, then answer.
    if tried:
        _wait(lambda: not _held(other), 1.5)
    _wait(lambda: _held(other), 1.5)
    return guess
def {entry_point}(*args, **kwargs):
    i = _state["i"]
    _state["i"] = i + 1
    return bool(_answer(i))
'''


def attack_programs(nonce: int) -> list[Program]:
    """SAMPLES attacking samples of each task in TASKS, the samples of one task next to each other (as in a
    samples file)."""
    programs = []
    for task in (p for p in load_problems() if p["task_id"] in TASKS):
        calls = task["test"].count("candidate(")
        for sample in range(SAMPLES):
            completion = "    pass\n" + ATTACKER.format(nonce=nonce, sample=sample, calls=calls,
                                                       entry_point=task["entry_point"])
            programs.append(Program(task["prompt"], completion, task["test"], task["entry_point"]))
    return programs


@pytest.mark.parametrize("workers", [1, 2, 4])
def test_concurrent_samples_forge_no_pass(start_box, default_box, workers):
    box = default_box if workers == 2 else start_box(SandboxConfig(timeout=3.0), workers=workers)
    nonce = int.from_bytes(os.urandom(3), "little")  # our own lock ranges: other test runs may attack too
    results = box.run(attack_programs(nonce))
    passed = [i for i, r in enumerate(results) if r.passed]
    assert passed == [], f"{len(passed)} of {len(results)} forged passes with {workers} workers"
    assert all(r.status == "failed" for r in results), {r.status for r in results}


# The sender takes every kind of lock on files every worker's view holds (the standard library, the
# interpreter, a device node), the receiver looks for them, while both run side by side on two workers (the
# host-wide /proc files that list locks or count threads: test_allowlist.py).
SENDER = r'''
import fcntl, os, struct, sys, time
def f(nonce):
    took = []
    for path in (os.__file__, sys.executable, "/dev/null"):
        fd = os.open(path, os.O_RDONLY)
        for name, take in (("lockf", lambda: fcntl.lockf(fd, fcntl.LOCK_SH | fcntl.LOCK_NB, 1, nonce)),
                           ("ofd", lambda: fcntl.fcntl(fd, fcntl.F_OFD_SETLK,
                                                       struct.pack("hhqqi4x", fcntl.F_RDLCK, 0, nonce + 1, 1, 0))),
                           ("flock", lambda: fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB))):
            try:
                take()
                took.append(name)
            except OSError:
                pass
    time.sleep(1.5)
    return took
'''
RECEIVER = r'''
import fcntl, os, struct, sys, time
def f(nonce):
    time.sleep(0.5)
    seen = []
    for path in (os.__file__, sys.executable, "/dev/null"):
        fd = os.open(path, os.O_RDONLY)
        for start in (nonce, nonce + 1):
            try:
                got = fcntl.fcntl(fd, fcntl.F_GETLK, struct.pack("hhqqi4x", fcntl.F_WRLCK, 0, start, 1, 0))
                if struct.unpack("hhqqi4x", got)[0] != fcntl.F_UNLCK:
                    seen.append(("record lock", path, start))
            except OSError:
                pass
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            seen.append(("flock", path))
        except OSError:
            pass
    return seen
'''


def test_two_programs_running_side_by_side_exchange_nothing(default_box):
    box = default_box
    nonce = int.from_bytes(os.urandom(3), "little") * 64
    check = "def check(candidate):\n    raise RuntimeError(repr(candidate(%d)))\n" % nonce
    sender, receiver = box.run([Program("", SENDER, check, "f"), Program("", RECEIVER, check, "f")])
    assert sender.detail == "RuntimeError: []", sender  # no lock of any kind could be taken
    assert receiver.detail == "RuntimeError: []", receiver  # and none was seen

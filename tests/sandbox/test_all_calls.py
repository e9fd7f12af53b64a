"""The call sequence is not an oracle (issue 29, attack 1): every call of the test runs whatever the answers,
so a program answering right and one answering wrong (or raising) see the same calls, then the same end.

Before: the checker stopped at the first failing assertion and the program was ended, so being called again
meant "your last answer was accepted"; and six HumanEval tests (77, 78, 95, 97, 117, 148) call the
candidate again in an assertion's message, only when the answer is wrong.
"""

from __future__ import annotations

import ast
import importlib
import random
import sys
import threading
from pathlib import Path

import pytest

from codeparrot.humaneval.problems import load_problems
from codeparrot.sandbox import Program

SANDBOX = Path(__file__).resolve().parents[2] / "codeparrot" / "sandbox"


@pytest.fixture(scope="module")
def worker_modules():
    """checker.py and rewrite.py as the worker loads them (plain names, the sandbox folder on sys.path)."""
    sys.path.insert(0, str(SANDBOX))
    try:
        yield importlib.import_module("checker"), importlib.import_module("rewrite"), importlib.import_module("channel")
    finally:
        sys.path.remove(str(SANDBOX))
        for name in ("checker", "rewrite", "channel"):
            sys.modules.pop(name, None)


def _serve(channel, function, call_r, reply_w, seen):
    """The program's side of the call loop (like child.serve_candidate), recording each call's arguments."""
    import os

    channel.send(reply_w, b'"ready"')
    while True:
        frame = channel.receive(call_r)
        if frame is None:
            seen.append("EOF")
            os.close(reply_w)
            return
        args, kwargs = channel.decode(channel.loads(frame))
        seen.append(repr((args, kwargs)))
        try:
            reply = {"ok": channel.encode(function(*args, **kwargs), exact=False)}
        except Exception as err:  # noqa: BLE001 - the candidate's exception, by name
            reply = {"raise": [type(err).__name__, str(err)]}
        channel.send(reply_w, channel.dumps(reply))


def _check(modules, problem, function, test_code) -> tuple[str, list]:
    """The checker's verdict letter for `function` as the candidate, and the calls the candidate saw."""
    import os

    checker, _rewrite, channel = modules
    call_r, call_w = os.pipe()
    reply_r, reply_w = os.pipe()
    seen = []
    server = threading.Thread(target=_serve, args=(channel, function, call_r, reply_w, seen))
    server.start()
    random.seed(0)  # tests that draw random inputs draw the same ones for every candidate
    job = {"prompt": problem["prompt"], "entry_point": problem["entry_point"]}
    letter, _detail = checker.check(job, call_w, reply_r, test_code)  # hangs up (closes call_w) at the end
    server.join()
    for fd in (call_r, reply_r):
        os.close(fd)
    return letter, seen


def _mutated(value):
    """A wrong answer of the right answer's type (so the test's own expressions go the same way)."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, (int, float)):
        return value + 1
    if isinstance(value, str):
        return value + "x"
    if isinstance(value, (list, tuple)):
        return type(value)([*value, 0])
    if isinstance(value, dict):
        return {**value, "x": 0}
    return 0 if value is None else None


def _raising(*args, **kwargs):
    raise ValueError("no")


def _calls_per_statement(problem) -> int:
    """The most candidate calls one statement of the test makes (the entry point's name calls it too)."""
    names = {"candidate", problem["entry_point"]}
    return max((sum(isinstance(n, ast.Call) and getattr(n.func, "id", "") in names for n in ast.walk(stmt))
                for stmt in ast.walk(ast.parse(problem["test"])) if isinstance(stmt, ast.Assert)), default=0)


def test_right_wrong_and_raising_candidates_see_the_same_calls(worker_modules):
    """On all 164 HumanEval tests: the canonical solution passes and a wrong one (each answer changed, its
    type kept) fails, having received exactly the same calls, then end of input. A candidate that raises at
    every call fails too and is still called by every statement: the same calls where a statement calls it
    once (where a statement calls it twice, the second call falls with the first's exception, which the
    program itself raised)."""
    rewrite = worker_modules[1]
    for problem in load_problems():
        namespace = {}
        exec(problem["prompt"] + problem["canonical_solution"], namespace)
        solution, test_code = namespace[problem["entry_point"]], rewrite.record_all(problem["test"])
        right, right_calls = _check(worker_modules, problem, solution, test_code)
        assert right == "P", problem["task_id"]
        assert right_calls[-1] == "EOF" and len(right_calls) > 1, problem["task_id"]
        letter, calls = _check(worker_modules, problem, lambda *a, **k: _mutated(solution(*a, **k)), test_code)
        assert letter == "F" and calls == right_calls, (problem["task_id"], letter, len(calls), len(right_calls))
        letter, calls = _check(worker_modules, problem, _raising, test_code)
        assert letter == "F", problem["task_id"]
        if _calls_per_statement(problem) == 1:
            assert calls == right_calls, (problem["task_id"], len(calls), len(right_calls))
        else:
            remaining = iter(right_calls)
            assert all(call in remaining for call in calls), problem["task_id"]  # a subsequence


def test_answer_dependent_calls_are_named(worker_modules):
    """What the rewriting cannot make answer-independent is named; HumanEval's tests have none of it (its
    messages that call the candidate are never evaluated, so they need no name)."""
    _checker, rewrite, _channel = worker_modules
    assert [p["task_id"] for p in load_problems() if rewrite.answer_dependent(p["test"])] == []
    test = ("def check(candidate):\n    first = candidate(1)\n    if first:\n        assert candidate(2)\n"
            "    assert candidate(3) == 3 or candidate(4) == 4\n    assert all(candidate(x) for x in range(3))\n"
            "    try:\n        assert candidate(5)\n    except AssertionError:\n        pass\n")
    assert rewrite.answer_dependent(test) == [
        "line 3: if on an answer", "line 7: assertion inside a try/with block (raises, skipping the rest of the block)",
        "line 5: and/or on an answer", "line 6: all() over a generator of answers"]


def test_a_wrong_answer_is_followed_by_the_next_call(default_box):
    """End to end: programs that answer the first call right or wrong, then never return from the second
    one, both time out (the second call came); before, the wrong one failed at once (it was ended)."""
    box = default_box
    check = "def check(candidate):\n    assert candidate(1) == 2\n    assert candidate(2) == 3\n"
    hang = "import time\ndef f(x):\n    if x == 2:\n        time.sleep(60)\n    return x + {}\n"
    results = box.run([Program("", hang.format(1), check, "f"), Program("", hang.format(5), check, "f")], timeout=1.0)
    assert [r.status for r in results] == ["timed out", "timed out"], results

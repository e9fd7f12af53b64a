"""The answer key never reaches the untrusted process: a program cannot find the test (or any earlier job's
text) by walking frames, tracebacks or generators, by scanning every object it can reach, or in its memory,
and a completion that forges answers from the test passes no task.

The forger and the scanner are first shown to work where the test is reachable (a positive control in this
process), so a "found nothing" in the sandbox means the text is not there, not that the attack is broken.
"""

from __future__ import annotations

import os
import threading
import time

import pytest

from codeparrot.humaneval.problems import load_problems
from codeparrot.sandbox import Program, SandboxConfig

# Looks everywhere a program can look without special privileges for text holding test assertions: the
# frames above it (sys._getframe, a traceback's tb_frame.f_back, a generator's gi_frame.f_back), and every
# object reachable from them, from sys.modules and from the garbage collector's generations when allowed.
SCANNER = r'''
import sys

def _reachable_strings(roots, limit=400000):
    from collections import deque
    seen, todo, found = set(), deque(roots), []  # breadth first: what is near the frames comes first
    while todo and len(seen) < limit:
        obj = todo.popleft()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        kind = type(obj)
        if kind is str:
            found.append(obj)
        elif kind is bytes or kind is bytearray:
            found.append(bytes(obj).decode("latin-1"))
        elif kind is dict:
            todo.extend(obj.keys()); todo.extend(obj.values())
        elif kind in (list, tuple, set, frozenset):
            todo.extend(obj)
        elif kind.__name__ == "frame":
            todo.extend([obj.f_locals, obj.f_globals, obj.f_back, obj.f_code])
        elif kind.__name__ == "code":
            todo.extend(obj.co_consts)
        elif kind.__name__ == "function":
            todo.extend([obj.__globals__, obj.__code__, obj.__defaults__, obj.__closure__ or ()])
        elif kind.__name__ == "cell":
            try:
                todo.append(obj.cell_contents)
            except ValueError:
                pass
        elif kind.__name__ in ("module", "type"):
            todo.append(vars(obj))
        elif hasattr(obj, "__dict__") and type(getattr(obj, "__dict__", None)) is dict:
            todo.append(obj.__dict__)
    return found

def _roots():
    roots = []
    frame = sys._getframe()
    while frame is not None:
        roots.append(frame)
        frame = frame.f_back
    try:
        raise RuntimeError
    except RuntimeError as err:
        tb = err.__traceback__
        roots.append(tb.tb_frame.f_back)
    def gen():
        yield sys._getframe()
    g = gen()
    roots.append(next(g).f_back)
    roots.append(g.gi_frame)
    return roots + [sys.modules, sys.__dict__]

def find_test_text(limit=400000):
    """Every reachable string that looks like a HumanEval test."""
    return [s for s in _reachable_strings(_roots(), limit) if "def check(" in s and "candidate" in s]
'''

# Answers each call with the test's own expected value for those arguments, when it can find the test
# (looked for once per process, among the first 50,000 objects reachable from the frames and modules: the
# job dict of the serving functions above it was within a few hops).
FORGER = SCANNER + r'''
import ast
_FOUND = []

def _parsed(texts):
    trees = []
    for text in texts:
        try:
            trees.append(list(ast.walk(ast.parse(text))))
        except SyntaxError:
            pass
    return trees

def _answer(args):
    if not _FOUND:  # every call runs (the checker records failures): look and parse once
        _FOUND.append(_parsed(find_test_text(50000)))
    for nodes in _FOUND[0]:
        for node in nodes:
            if isinstance(node, ast.Compare) and len(node.ops) == 1 and isinstance(node.left, ast.Call):
                call = node.left
                if getattr(call.func, "id", "") == "candidate":
                    try:
                        if [eval(compile(ast.Expression(a), "<a>", "eval"), {}) for a in call.args] == list(args):
                            return eval(compile(ast.Expression(node.comparators[0]), "<e>", "eval"), {})
                    except Exception:
                        continue
    return None
'''


def _forged(entry_point: str) -> str:
    return FORGER + f"\ndef {entry_point}(*args, **kwargs):\n    return _answer(args)\n"


def test_the_forger_and_the_scanner_work_when_the_test_is_reachable():
    """Positive control: with the task's test a local of a calling frame (as it was in the worker that forked
    the program), the forger answers correctly and the scanner finds the text."""
    task = next(p for p in load_problems() if p["entry_point"] == "add")  # HumanEval/53: assert candidate(0, 1) == 1
    namespace = {}
    exec(compile(_forged("add"), "<forger>", "exec"), namespace)

    def serving_loop(job):  # like the worker's frames: the job dict, test included, is a local up the stack
        return namespace["add"](0, 1), namespace["find_test_text"]()

    answer, found = serving_loop({"test": task["test"]})
    assert answer == 1 and any(task["test"] in text for text in found)


@pytest.mark.slow(25)
def test_a_completion_that_forges_answers_from_the_test_passes_no_task(start_box):
    """The forger as every task's completion, in the default sandbox: it never finds the test (0 of 164
    pass), while the same sandbox still passes all canonical solutions (run in the same worker, interleaved,
    so an earlier job's test would be there to find if anything leaked)."""
    problems = load_problems()
    box = start_box(SandboxConfig(timeout=5.0), workers=2)
    try:
        programs = []
        for p in problems:
            programs.append(Program(p["prompt"], p["canonical_solution"], p["test"], p["entry_point"]))
            programs.append(Program(p["prompt"], _forged(p["entry_point"]), p["test"], p["entry_point"]))
        results = box.run(programs)
    finally:
        box.close()
    canonical, forged = results[0::2], results[1::2]
    assert all(r.passed for r in canonical), [r for r in canonical if not r.passed][:3]
    passed = [p["task_id"] for p, r in zip(problems, forged) if r.passed]
    assert passed == [], passed
    assert all(r.checker == "isolated" for r in forged)


def test_a_program_finds_no_test_and_no_earlier_job_by_scanning_what_it_reaches(start_box):
    """On one worker, after jobs whose prompts and tests carry unique markers, a program that walks every
    frame, traceback, generator and reachable object finds neither its own test nor any earlier job's text,
    but does find its own prompt (the scan works inside the sandbox too)."""
    markers = [f"marker_{i}_{os.urandom(4).hex()}" for i in range(4)]
    earlier = [Program(f"# prompt {m}\n", "def f():\n    return 1\n",
                       f"def check(candidate):\n    assert candidate() == 1, 'test {m}'\n", "f")
               for m in markers[:3]]
    own_test_marker = markers[3]
    # The pattern is assembled at run time, so the program's own text holds no string it matches.
    probe = SCANNER + ("import re\n"
                       "def f():\n    texts = _reachable_strings(_roots())\n"
                       "    pattern = re.compile('mark' + r'er_[0-9]_[0-9a-f]{8}')\n"
                       "    return sorted({m for t in texts for m in pattern.findall(t)}), "
                       "any('own prompt marker' in t for t in texts)\n")
    test = (f"def check(candidate):\n    # {own_test_marker}\n    found, own = candidate()\n"
            "    assert own, 'the scan did not even find its own prompt'\n    assert found == [], found\n")
    box = start_box(SandboxConfig(timeout=10.0), workers=1)
    try:
        results = box.run(earlier + [Program("# own prompt marker\n", probe, test, "f")])
    finally:
        box.close()
    assert all(r.passed for r in results), results


def _processes_of(uid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.stat(f"/proc/{entry}").st_uid == uid:
                    found.append(int(entry))
            except OSError:
                pass
    return found


def _memory_of(pid: int) -> bytes:
    """Every readable mapping of `pid` (read as root from outside: more than the program itself can do)."""
    chunks = []
    with open(f"/proc/{pid}/maps") as maps, open(f"/proc/{pid}/mem", "rb", buffering=0) as mem:
        for line in maps:
            span, perms = line.split()[:2]
            if "r" not in perms or line.rstrip().endswith("[vvar]"):
                continue
            start, end = (int(x, 16) for x in span.split("-"))
            try:
                mem.seek(start)
                chunks.append(mem.read(end - start))
            except (OSError, ValueError, OverflowError):
                pass
    return b"".join(chunks)


def test_the_program_memory_holds_neither_its_test_nor_earlier_jobs(start_box):
    """Read from outside (as root, every readable page of the running program): its own prompt is there,
    its test and the earlier jobs' prompts, completions and tests are not."""
    if os.geteuid() != 0:
        pytest.skip("reading another process's memory from outside needs root")
    box = start_box(SandboxConfig(timeout=8.0), workers=1)
    if box.layers.get("uid") is None:
        pytest.skip(f"no private uid to find the program by: {box.layers['notes']}")
    markers = {name: f"{name}_{os.urandom(6).hex()}" for name in
               ("earlier_prompt", "earlier_completion", "earlier_test", "own_prompt", "own_test")}
    earlier = Program(f"# {markers['earlier_prompt']}\n", f"def f():\n    return '{markers['earlier_completion']}'\n",
                      f"def check(candidate):\n    assert candidate() != '{markers['earlier_test']}'\n", "f")
    waiting = Program(f"# {markers['own_prompt']}\n", "import time\ndef f():\n    time.sleep(3)\n    return 1\n",
                      f"def check(candidate):\n    assert candidate() == 1, '{markers['own_test']}'\n", "f")
    memory, done = [], threading.Event()

    def scan():
        deadline = time.monotonic() + 6
        while not done.is_set() and time.monotonic() < deadline:
            pids = _processes_of(box.uid_base)
            if pids:
                time.sleep(0.5)  # prompt + completion executed, the checker's call under way
                memory.extend(_memory_of(pid) for pid in _processes_of(box.uid_base))
                return
            time.sleep(0.01)

    try:
        assert box.run([earlier])[0].passed
        scanner = threading.Thread(target=scan)
        scanner.start()
        result = box.run([waiting])[0]
        done.set()
        scanner.join()
    finally:
        box.close()
    assert result.passed, result
    assert memory, "the program's process was not found"
    image = b"".join(memory)
    found = {name for name, marker in markers.items() if marker.encode() in image}
    assert found == {"own_prompt"}, found


def test_the_scanner_finds_text_built_at_run_time(start_box):
    """The in-sandbox scanner is not blind to strings built at run time (a guard against a scan that could
    never find anything): a marker the program itself assembles is found."""
    probe = SCANNER + ("def f():\n    secret = 'def check(' + 'candidate)'\n"
                       "    return len(find_test_text()) > 0\n")
    box = start_box(SandboxConfig(timeout=5.0), workers=1)
    try:
        result = box.run([Program("", probe, "def check(candidate):\n    assert candidate() is True\n", "f")])[0]
    finally:
        box.close()
    assert result.passed, result

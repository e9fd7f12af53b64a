"""The sandbox's states come from the sandbox (issue 29, attack 3): a program's exit status is only ever
"the program exited with N", a signal only "killed by signal S", and nothing a program does makes the
harness restart its worker or run the program again.

Before: status 250 read as the watchdog's own failure ("error"), so the harness killed the worker, started a
new one and ran the program again (30 such programs: 60 worker starts), and any status >= 128 was reported
as a signal.
"""

from __future__ import annotations

import time

from codeparrot.sandbox import Program

CHECK = "def check(candidate):\n    assert candidate(2) == 4\n"


def test_no_exit_status_reads_as_the_sandbox_s_own(default_box):
    box = default_box
    box.run([Program("", "def f(x):\n    return x * x\n", CHECK, "f")] * 2)  # both workers started
    workers = [server.proc.pid for server in box._servers]
    statuses = [250, 251, 252, 137, 143, 255, 1]
    programs = []
    for status in statuses:  # before any call (module level), and during a call
        programs.append(Program("", f"import os\nos._exit({status})\n", CHECK, "f"))
        programs.append(Program("", f"import os\ndef f(x):\n    os._exit({status})\n", CHECK, "f"))
    start = time.monotonic()
    results = box.run(programs * 3)
    seconds = time.monotonic() - start
    for i, result in enumerate(results):
        status = statuses[(i % len(programs)) // 2]
        assert result.status == "failed", (status, result)
        assert result.detail.startswith(f"the program exited with status {status} before the check finished"), \
            (status, result)
    assert [server.proc.pid for server in box._servers] == workers  # never restarted, nothing ran twice
    assert seconds < 10, seconds  # 42 programs; before, each status-250 one cost two worker starts


def test_a_real_signal_is_reported_as_one(default_box):
    """A program the kernel kills (a C stack overflow: SIGSEGV) is "killed" by that signal; beside it, a
    program exiting 139 (128 + SIGSEGV) only exited, and an honest program still passes on the same worker."""
    box = default_box
    crash = ("import sys, json\nsys.setrecursionlimit(10 ** 8)\ndef f(x):\n    deep = []\n"
             "    for _ in range(10 ** 6):\n        deep = [deep]\n    return len(json.dumps(deep))\n")
    results = box.run([Program("", crash, CHECK, "f"), Program("", "import os\nos._exit(139)\n", CHECK, "f"),
                       Program("", "def f(x):\n    return x * x\n", CHECK, "f")])
    assert (results[0].status, results[0].detail) == ("killed", "SIGSEGV (stack overflow or memory limit)"), results[0]
    assert results[1].status == "failed" and "exited with status 139" in results[1].detail, results[1]
    assert results[2].passed, results[2]

"""The sandbox worker: a small `python -I -S` process that runs untrusted programs one at a time (stdlib only).

`codeparrot.sandbox.Sandbox` starts one per worker with an empty environment:

    python -I -S server.py <settings: marshal, hex>

It enters its namespaces once (`kernel.setup`: network; mount, pivoting into the minimal filesystem view of
`rootfs.py`, everything read-only but a size-limited tmpfs workspace; a user namespace first when not
root), answers `{"hello": {layer: active}}`, then reads one job per frame on stdin and writes one result
per frame on stdout (frames: 8-byte length + `marshal`).

Before the first job it forks the zygote (in guard-only mode, having loaded every extension module of
the interpreter first: there the program's seccomp allowlist refuses all executable memory). Per job
there is no exec, only forks (about 2 ms instead of about 15 ms for a fresh interpreter):

    server ──fork (once, before any job)──> zygote ──fork──> watchdog: setsid, unshare(PID | IPC | mount)
                                                               ──fork──> program: pid 1 there
           ──fork──> checker: the trusted process that runs the test (jobs with an entry point)

The answer key. The server holds every job (test included) and, in its heap, the text of earlier ones;
the program does not descend from it. The zygote receives only the job number, timeout and the program's
pipes (SCM_RIGHTS); the program reads its own prompt and completion from a pipe (the test too only in the
in-process fallback). So no frame, object or page of the program holds the test or another job's text.

The worker joins its memory cgroup before it forks the zygote, so every program and every checker is born
in it (no migration per job). The program mounts its own /proc (process folders only) and tmpfs workspace,
sets its rlimits, drops to an unprivileged uid (or all capabilities in a
user namespace), installs its seccomp allowlist (`seccomp.py`) and the audit-hook guard, then runs
`child.serve_candidate` (isolated check) or `child.run_program` (in-process fallback). When the verdict is in or the wall-clock deadline passes, the
server closes the watchdog's stop pipe; the watchdog SIGKILLs the program through a pidfd of its own
unreaped child (never a pid that may have been reused) and, without a PID namespace, its process group
before reaping it. As the init of its PID namespace the program's death makes the kernel kill every
process it started, grandchildren and `setsid` escapees included, and free its IPC objects and mounts.
The server signals nothing there: it only closes the stop pipe, and reads the program's wait status from
a pipe the watchdog writes.

The verdict. With an entry point the checker (`checker.py`) decides it: it runs the prompt and the test
(rewritten once per distinct test by `rewrite.record_all` in the server, so every call runs whatever the
answers) in its own interpreter and calls the candidate over two pipes (call: checker -> program, fd 6;
reply: program -> checker, fd 7) carrying plain data only (`channel.py`), then writes one verdict line
(`P`, `F`, `X`, `N`) on a pipe only the server reads. Nothing the program writes anywhere can produce a
pass, and a passing and a failing program see the same calls.

Three more pipes serve both modes. The result pipe (fd 3 in the program) carries the audit hook's lines,
`D <nonce> <event>` (a refusal) and `F <nonce> <exception>` (why the program ended before the check); the
nonce (fd 4, read and closed while the guard installs) tells them from program output. Only in-process
(no entry point; or, only with `in_process_fallback`, a test passing non-plain arguments, otherwise the
sample's failure, since the program could provoke it) is a pass, `P <nonce>`, read there, and marked as
such in the result. The program's setup reports its own failures through fd 5, closed before program code
runs, and the watchdog reports on the status pipe (`W` + the program's wait status, or `E` + why it
failed), which the program never holds: the sandbox's errors never come from an exit status.

This file is the worker's start (memory cgroup, namespaces, warm-up, the zygote) and its frame loop. The
program's side of a job (the zygote, the watchdog, the program's process) is `zygote.py`; the server's side
(`run_job`: the pipes, the checker, the deadline, the result) is `job.py`; the memory cgroup it opens,
`cgroup.py`.
"""

import gc
import marshal
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import answers  # noqa: E402  (stdlib-only siblings; -I leaves the script's folder off sys.path)
import channel  # noqa: E402
from cgroup import MEMORY_GROUP, join_memory_group, oom_score_adj, open_memory_group  # noqa: E402
from job import run_job  # noqa: E402
from kernel import PR_SET_CHILD_SUBREAPER, prctl, refusal, setup  # noqa: E402
from rootfs import enter_minimal_root  # noqa: E402
from zygote import start_zygote, warm_up  # noqa: E402

sys.path.pop(0)


def _send(obj: dict) -> None:
    """One frame: 8-byte little-endian length, then `marshal` of `obj` (same interpreter on both ends)."""
    payload = marshal.dumps(obj)
    data = len(payload).to_bytes(8, "little") + payload
    while data:
        data = data[os.write(1, data):]


def _receive():
    """The next frame from stdin (the trusted harness: no size limit), or None at end of input."""
    body = channel.receive(0, limit=1 << 62)
    return None if body is None else marshal.loads(body)


def main() -> None:
    cfg = marshal.loads(bytes.fromhex(sys.argv[1]))
    prctl(PR_SET_CHILD_SUBREAPER, 1)  # orphans of a killed watchdog come to us, not to the system's init
    no_group = open_memory_group(cfg)
    # The answer key as the host has it, before any namespace (setup hides it, the guard refuses it).
    needed = [cfg["workspace"], sys.executable, *sys.path]  # no folder holding these can be covered
    cfg["answer_key"] = answers.survey(cfg.get("answer_paths") or [], keep=needed)
    layers = setup(cfg, enter_root=enter_minimal_root)
    layers["memory_cgroup"] = MEMORY_GROUP.get("kind")
    if no_group:
        layers["notes"].append(f"no memory cgroup ({no_group}): a program's memory is bounded by its address-space "
                               "limit, the workspace size and the syscall allowlist (no shared memory, memfd or "
                               "io_uring), not by one counter of everything it holds")
    refused = refusal(cfg, layers)
    if refused:
        _send({"error": refused})
        return
    warm_up(layers)
    gc.freeze()  # forked children then do not touch (copy) the server's objects when they collect
    # Into the memory cgroup (what it holds from now on counts, and every zygote, program and checker is born
    # there), never the OOM killer's choice where we may say so (as root; the zygote inherits it).
    oom_score_adj(-1000)
    join_memory_group()
    zygote = start_zygote(cfg, layers)  # before the first job: it never holds any job's text
    _send({"hello": layers})
    n = 0
    while True:
        job = _receive()
        if job is None:  # the harness is done: the zygote sees EOF, exits, and we reap it
            zygote[1].close()
            os.waitpid(zygote[0], 0)
            return
        n += 1
        try:
            job["_n"] = n
            job.setdefault("timeout", cfg["timeout"])
            result = run_job(cfg, layers, job, zygote)
        except Exception as err:  # a bug here must not look like a program's verdict
            result = {"status": "error", "detail": f"sandbox server: {type(err).__name__}: {err}", "seconds": 0.0}
        _send(result)


if __name__ == "__main__":
    main()

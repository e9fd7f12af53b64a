"""Run untrusted (model-generated) programs: each in its own locked-down process, many in parallel.

    with Sandbox(SandboxConfig(timeout=3.0), num_workers=8) as sandbox:
        results = sandbox.run([Program(prompt, completion, test, entry_point), ...])
        results[0].status  # "passed" | "failed" | "timed out" | "killed" | "error"

A program is prompt + completion, then the problem's test and `check(entry_point)`. Each runs in a process
forked from a small `python -I -S` worker (`server.py`, one per `num_workers`), with these layers, each
probed at start and reported in `Sandbox.layers` (never assumed):

The verdict: with an entry point the test runs in a separate trusted checker process (`checker.py`) that
calls the candidate over pipes carrying plain data only (`channel.py`); the program's process only
answers calls, so nothing it does (exit early, patch builtins, walk frames, write fake lines, return an
object whose `__eq__` says True) can make wrong answers pass. A program without an entry point (the test
is the program) runs in-process and the result says so (`ExecResult.checker`); a test whose arguments
cannot cross as plain data fails with that reason, never rerun with the test in the program's process
unless `in_process_fallback=True` (then marked the same way).

Enforced by the kernel (real boundaries):
- own session and a new PID namespace whose init is the program: on the wall-clock timeout (default 3 s)
  it is SIGKILLed and the kernel kills everything it started, grandchildren and `setsid` escapees too;
  its own /proc (no host process visible) and its own IPC namespace (SysV/POSIX IPC dies with it);
- rlimits: CPU time, address space (memory), file size, open files; RLIMIT_NPROC on a private uid;
- an unprivileged private uid per worker when we are root (root ignores RLIMIT_NPROC, can remount and
  signal anything; the private uid can do neither, and cannot read other users' /proc/<pid>/environ),
  or, when not root, a user namespace whose capabilities the program drops;
- a network namespace with no interface up: no network at all, loopback included;
- a minimal filesystem view (`rootfs.py`, `minimal_root=True`): the interpreter, its standard library and
  the shared libraries it loads, read-only, a few devices, /proc, and a size-limited noexec tmpfs
  workspace per program; no other host path exists for the program (the project, /etc, /home, /tmp and
  /run with their unix sockets). Where it cannot be built: the host's tree, read-only, with the home
  folders ($HOME, the user's home, /root, /home) covered by an empty tmpfs;
- a seccomp allowlist on every program (`seccomp.py`): the system calls a pure-Python program needs,
  everything else refused (memfd, io_uring, keyrings, bpf, ptrace, sockets, IPC, namespaces, executable
  memory, process spawning unless `allow_processes`); without a PID namespace and a private uid
  (guard-only mode) also no signal to any process but the program itself, whoever issues it;
- a memory cgroup per worker (`cgroup.py`) where cgroup v2 or v1's memory controller is writable:
  `memory_mb` bounds everything a program and its checker hold (heap, tmpfs workspace, shared memory,
  kernel buffers);
- nothing shared two programs running side by side can signal through: no file locks (every worker's view
  holds the same inodes), no shared-futex wakes, no host-wide /proc files, no `sysinfo`;
- programs descend from a zygote forked before the first job: the test and other jobs' text are never in
  a program's memory;
- an empty environment (HOME and TMPDIR point at the workspace), stdin/stdout/stderr on /dev/null.

In the interpreter (best effort, `guard=True`; the only containment when the kernel offers none of the
above, e.g. an unprivileged container): an audit hook (`sys.addaudithook`, which the program cannot
remove) refuses sockets, fork/exec/subprocess, signals to other processes, writes outside the workspace,
/proc (paths resolved through symlinks, as the kernel does), ctypes and more. Audit events are raised
inside C functions, so `posix.*` calls are covered too, but a hook in the same interpreter is not a
security boundary: functions without an audit event (`os.pidfd_open` + `signal.pidfd_send_signal`,
`os.sched_setaffinity`, ...) are removed before it installs, yet a program can rebuild those modules, and
any syscall made from native code (an extension module loaded under another name) is invisible to it.
Only the kernel layers stop those. See `guard.py` for the guard's rules. Where it would be the only
barrier (no namespaces, no private uid) the sandbox refuses to start without `allow_guard_only=True`.

A program runs once: whatever happens after its job reached a worker is its result (the sandbox's own
failures as "error", detail "sandbox: ..."), and the worker is replaced after such a failure.

Not restricted: CPU use within the limits; without a writable memory cgroup, memory across processes
beyond RLIMIT_AS x RLIMIT_NPROC (printed as a weaker mode at start). Without the minimal view, reading files
the program's uid may read outside the home folders (the private uid cannot enter 0700 folders; as the
harness's own user without a mount namespace it reads what you can, your home included), except the answer
key's files the harness names (`SandboxConfig.answer_paths`), hidden in every mode or the mode refused
(`answers.py`). Root without the
private uid is refused unless `allow_root=True`.

Worker processes start once; a program costs three forks of a ~15 MB process (watchdog, program,
checker), not a new interpreter. See the package docstring for the threat model.

Each Sandbox works in `$TMPDIR/codeparrot-sandbox-<pid>-*/`, holding an flock on its `owner.lock` while it
lives. A harness killed with SIGKILL cannot remove it; the next Sandbox started by the same user removes
every such folder whose lock nobody holds (and that is older than a minute: never one being created).

This file is the `Sandbox` pool; beside it: `config.py` (`SandboxConfig`, the opt-in), `program.py` (`Program`,
`ExecResult`), `worker.py` (one worker process and its frame protocol), `stale_roots.py` (the folders of dead
harnesses) and `layers.py` (the layers line).
"""

from __future__ import annotations

import fcntl
import os
import sys
import tempfile
import threading
import weakref
from pathlib import Path
from queue import Empty, Queue
from typing import Callable, Sequence

from codeparrot.sandbox import cgroup
from codeparrot.sandbox.cleanup import remove_tree
from codeparrot.sandbox.config import SandboxConfig
from codeparrot.sandbox.program import ExecResult, Program
from codeparrot.sandbox.stale_roots import OWNER_LOCK, ROOT_PREFIX, remove_stale_roots
from codeparrot.sandbox.worker import Worker, pick_uid_base


def available_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


class Sandbox:
    """A pool of sandbox workers. `run` executes programs in parallel and returns results in order."""

    def __init__(self, config: SandboxConfig | None = None, num_workers: int | None = None):
        self.config = config or SandboxConfig()
        self.config.validate()
        self.num_workers = max(1, int(num_workers or available_cpus()))
        remove_stale_roots()
        self._root = Path(tempfile.mkdtemp(prefix=f"{ROOT_PREFIX}{os.getpid()}-"))
        os.chmod(self._root, 0o711)
        # Held while we live (released by the kernel however we die): marks the folder as in use.
        self._owner_fd = os.open(self._root / OWNER_LOCK, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)
        fcntl.flock(self._owner_fd, fcntl.LOCK_EX)
        self.uid_base = self.config.uid_base if self.config.uid_base is not None else pick_uid_base(self.num_workers)
        self._servers: list[Worker | None] = [None] * self.num_workers
        # Per worker: (memory cgroup folder, "v1"/"v2") or (None, why not); made at its first start.
        self.memory_groups: list[tuple | None] = [None] * self.num_workers
        self._lock = threading.Lock()
        self.layers: dict | None = None
        # Workers, their cgroups and the workspace go away even when close() is never called (e.g. start() raised).
        self._finalizer = weakref.finalize(self, _shutdown, self._servers, self._root, self._owner_fd,
                                           self.memory_groups)

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _server(self, slot: int) -> Worker:
        server = self._servers[slot]
        if server is None or server.proc.poll() is not None:
            workspace = self._root / f"worker-{slot}"
            workspace.mkdir(mode=0o711, exist_ok=True)
            os.chmod(workspace, 0o711)
            if self.memory_groups[slot] is None:
                try:
                    self.memory_groups[slot] = cgroup.create(f"{os.getpid()}-{self._root.name[-8:]}-{slot}",
                                                             int(self.config.memory_mb) << 20)
                except OSError as err:
                    self.memory_groups[slot] = (None, str(err))
            server = Worker(self.config, workspace, slot, self._root / f"worker-{slot}.log", self.uid_base,
                             self.memory_groups[slot])
            self._servers[slot] = server
            with self._lock:
                if self.layers is None:
                    self.layers = server.layers
        return server

    def start(self) -> dict:
        """Start the first worker (the others start on first use); return the active layers. Each layer
        the kernel refused is printed (stderr) as a weaker-mode line, never left silent."""
        self._server(0)
        for note in self.layers.get("notes", []):
            print(f"sandbox: weaker mode: {note}", file=sys.stderr)
        return self.layers

    def _execute(self, slot: int, program: Program, timeout: float) -> ExecResult:
        """Run `program` on worker `slot`. Never twice: once the job has reached the worker, whatever happens
        is this program's result, the sandbox's own failures included ("error", detail "sandbox: ..." or the
        harness's reason), and the worker is replaced after one (its state is unknown). Only when no worker
        could take the job (it failed to start, or was found dead, its pipe broken, before reading it) is the
        job handed to a new one, once."""
        job = {"prompt": program.prompt, "completion": program.completion, "test": program.test,
               "entry_point": program.entry_point, "timeout": timeout}
        result = ExecResult("error", "harness: no worker")
        for _attempt in range(2):
            try:
                server = self._server(slot)
                server.send(job)
            except Exception as err:  # noqa: BLE001 - the program never ran: a new worker may take it
                result = ExecResult("error", f"harness: {type(err).__name__}: {err}")
                self._replace(slot)
                continue
            try:
                reply = server.receive(timeout)
            except Exception as err:  # noqa: BLE001 - any harness failure is this program's error, not the run's
                result = ExecResult("error", f"harness: {type(err).__name__}: {err}")
            else:
                if reply.get("status") != "error":
                    return ExecResult(reply["status"], reply.get("detail", ""), float(reply.get("seconds", 0.0)),
                                      reply.get("checker", ""))
                result = ExecResult("error", reply.get("detail", "") or "sandbox: unknown failure",
                                    float(reply.get("seconds", 0.0)), reply.get("checker", ""))
            self._replace(slot)
            return result
        return result

    def _replace(self, slot: int) -> None:
        """Kill worker `slot`; the next job there starts a new one."""
        server = self._servers[slot]
        if server is not None:
            server.kill()
            self._servers[slot] = None

    def run(self, programs: Sequence[Program], on_result: Callable[[int, ExecResult], None] | None = None,
            timeout: float | None = None) -> list[ExecResult]:
        """Execute `programs` on all workers; `on_result(index, result)` is called as each finishes."""
        timeout = float(timeout or self.config.timeout)
        results: list[ExecResult | None] = [None] * len(programs)
        todo: Queue[int] = Queue()
        for i in range(len(programs)):
            todo.put(i)
        failures: list[BaseException] = []

        def worker(slot: int) -> None:
            while not failures:
                try:
                    i = todo.get_nowait()
                except Empty:
                    return
                try:
                    result = self._execute(slot, programs[i], timeout)
                except Exception as err:  # noqa: BLE001 - one program's harness failure: its own "error"
                    result = ExecResult("error", f"harness: {type(err).__name__}: {err}")
                except BaseException as err:  # KeyboardInterrupt and the like: stop everyone, re-raise
                    failures.append(err)
                    return
                results[i] = result
                if on_result is not None:
                    with self._lock:
                        on_result(i, result)

        threads = [threading.Thread(target=worker, args=(slot,), daemon=True)
                   for slot in range(min(self.num_workers, len(programs)))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if failures:
            raise failures[0]
        return results  # type: ignore[return-value]

    def close(self) -> None:
        self._finalizer()


def _shutdown(servers: list, root: Path, owner_fd: int, memory_groups: list) -> None:
    for slot, server in enumerate(servers):
        if server is not None:
            server.close()
            servers[slot] = None
    for slot, group in enumerate(memory_groups):
        if group is not None and group[0] is not None:
            cgroup.remove(group[0])  # empty now: its programs ended with their worker
            memory_groups[slot] = None
    remove_tree(str(root))  # iterative: a 2,000-deep chain left behind cannot make this raise
    os.close(owner_fd)

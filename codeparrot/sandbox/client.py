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
  `memory_mb` bounds everything a program holds (heap, tmpfs workspace, shared memory, kernel buffers);
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
Only the kernel layers stop those. See `child.py` for the guard's rules.

Not restricted: CPU use within the limits; without a writable memory cgroup, memory across processes
beyond RLIMIT_AS x RLIMIT_NPROC (printed as a weaker mode at start). Without the minimal view, reading files
the program's uid may read outside the home folders (the private uid cannot enter 0700 folders; as the
harness's own user without a mount namespace it reads what you can, your home included). Root without the
private uid is refused unless `allow_root=True`.

Worker processes start once; a program costs three forks of a ~15 MB process (watchdog, program,
checker), not a new interpreter. See the package docstring for the threat model.

Each Sandbox works in `$TMPDIR/codeparrot-sandbox-<pid>-*/`, holding an flock on its `owner.lock` while it
lives. A harness killed with SIGKILL cannot remove it; the next Sandbox started by the same user removes
every such folder whose lock nobody holds (and that is older than a minute: never one being created).
"""

from __future__ import annotations

import fcntl
import marshal
import os
import pwd
import random
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from dataclasses import asdict, dataclass
from pathlib import Path
from queue import Empty, Queue
from typing import Callable, Sequence

from codeparrot.errors import CodeParrotError
from codeparrot.sandbox import cgroup
from codeparrot.sandbox.cleanup import remove_tree

SERVER = Path(__file__).with_name("server.py")
ALLOW_ENV = "CODEPARROT_ALLOW_CODE_EXECUTION"
STATUSES = ("passed", "failed", "timed out", "killed", "error")
ROOT_PREFIX, OWNER_LOCK = "codeparrot-sandbox-", "owner.lock"
STALE_AFTER_S = 60.0  # an unlocked folder younger than this may be one whose creator has not locked it yet


def available_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def code_execution_allowed(flag: bool = False) -> bool:
    """Executing model-generated code needs an explicit opt-in: the flag or CODEPARROT_ALLOW_CODE_EXECUTION=1."""
    return bool(flag) or os.environ.get(ALLOW_ENV, "") == "1"


@dataclass
class SandboxConfig:
    timeout: float = 3.0  # wall-clock seconds per program (HumanEval's default)
    memory_mb: int = 1024  # address-space limit per process
    file_mb: int = 16  # largest file a program may write
    max_processes: int = 16  # RLIMIT_NPROC for the private uid (threads count too)
    max_open_files: int = 64
    workspace_mb: int = 64  # size of the tmpfs workspace (mount-namespace mode)
    namespaces: bool = True  # use network/mount/PID (and user) namespaces where the kernel allows
    drop_privileges: bool = True  # when root, run programs as a private uid (uid_base + worker index)
    uid_base: int | None = None  # private uids uid_base + worker index; None: a random unused range
    guard: bool = True  # the audit-hook containment rules (integrity rules are always on)
    allow_root: bool = False  # run programs as root when the private uid is impossible (guard only!)
    allow_processes: bool = False  # let programs fork/exec (else the seccomp filter refuses every spawn)
    # Programs see only the interpreter, its standard and shared libraries, a few devices, /proc and their
    # workspace (rootfs.py); False: the host's tree, read-only, with the home folders covered.
    minimal_root: bool = True
    # A test whose arguments cannot cross the plain-data channel (a function, an object of the test's): False
    # fails the sample with that reason; True reruns it with the test in the program's process (the answer
    # key within its reach), marked `in-process (why)`: integrity best effort only, and a program can steer
    # a test into that mode (a return value that cannot be sent back).
    in_process_fallback: bool = False

    def validate(self) -> None:
        if not self.timeout > 0:
            raise CodeParrotError(f"sandbox timeout must be positive, got {self.timeout}")
        for name in ("memory_mb", "file_mb", "max_processes", "workspace_mb"):
            if getattr(self, name) < 1:
                raise CodeParrotError(f"sandbox {name} must be at least 1, got {getattr(self, name)}")
        if self.max_open_files < 16:
            raise CodeParrotError(f"sandbox max_open_files must be at least 16, got {self.max_open_files}")


@dataclass
class Program:
    prompt: str
    completion: str
    test: str
    entry_point: str | None = None  # None: the test itself is the check (e.g. a list of asserts)


@dataclass
class ExecResult:
    status: str  # one of STATUSES
    detail: str = ""  # exception type and message, the limit hit, or what the sandbox refused
    seconds: float = 0.0
    # Where the verdict was decided: "isolated" (a trusted checker process, the candidate called over
    # plain data), or "in-process (why)" (the test ran beside the program: integrity best effort only).
    checker: str = ""

    @property
    def passed(self) -> bool:
        return self.status == "passed"


def pick_uid_base(count: int) -> int:
    """A random base for `count` private uids, inside this user namespace's mapped range and far from real
    users: each Sandbox gets its own uids, so concurrent sandboxes never share RLIMIT_NPROC or signals."""
    low, high = 2_000_000_000, 4_000_000_000  # the usual full mapping
    try:
        extents = [tuple(map(int, line.split())) for line in Path("/proc/self/uid_map").read_text().splitlines()]
        inside, _, length = max(extents, key=lambda e: e[2])
        if inside + length < high:  # a container mapping only some uids, e.g. 0..65535: use its top
            low, high = max(inside, inside + length - 5000), inside + length - 2  # below nobody (65534)
    except (OSError, ValueError):
        pass
    return random.SystemRandom().randrange(low, max(low + 1, high - count))


def home_folders() -> list[str]:
    """Folders to hide from programs: $HOME, the user's home from the password database, /root, /home."""
    found = [os.environ.get("HOME", ""), "/root", "/home"]
    try:
        found.append(pwd.getpwuid(os.getuid()).pw_dir)
    except KeyError:
        pass
    return [f for f in dict.fromkeys(found) if f and os.path.isabs(f)]


def remove_stale_roots(tmp: str | None = None, min_age_s: float = STALE_AFTER_S) -> list[Path]:
    """Remove the sandbox folders of dead harnesses (SIGKILLed: their `finally` never ran): ours, unlocked,
    not modified for `min_age_s`. Folders without an owner lock (older versions) are left alone."""
    removed = []
    for root in Path(tmp or tempfile.gettempdir()).glob(ROOT_PREFIX + "*"):
        try:
            info = root.lstat()
            if not root.is_dir() or root.is_symlink() or info.st_uid != os.geteuid():
                continue
            if time.time() - info.st_mtime < min_age_s:
                continue
            fd = os.open(root / OWNER_LOCK, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # its owner holds LOCK_EX while alive
        except OSError:
            continue
        else:
            remove_tree(str(root))
            removed.append(root)
        finally:
            os.close(fd)
    return removed


def describe_layers(layers: dict) -> str:
    """One line naming the active layers, for logs and results.json."""
    parts = ["own process + session", "rlimits (cpu, memory, file size, open files)", "empty environment"]
    if layers.get("pid_namespace"):
        parts.append("PID namespace (whole tree killed on timeout)")
    else:
        parts.append("process-group kill on timeout (no PID namespace)")
    if layers.get("uid") is not None:
        parts.append(f"private uid {layers['uid']} + RLIMIT_NPROC")
    if layers.get("user_namespace"):
        parts.append("user namespace, capabilities dropped")
    if layers.get("network_namespace"):
        parts.append("network namespace (no network)")
    view = layers.get("minimal_root")
    if view:
        parts.append(f"minimal filesystem view (interpreter, stdlib and {view['files']} shared libraries read-only, "
                     "a tmpfs workspace; no other host path)")
    elif layers.get("readonly_root"):
        parts.append("read-only filesystem except a " + ("tmpfs " if layers.get("workspace_tmpfs") else "")
                     + "workspace")
    if layers.get("hidden_homes") and not view:
        parts.append("home folders hidden (" + ", ".join(layers["hidden_homes"]) + ")")
    if layers.get("ipc_namespace"):
        parts.append("IPC namespace per program (SysV/POSIX IPC dies with it)")
    if layers.get("fresh_proc"):
        parts.append("own /proc per program (host processes invisible) + per-program tmpfs workspace")
    if layers.get("memory_cgroup"):
        parts.append(f"memory cgroup {layers['memory_cgroup']} per worker (everything a program holds: heap, "
                     "tmpfs, shared memory, kernel buffers)")
    else:
        parts.append("no memory cgroup (memory bounded by the address-space limit and the syscall allowlist)")
    if layers.get("program_seccomp"):
        parts.append("seccomp syscall allowlist (no executable memory, no sockets, no IPC, memfd, io_uring, keys"
                     + (")" if layers.get("spawning") else ", no process spawning)"))
    if layers.get("seccomp"):
        parts.append("seccomp: no signals to other processes")
    parts.append("audit-hook guard" if layers.get("guard") else "audit hook: verdict integrity only")
    return "; ".join(parts)


class _Server:
    """One worker (`server.py`) process and its frame protocol."""

    def __init__(self, config: SandboxConfig, workspace: Path, slot: int, log: Path, uid_base: int,
                 memory_group: tuple):
        settings = asdict(config)
        settings.update(workspace=str(workspace), uid=uid_base + slot if config.drop_privileges else None,
                        hide=home_folders(), memory_cgroup=memory_group)
        self.log = log
        with open(log, "ab") as err:
            self.proc = subprocess.Popen([sys.executable, "-I", "-S", str(SERVER), marshal.dumps(settings).hex()],
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, env={},
                                         cwd="/", start_new_session=True, close_fds=True)
        try:  # taken before anything can reap it: names this worker for as long as the descriptor lives
            self.pidfd = os.pidfd_open(self.proc.pid)
        except (AttributeError, OSError):  # no pidfds (kernel < 5.3): only the returncode tells
            self.pidfd = None
        self.buf = b""
        hello = self.readline(time.monotonic() + 60)
        if "error" in hello:
            self.kill()
            raise CodeParrotError(f"sandbox: {hello['error']}")
        if "hello" not in hello:
            self.kill()
            raise RuntimeError(f"sandbox worker did not start: {hello}")
        self.layers = hello["hello"]

    def _read(self, n: int, deadline: float) -> bytes:
        fd = self.proc.stdout.fileno()
        while len(self.buf) < n:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
                raise TimeoutError("sandbox worker did not answer in time")
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                tail = self.log.read_text(errors="replace")[-500:] if self.log.exists() else ""
                raise EOFError(f"sandbox worker exited (code {self.proc.poll()}): {tail.strip()}")
            self.buf += chunk
        data, self.buf = self.buf[:n], self.buf[n:]
        return data

    def readline(self, deadline: float) -> dict:
        """One frame from the worker: 8-byte little-endian length, then `marshal` data."""
        size = int.from_bytes(self._read(8, deadline), "little")
        return marshal.loads(self._read(size, deadline))

    def request(self, job: dict, timeout: float) -> dict:
        payload = marshal.dumps(job)
        self.proc.stdin.write(len(payload).to_bytes(8, "little") + payload)
        self.proc.stdin.flush()
        return self.readline(time.monotonic() + timeout + 30.0)  # the worker enforces `timeout` itself

    def kill(self) -> None:
        """SIGKILL the worker and its process group, then reap it. Its pid (and so the group id it leads)
        names our worker only until it is reaped, and `poll()` may have reaped it already (a worker that
        died mid-job: the read that saw EOF asked for its exit code): then signal nothing, since the
        number may belong to someone else by now. The worker's children die with it (PDEATHSIG)."""
        if self.proc.returncode is None and self._unreaped():
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)  # unreaped, a zombie included: still our group
            except (ProcessLookupError, PermissionError):
                pass
        self.proc.wait()
        self._close_pidfd()
        for stream in (self.proc.stdin, self.proc.stdout):
            try:
                stream.close()
            except OSError:
                pass

    def _unreaped(self) -> bool:
        """Is the worker's process still there to signal (running or a zombie), reaped by nobody? Popen
        reaps only in poll()/wait(); the pidfd also catches a reaper elsewhere in the harness."""
        if self.pidfd is None:
            return True
        try:
            signal.pidfd_send_signal(self.pidfd, 0)
        except ProcessLookupError:
            return False
        except OSError:
            return True
        return True

    def _close_pidfd(self) -> None:
        if self.pidfd is not None:
            os.close(self.pidfd)
            self.pidfd = None

    def close(self) -> None:
        try:
            self.proc.stdin.close()  # EOF: the worker finishes and exits
            self.proc.wait(timeout=5)
            self.proc.stdout.close()
            self._close_pidfd()
        except (OSError, subprocess.TimeoutExpired):
            self.kill()


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
        self._servers: list[_Server | None] = [None] * self.num_workers
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

    def _server(self, slot: int) -> _Server:
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
            server = _Server(self.config, workspace, slot, self._root / f"worker-{slot}.log", self.uid_base,
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
        job = {"prompt": program.prompt, "completion": program.completion, "test": program.test,
               "entry_point": program.entry_point, "timeout": timeout}
        last = "unknown"
        for _attempt in range(2):  # a broken worker is replaced and the program retried once
            try:
                reply = self._server(slot).request(job, timeout)
                if reply.get("status") != "error":
                    return ExecResult(reply["status"], reply.get("detail", ""), float(reply.get("seconds", 0.0)),
                                      reply.get("checker", ""))
                last = reply.get("detail", "")
            except Exception as err:  # noqa: BLE001 - any harness failure is this program's error, not the run's
                last = f"{type(err).__name__}: {err}"
            server = self._servers[slot]
            if server is not None:
                server.kill()
                self._servers[slot] = None
        return ExecResult("error", last)

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

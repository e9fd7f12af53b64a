"""The harness's handle on one sandbox worker: the `python -I -S server.py` process, its settings (a private
uid, the home folders to hide) and its frame protocol (8-byte length + `marshal`, both ways).

`Sandbox` (`client.py`) starts one per `num_workers`; `server.py` is the other end.
"""

from __future__ import annotations

import marshal
import os
import pwd
import random
import select
import signal
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

from codeparrot.errors import CodeParrotError
from codeparrot.sandbox.config import SandboxConfig

SERVER = Path(__file__).with_name("server.py")


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


class Worker:
    """One worker (`server.py`) process and its frame protocol."""

    def __init__(self, config: SandboxConfig, workspace: Path, slot: int, log: Path, uid_base: int,
                 memory_group: tuple):
        settings = asdict(config)
        settings.update(workspace=str(workspace), uid=uid_base + slot if config.drop_privileges else None,
                        hide=home_folders(), memory_cgroup=memory_group,
                        answer_paths=[os.path.abspath(p) for p in config.answer_paths])  # the worker's cwd is /
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

    def send(self, job: dict) -> None:
        """Hand the worker a job (raises BrokenPipeError when it is gone: then it never read it)."""
        payload = marshal.dumps(job)
        self.proc.stdin.write(len(payload).to_bytes(8, "little") + payload)
        self.proc.stdin.flush()

    def receive(self, timeout: float) -> dict:
        """The job's result (the worker enforces `timeout` itself; 30 s more before we give up on it)."""
        return self.readline(time.monotonic() + timeout + 30.0)

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

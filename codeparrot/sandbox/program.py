"""What the sandbox runs and what it answers: a `Program` (prompt, completion, test, entry point) and its
`ExecResult` (one of `STATUSES`, why, how long, and where the verdict was decided)."""

from __future__ import annotations

from dataclasses import dataclass

STATUSES = ("passed", "failed", "timed out", "killed", "error")


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

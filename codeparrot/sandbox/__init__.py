"""Running untrusted (model-generated) programs: each in its own locked-down process, many in parallel.

Takes in: `Program`s (prompt + completion + test + entry point) and a `SandboxConfig`. Gives out: one result
per program (passed / failed / timed out / error, with the reason). `client.py` is the harness side;
`server.py` (the `python -I -S` worker), `checker.py` (the trusted process that runs the test),
`channel.py` (the plain-data pipe protocol between them), `child.py` (the program's process: the
audit-hook guard, the candidate's call loop, the in-process fallback), `kernel.py` (namespaces, mounts,
seccomp), `rootfs.py` (the minimal filesystem view), `verdict.py` (how a job ended) and `cleanup.py` run
inside the sandbox and use only the standard library, so they stay importable on their own.
"""

from codeparrot.sandbox.client import (
    ALLOW_ENV,
    Program,
    Sandbox,
    SandboxConfig,
    code_execution_allowed,
    describe_layers,
)

__all__ = ["ALLOW_ENV", "Program", "Sandbox", "SandboxConfig", "code_execution_allowed", "describe_layers"]

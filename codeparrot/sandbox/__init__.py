"""Running untrusted (model-generated) programs: each in its own locked-down process, many in parallel.

Takes in: `Program`s (prompt + completion + test + entry point) and a `SandboxConfig`. Gives out: one result
per program (passed / failed / timed out / error, with the reason). `client.py` is the harness side;
`server.py` (the `python -I -S` worker), `child.py` (the audit-hook guard and checker) and `kernel.py`
(namespaces, mounts, seccomp) run inside the sandbox and use only the standard library, so they stay
importable on their own.
"""

from codeparrot.sandbox.client import (ALLOW_ENV, Program, Sandbox, SandboxConfig, code_execution_allowed,
                                       describe_layers)

__all__ = ["ALLOW_ENV", "Program", "Sandbox", "SandboxConfig", "code_execution_allowed", "describe_layers"]

"""One error type for every user-facing failure, and the CLI wrapper that prints it as one line.

Library code raises `CodeParrotError("what went wrong, naming the file/line/key")`; scripts wrap their
`main()` in `run_cli`, which prints `error: <message>` to stderr and exits with status 2 instead of a
traceback. Anything else (a real bug) still shows its traceback.

Under a multi-process launcher (`accelerate launch --num_processes N`, torchrun) every process runs the same
checks and fails the same way; only the main process (RANK 0) prints the line, so it appears once.
"""

from __future__ import annotations

import os
import sys
from typing import Callable


class CodeParrotError(Exception):
    """A problem with the user's input or environment, reported as one line without a traceback."""


def run_cli(main: Callable[[], int | None]) -> None:
    """Run a script's `main()`, turning `CodeParrotError` and Ctrl-C into a one-line message and exit code."""
    try:
        code = main()
    except CodeParrotError as err:
        if is_main_launched_process():
            print(f"error: {err}", file=sys.stderr, flush=True)
        sys.exit(2)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)
    sys.exit(code or 0)


def is_main_launched_process() -> bool:
    """True unless this process is a non-zero rank started by a distributed launcher (which sets RANK)."""
    return os.environ.get("RANK", "0").strip() in ("", "0")

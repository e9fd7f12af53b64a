"""One error type for every user-facing failure, and the CLI wrapper that prints it as one line.

Library code raises `CodeParrotError("what went wrong, naming the file/line/key")`; scripts wrap their
`main()` in `run_cli`, which prints `error: <message>` to stderr and exits with status 2 instead of a
traceback. Anything else (a real bug) still shows its traceback.
"""

from __future__ import annotations

import sys
from typing import Callable


class CodeParrotError(Exception):
    """A problem with the user's input or environment, reported as one line without a traceback."""


def run_cli(main: Callable[[], int | None]) -> None:
    """Run a script's `main()`, turning `CodeParrotError` and Ctrl-C into a one-line message and exit code."""
    try:
        code = main()
    except CodeParrotError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)
    sys.exit(code or 0)

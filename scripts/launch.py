"""`accelerate launch` whose failure report is the processes' own one-line error.

    python scripts/launch.py [accelerate launch flags] scripts/train.py [script flags]

Takes exactly `accelerate launch`'s flags and starts the same processes (it runs accelerate's launcher in this
process). The difference is only on failure: instead of the launcher's `CalledProcessError`/`ChildFailedError`
traceback printed after the processes' output, the `error:` line the main process printed stays the last line
(or one line names the rank that crashed and how). See `codeparrot/training/launcher.py`.
"""

from __future__ import annotations

import sys

from codeparrot.errors import run_cli
from codeparrot.training.launcher import launch


def main() -> int:
    if len(sys.argv) < 2 or sys.argv[1] in ("-h", "--help"):
        # accelerate's own --help lists every launcher flag
        print(__doc__.strip() + "\n", flush=True)
    return launch(sys.argv[1:])


if __name__ == "__main__":
    run_cli(main)

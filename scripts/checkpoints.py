"""Browse and manage a checkpoint repository (a local git repository path, or a Hub id user/name).

    python scripts/checkpoints.py list REPO                                   experiments: branches, latest step, date
    python scripts/checkpoints.py log REPO --branch NAME                      checkpoints on a branch, newest first
    python scripts/checkpoints.py download REPO --revision REV --output-dir DIR   a folder from_pretrained loads
    python scripts/checkpoints.py promote REPO --revision REV                 make a checkpoint the main model
    python scripts/checkpoints.py plot REPO --branch NAME --output PNG [--dataset PATH]   validation loss per checkpoint

REV is a branch, a tag or a commit id (as `log` prints it, full or abbreviated). `promote` with a branch picks
the branch's checkpoint with the lowest validation loss pushed with it (`metrics.json`; the newest when none
was pushed) and says which and why; with a commit or tag it promotes exactly that. It prints what `main`
held before. `plot` uses the losses pushed with the checkpoints, or computes them on --dataset.
"""

from __future__ import annotations

import argparse

from codeparrot.config import add_flags, config_from_args
from codeparrot.errors import run_cli
from codeparrot.tools.checkpoints import COMMANDS


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (cls, _) in COMMANDS.items():
        add_flags(sub.add_parser(name, help=" ".join(cls.__doc__.split())), cls)
    args = p.parse_args(argv)
    cls, run = COMMANDS[args.command]
    run(config_from_args(cls, args))
    return 0


if __name__ == "__main__":
    run_cli(main)

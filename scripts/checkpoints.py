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

from codeparrot.atomic_io import ensure_writable_file
from codeparrot.config_flags import parse_subcommand
from codeparrot.errors import run_cli


def main(argv: list[str] | None = None) -> int:
    from codeparrot.tools.checkpoints import COMMANDS  # the Hub client: inside run_cli, so Ctrl-C is `interrupted`

    name, cfg = parse_subcommand(COMMANDS, argv, __doc__)
    if name == "plot":  # before the losses are read or computed (--dataset: a model evaluation per checkpoint)
        ensure_writable_file(cfg.output, what="PNG")
    COMMANDS[name][1](cfg)
    return 0


if __name__ == "__main__":
    run_cli(main)

"""Draw the project's PNG plots from the files its stages write.

    python scripts/plot.py training RUN_DIR/metrics.jsonl --output-dir PLOTS   loss vs tokens, lr, tokens/s
    python scripts/plot.py filters CLEAN/stats.json --output PLOTS/filters.png  what each filter/dedup removed

(Validation loss across an experiment's checkpoints: `scripts/checkpoints.py plot`.)
"""

from __future__ import annotations

from codeparrot.config_flags import parse_subcommand
from codeparrot.errors import run_cli
from codeparrot.tools.plot_commands import PLOT_COMMANDS


def main(argv: list[str] | None = None) -> int:
    name, cfg = parse_subcommand(PLOT_COMMANDS, argv, __doc__)
    for path in PLOT_COMMANDS[name][1](cfg):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    run_cli(main)

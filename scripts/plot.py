"""Draw the project's PNG plots from the files its stages write.

    python scripts/plot.py training RUN_DIR/metrics.jsonl --output-dir PLOTS   loss vs tokens, lr, tokens/s
    python scripts/plot.py filters CLEAN/stats.json --output PLOTS/filters.png  what each filter/dedup removed

(Validation loss across an experiment's checkpoints: `scripts/checkpoints.py plot`.)
"""

from __future__ import annotations

from codeparrot.atomic_io import ensure_writable_dir, ensure_writable_file
from codeparrot.config_flags import parse_subcommand
from codeparrot.errors import run_cli


def main(argv: list[str] | None = None) -> int:
    from codeparrot.tools.plot_commands import PLOT_COMMANDS  # numpy: inside run_cli, so Ctrl-C is `interrupted`

    name, cfg = parse_subcommand(PLOT_COMMANDS, argv, __doc__)
    if name == "training":  # before the plots are drawn
        ensure_writable_dir(cfg.output_dir)
    else:
        ensure_writable_file(cfg.output, what="PNG")
    for path in PLOT_COMMANDS[name][1](cfg):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    run_cli(main)

"""Draw the project's PNG plots from the files its stages write.

    python scripts/plot.py training RUN_DIR/metrics.jsonl --output-dir PLOTS   loss vs tokens, lr, tokens/s
    python scripts/plot.py filters CLEAN/stats.json --output PLOTS/filters.png  what each filter/dedup removed

(Validation loss across an experiment's checkpoints: `scripts/checkpoints.py plot`.)
"""

from __future__ import annotations

import argparse

from codeparrot.errors import run_cli


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    tr = sub.add_parser("training", help="train/validation loss vs tokens seen, learning rate, tokens/s")
    tr.add_argument("metrics", help="metrics.jsonl written by scripts/train.py in its run folder")
    tr.add_argument("--output-dir", required=True, help="folder the PNGs are written to")
    fi = sub.add_parser("filters", help="files removed by each filter and dedup stage, and files kept")
    fi.add_argument("stats", help="stats.json written by scripts/preprocess.py")
    fi.add_argument("--output", required=True, help="PNG to write")
    args = parser.parse_args()

    from codeparrot.tools.plots import plot_filter_stats, plot_training

    paths = plot_training(args.metrics, args.output_dir) if args.command == "training" else [
        plot_filter_stats(args.stats, args.output)]
    for path in paths:
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    run_cli(main)

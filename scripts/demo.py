"""Run the whole CodeParrot pipeline on the embedded default corpus (the Python standard library).

Stages: export -> preprocess (near dedup) -> tokenizer -> initialize tiny model in a local repository ->
pretokenize -> train a few minutes (checkpoints pushed to the experiment branch) -> validation loss ->
generations -> HumanEval on a handful of tasks -> summary. Finished stages are reused unless --fresh.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from codeparrot.errors import run_cli
from codeparrot.tools.demo import run_demo


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output-dir", type=Path, default=Path("demo_output"), help="where every stage writes (default: demo_output)")
    parser.add_argument("--fresh", action="store_true", help="delete the output folder first and redo every stage")
    parser.add_argument("--train-minutes", type=float, default=4.0, help="wall-clock budget of the training stage (default: 4)")
    parser.add_argument("--humaneval-tasks", type=int, default=5, help="HumanEval problems the demo model is scored on (default: 5)")
    parser.add_argument("--num-processes", type=int, default=1, help="training processes (CPU: 2 uses both cores as 2 ranks)")
    args = parser.parse_args()
    run_demo(args.output_dir, args.fresh, args.train_minutes, args.humaneval_tasks, args.num_processes)
    return 0


if __name__ == "__main__":
    run_cli(main)

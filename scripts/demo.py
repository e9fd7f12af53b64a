"""Run the whole CodeParrot pipeline on the embedded default corpus (the Python standard library).

Stages: export -> preprocess (near dedup) -> tokenizer -> initialize tiny model in a local repository ->
pretokenize -> train a few minutes (checkpoints pushed to the experiment branch) -> validation loss ->
generations -> HumanEval on a handful of tasks -> summary. Finished stages are reused unless --fresh.
"""

from __future__ import annotations

from codeparrot.config_flags import parse_config
from codeparrot.errors import run_cli
from codeparrot.tools.demo import DemoConfig, run_demo


def main(argv: list[str] | None = None) -> int:
    run_demo(parse_config(DemoConfig, argv, __doc__))
    return 0


if __name__ == "__main__":
    run_cli(main)

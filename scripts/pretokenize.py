"""Tokenize the clean shards once into memory-mapped token files: the fast data path for real training runs.

    python scripts/pretokenize.py --dataset clean --tokenizer tokenizer --output-dir pretokenized [--num-workers N]

With a preprocess output root (a folder holding train/ and valid/), each split goes to its own folder
(OUTPUT_DIR/train, OUTPUT_DIR/valid); otherwise the given shards go to OUTPUT_DIR. Each output folder holds
tokens.bin (uint16 when the vocabulary fits, else uint32; EOS after every file) and index.json (counts, dtype,
EOS id, tokenizer fingerprint). Point the training config's data.train / data.valid at those folders.

Written atomically: an interrupted run (Ctrl-C, a kill, a power loss, a full disk; during the final commit too)
leaves only a hidden .NAME.partial/ folder, and running the same command again resumes from it; a folder already
holding this data tokenized by this tokenizer is skipped. A second run on the same output (the command started on
every node) waits for the first, naming it (a lock on the hidden .NAME.lock beside the output), then reuses its
output.
"""

from __future__ import annotations

from codeparrot.config_flags import parse_config
from codeparrot.errors import run_cli
from codeparrot.training.config import PretokenizeConfig


def main(argv: list[str] | None = None) -> int:
    cfg = parse_config(PretokenizeConfig, argv, __doc__)  # also checks that the shards exist
    from codeparrot.training.datasets.pretokenize import run_pretokenize  # after the checks: torch loads here

    run_pretokenize(cfg)
    return 0


if __name__ == "__main__":
    run_cli(main)

"""Validation loss and perplexity of any checkpoint on a dataset, on one or many processes.

    python scripts/validation_loss.py --model REPO --revision RUN_BRANCH --dataset PATH [--output result.json]
    python scripts/launch.py --num_processes 4 scripts/validation_loss.py --model REPO --revision main --dataset PATH

The loss is token-weighted (sum of next-token cross-entropies / predicted tokens) over the whole split (or
--max-eval-steps batches per process); each process reads its own shard and every sequence counts once.
"""

from __future__ import annotations

from codeparrot.config_flags import parse_config
from codeparrot.errors import run_cli
from codeparrot.training.config import ValidationLossConfig


def main(argv: list[str] | None = None) -> int:
    cfg = parse_config(ValidationLossConfig, argv, __doc__)
    from codeparrot.training.validation import run_validation_loss  # after parsing: --help stays fast

    run_validation_loss(cfg)
    return 0


if __name__ == "__main__":
    run_cli(main)

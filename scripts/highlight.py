"""Colour a Python file by how surprised the model is by each token, as a self-contained HTML page.

    python scripts/highlight.py --model REPO [--revision REV] path/to/file.py --output file.html

Each token's loss is -log p(token | everything before it) in nats, scored like training (the file follows
an EOS token). Files longer than the model's context are scored with a sliding window (--stride). Hover a
token in the page for its probability and the model's top-k alternatives. The most surprising lines are
also printed here.
"""

from __future__ import annotations

from codeparrot.atomic_io import ensure_writable_file
from codeparrot.config_flags import parse_config
from codeparrot.errors import run_cli
from codeparrot.inference.config import HighlightConfig


def main(argv: list[str] | None = None) -> int:
    cfg = parse_config(HighlightConfig, argv, __doc__)
    ensure_writable_file(cfg.output, what="HTML page")  # before the model loads and scores, not after
    from codeparrot.inference.highlight import run_highlight  # after parsing: --help stays fast

    run_highlight(cfg)
    return 0


if __name__ == "__main__":
    run_cli(main)

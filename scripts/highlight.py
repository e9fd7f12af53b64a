"""Colour a Python file by how surprised the model is by each token, as a self-contained HTML page.

    python scripts/highlight.py --model REPO [--revision REV] path/to/file.py --output file.html

Each token's loss is -log p(token | everything before it) in nats, scored like training (the file follows
an EOS token). Files longer than the model's context are scored with a sliding window (--stride). Hover a
token in the page for its probability and the model's top-k alternatives. The most surprising lines are
also printed here.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from codeparrot.errors import CodeParrotError, run_cli


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("file", help="the source file to score (UTF-8)")
    p.add_argument("--model", required=True,
                   help="model repository: a local checkpoint repository (path), a Hub id, or a plain model folder")
    p.add_argument("--revision", default=None, help="branch (experiment), tag or commit to load (default: main)")
    p.add_argument("--output", required=True, help="HTML page to write (atomically)")
    p.add_argument("--top-k", type=int, default=5, help="alternatives shown per token on hover (default 5)")
    p.add_argument("--lines", type=int, default=10, help="most surprising lines to print and list (default 10)")
    p.add_argument("--rank-by", choices=("mean", "max"), default="mean",
                   help="rank lines by their mean or their max token loss (default mean)")
    p.add_argument("--context", type=int, default=None,
                   help="tokens per scoring window (default: the model's full context)")
    p.add_argument("--stride", type=int, default=None,
                   help="new tokens scored per window after the first; each then sees at least context - stride + 1 "
                        "tokens of context (default context/2; 1 = full context for every token, slowest)")
    p.add_argument("--max-loss", type=float, default=8.0,
                   help="loss (nats) at the top of the colour scale; higher losses are clipped (default 8, "
                        "p ≈ 0.0003); fixed so that pages of different checkpoints compare")
    p.add_argument("--device", default="auto", help="cpu, cuda, ... (default: cuda when available)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import transformers

    from codeparrot.atomic_io import atomic_write_text
    from codeparrot.inference.completion import read_source_file
    from codeparrot.inference.highlight import format_lines, most_surprising, render_html, score_file
    from codeparrot.repository.model import load_model_and_tokenizer

    transformers.utils.logging.disable_progress_bar()
    path = Path(args.file)
    text = read_source_file(path)
    if not text:
        raise CodeParrotError(f"{path}: the file is empty; nothing to score")
    if Path(args.output).resolve() == path.resolve():
        raise CodeParrotError(f"--output {args.output} is the input file; choose another path for the page")
    if args.lines < 0:
        raise CodeParrotError(f"--lines must be >= 0, got {args.lines}")
    model, tokenizer = load_model_and_tokenizer(args.model, args.revision, args.device)
    scores = score_file(model, tokenizer, text, context=args.context, stride=args.stride, top_k=args.top_k,
                        progress=True)
    where = args.model + (f"@{args.revision}" if args.revision else "")
    page = render_html(scores, title=path.name, subtitle=f"{path} · model {where}", max_loss=args.max_loss,
                       n_lines=args.lines, rank_by=args.rank_by)
    atomic_write_text(args.output, page)
    n_tok = len(scores.tokens)
    print(f"{path}: {n_tok:,} tokens, mean loss {scores.mean_loss:.3f} nats/token, "
          f"{scores.bits_per_byte:.3f} bits/byte -> {args.output}")
    if args.lines:
        print(format_lines(most_surprising(scores.lines, args.lines, args.rank_by), args.rank_by))
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    run_cli(main)

"""Tokenize the clean shards once into memory-mapped token files: the fast data path for real training runs.

    python scripts/pretokenize.py --dataset clean --tokenizer tokenizer --output-dir pretokenized [--num-workers N]

With a preprocess output root (a folder holding train/ and valid/), each split goes to its own folder
(OUTPUT_DIR/train, OUTPUT_DIR/valid); otherwise the given shards go to OUTPUT_DIR. Each output folder holds
tokens.bin (uint16 when the vocabulary fits, else uint32; EOS after every file) and index.json (counts, dtype,
EOS id, tokenizer fingerprint). Point the training config's data.train / data.valid at those folders.

Written atomically: an interrupted run leaves only a hidden .NAME.partial/ folder, and running the same command
again resumes from it; a folder already holding this data tokenized by this tokenizer is skipped.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from codeparrot.data.records import resolve_data_files, split_folders
from codeparrot.errors import run_cli


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dataset", required=True, nargs="+", metavar="PATH_OR_GLOB",
                   help="clean gzip/plain JSONL shards: a preprocess output root with train/ and valid/ (each "
                        "split is pretokenized), a folder of shards, a glob, or files")
    p.add_argument("--tokenizer", required=True, metavar="DIR",
                   help="tokenizer folder (scripts/train_tokenizer.py), checkpoint repository or Hub id")
    p.add_argument("--output-dir", required=True, type=Path,
                   help="where the token files go (OUTPUT_DIR/train and OUTPUT_DIR/valid for a preprocess root)")
    p.add_argument("--num-workers", type=int, default=max(1, (os.cpu_count() or 1)),
                   help="tokenizer processes (default: the number of CPU cores); output does not depend on it")
    p.add_argument("--text-column", default="content", help="JSON field holding the file's text (default: content)")
    p.add_argument("--batch-size", type=int, default=1000,
                   help="records per batched tokenizer call and per task handed to a worker (default: 1000)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    args = p.parse_args(argv)
    if args.num_workers < 1 or args.batch_size < 1:
        p.error("--num-workers and --batch-size must be >= 1")
    return args


def splits_of(dataset: list[str], output_dir: Path) -> list[tuple[str | list[str], Path]]:
    """(shards, output folder) pairs: one per split of a preprocess root, else the dataset as given."""
    splits = split_folders(Path(dataset[0]).expanduser()) if len(dataset) == 1 else {}
    if splits:
        return [(str(folder), output_dir / name) for name, folder in splits.items()]
    return [(dataset[0] if len(dataset) == 1 else dataset, output_dir)]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    jobs = splits_of(args.dataset, args.output_dir)
    for shards, _ in jobs:  # a wrong path fails now, before the tokenizer (and torch) are loaded
        resolve_data_files(shards)
    from codeparrot.tokenizer import load_tokenizer
    from codeparrot.training.datasets.pretokenized import pretokenize

    tokenizer = load_tokenizer(args.tokenizer)
    for shards, out in jobs:
        print(f"pretokenizing {shards} -> {out} with {args.num_workers} worker(s)", file=sys.stderr)
        index = pretokenize(shards, tokenizer, out, text_column=args.text_column, num_workers=args.num_workers,
                            batch_size=args.batch_size, progress=not args.quiet)
        if index.get("reused"):
            print(f"{out}: already holds this data tokenized by this tokenizer ({index['n_tokens']:,} tokens); "
                  "nothing to do")
            continue
        print(f"{out}: {index['n_tokens']:,} tokens ({index['dtype']}) from {index['n_records']:,} files in "
              f"{len(index['files'])} shard(s); {index['seconds']:.1f} s, {index['tokens_per_second']:,} tokens/s")
    return 0


if __name__ == "__main__":
    run_cli(main)

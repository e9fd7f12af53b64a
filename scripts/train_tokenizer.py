"""Train CodeParrot's tokenizer: a GPT-2-style byte-level BPE, from scratch, on the clean training shards.

    python scripts/train_tokenizer.py --dataset clean/train --output-dir tokenizer [--vocab-size 32768]
        [--n-examples 32768] [--repo REPO]

Streams the first --n-examples files, trains, then prints and saves (tokenizer_stats.json) the bytes per
token it achieves on the validation split. `AutoTokenizer.from_pretrained(OUTPUT_DIR)` loads the result.
"""

from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

from codeparrot.errors import CodeParrotError, run_cli


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dataset", required=True, nargs="+", metavar="PATH_OR_GLOB",
                   help="training data: gzip/plain JSONL shards as written by preprocess.py - a folder (e.g. "
                        "clean/train, or clean with train/ and valid/ inside), a glob, or files")
    p.add_argument("--output-dir", required=True, type=Path,
                   help="folder for the tokenizer (written atomically; an existing tokenizer there is replaced)")
    p.add_argument("--vocab-size", type=int, default=32768,
                   help="vocabulary size including the 256 byte symbols and <|endoftext|> (default: 32768, "
                        "CodeParrot's)")
    p.add_argument("--n-examples", type=int, default=32768,
                   help="number of files to train on, taken in order from the start of the dataset "
                        "(default: 32768, CodeParrot's)")
    p.add_argument("--text-column", default="content", help="JSON field holding the file's text (default: content)")
    p.add_argument("--valid-dataset", nargs="+", metavar="PATH_OR_GLOB",
                   help="files to measure bytes/token on (a preprocess root stands for its valid/; default: the "
                        "valid/ split next to the training shards, or without one the files that follow the training "
                        "examples in the stream)")
    p.add_argument("--valid-examples", type=int, default=2000,
                   help="at most this many validation files are measured (default: 2000)")
    p.add_argument("--repo", help="optionally commit the tokenizer to this checkpoint repository's main branch "
                                  "(a local path or a Hub id user/name)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    args = p.parse_args(argv)
    if args.vocab_size < 257:
        p.error("--vocab-size must be at least 257 (256 bytes + <|endoftext|>)")
    if args.n_examples < 1 or args.valid_examples < 1:
        p.error("--n-examples and --valid-examples must be positive")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from codeparrot.data.records import BadRecords, iter_texts, resolve_data_files, split_files_for
    from codeparrot.tokenizer import bytes_per_token, save_tokenizer, train_tokenizer

    out = args.output_dir
    if out.exists() and (not out.is_dir() or (any(out.iterdir()) and not (out / "tokenizer.json").is_file())):
        raise CodeParrotError(f"{out} exists and is not a tokenizer folder; refusing to replace it")
    train_files = resolve_data_files(args.dataset, split="train")  # a preprocess root stands for its train/
    valid_files = resolve_data_files(args.valid_dataset, split="valid") if args.valid_dataset else None
    if valid_files is None and len(args.dataset) == 1:
        try:  # a preprocess root's valid/ split; a small corpus may have none (then held-out files are used)
            valid_files = split_files_for(args.dataset[0], "valid")
        except CodeParrotError:
            valid_files = None
    skipped = BadRecords()  # bad records are counted and skipped, not fatal, in a long run
    stream = iter_texts(train_files, args.text_column, skipped)
    print(f"training a {args.vocab_size}-token byte-level BPE on up to {args.n_examples} files from "
          f"{len(train_files)} shard(s)", file=sys.stderr)
    tokenizer = train_tokenizer(stream, vocab_size=args.vocab_size, length=args.n_examples,
                                show_progress=not args.quiet)
    stats = dict(tokenizer.train_stats)
    if stats["train_examples"] < args.n_examples:
        print(f"note: the dataset has only {stats['train_examples']} usable files (asked for {args.n_examples})",
              file=sys.stderr)
    if valid_files:
        valid_texts = list(itertools.islice(iter_texts(valid_files, args.text_column, skipped), args.valid_examples))
        valid_source = f"valid split ({len(valid_files)} shard(s))"
    else:  # the files after the training examples: unseen by the trainer
        valid_texts = list(itertools.islice(stream, args.valid_examples))
        valid_source = "held-out files after the training examples"
    # Training is the expensive part: without held-out text the tokenizer is still saved, bytes/token marked
    # as not measured, rather than thrown away.
    bpt = bytes_per_token(tokenizer, valid_texts) if valid_texts else None
    if bpt is None:
        print("warning: no validation files to measure bytes/token on (no valid/ split and no files beyond "
              "--n-examples); saving the tokenizer without it (pass --valid-dataset to measure)", file=sys.stderr)
    stats.update(valid_examples=len(valid_texts), valid_source=valid_source,
                 valid_bytes_per_token=None if bpt is None else round(bpt, 4), skipped_records=dict(skipped.counts),
                 text_column=args.text_column)
    if skipped.total:
        print("skipped records: " + "; ".join(skipped.summary_lines()), file=sys.stderr)
    save_tokenizer(tokenizer, out, stats)
    print(f"trained on {stats['train_examples']} files ({stats['train_bytes'] / 1e6:.1f} MB) in "
          f"{stats['train_seconds']:.1f} s ({stats['train_mb_per_s']:.2f} MB/s); vocab {len(tokenizer)}")
    if bpt is not None:
        print(f"bytes/token on {len(valid_texts)} {valid_source}: {bpt:.3f}")
    print(f"saved to {out}")
    if args.repo:
        from codeparrot.repository.refs import open_repository

        repo = open_repository(args.repo, create=True)
        measured = "" if bpt is None else f", {bpt:.2f} bytes/token"
        commit = repo.commit_folder(out, "main", f"tokenizer (vocab {len(tokenizer)}{measured})")
        print(f"committed to {args.repo} main: {commit[:12]}")
    return 0


if __name__ == "__main__":
    run_cli(main)

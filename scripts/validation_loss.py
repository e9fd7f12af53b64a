"""Validation loss and perplexity of any checkpoint on a dataset, on one or many processes.

    python scripts/validation_loss.py --model REPO --revision RUN_BRANCH --dataset PATH [--output result.json]
    accelerate launch --num_processes 4 scripts/validation_loss.py --model REPO --revision main --dataset PATH

The loss is token-weighted (sum of next-token cross-entropies / predicted tokens) over the whole split (or
--max-eval-steps batches per process); each process reads its own shard and every sequence counts once.
"""

from __future__ import annotations

import argparse
import json

from codeparrot.errors import run_cli


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="model repository (local path or Hub id) or a model folder "
                                                  "(e.g. a run's checkpoints/step-N or final/)")
    p.add_argument("--revision", default=None, help="branch, tag or commit of --model (default: main; none for a folder)")
    p.add_argument("--dataset", required=True, help="pretokenized folder, JSON/JSONL(.gz) shards (file, folder, glob) "
                                                    "or a Hub dataset id")
    p.add_argument("--tokenizer", default=None, help="tokenizer folder/repository (default: the model's)")
    p.add_argument("--seq-length", type=int, default=None, help="tokens per sequence (default: the model's context)")
    p.add_argument("--batch-size", type=int, default=8, help="sequences per process per batch (default: 8)")
    p.add_argument("--max-eval-steps", type=int, default=-1,
                   help="batches per process; -1 = the whole dataset (default)")
    p.add_argument("--text-column", default="content", help="record field with the text (default: content)")
    p.add_argument("--num-workers", type=int, default=0, help="DataLoader workers per process (default: 0)")
    p.add_argument("--mixed-precision", choices=["no", "fp16", "bf16"], default=None,
                   help="default: from the Accelerate config/launcher")
    p.add_argument("--output", default=None, help="also write the result as JSON here (atomically)")
    args = p.parse_args(argv)

    from codeparrot.atomic_io import atomic_write_json
    from codeparrot.training.validation import validation_loss

    result = validation_loss(args.model, args.dataset, revision=args.revision, tokenizer_ref=args.tokenizer,
                             seq_length=args.seq_length, batch_size=args.batch_size,
                             max_eval_steps=args.max_eval_steps, text_column=args.text_column,
                             num_workers=args.num_workers, mixed_precision=args.mixed_precision)
    from accelerate import PartialState

    if PartialState().is_main_process:
        print(f"validation loss {result['loss']:.4f} | perplexity {result['perplexity']:.2f} | "
              f"{result['tokens']:,} tokens | {result['processes']} process(es) | {args.model}"
              f"{'@' + args.revision if args.revision else ''} on {args.dataset}")
        if args.output:
            atomic_write_json(args.output, result)
        else:
            print(json.dumps(result))
    return 0


if __name__ == "__main__":
    run_cli(main)

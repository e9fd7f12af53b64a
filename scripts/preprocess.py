"""Clean a BigQuery GitHub export into deduplicated, filtered, decontaminated train/valid shards.

    python scripts/preprocess.py --input PATH_OR_GLOB [...] --output-dir DIR [--near-dedup] [--num-workers N]

Steps: (1) exact dedup on the content with all whitespace removed, first occurrence in input order kept;
(2) CodeParrot's heuristic filters, in order, each switchable; (3) HumanEval decontamination; (4) with
--near-dedup, MinHash LSH over identifier-token sets, clusters as connected components, the first file of each
cluster kept; (5) a deterministic train/valid split by content hash into gzip JSONL shards
DIR/train/file-000000000001.json.gz, DIR/valid/..., plus DIR/stats.json and DIR/duplicate_clusters.json.
Bad records are counted by reason (first file:line shown) and skipped; --strict stops at the first one.
DIR is written atomically: a failed or interrupted run leaves no half-written output.
"""

from __future__ import annotations

import argparse
import dataclasses
import signal
import sys
import typing
from typing import Any

from codeparrot.data.filters import FilterConfig, filter_config_from_args
from codeparrot.data.preprocess import PreprocessConfig, available_cores, preprocess
from codeparrot.errors import run_cli


def _add_filter_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("heuristic filters (CodeParrot's defaults; FIXED marks a corrected definition)")
    hints = typing.get_type_hints(FilterConfig)
    for f in dataclasses.fields(FilterConfig):
        flag = "--" + f.name.replace("_", "-")
        tp = hints[f.name]
        if tp is bool:
            group.add_argument(flag, action=argparse.BooleanOptionalAction, default=f.default,
                               help=f.metadata["help"].replace("%", "%%") + " (default: on)")
        else:
            group.add_argument(flag, type=tp, default=f.default, metavar=tp.__name__.upper(),
                               help=f.metadata["help"].replace("%", "%%") + " (default: %(default)s)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--input", nargs="+", action="extend", required=True, metavar="PATH_OR_GLOB",
                        help="export files (.json/.jsonl, optionally .gz), directories (searched recursively) or "
                             "globs; repeatable")
    parser.add_argument("--output-dir", required=True, help="output folder (replaced atomically at the end)")
    parser.add_argument("--near-dedup", action="store_true", help="also remove near duplicates (MinHash LSH)")
    parser.add_argument("--num-workers", type=int, default=available_cores(),
                        help="worker processes for filtering, decontamination and MinHash; 0 runs everything in "
                             "this process; the output is identical for every value (default: %(default)s, the "
                             "core count)")
    parser.add_argument("--seed", type=int, default=0,
                        help="seed of the random filters and MinHash: same seed, same output (default 0)")
    parser.add_argument("--text-column", default="content", help="JSON key holding the file text (default content)")
    parser.add_argument("--strict", action="store_true",
                        help="stop with an error naming file:line at the first bad record instead of counting it")
    parser.add_argument("--valid-fraction", type=float, default=0.01,
                        help="share of files in the valid split, chosen by content hash (default 0.01)")
    parser.add_argument("--samples-per-file", type=int, default=100_000, help="records per shard (default 100000)")
    parser.add_argument("--tokenizer", default=None,
                        help="tokenizer folder (AutoTokenizer.from_pretrained) for the characters-per-token filter; "
                             "without it that filter is off")
    parser.add_argument("--decontaminate", action=argparse.BooleanOptionalAction, default=True,
                        help="drop files containing a HumanEval problem's docstring or canonical solution "
                             "(whitespace-insensitive; solutions under 40 non-space characters are skipped as not "
                             "distinctive) (default: on)")
    near = parser.add_argument_group("near deduplication (with --near-dedup)")
    near.add_argument("--num-perm", type=int, default=256, help="MinHash permutations (default 256)")
    near.add_argument("--jaccard-threshold", type=float, default=0.85,
                      help="estimated Jaccard similarity of identifier-token sets that links two files (default 0.85)")
    near.add_argument("--min-tokens", type=int, default=10,
                      help="files with fewer identifier tokens are never clustered (default 10)")
    parser.add_argument("--compression-level", type=int, default=6, help="gzip level 0-9 of the shards (default 6)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    _add_filter_flags(parser)
    return parser


def format_summary(stats: dict[str, Any]) -> str:
    """The human summary: files kept and removed by reason, then seconds and throughput per stage."""
    rows = [(f"bad records: {r}", c) for r, c in stats["bad_records"].items()]
    rows.append(("exact duplicates", stats["exact_duplicates"]))
    rows += [(f"filtered: {r}", c) for r, c in stats["filtered"].items()]
    rows.append(("HumanEval decontamination", stats["decontaminated"]))
    if stats["config"]["near_dedup"]:
        rows.append((f"near duplicates ({stats['near_duplicate_clusters']} clusters)", stats["near_duplicates"]))
    rows += [("kept: train", stats["kept_train"]), ("kept: valid", stats["kept_valid"])]
    total, width = max(stats["input_records"], 1), max(len(name) for name, _ in rows) + 2
    lines = [f"  {'':<{width}}{'files':>9}  {'share':>6}"]
    lines += [f"  {name:<{width}}{count:>9,}  {100 * count / total:5.1f}%" for name, count in rows]
    lines.append(f"  {'input records':<{width}}{stats['input_records']:>9,}  -> "
                 f"{stats['kept_train'] + stats['kept_valid']:,} kept; {stats['bytes_in'] / 1e6:.1f} MB in, "
                 f"{stats['bytes_out'] / 1e6:.1f} MB out")
    lines += [f"  first '{reason}' at {where}" for reason, where in stats["bad_record_examples"].items()]
    lines.append(f"  {'stage':<14}{'seconds':>9}{'files/s':>10}{'MB/s':>8}")
    for stage, sec in stats["seconds"].items():
        fps, mbs = stats["files_per_second"].get(stage), stats["mb_per_second"].get(stage)
        lines.append(f"  {stage:<14}{sec:>9.2f}{'' if fps is None else f'{fps:,.0f}':>10}"
                     f"{'' if mbs is None else f'{mbs:.1f}':>8}")
    lines.append("  (stages in CPU seconds, files/s per core; filters, decontaminate and minhash summed over workers; "
                 "pass1, pass2, total wall-clock)")
    return "\n".join(lines)


def main() -> int:
    args = build_parser().parse_args()
    # A `kill` (SIGTERM) unwinds like Ctrl-C, so the temporary output folder is removed.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    filters = filter_config_from_args(args)
    cfg = PreprocessConfig(
        inputs=args.input, output_dir=args.output_dir, text_column=args.text_column, strict=args.strict,
        num_workers=args.num_workers, seed=args.seed, near_dedup=args.near_dedup, num_perm=args.num_perm,
        jaccard_threshold=args.jaccard_threshold, min_tokens=args.min_tokens, decontaminate=args.decontaminate,
        valid_fraction=args.valid_fraction, samples_per_file=args.samples_per_file, tokenizer=args.tokenizer,
        compression_level=args.compression_level, progress=False if args.no_progress else None, filters=filters)
    stats = preprocess(cfg)
    print(format_summary(stats))
    print(f"wrote {args.output_dir}/train ({stats['kept_train']} files), {args.output_dir}/valid "
          f"({stats['kept_valid']} files), stats.json" + (", duplicate_clusters.json" if args.near_dedup else ""))
    return 0


if __name__ == "__main__":
    run_cli(main)

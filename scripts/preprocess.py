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

import sys

from codeparrot.errors import run_cli


def main(argv: list[str] | None = None) -> int:
    # inside run_cli (Ctrl-C while they load is `interrupted`), the engine's after parsing (--help stays fast)
    from codeparrot.data.preprocess_config import parse_preprocess_config

    cfg = parse_preprocess_config(argv, __doc__)
    from codeparrot.data.preprocess import preprocess
    from codeparrot.data.preprocess_stats import format_summary, printable

    stats = preprocess(cfg)
    print(format_summary(stats))
    for warning in stats["warnings"]:
        print(f"warning: {warning}", file=sys.stderr)
    clusters = ", duplicate_clusters.json" if cfg.near_dedup else ""
    print(printable(f"wrote {cfg.output_dir}/train ({stats['kept_train']} files), {cfg.output_dir}/valid "
                    f"({stats['kept_valid']} files), stats.json{clusters}"))
    return 0


if __name__ == "__main__":
    run_cli(main)

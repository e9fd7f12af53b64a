"""Export local source trees (default: this interpreter's standard library) in CodeParrot's BigQuery format.

    python scripts/export_local.py [SRC_DIR ...] --output-dir DIR

Writes DIR/file-000000000001.json.gz, ... : one JSON line per .py file with 1 KiB <= size < 1 MiB and the
BigQuery export's fields `repo_name, path, copies, size, content, license` (INT64 columns as strings, as
BigQuery writes them). DIR is written atomically: an interrupted export leaves nothing behind.
"""

from __future__ import annotations

import argparse

from codeparrot.data.export import MAX_SIZE, MIN_SIZE, default_source, export_local
from codeparrot.errors import run_cli


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("src_dirs", nargs="*", metavar="SRC_DIR",
                        help=f"source trees to export; each is one repository named after its folder "
                             f"(default: the standard library, {default_source()})")
    parser.add_argument("--output-dir", required=True, help="folder for the gzip JSONL shards (replaced atomically)")
    parser.add_argument("--samples-per-file", type=int, default=100_000, help="records per shard (default 100000)")
    parser.add_argument("--extension", default=".py", help="file name suffix to export (default .py)")
    parser.add_argument("--min-size", type=int, default=MIN_SIZE, help="smallest file in bytes (default 1024)")
    parser.add_argument("--max-size", type=int, default=MAX_SIZE,
                        help="files must be smaller than this many bytes (default 1048576)")
    parser.add_argument("--repo-per-subfolder", action="store_true",
                        help="treat each top-level subfolder of a SRC_DIR as its own repository (e.g. the packages "
                             "of a site-packages folder, or a folder of cloned repositories)")
    parser.add_argument("--compression-level", type=int, default=6, help="gzip level 0-9 of the shards (default 6)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    return parser


def main() -> int:
    args = build_parser().parse_args()
    stats = export_local(args.src_dirs or None, args.output_dir, samples_per_file=args.samples_per_file,
                         suffix=args.extension, min_size=args.min_size, max_size=args.max_size,
                         repo_per_subfolder=args.repo_per_subfolder, compresslevel=args.compression_level,
                         progress=False if args.no_progress else None)
    rate = stats.files_written / max(stats.seconds, 1e-9)
    print(f"exported {stats.files_written} files ({stats.bytes_written / 1e6:.1f} MB) into {len(stats.shards)} "
          f"shard(s) under {args.output_dir} in {stats.seconds:.1f}s ({rate:.0f} files/s)")
    for reason, count in sorted(stats.skipped.items()):
        print(f"  skipped {count} ({reason})")
    return 0


if __name__ == "__main__":
    run_cli(main)

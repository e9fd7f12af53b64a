"""Export local source trees (default: this interpreter's standard library) in CodeParrot's BigQuery format.

    python scripts/export_local.py [SRC_DIR ...] --output-dir DIR

Writes DIR/file-000000000001.json.gz, ... : one JSON line per .py file with 1 KiB <= size < 1 MiB and the
BigQuery export's fields `repo_name, path, copies, size, content, license` (INT64 columns as strings, as
BigQuery writes them). DIR is written atomically: an interrupted export leaves nothing behind.
"""

from __future__ import annotations

from codeparrot.config_flags import parse_config
from codeparrot.data.export import ExportConfig, run_export
from codeparrot.errors import run_cli


def main(argv: list[str] | None = None) -> int:
    run_export(parse_config(ExportConfig, argv, __doc__))
    return 0


if __name__ == "__main__":
    run_cli(main)

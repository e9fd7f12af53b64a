"""A web app for a checkpoint repository: complete prompts, highlight surprising tokens, browse experiments.

    python scripts/app.py --model REPO [--revision REV] [--host 127.0.0.1] [--port 7860]
                          [--data-dir PREPROCESS_OUTPUT] [--runs-dir RUNS]

REPO is a local checkpoint repository (path) or a Hub id user/name, as everywhere else. The app runs offline:
Gradio's analytics and version check are off, there is no share link, and it listens on 127.0.0.1 unless
--host says otherwise. Open the printed URL in a browser; Ctrl-C stops it.
"""

from __future__ import annotations

import argparse
import threading
from pathlib import Path

from codeparrot.errors import CodeParrotError, run_cli


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True,
                   help="checkpoint repository: a local git repository path or a Hub id user/name (hf://user/name "
                        "to force the Hub)")
    p.add_argument("--revision", default=None, help="branch the pickers start on (default: main)")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default 127.0.0.1: this machine only; 0.0.0.0 exposes the app)")
    p.add_argument("--port", type=int, default=7860, help="port to listen on (default 7860)")
    p.add_argument("--data-dir", default=None,
                   help="a preprocess output folder (with stats.json) for the Data tab, e.g. demo_output/clean")
    p.add_argument("--runs-dir", default=None,
                   help="folder of run folders named like the branches, each with the metrics.jsonl its run logged "
                        "(e.g. demo_output/runs): the Experiments tab plots their validation losses")
    p.add_argument("--cache-gb", type=float, default=4.0,
                   help="memory bound of the loaded-models cache in GiB (least recently used models leave first; "
                        "default 4)")
    p.add_argument("--max-upload-kb", type=int, default=1000,
                   help="largest code a user may paste or upload, in KB (default 1000)")
    p.add_argument("--device", default="auto", help="cpu, cuda, ... (default: cuda when available)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from codeparrot.app.models import ModelCache
    from codeparrot.app.server import start
    from codeparrot.app.workspace import Workspace
    from codeparrot.repository.model import resolve_device

    for flag, value in (("--data-dir", args.data_dir), ("--runs-dir", args.runs_dir)):
        if value is not None and not Path(value).is_dir():
            raise CodeParrotError(f"{flag} {value}: not a folder")
    if args.cache_gb <= 0 or args.max_upload_kb <= 0:
        raise CodeParrotError("--cache-gb and --max-upload-kb must be positive")
    resolve_device(args.device)  # an unavailable device is an error now, not on the first request
    ws = Workspace(args.model, revision=args.revision, data_dir=Path(args.data_dir) if args.data_dir else None,
                   runs_dir=Path(args.runs_dir) if args.runs_dir else None,
                   max_upload_bytes=args.max_upload_kb * 1000,
                   cache=ModelCache(int(args.cache_gb * 2**30), device=args.device))
    demo, url = start(ws, args.host, args.port)
    print(f"CodeParrot app for {args.model} at {url} (Ctrl-C stops it)", flush=True)
    try:
        threading.Event().wait()
    finally:
        demo.close()
    return 0


if __name__ == "__main__":
    run_cli(main)

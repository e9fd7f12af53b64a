"""A web app for a checkpoint repository: complete prompts, highlight surprising tokens, browse experiments.

    python scripts/app.py --model REPO [--revision REV] [--host 127.0.0.1] [--port 7860 (0: a free one)]
                          [--data-dir PREPROCESS_OUTPUT] [--runs-dir RUNS]

REPO is a local checkpoint repository (path) or a Hub id user/name, as everywhere else. The app runs offline:
Gradio's analytics and version check are off, there is no share link, and it listens on 127.0.0.1 unless
--host says otherwise. Open the printed URL in a browser; Ctrl-C stops it.
"""

from __future__ import annotations

from codeparrot.app.config import AppConfig
from codeparrot.config_flags import parse_config
from codeparrot.errors import run_cli


def main(argv: list[str] | None = None) -> int:
    cfg = parse_config(AppConfig, argv, __doc__)
    cfg.check_model()  # before the slow imports below, as scripts/serve.py refuses a bad --model in one line
    from codeparrot.app.server import serve  # after parsing: --help stays fast (no Gradio, no torch)

    serve(cfg)
    return 0


if __name__ == "__main__":
    run_cli(main)

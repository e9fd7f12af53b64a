"""Serve a checkpoint to editors and clients: TGI- and OpenAI-compatible completion APIs with continuous batching.

    python scripts/serve.py --model REPO [--revision BRANCH_OR_COMMIT] [--host 127.0.0.1] [--port 8080]
    CODEPARROT_API_KEY=secret python scripts/serve.py --model REPO --host 0.0.0.0

Routes: TGI's POST /generate, /generate_stream (server-sent events) and / (its compatibility route), GET /info and
/health; OpenAI's POST /v1/completions (`suffix` makes it fill-in-the-middle; `stream` sends chunks ending in
data: [DONE]) and GET /v1/models. Concurrent requests share forward passes: they join and leave the batch between
decoding steps. Greedy answers equal scripts/generate.py's for the same prompt (its --no-strip --no-stop
--temperature 0). It listens on 127.0.0.1 unless --host says otherwise; SIGTERM or Ctrl-C lets the requests in
flight finish (--shutdown-timeout) and exits. Editor set-up (llm-vscode, Continue): docs/serving.md.
"""

from __future__ import annotations

from codeparrot.config_flags import parse_config
from codeparrot.errors import run_cli
from codeparrot.serving.config import ServeConfig


def main(argv: list[str] | None = None) -> int:
    cfg = parse_config(ServeConfig, argv, __doc__)
    from codeparrot.serving.server import serve  # after parsing: --help stays fast (no torch, no FastAPI)

    serve(cfg)
    return 0


if __name__ == "__main__":
    run_cli(main)

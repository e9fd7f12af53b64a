"""The app's page (five tabs) and its server: `build_app` makes the Blocks, `start` serves it without blocking.

Everything Gradio could contact beyond loopback is off (`codeparrot.app.offline`); the server binds the given
host (127.0.0.1 by default; any other needs a login or --allow-unauthenticated: codeparrot/app/access.py).
Requests queue per event (Gradio's default, one at a time per button), and one request's failure is a one-line
status in the page (`codeparrot.app.workspace.guarded`). At most `max_queue` requests wait at once (all buttons
and page loads together): a burst beyond gets Gradio's "queue full" error at once, rather than waits and memory
without bound. A streamed generation whose client cancels or disconnects stops at its next token
(`codeparrot.app.complete.stream_generation`).
"""

from __future__ import annotations

import socket
import threading
from pathlib import Path

from codeparrot.app.access import check_exposure, check_port_number
from codeparrot.app.complete import build_complete_tab
from codeparrot.app.config import DEFAULT_MAX_QUEUE, AppConfig
from codeparrot.app.data import build_data_tab
from codeparrot.app.experiments import build_experiments_tab
from codeparrot.app.highlight import build_highlight_tab
from codeparrot.app.infill import build_infill_tab
from codeparrot.app.models import ModelCache
from codeparrot.app.offline import go_offline, launch_kwargs
from codeparrot.app.workspace import Workspace
from codeparrot.errors import CodeParrotError
from codeparrot.repository.model import resolve_device

TITLE = "CodeParrot"
CSS = ".cp-code textarea { font-family: ui-monospace, 'DejaVu Sans Mono', Menlo, monospace; font-size: 13px; }"


def build_app(ws: Workspace):
    """The Blocks page for `ws`: tabs Complete, Infill, Highlight, Experiments, Data."""
    go_offline()
    import gradio as gr

    with gr.Blocks(title=f"{TITLE} · {ws.ref}", analytics_enabled=False) as demo:
        gr.Markdown(f"# {TITLE}\nModel repository **`{ws.ref}`** — complete, fill in, highlight and compare its checkpoints.")
        with gr.Tabs():
            with gr.Tab("Complete", id="complete"):
                build_complete_tab(ws)
            with gr.Tab("Infill", id="infill"):
                build_infill_tab(ws)
            with gr.Tab("Highlight", id="highlight"):
                build_highlight_tab(ws)
            with gr.Tab("Experiments", id="experiments"):
                on_load = build_experiments_tab(ws)
            with gr.Tab("Data", id="data"):
                on_load += build_data_tab(ws)
        for fn, inputs, outputs in on_load:
            demo.load(fn, inputs, outputs, api_visibility="private")
    return demo


def check_port(host: str, port: int) -> int:
    """The port to serve on: `port`, or for 0 a free one the OS picks (Gradio's own choice for 0 is its first
    free port from 7860, not the OS's); a one-line error when `host:port` cannot be bound (in use, or not an
    address of this machine)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError as err:
            raise CodeParrotError(f"cannot serve on {host}:{port}: {err.strerror or err}") from None
        return s.getsockname()[1]


def start(ws: Workspace, host: str = "127.0.0.1", port: int = 7860, auth: list[tuple[str, str]] | None = None,
          allow_unauthenticated: bool = False, max_queue: int = DEFAULT_MAX_QUEUE):
    """Serve the app in background threads; returns (blocks, local URL). `blocks.close()` stops it.
    `auth`: [(user, password)] for Gradio's login; without it only a loopback `host` is served, unless
    `allow_unauthenticated` (codeparrot/app/access.py). `max_queue`: requests that may wait at once."""
    check_port_number(port)
    if max_queue < 1:
        raise CodeParrotError(f"--max-queue must be at least 1, got {max_queue}")
    check_exposure(host, auth, allow_unauthenticated)
    port = check_port(host, port)
    demo = build_app(ws)
    demo.queue(default_concurrency_limit=1, max_size=max_queue)
    # Gradio refuses larger uploads before they reach a handler; the handler's own limit gives the message.
    _, url, _ = demo.launch(**launch_kwargs(host, port), max_file_size=4 * ws.max_upload_bytes + 65536,
                            css=CSS, allowed_paths=[], auth=auth)
    return demo, url


def serve(cfg: AppConfig) -> None:
    """scripts/app.py: serve the app for `cfg.model` until interrupted (Ctrl-C)."""
    resolve_device(cfg.device)  # an unavailable device is an error now, not on the first request
    ws = Workspace(cfg.model, revision=cfg.revision, data_dir=Path(cfg.data_dir) if cfg.data_dir else None,
                   runs_dir=Path(cfg.runs_dir) if cfg.runs_dir else None,
                   max_upload_bytes=cfg.max_upload_kb * 1000,
                   cache=ModelCache(int(cfg.cache_gb * 2**30), device=cfg.device))
    demo, url = start(ws, cfg.host, cfg.port, auth=cfg.credentials(), allow_unauthenticated=cfg.allow_unauthenticated,
                      max_queue=cfg.max_queue)
    print(f"CodeParrot app for {cfg.model} at {url} (Ctrl-C stops it)", flush=True)
    try:
        threading.Event().wait()
    finally:
        demo.close()

"""Load a checkpoint into an engine and serve it with uvicorn: `serve(cfg)` for scripts/serve.py, `start_in_thread`
for the tests and the benchmark.

The listening socket is bound here, before uvicorn starts, so that a port in use or an address of another machine
is a one-line error (and port 0 gives a free port, read back from the socket). Shutdown: SIGTERM or Ctrl-C stops
accepting connections, lets the requests in flight finish for up to --shutdown-timeout seconds (uvicorn's graceful
shutdown), cancels what is left, stops the engine and exits 0 with a summary line. uvicorn's own signal handling
would re-raise the signal once it is done, ending the process with the signal's status; `Server` keeps the handling
and drops the re-raise. A second Ctrl-C forces the exit.
"""

from __future__ import annotations

import contextlib
import logging
import re
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass

import torch
import uvicorn

from codeparrot.errors import CodeParrotError
from codeparrot.fim import fim_token_ids, has_fim_tokens
from codeparrot.repository.base import is_hub_ref, strip_scheme
from codeparrot.repository.model import load_model_and_tokenizer, model_context, resolve_device
from codeparrot.repository.refs import resolve_model_dir
from codeparrot.serving.app import build_app
from codeparrot.serving.config import API_KEY_ENV, ServeConfig
from codeparrot.serving.engine import Engine
from codeparrot.serving.header_timeout import header_deadline_protocol
from codeparrot.serving.state import Limits, ModelInfo, ServingState


def served_name(ref: str) -> str:
    """What clients see as the model id: a Hub id as it is, a local path by its folder name."""
    if is_hub_ref(ref):
        return strip_scheme(ref)
    return strip_scheme(ref).rstrip("/").rsplit("/", 1)[-1] or ref


def load_state(cfg: ServeConfig, model=None, tokenizer=None) -> ServingState:
    """The model (loaded from `cfg.model` at `cfg.revision` unless given) in an engine (not started yet), with
    `cfg`'s limits. A bad path, revision or device is a one-line `CodeParrotError`."""
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    sha = None
    if model is None:
        resolve_device(cfg.device)  # an unavailable device is named before anything loads
        model, tokenizer = load_model_and_tokenizer(cfg.model, cfg.revision, cfg.device)
        folder = resolve_model_dir(cfg.model, cfg.revision)  # already materialized: the commit names the folder
        sha = folder.name if re.fullmatch(r"[0-9a-f]{40}", folder.name) else None
    fim = has_fim_tokens(tokenizer)
    end_ids = (tokenizer.eos_token_id, *(fim_token_ids(tokenizer).all() if fim else ()))
    context = model_context(model)
    limits = Limits(context=context, max_input_tokens=min(cfg.max_input_tokens or context - 1, context - 1),
                    max_new_tokens=min(cfg.max_new_tokens, context - 1), max_stop_sequences=cfg.max_stop_sequences,
                    max_n=cfg.max_n)
    engine = Engine(model, tokenizer, max_batch_size=cfg.max_batch_size, max_requests=cfg.max_concurrent_requests,
                    end_token_ids=end_ids)
    device = next(model.parameters()).device
    info = ModelInfo(name=cfg.served_model_name or served_name(cfg.model), sha=sha,
                     dtype=str(next(model.parameters()).dtype), device=device.type, fim=fim)
    return ServingState(engine, tokenizer, limits, info, api_key=cfg.resolved_api_key())


def bind_socket(host: str, port: int) -> socket.socket:
    """The listening socket, or a one-line error (port in use, not an address of this machine)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host.strip("[]"), port))
    except OSError as err:
        sock.close()
        raise CodeParrotError(f"cannot serve on {host}:{port}: {err.strerror or err}") from None
    # Listening now, not when uvicorn starts: a client that read the printed URL is queued, not refused.
    sock.listen(2048)
    return sock


def url_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


class Server(uvicorn.Server):
    """uvicorn's server; SIGTERM/SIGINT start its graceful shutdown and are remembered, not re-raised."""

    stopped_by: str | None = None

    @contextlib.contextmanager
    def capture_signals(self):
        if threading.current_thread() is not threading.main_thread():  # signals only reach the main thread
            yield
            return

        def handle(sig, frame):
            self.stopped_by = signal.Signals(sig).name
            if self.should_exit:  # a second signal: stop waiting for the requests in flight
                self.force_exit = True
            self.should_exit = True

        previous = {sig: signal.signal(sig, handle) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


def make_server(state: ServingState, cfg: ServeConfig, quiet: bool = False) -> Server:
    app = build_app(state, max_request_bytes=cfg.max_request_kb * 1024, body_timeout=cfg.body_timeout)
    # h11 with a deadline on request heads (header_timeout.py), whatever "auto" would pick
    config = uvicorn.Config(app, http=header_deadline_protocol(cfg.header_timeout), lifespan="off",
                            timeout_graceful_shutdown=cfg.shutdown_timeout,
                            log_level="warning" if quiet else cfg.log_level, access_log=not quiet,
                            log_config=None if quiet else uvicorn.config.LOGGING_CONFIG)
    return Server(config)


@dataclass
class RunningServer:
    """A server running in a background thread (tests, benchmark): its URL, state; `stop()` ends it."""

    url: str
    state: ServingState
    server: Server
    thread: threading.Thread

    def stop(self, timeout: float = 30.0) -> None:
        self.server.should_exit = True
        self.thread.join(timeout)
        self.state.engine.close()


def start_in_thread(state: ServingState, cfg: ServeConfig) -> RunningServer:
    """Serve `state` on `cfg.host:cfg.port` (0: a free port) from a daemon thread, quietly; returns once it accepts
    connections."""
    sock = bind_socket(cfg.host, cfg.port)
    server = make_server(state, cfg, quiet=True)
    state.engine.start()
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="codeparrot-serve", daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            state.engine.close()
            raise RuntimeError("the server thread did not start")
        time.sleep(0.01)
    return RunningServer(url_of(sock), state, server, thread)


def serve(cfg: ServeConfig) -> None:
    """scripts/serve.py: serve until SIGTERM or Ctrl-C, then finish or cancel what is in flight and exit."""
    state = load_state(cfg)
    sock = bind_socket(cfg.host, cfg.port)
    server = make_server(state, cfg)
    state.engine.start()
    params = sum(p.numel() for p in state.engine.model.parameters()) / 1e6
    auth = f"bearer key required (from {'--api-key' if cfg.api_key else '$' + API_KEY_ENV})" if state.api_key \
        else "no auth"
    url = url_of(sock)
    print(f"serving {state.info.name} ({params:.1f}M parameters, {state.info.device}, batch of up to "
          f"{cfg.max_batch_size}, {auth}) at {url}\n"
          f"  TGI: {url}/generate, {url}/generate_stream, {url}/ ; OpenAI: {url}/v1/completions "
          f"(suffix = fill-in-the-middle{'' if state.info.fim else ': unavailable, no FIM tokens'})\n"
          "  SIGTERM or Ctrl-C stops it", flush=True)
    log = logging.getLogger("codeparrot.serving")  # the engine's own failures, beside uvicorn's lines
    log.setLevel(cfg.log_level.upper())
    if not log.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(levelname)s:     %(message)s"))
        log.addHandler(handler)
    try:
        server.run(sockets=[sock])
    finally:
        state.engine.close(timeout=cfg.shutdown_timeout + 10)
    counts = state.engine.counts
    why = f" ({server.stopped_by})" if server.stopped_by else ""
    print(f"stopped{why}: {counts['completed']} request(s) answered, {counts['cancelled']} cancelled, "
          f"{counts['failed']} failed", file=sys.stderr, flush=True)

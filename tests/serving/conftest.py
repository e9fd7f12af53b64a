"""Fixtures of the serving tests: a server on 127.0.0.1 in a background thread of the test process (one per test
module, sharing the session's tiny models), and scripts/generate.py's own answers to compare with."""

from __future__ import annotations

import ipaddress
import json
import sys

import pytest

# Every address the test process connects to, recorded by an audit hook: the clients must talk to 127.0.0.1 only.
CONNECTED: list[str] = []


def _audit(event: str, args) -> None:
    if event == "socket.connect" and isinstance(args[1], tuple):
        CONNECTED.append(str(args[1][0]))


sys.addaudithook(_audit)


@pytest.fixture(scope="module")
def off_loopback():
    """`off_loopback() -> [address]`: the addresses this test module connected to that are not loopback ones (only
    this module's: a worker process runs other modules too)."""
    start = len(CONNECTED)
    return lambda: _off_loopback(CONNECTED[start:])


def _off_loopback(hosts: list[str]) -> list[str]:
    out = []
    for host in hosts:
        try:
            loopback = ipaddress.ip_address(host).is_loopback
        except ValueError:
            loopback = host == "localhost"
        if not loopback:
            out.append(host)
    return out

# Short enough to keep the modules fast, long enough for the memorized model to say all it knows and stop at EOS.
NEW_TOKENS = 40


@pytest.fixture(scope="module")
def serve_model(tiny_models, one_torch_thread):
    """`serve_model(name, **flags) -> RunningServer`: tiny model `name` served from a thread with ServeConfig `flags`
    (port 0, CPU); every server started is stopped at the end of the module."""
    from codeparrot.serving.config import ServeConfig
    from codeparrot.serving.server import load_state, start_in_thread

    running = []

    def start(name: str = "memorized", **flags):
        cfg = ServeConfig(model=str(tiny_models[name]), device="cpu", port=0, shutdown_timeout=5, **flags)
        server = start_in_thread(load_state(cfg), cfg)
        running.append(server)
        return server

    yield start
    for server in running:
        server.stop()


@pytest.fixture(scope="module")
def served(serve_model):
    """The memorized model (it greedily writes `MEMORIZED_CODE` back, then EOS) with default limits."""
    return serve_model("memorized", max_batch_size=8)


@pytest.fixture(scope="module")
def generate_py(tmp_path_factory, load_script, tiny_models):
    """`generate_py(prompt, model="memorized", stop=False, suffix=None) -> completion text`: scripts/generate.py
    run in-process, greedy and unstripped (what the server does), without HumanEval's stop strings unless `stop`,
    its answer read from its --output file. With `suffix`: fill-in-the-middle (`--suffix`), the reference for a FIM
    prompt whether the server builds it or a client does (generate.py reads `--prompt` as plain text, as training
    read code: sentinel strings in it stay text)."""
    script = load_script("generate")
    folder = tmp_path_factory.mktemp("generate")
    cache: dict = {}

    def run(prompt: str, model: str = "memorized", new_tokens: int = NEW_TOKENS, stop: bool = False,
            suffix: str | None = None) -> str:
        key = (prompt, model, new_tokens, stop, suffix)
        if key not in cache:
            out = folder / f"{len(cache)}.json"
            infill = [] if suffix is None else ["--suffix", suffix]
            assert script.main(["--model", str(tiny_models[model]), "--prompt", prompt, "--no-strip", "--temperature",
                                "0", "--seed", "0", "--device", "cpu", "--max-new-tokens", str(new_tokens),
                                "--quiet", "--output", str(out), *infill, *([] if stop else ["--no-stop"])]) == 0
            cache[key] = json.loads(out.read_text())["completions"][0]["completion"]
        return cache[key]

    return run

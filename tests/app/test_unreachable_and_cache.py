"""A repository that cannot be reached still gives a serving app with one-line messages; the model cache's and the
request queue's bounds; the CLI's own errors."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch


def test_unreachable_repository_keeps_serving(tmp_path):
    from gradio_client import Client

    from codeparrot.app.server import start
    from codeparrot.app.workspace import Workspace

    for ref in (str(tmp_path / "no-such-repo"), "hf://nobody-here/missing-model"):  # offline: the Hub is unreachable
        demo, url = start(Workspace(ref), "127.0.0.1", _free_port())
        try:
            client = Client(url, verbose=False)
            rows, status = client.predict(api_name="/experiments")
            assert not any(any(cell != "" for cell in row) for row in rows["data"])  # no branches listed
            assert status.startswith("error: ") and "\n" not in status and "Traceback" not in status
            _, complete_status = client.predict("def f():", "main", "latest", 0.0, 0.95, 8, 0, api_name="/complete")
            assert complete_status.startswith("error: ") and "\n" not in complete_status
            assert client.predict(api_name="/experiments")[1] == status  # still serving, same message
        finally:
            demo.close()


def _free_port() -> int:
    return next(m for n, m in sys.modules.items() if n.endswith("conftest") and hasattr(m, "free_port")).free_port()


def test_a_burst_beyond_the_queue_bound_is_refused_at_once(tmp_path, monkeypatch):
    """With --max-queue 1, while one request runs and one waits, the next is refused at once with Gradio's
    "queue full" error instead of waiting (and holding memory) without bound; the queued ones are still served."""
    import threading
    import time

    from gradio_client import Client

    from codeparrot.app.server import start
    from codeparrot.app.workspace import Workspace
    from codeparrot.errors import CodeParrotError

    running, release = threading.Event(), threading.Event()

    def slow_model(self, branch, checkpoint):  # holds the Complete button's one slot until released
        running.set()
        release.wait(30)
        raise CodeParrotError("no model here")

    monkeypatch.setattr(Workspace, "model", slow_model)
    demo, url = start(Workspace(str(tmp_path / "repo")), "127.0.0.1", _free_port(), max_queue=1)
    try:
        client = Client(url, verbose=False)
        args = ("def f():", "main", "latest", 0.0, 0.95, 8, 0)
        first = client.submit(*args, api_name="/complete")
        assert running.wait(30)
        burst = [client.submit(*args, api_name="/complete") for _ in range(2)]  # one can wait, the other not
        deadline = time.monotonic() + 10
        while not any(job.done() for job in burst) and time.monotonic() < deadline:  # the refusal is at once
            time.sleep(0.02)
        release.set()
        outcomes = []
        for job in burst:
            try:
                outcomes.append(job.result(timeout=30)[1])
            except Exception as err:  # noqa: BLE001 - gradio_client's error for a refused request
                outcomes.append(f"refused: {err}")
        assert first.result(timeout=30)[1] == "error: no model here"
        assert sorted(o.split(":")[0] for o in outcomes) == ["error", "refused"], outcomes
        assert any("Queue is full" in o for o in outcomes), outcomes
    finally:
        release.set()
        demo.close()


def test_the_max_queue_flag_bounds_the_served_queue(monkeypatch, capsys):
    """`--max-queue` is in --help with its default, must be positive, and is what `serve` hands the queue."""
    from codeparrot.app import server
    from codeparrot.app.config import DEFAULT_MAX_QUEUE, AppConfig
    from codeparrot.config_flags import parse_config
    from codeparrot.errors import CodeParrotError

    with pytest.raises(SystemExit):
        parse_config(AppConfig, ["--help"])
    assert f"'queue full' (default {DEFAULT_MAX_QUEUE})" in " ".join(capsys.readouterr().out.split())
    with pytest.raises(CodeParrotError, match="--max-queue must be positive"):
        parse_config(AppConfig, ["--model", "x", "--max-queue", "0"])
    started = {}

    def fake_start(ws, host, port, **kwargs):
        started.update(kwargs)
        raise KeyboardInterrupt  # instead of serving until Ctrl-C

    monkeypatch.setattr(server, "start", fake_start)
    with pytest.raises(KeyboardInterrupt):
        server.serve(parse_config(AppConfig, ["--model", "x", "--max-queue", "3", "--device", "cpu"]))
    assert started["max_queue"] == 3


class _Tiny(torch.nn.Module):
    def __init__(self, n: int):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(n))  # n float32 = 4n bytes


def test_model_cache_loads_once_and_respects_the_bound():
    from codeparrot.app.models import ModelCache

    loaded = []
    c1, c2, c3 = ("c1" * 20, "c2" * 20, "c3" * 20)  # full commit ids (40 hex digits)

    def loader(ref, commit):
        loaded.append(commit)
        return _Tiny(100), "tok"  # 400 bytes each

    cache = ModelCache(max_bytes=900, loader=loader)
    first = cache.get("r", c1)
    assert cache.get("r", c1) is not None and cache.get("./r", c1)[0] is first[0] and loaded == [c1]
    cache.get("r", c2)
    cache.get("r", c1)  # c1 is now the most recently used
    cache.get("r", c3)  # 1200 > 900 bytes: the least recently used (c2) leaves
    assert cache.keys() == [c1, c3] and cache.used_bytes == 800 and loaded == [c1, c2, c3]
    with pytest.raises(ValueError, match="full commit id"):  # a branch name would be a second, stale key
        cache.get("r", "main")


@pytest.mark.parametrize("args, message", [
    (["--model", "x", "--data-dir", "/no/such/dir"], "error: --data-dir /no/such/dir: not a folder"),
    (["--model", "x", "--port", "70000"], "error: --port must be in 0..65535 (0: a free port), got 70000"),
    # refused at startup, before Gradio and torch load, as scripts/serve.py refuses it (not on every request)
    (["--model", "/no/such/repo"], "error: repository not found: /no/such/repo (scripts/initialize_model.py "
                                   "creates one)"),
    (["--model", "no-such-dir/repo"], "error: no-such-dir/repo: no such folder, and no-such-dir/repo@main is not "
                                      "in the local Hub cache either (the Hub is offline: HF_HUB_OFFLINE=1)"),
])
def test_cli_errors_are_one_line(repo_root, scripts_env, python, args, message):
    result = subprocess.run([python, str(repo_root / "scripts" / "app.py"), *args], capture_output=True, text=True,
                            env=scripts_env, timeout=120)
    assert result.returncode == 2 and result.stderr.strip() == message, result.stderr


def test_port_0_is_a_free_port_the_os_picks():
    """Gradio takes port 0 as "its first free port from 7860"; the app asks the OS, like scripts/serve.py."""
    from codeparrot.app.server import check_port

    assert 0 < check_port("127.0.0.1", 0) <= 65535

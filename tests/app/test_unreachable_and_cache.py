"""A repository that cannot be reached still gives a serving app with one-line messages; the model cache's bound;
the CLI's own errors."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch


def test_unreachable_repository_keeps_serving(tmp_path):
    from gradio_client import Client

    from codeparrot.app.server import start
    from codeparrot.app.workspace import Workspace

    conftest = next(m for n, m in sys.modules.items() if n.endswith("conftest") and hasattr(m, "free_port"))
    for ref in (str(tmp_path / "no-such-repo"), "hf://nobody-here/missing-model"):  # offline: the Hub is unreachable
        demo, url = start(Workspace(ref), "127.0.0.1", conftest.free_port())
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


class _Tiny(torch.nn.Module):
    def __init__(self, n: int):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(n))  # n float32 = 4n bytes


def test_model_cache_loads_once_and_respects_the_bound():
    from codeparrot.app.models import ModelCache

    loaded = []

    def loader(ref, commit):
        loaded.append(commit)
        return _Tiny(100), "tok"  # 400 bytes each

    cache = ModelCache(max_bytes=900, loader=loader)
    first = cache.get("r", "a", "c1")
    assert cache.get("r", "a", "c1") is not None and cache.get("r", "a", "c1")[0] is first[0] and loaded == ["c1"]
    cache.get("r", "b", "c2")
    cache.get("r", "a", "c1")  # c1 is now the most recently used
    cache.get("r", "b", "c3")  # 1200 > 900 bytes: the least recently used (c2) leaves
    assert cache.keys() == [("a", "c1"), ("b", "c3")] and cache.used_bytes == 800 and loaded == ["c1", "c2", "c3"]


@pytest.mark.parametrize("args, message", [
    (["--model", "x", "--data-dir", "/no/such/dir"], "error: --data-dir /no/such/dir: not a folder"),
    (["--model", "x", "--port", "0"], "error: --port must be in 1..65535, got 0"),
])
def test_cli_errors_are_one_line(repo_root, scripts_env, python, args, message):
    result = subprocess.run([python, str(repo_root / "scripts" / "app.py"), *args], capture_output=True, text=True,
                            env=scripts_env, timeout=120)
    assert result.returncode == 2 and result.stderr.strip() == message, result.stderr

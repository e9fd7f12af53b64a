"""Nothing beyond loopback: serving and calling the app contacts only 127.0.0.1, and no request makes the server
fetch a URL or use the machine's Hugging Face token."""

from __future__ import annotations

import os
import sys

import pytest

from .conftest import SIGNATURE


def test_no_network_beyond_loopback(client, served):
    """Everything this process resolved or connected to while building, serving and calling the app (the
    session's audit hook saw it all) is loopback; Gradio's analytics and version check are off."""
    import gradio.analytics

    client.predict(SIGNATURE, "exp", "latest", 0.0, 0.95, 8, 0, api_name="/complete")
    contacted = sys.modules[_conftest_name()].CONTACTED
    assert contacted, "the audit hook saw no socket activity at all"
    hosts = {host for _, host in contacted}
    assert hosts <= {"127.0.0.1", "localhost", "::1"}, hosts
    assert not gradio.analytics.analytics_enabled() and os.environ["HF_HUB_DISABLE_TELEMETRY"] in ("1", "True")


def _conftest_name() -> str:
    """tests/app/conftest.py's module name under pytest's importlib import mode."""
    return next(n for n, m in sys.modules.items() if n.endswith("conftest") and hasattr(m, "CONTACTED"))


def test_no_request_makes_the_server_reach_beyond_loopback(served, monkeypatch):
    """Gradio would fetch a URL a client names (`/gradio_api/file=https://...`; a file given as a URL in any input,
    where the page sends an upload) and use this machine's Hugging Face token for its run history
    (`/gradio_api/run-history/...`, no login needed): all refused, before any name is looked up."""
    import json
    import urllib.error
    import urllib.request

    import huggingface_hub

    url = served[1].rstrip("/")
    hub_calls = []
    monkeypatch.setenv("HF_TOKEN", "hf_the_operators_own_token")
    monkeypatch.setattr(huggingface_hub.HfApi, "list_buckets", lambda self, **kw: hub_calls.append(kw) or [],
                        raising=False)
    contacted = sys.modules[_conftest_name()].CONTACTED
    seen = len(contacted)
    remote = {"path": "https://huggingface.co/x.py", "url": "https://huggingface.co/x.py", "orig_name": "x.py",
              "meta": {"_type": "gradio.FileData"}}
    requests = [urllib.request.Request(f"{url}/{path}") for path in (
        "gradio_api/file=https://huggingface.co/favicon.ico", "gradio_api/file=http://example.org/a.py",
        "gradio_api/run-history/buckets")]
    requests += [urllib.request.Request(f"{url}/gradio_api/call/{api}", data=json.dumps({"data": data}).encode(),
                                        headers={"Content-Type": "application/json"})
                 for api, data in (("highlight", ["", remote, "exp", "latest"]),  # the upload field
                                   ("complete", [SIGNATURE, "exp", remote, 0.0, 0.95, 8, 0]))]  # any field
    for request in requests:
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=30)
        assert refused.value.code in (403, 404), request.full_url
    hosts = {host for _, host in contacted[seen:]}
    assert hosts <= {"127.0.0.1", "localhost", "::1"} and not hub_calls, (hosts, hub_calls)

"""The app through its HTTP API (gradio_client), served for real on 127.0.0.1: every endpoint and every bad input."""

from __future__ import annotations

import os
import re
import sys
import threading
import time
from pathlib import Path

import pytest
from gradio_client import handle_file

from codeparrot.humaneval.stopping import STOP_STRINGS

SIGNATURE = "def add(a, b):"


def complete(client, prompt, branch="exp", checkpoint="latest", temperature=0.0, max_new=40, seed=0):
    return client.predict(prompt, branch, checkpoint, temperature, 0.95, max_new, seed, api_name="/complete")


def test_complete_streams_and_stops_at_a_stop_string(client, served, memorized_code):
    job = client.submit(SIGNATURE, "exp", "latest", 0.0, 0.95, 40, 0, api_name="/complete")
    final, status = job.result()
    assert final == SIGNATURE + "\n    return a + b\n", final  # memorized body, cut before "\ndef sub"
    assert "stop string '\\ndef'" in status and "exp@" in status
    streamed = [o[0] for o in job.outputs()]
    assert len(streamed) >= 3 and all(final.startswith(s) for s in streamed)  # token by token, only prefixes
    assert not any(s in final[len(SIGNATURE):] for s in STOP_STRINGS)


def test_model_loads_once_per_checkpoint(client, served):
    ws = served[0]
    complete(client, SIGNATURE)
    loads = ws.cache.loads
    complete(client, SIGNATURE)  # a second request (any user) reuses the loaded model
    assert ws.cache.loads == loads
    assert ws.resolve("exp", "latest")[1] in ws.cache.keys()


def test_one_model_per_commit_whichever_branch_or_spelling_names_it(served, tmp_path):
    """A checkpoint picked by its commit under another branch's dropdown (the side by side's B picker, or main's
    history after a fast-forward), or the repository named by another path (a symlink, a trailing slash),
    is the model already loaded: one copy in memory, no second load."""
    from codeparrot.app.workspace import Workspace

    ws = served[0]
    tip = ws.resolve("exp", "latest")[1]
    model, _, _ = ws.model("exp", "latest")
    loads = ws.cache.loads
    assert ws.model("main", tip)[0] is model and ws.model("exp", tip)[0] is model
    (tmp_path / "link").symlink_to(ws.ref)
    assert Workspace(str(tmp_path / "link"), cache=ws.cache).model("exp", "latest")[0] is model
    assert ws.cache.loads == loads and len([k for k in ws.cache.keys() if tip in str(k)]) == 1


@pytest.fixture
def endless(monkeypatch, served):
    """/complete's generation replaced by one that streams "x" every 10 ms for up to 20 s: (stopped, release)
    events; `stopped` is set when it returns or raises, `release` (set at teardown) ends it on the old code."""
    import threading
    import time

    import torch

    from codeparrot.app import complete

    stopped, release = threading.Event(), threading.Event()
    x = served[0].model("exp", "latest")[1].convert_tokens_to_ids("x")

    def generate(model, tokenizer, prompt, *, streamer, **kwargs):
        try:
            streamer.put(torch.tensor([[1, 2]]))  # the prompt, as generate() sends it first
            for _ in range(2000):
                if release.is_set():
                    break
                streamer.put(torch.tensor([x]))
                time.sleep(0.01)
            streamer.end()
            return []
        finally:
            stopped.set()

    monkeypatch.setattr(complete, "generate_completions", generate)
    yield stopped, release
    release.set()
    stopped.wait(5)  # the next test finds the generation slot free


def _slot_is_free() -> bool:
    from codeparrot.app.complete import _GENERATION_LOCK

    if not _GENERATION_LOCK.acquire(timeout=2):
        return False
    _GENERATION_LOCK.release()
    return True


def test_a_cancelled_completion_stops_generating(client, endless):
    """A client that cancels its /complete (gradio_client's job.cancel(), the page's cancel) stops the
    generation within a token or two: the one generation slot is free for the next user at once."""
    import time

    stopped, _ = endless
    job = client.submit(SIGNATURE, "exp", "latest", 0.0, 0.95, 40, 0, api_name="/complete")
    deadline = time.monotonic() + 30
    while not job.outputs() and time.monotonic() < deadline:  # streaming: the generation is running
        time.sleep(0.02)
    assert job.outputs() and not stopped.is_set()
    job.cancel()
    assert stopped.wait(3), "the generation went on after its request was cancelled"
    assert _slot_is_free()


def test_a_client_that_disconnects_stops_its_generation(served, endless):
    """A client that goes away mid-stream (a closed tab, a killed script: here a plain HTTP client that closes its
    event stream) stops the generation it asked for."""
    import http.client
    import json
    from urllib.parse import urlsplit

    stopped, _ = endless
    address = urlsplit(served[1])
    conn = http.client.HTTPConnection(address.hostname, address.port, timeout=30)
    body = json.dumps({"data": [SIGNATURE, "exp", "latest", 0.0, 0.95, 40, 0]})
    conn.request("POST", "/gradio_api/call/complete", body, {"Content-Type": "application/json"})
    event_id = json.loads(conn.getresponse().read())["event_id"]
    conn.request("GET", f"/gradio_api/call/complete/{event_id}")
    events = conn.getresponse()
    for line in iter(events.readline, b""):  # until the first streamed state: the generation is running
        if line.strip() == b"event: generating":
            break
    else:
        pytest.fail("the event stream ended before any text was streamed")
    assert not stopped.is_set()
    conn.close()
    events.close()
    assert stopped.wait(3), "the generation went on after its client disconnected"
    assert _slot_is_free()


def test_a_completion_cancelled_while_queued_for_the_generation_lock_never_generates(client, monkeypatch):
    """A /complete cancelled while another tab's generation holds the lock is closed at once (Gradio used to retry
    closing it for 60 s under the app's lock, stalling every other cancel) and never generates afterwards."""
    from codeparrot.app import background, complete

    generated = []
    monkeypatch.setattr(background, "HEARTBEAT_S", 0.05, raising=False)  # (the old code had none)
    monkeypatch.setattr(complete, "generate_completions", lambda *args, **kwargs: generated.append(1) or [])
    assert complete._GENERATION_LOCK.acquire(timeout=2)  # another tab's generation
    try:
        job = client.submit(SIGNATURE, "exp", "latest", 0.0, 0.95, 40, 0, api_name="/complete")
        deadline = time.monotonic() + 30
        while not job.outputs() and time.monotonic() < deadline:  # heartbeats while it waits for the lock
            time.sleep(0.02)
        assert job.outputs() and job.outputs()[-1][0] == SIGNATURE, "no heartbeat streamed while waiting"
        waiting, cancelled = [t for t in threading.enumerate() if t.name == "codeparrot-complete"], time.monotonic()
        job.cancel()
        assert not any(w.join(timeout=2) or w.is_alive() for w in waiting) and time.monotonic() - cancelled < 2
    finally:
        complete._GENERATION_LOCK.release()
    time.sleep(0.2)  # the old code's request, queued for the lock, generated now
    assert not generated and _slot_is_free()


@pytest.fixture
def slow_losses(monkeypatch, app_repo, write_shards, memorized_code):
    """/losses computed on a validation folder of the app's --data-dir (40 batches of 8 per checkpoint), every
    forward of the evaluation slowed to 0.1 s: (forwards, stopped). `forwards` holds each forward's start time,
    `stopped` is set when the plot's computation returns or raises; at teardown every further forward fails,
    which ends it on the old code."""
    import threading
    import time

    from codeparrot.app import experiments
    from codeparrot.training import validation

    write_shards(app_repo["clean"] / "slow-valid", [memorized_code] * 1000, 1)
    forwards, stopped, release = [], threading.Event(), threading.Event()
    forward, plot = validation.token_loss_sum, experiments.losses_plot

    def slow_forward(*args, **kwargs):
        if release.is_set():
            raise RuntimeError("the test is over")
        forwards.append(time.monotonic())
        time.sleep(0.1)
        return forward(*args, **kwargs)

    def watched_plot(*args, **kwargs):
        try:
            return plot(*args, **kwargs)
        finally:
            stopped.set()

    monkeypatch.setattr(validation, "token_loss_sum", slow_forward)
    monkeypatch.setattr(experiments, "losses_plot", watched_plot)
    yield forwards, stopped
    release.set()
    stopped.wait(10)  # the next test finds the losses event free


def _evaluating(forwards) -> None:
    import time

    deadline = time.monotonic() + 30
    while not forwards and time.monotonic() < deadline:
        time.sleep(0.02)
    assert forwards, "the losses computation never started evaluating"


def test_a_cancelled_losses_plot_stops_evaluating(client, slow_losses):
    """A client that cancels its /losses computed on a validation folder (up to 256 batches per checkpoint of
    every branch) stops the evaluation within a batch or two, instead of running it to the end for nobody."""
    import time

    forwards, stopped = slow_losses
    job = client.submit(["exp"], "slow-valid", 40, api_name="/losses")
    _evaluating(forwards)
    assert not stopped.is_set()
    cancelled = time.monotonic()
    job.cancel()
    assert stopped.wait(3), "the evaluation went on after its request was cancelled"
    # the batch in flight and the few a heartbeat (0.5 s) lets through: not the rest of the split (40 per checkpoint)
    assert len([t for t in forwards if t > cancelled]) <= 8 and len(forwards) < 40, len(forwards)


def test_a_client_that_disconnects_stops_its_losses_plot(served, slow_losses):
    """A client that goes away while its losses are computed (a closed tab; here a plain HTTP client that closes
    its event stream) stops the evaluation it asked for."""
    import http.client
    import json
    from urllib.parse import urlsplit

    forwards, stopped = slow_losses
    address = urlsplit(served[1])
    conn = http.client.HTTPConnection(address.hostname, address.port, timeout=30)
    conn.request("POST", "/gradio_api/call/losses", json.dumps({"data": [["exp"], "slow-valid", 40]}),
                 {"Content-Type": "application/json"})
    event_id = json.loads(conn.getresponse().read())["event_id"]
    conn.request("GET", f"/gradio_api/call/losses/{event_id}")
    events = conn.getresponse()
    _evaluating(forwards)
    assert not stopped.is_set()
    conn.close()
    events.close()
    assert stopped.wait(3), "the evaluation went on after its client disconnected"
    assert len(forwards) < 40, len(forwards)


def test_highlight_one_coloured_span_per_token(client, served, memorized_code):
    page, lines, status = client.predict(memorized_code, None, "exp", "latest", api_name="/highlight")
    _, tok, _ = served[0].model("exp", "latest")
    n_tokens = len(tok(memorized_code, add_special_tokens=False)["input_ids"])
    spans = re.findall(r'<span class="t b(\d+)" data-loss="([\d.]+)" title="', page)
    assert len(spans) == n_tokens  # ASCII code: one span per token
    assert f"{n_tokens} tokens" in status
    assert lines["headers"][0] == "line" and len(lines["data"]) == 4  # 4 non-blank lines, ranked
    assert "Most surprising lines" in page and "legend" in page


def test_highlight_upload(client, tmp_path, memorized_code):
    f = tmp_path / "mod.py"
    f.write_text(memorized_code)
    page, _, status = client.predict("", handle_file(str(f)), "main", "latest", api_name="/highlight")
    assert "<h1>mod.py</h1>" in page and "main@" in status


def test_experiments_checkpoints_losses(client, app_repo):
    rows, status = client.predict(api_name="/experiments")
    assert [r[0] for r in rows["data"]] == ["main", "exp"]  # main first
    assert rows["data"][1][1] == 20 and "2 branch" in status
    rows, _ = client.predict("exp", api_name="/checkpoints")
    assert [r[1] for r in rows["data"]] == [20, 10, ""]  # newest first, down to main's initial model
    png, status = client.predict(["exp"], "", 4, api_name="/losses")
    assert _png(png)[:8] == b"\x89PNG\r\n\x1a\n" and status.startswith("2 point(s)")
    png, status = client.predict(["main", "exp"], "", 4, api_name="/losses")  # main: no run logged it
    assert png and "not plotted: main (no logged metrics" in status


def test_compare_two_checkpoints(client, served):
    commits = [c.commit_id for c in served[0].repository().list_commits("exp")]
    a, b, status = client.predict(SIGNATURE, "exp", commits[0], "exp", commits[1], 0.0, 24, 0, api_name="/compare")
    assert a == SIGNATURE + "\n    return a + b\n" and b != a and b.startswith(SIGNATURE)
    assert status.count("exp@") == 2


def test_promote_needs_confirmation_and_moves_main(client, served):
    repo = served[0].repository()
    before = repo.resolve_revision("main")
    status, _ = client.predict("exp", "latest", False, api_name="/promote")
    assert status.startswith("error: not promoted") and repo.resolve_revision("main") == before
    status, rows = client.predict("exp", "latest", True, api_name="/promote")
    after = repo.resolve_revision("main")
    assert after != before and after[:12] in status and "promoted exp@" in status
    assert f"main held {before[:12]} (" in status  # what main held before
    # main now holds the memorized checkpoint's files
    assert repo.list_commits("main")[0].message.startswith("promote ")
    assert rows["data"][0][0] == "main" and rows["data"][0][1] == 20


def test_data_tab(client):
    png, rows, status = client.predict(api_name="/data")
    table = {r[0]: r[1] for r in rows["data"]}
    assert table["exact duplicates"] == 7 and table["filter: config or test"] == 11
    assert table["files in 4 near-duplicate clusters"] == 9 and "71 kept" in status
    assert _png(png)[:4] == b"\x89PNG"


@pytest.mark.parametrize("args, message", [
    (("   ", "exp", "latest"), "the prompt is empty"),
    ((SIGNATURE, "no-such-branch", "latest"), "no-such-branch"),
    ((SIGNATURE, "exp", "0123456789abcdef"), "0123456789abcdef"),
    (("x" * 5000, "exp", "latest"), "over the limit of 4,000 bytes"),
])
def test_complete_bad_input(client, args, message):
    _, status = complete(client, *args)
    assert status.startswith("error: ") and message in status and "\n" not in status and "Traceback" not in status


def test_infill_streams_the_middle_in_place(client, served):
    """/infill: the code before and after the cursor stay exactly as given (nothing stripped), the middle grows
    between them token by token, never holds a sentinel, and the status says how it ended."""
    from codeparrot.fim import FIM_TOKENS

    before, after = "def add(a, b):\n    ", "\n\ndef sub(a, b):\n    return a - b\n"
    job = client.submit(before, after, "exp", "latest", 0.0, 0.95, 12, 0, api_name="/infill")
    whole, middle, status = job.result()
    assert whole == before + middle + after and middle
    assert not any(token in middle for token in FIM_TOKENS)
    assert "ended by " in status and "exp@" in status and "middle of " in status
    streamed = [o for o in job.outputs()]
    assert len(streamed) >= 2 and all(w.startswith(before) and w.endswith(after) and middle.startswith(m)
                                      for w, m, _ in streamed)


def test_infill_bad_input_and_a_tokenizer_without_fim_tokens(client, tmp_path, stdlib_texts):
    status = client.predict("  ", "\n", "exp", "latest", 0.0, 0.95, 8, 0, api_name="/infill")[2]
    assert status == "error: the code before and after the cursor is empty; type or paste some code first"
    status = client.predict("x" * 5000, "", "exp", "latest", 0.0, 0.95, 8, 0, api_name="/infill")[2]
    assert "over the limit of 4,000 bytes" in status
    # a checkpoint from before the FIM tokens were reserved: one line, no generation
    from codeparrot.app.infill import stream_infill
    from codeparrot.app.models import ModelCache
    from codeparrot.app.workspace import Workspace, guarded
    from codeparrot.repository.model import ModelConfig, build_model, to_gpt2_config
    from codeparrot.repository.refs import open_repository

    from ..fim.helpers import old_style_tokenizer

    old = old_style_tokenizer(stdlib_texts[:10], vocab_size=300)
    folder = tmp_path / "old"
    build_model(to_gpt2_config(ModelConfig(n_layer=1, n_embd=32, n_head=2, n_positions=64), old), seed=0) \
        .save_pretrained(folder)
    old.save_pretrained(folder)
    open_repository(str(tmp_path / "repo"), create=True).commit_folder(folder, "main", "initial model")
    ws = Workspace(str(tmp_path / "repo"), cache=ModelCache(1 << 30, device="cpu"))
    run = guarded(lambda line: ("", "", line))(stream_infill)
    [(_, _, status)] = list(run(ws, "x = 1\n", "", "main", "latest", 0.0, 0.95, 8, 0))
    assert status.startswith("error: infilling needs the FIM tokens") and "\n" not in status


def _png(image) -> bytes:
    """The bytes of an image output (a served file's path: the server runs in this process)."""
    return Path(image["path"] if isinstance(image, dict) else image).read_bytes()


def _upload(tmp_path, name, data: bytes):
    f = tmp_path / name
    f.write_bytes(data)
    return handle_file(str(f))


@pytest.mark.parametrize("name, data, message", [
    ("bin.py", b"\x7fELF\x00\x01", "binary file"),
    ("latin.py", "x = 'café'\n".encode("latin-1"), "not UTF-8 text (invalid byte at offset 8, line 1)"),
    ("big.py", b"x = 1\n" * 1000, "over the upload limit of 4,000 bytes"),
    ("empty.py", b"\n\n", "is empty"),
])
def test_highlight_bad_upload(client, tmp_path, name, data, message):
    page, _, status = client.predict("", _upload(tmp_path, name, data), "exp", "latest", api_name="/highlight")
    assert page == "" and status.startswith("error: ") and message in status and "\n" not in status


def test_highlight_empty_code_and_bad_revision(client):
    status = client.predict("  \n", None, "exp", "latest", api_name="/highlight")[2]
    assert status.startswith("error: the code is empty")
    status = client.predict("x = 1\n", None, "nope", "latest", api_name="/highlight")[2]
    assert status.startswith("error: ") and "nope" in status


def test_bad_experiment_inputs(client):
    assert "not found" in client.predict("nope", api_name="/checkpoints")[1]
    assert client.predict([], "", 4, api_name="/losses")[1] == "error: choose at least one branch to plot"
    status = client.predict(["main"], "", 4, api_name="/losses")[1]
    assert status.startswith("error: no logged metrics for branch 'main'")
    status = client.predict(["exp"], "/no/such/folder", 4, api_name="/losses")[1]
    assert status == ("error: validation folder '/no/such/folder' is not a folder inside the app's data folder "
                      "(--data-dir); give a path relative to it, e.g. valid")
    assert client.predict("exp", "deadbeef", True, api_name="/promote")[0].startswith("error: ")


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

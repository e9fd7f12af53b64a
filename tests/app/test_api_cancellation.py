"""A request cancelled through the HTTP API, or whose client goes away, stops its work at once: a /complete's
generation (running, or queued for the generation lock) and a /losses evaluation."""

from __future__ import annotations

import threading
import time

import pytest

from .conftest import SIGNATURE


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

"""The tabs' handlers called in-process, without a server or a model: bounds on what a request may send, the
generation lock every tab shares, and the chart files a long-running app leaves behind."""

from __future__ import annotations

import re
import time

import pytest

from codeparrot.app.workspace import Workspace
from codeparrot.errors import CodeParrotError


class _Tokenizer:
    """Enough of a tokenizer for `CompletionStreamer`: token i decodes to "x" (no stop string ever)."""

    eos_token_id = 0

    def decode(self, ids, **kwargs):
        return "x" * len(ids)


def _endless_generation(stopped, release):
    """A stand-in for `generate_completions` that streams one token every 10 ms for up to 20 s (the test's
    `release` ends it early on the old code, which never stopped it); `stopped` is set when it returns or raises."""
    import time

    import torch

    def generate(streamer, *args, **kwargs):
        try:
            streamer.put(torch.tensor([[1, 2]]))  # the prompt, as generate() sends it first
            for _ in range(2000):
                if release.is_set():
                    break
                streamer.put(torch.tensor([5]))
                time.sleep(0.01)
            streamer.end()
            return []
        finally:
            stopped.set()

    return generate


def test_blank_code_around_the_cursor_is_bounded_too(tmp_path):
    """Infill reads both sides exactly as given (nothing stripped): a blank side counts against the size limit
    like any other code, it is not skipped."""
    from codeparrot.app.infill import stream_infill

    ws = Workspace(str(tmp_path / "no-repo"), max_upload_bytes=4000)
    for before, after, what in ((" " * 5000, "x = 1\n", "code before the cursor"),
                                ("x = ", "\n" * 5000, "code after the cursor")):
        with pytest.raises(CodeParrotError, match=f"the {what} is 5,000 bytes, over the limit of 4,000 bytes"):
            next(stream_infill(ws, before, after, "main", "latest", 0.0, 0.95, 8, 0))


def test_compare_generates_under_the_generation_lock(monkeypatch, tmp_path):
    """Gradio runs different events at once, and a seeded generation seeds torch's global RNG: the side-by-side
    of the Experiments tab must hold the lock the Complete and Infill tabs hold, or a completion running beside
    it changes what its seed gives."""
    from codeparrot.app import complete, experiments
    from codeparrot.inference.completion import Completion

    held = []

    def generate(model, tokenizer, prompt, **kwargs):
        held.append(complete._GENERATION_LOCK.locked())
        return [Completion(" pass\n", 2, "eos")]

    monkeypatch.setattr(experiments, "generate_completions", generate)
    monkeypatch.setattr(experiments, "fit_to_context", lambda model, tokenizer, prompt, n: n)
    monkeypatch.setattr(Workspace, "model", lambda self, branch, ckpt: (None, _Tokenizer(), f"{branch}@0123"))
    *_, (a, b, status) = experiments.compare(Workspace(str(tmp_path)), "def f():", "main", "latest", "exp",
                                             "latest", 0.5, 8, 7)
    assert a == b == "def f(): pass\n" and held == [True, True], held
    assert not complete._GENERATION_LOCK.locked()


@pytest.mark.parametrize("max_new, seed, message", [
    (2.5, 0, "max new tokens must be a whole number of at least 1, got 2.5"),
    (8, None, "the seed must be a whole number"),
    (8, 1.5, "the seed must be a whole number"),
])
def test_compare_refuses_what_it_cannot_honour(tmp_path, max_new, seed, message):
    """Refused in one line before any model loads (not truncated to 2 tokens, not an internal TypeError)."""
    from codeparrot.app.experiments import compare

    with pytest.raises(CodeParrotError, match=message):
        next(compare(Workspace(str(tmp_path / "no-repo")), "def f():", "main", "latest", "main", "latest", 0.0,
                     max_new, seed))


@pytest.mark.parametrize("tab, seed, message", [
    ("complete", float("nan"), "the seed must be a whole number, got nan"),
    ("infill", 1.5, "the seed must be a whole number, got 1.5"),
    ("compare", "7x", "the seed must be a whole number (both checkpoints sample with it), got '7x'"),
])
def test_a_seed_that_is_no_whole_number_is_refused_before_any_model_loads(tmp_path, tab, seed, message):
    """The HTTP API can send any JSON for a seed: nan was an internal error after the model had loaded, 1.5
    silently became 1, text was an internal ValueError. Each is now the seed's one-line refusal, before any
    model loads (the workspace here has no repository: reaching it would be a different error)."""
    from codeparrot.app.complete import stream_completion
    from codeparrot.app.experiments import compare
    from codeparrot.app.infill import stream_infill

    ws = Workspace(str(tmp_path / "no-repo"))
    handler = {"complete": lambda: stream_completion(ws, "def f():", "main", "latest", 0.0, 0.95, 8, seed),
               "infill": lambda: stream_infill(ws, "x = ", "\n", "main", "latest", 0.0, 0.95, 8, seed),
               "compare": lambda: compare(ws, "def f():", "main", "latest", "exp", "latest", 0.0, 8, seed)}[tab]
    with pytest.raises(CodeParrotError) as refused:
        next(handler())
    assert str(refused.value) == message


@pytest.mark.parametrize("tab", ["complete", "infill", "compare"])
@pytest.mark.parametrize("max_new", [0, -5])
def test_max_new_tokens_below_one_is_refused_before_any_model_loads(tmp_path, tab, max_new):
    """The HTTP API can ask for 0 or -5 new tokens (the page's slider starts at 1): it was quietly raised to 1
    and one token generated. It is now the field's one-line refusal, before any model loads (the workspace has no
    repository: reaching it would be a different error)."""
    from codeparrot.app.complete import stream_completion
    from codeparrot.app.experiments import compare
    from codeparrot.app.infill import stream_infill

    ws = Workspace(str(tmp_path / "no-repo"))
    handler = {"complete": lambda: stream_completion(ws, "def f():", "main", "latest", 0.0, 0.95, max_new, 0),
               "infill": lambda: stream_infill(ws, "x = ", "\n", "main", "latest", 0.0, 0.95, max_new, 0),
               "compare": lambda: compare(ws, "def f():", "main", "latest", "exp", "latest", 0.0, max_new, 0)}[tab]
    with pytest.raises(CodeParrotError) as refused:
        next(handler())
    assert str(refused.value) == f"max new tokens must be a whole number of at least 1, got {max_new!r}"


def test_whole_number_fields():
    """What the page and the API send for a count or a seed: floats from sliders, text, JSON's oddities."""
    from codeparrot.app.whole_number import whole_number

    assert [whole_number(v, "n") for v in (4, 4.0, "4", " 4.0 ", "1e3", 2**63 + 1)] == [4, 4, 4, 4, 1000, 2**63 + 1]
    for bad in (None, 2.5, "x", "", float("nan"), float("inf"), "1e999", True, [4]):
        with pytest.raises(CodeParrotError, match=f"^n must be a whole number, got {re.escape(repr(bad))}$"):
            whole_number(bad, "n")
    with pytest.raises(CodeParrotError, match="^n must be a whole number from 1 to 3 to plot, got 4$"):
        whole_number(4, "n", within=(1, 3), why=" to plot")
    with pytest.raises(CodeParrotError, match="^n must be a whole number of at least 1, got 0$"):
        whole_number(0, "n", within=(1, None))
    assert whole_number(2**70, "n", within=(1, None)) == 2**70


def test_an_empty_batches_field_gets_the_bound_message(tmp_path):
    """The Experiments tab's batches per checkpoint reach `bounded_steps` as given: an empty field (None) is
    its one-line refusal, not an internal error from converting it first."""
    from codeparrot.app.access import MAX_EVAL_STEPS
    from codeparrot.app.experiments import losses_plot

    (tmp_path / "valid").mkdir()
    ws = Workspace(str(tmp_path / "no-repo"), data_dir=tmp_path)
    with pytest.raises(CodeParrotError, match=f"from 1 to {MAX_EVAL_STEPS}, got None"):
        losses_plot(ws, ["exp"], "valid", None, lambda f, desc="": None)


def test_charts_do_not_pile_up_in_the_temp_folder(tmp_path, monkeypatch):
    """Every page load draws the Data tab's chart (and every plot a loss chart): they share one folder of the
    process, and only the newest few stay."""
    import tempfile

    from codeparrot.app.workspace import ChartFiles

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    charts = ChartFiles(keep=3)
    paths = []
    for i in range(8):
        paths.append(charts.new("losses.png"))
        paths[-1].write_bytes(b"png %d" % i)
    assert [p.name for p in paths] == ["losses.png"] * 8 and len({p.parent for p in paths}) == 8
    assert len(list(tmp_path.iterdir())) == 1  # one folder for the process, not one per chart
    assert [p.exists() for p in paths] == [False] * 5 + [True] * 3


def test_page_loads_leave_no_folder_per_chart(monkeypatch, tmp_path):
    """The Data tab's chart is drawn on every page load: two loads leave at most the process's one chart
    folder in the temp folder (there was one new folder per load, never removed)."""
    import json
    import tempfile

    from codeparrot.app.data import data_summary

    (tmp_path / "clean").mkdir()
    (tmp_path / "clean" / "stats.json").write_text(json.dumps({
        "input_records": 10, "bad_records": {"not_utf8": 1}, "exact_duplicates": 2, "filtered": {"autogenerated": 1},
        "kept_train": 5, "kept_valid": 1}))
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    ws = Workspace(str(tmp_path / "no-repo"), data_dir=tmp_path / "clean")
    charts = {data_summary(ws)[0] for _ in range(2)}
    left = list((tmp_path / "tmp").iterdir())
    assert len(charts) == 2 and len(left) <= 1, left


@pytest.mark.parametrize("content_types, refused", [
    ([b"application/json"], True),
    ([b"application/json", b"multipart/form-data; boundary=x"], True),  # Starlette reads the first header
    ([b"application/x-www-form-urlencoded+json"], True),  # FastAPI reads any application/...+json as JSON
    ([b"multipart/form-data; boundary=x"], False),  # an upload: passed on unread
])
def test_a_file_given_as_a_url_is_refused_whatever_the_content_type_says(content_types, refused):
    """The middleware skips only bodies that no route reads as JSON: a form header beside a JSON one, or a form
    media type as a prefix of a JSON one, would otherwise let Gradio download the URL."""
    import asyncio
    import json

    from codeparrot.app.offline import RefuseRemoteFiles

    reached = []

    async def app(scope, receive, send):
        reached.append((await receive())["body"])
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    body = json.dumps({"data": [{"path": "https://example.org/x.py", "meta": {"_type": "gradio.FileData"}}]})
    messages = [{"type": "http.request", "body": body.encode(), "more_body": False}]
    scope = {"type": "http", "method": "POST", "path": "/gradio_api/queue/join", "query_string": b"",
             "headers": [(b"content-type", value) for value in content_types]}
    sent = []

    async def receive():
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)

    asyncio.run(RefuseRemoteFiles(app)(scope, receive, send))
    assert sent[0]["status"] == (403 if refused else 200) and bool(reached) is not refused


def test_a_stream_closed_early_stops_its_generation():
    """Gradio closes a streaming handler's generator when its client cancels or goes away: the generation
    thread behind it must stop within a token or two and free the one generation slot (the lock every tab
    shares), not go on to max_new_tokens for nobody while everyone else waits."""
    import threading

    from codeparrot.app import complete

    stopped, release = threading.Event(), threading.Event()
    stream = complete.stream_generation(_Tokenizer(), _endless_generation(stopped, release), name="test-stream")
    try:
        assert next(stream) == ("x", None)
        stream.close()  # what gradio.utils.SyncToAsyncIterator.aclose does on cancel or disconnect
        assert stopped.wait(2), "the generation went on after its stream was closed"
        assert complete._GENERATION_LOCK.acquire(timeout=2)
        complete._GENERATION_LOCK.release()
    finally:
        release.set()


def test_a_side_by_side_closed_early_stops_its_generation(monkeypatch, tmp_path):
    """The Experiments tab's side by side (two generations under the one lock) stops like the Complete tab when
    its client cancels or leaves: it streams, and closing its stream ends the generation at once."""
    import threading

    from codeparrot.app import complete, experiments

    stopped, release = threading.Event(), threading.Event()
    endless = _endless_generation(stopped, release)
    monkeypatch.setattr(experiments, "generate_completions", lambda *args, streamer, **kw: endless(streamer))
    monkeypatch.setattr(experiments, "fit_to_context", lambda model, tokenizer, prompt, n: n)
    monkeypatch.setattr(Workspace, "model", lambda self, branch, ckpt: (None, _Tokenizer(), f"{branch}@0123"))
    timer = threading.Timer(5, release.set)  # the old code generated to the end inside compare(): bound it
    timer.start()
    try:
        stream = experiments.compare(Workspace(str(tmp_path)), "def f():", "main", "latest", "exp", "latest",
                                     0.0, 8, 7)
        assert next(stream)[0] == "def f():x"
        stream.close()
        assert stopped.wait(2) and not release.is_set(), "the generation went on after its stream was closed"
        assert complete._GENERATION_LOCK.acquire(timeout=2)
        complete._GENERATION_LOCK.release()
    finally:
        timer.cancel()
        release.set()


def _close_while_it_waits(stream) -> None:
    """Close `stream` the way Gradio does on cancel or disconnect while its first `next()` runs on another thread
    (`run_sync_iterator_async`): `close()` fails while the generator executes ("generator already executing"),
    and `SyncToAsyncIterator.aclose` retries it for 60 s holding the app's lock. Here a heartbeat must make it
    closable within a second, and the work thread behind it must then end, not stay queued for the lock."""
    import inspect
    import threading
    import time

    before = set(threading.enumerate())
    waiter = threading.Thread(target=next, args=(stream, None), daemon=True)
    waiter.start()
    while inspect.getgeneratorstate(stream) == inspect.GEN_CREATED:  # the request has started
        time.sleep(0.005)
    start = time.monotonic()
    while True:
        try:
            stream.close()
            break
        except ValueError:  # "generator already executing"
            assert time.monotonic() - start < 1, "a request waiting for the generation lock could not be closed"
            time.sleep(0.01)
    for worker in set(threading.enumerate()) - before - {waiter}:
        worker.join(timeout=1)
        assert not worker.is_alive(), f"{worker.name} still waits for the lock for a closed request"


@pytest.fixture
def lock_held_elsewhere(monkeypatch):
    """Another tab's generation holds the generation lock for the whole test; heartbeats every 50 ms (`generated`:
    a list the generation stand-ins append to, which must stay empty)."""
    from codeparrot.app import background, complete

    monkeypatch.setattr(background, "HEARTBEAT_S", 0.05, raising=False)
    assert complete._GENERATION_LOCK.acquire(timeout=2)
    generated: list = []
    yield generated
    complete._GENERATION_LOCK.release()
    time.sleep(0.1)  # a request the old code left queued for the lock would generate now
    assert not generated, "a closed request generated once the lock was free"


def test_a_stream_waiting_for_the_generation_lock_can_be_closed(lock_held_elsewhere):
    """A request queued behind another tab's generation (blocked waiting for the lock, before any token) is
    closable within a heartbeat when its client cancels or leaves, and never generates afterwards."""
    from codeparrot.app import complete

    stream = complete.stream_generation(_Tokenizer(), lambda streamer: lock_held_elsewhere.append(1) or [],
                                        name="test-lock-wait")
    _close_while_it_waits(stream)


@pytest.mark.parametrize("tab", ["complete", "infill", "compare"])
def test_a_request_waiting_for_the_generation_lock_can_be_cancelled(monkeypatch, tmp_path, lock_held_elsewhere,
                                                                    tab):
    """The same through each generating tab's handler: each must pass the heartbeat on as a yield of what it shows
    (a handler that skipped it without yielding would be as unclosable as before)."""
    from codeparrot.app import complete, experiments, infill

    def generate(*args, streamer, **kwargs):
        lock_held_elsewhere.append(1)
        return []

    for module in (complete, experiments, infill):
        monkeypatch.setattr(module, "generate_completions", generate)
    monkeypatch.setattr(complete, "fit_to_context", lambda model, tokenizer, prompt, n: n)
    monkeypatch.setattr(experiments, "fit_to_context", lambda model, tokenizer, prompt, n: n)
    monkeypatch.setattr(infill, "model_context", lambda model: 100)
    monkeypatch.setattr(infill, "fim_prompt_ids", lambda *args: [1])
    monkeypatch.setattr(infill, "infill_stops", lambda *args: ((), ()))
    monkeypatch.setattr(Workspace, "model", lambda self, branch, ckpt: (None, _Tokenizer(), f"{branch}@0123"))
    ws = Workspace(str(tmp_path))
    stream = {"complete": lambda: complete.stream_completion(ws, "def f():", "main", "latest", 0.0, 0.95, 8, 0),
              "infill": lambda: infill.stream_infill(ws, "x = ", "\n", "main", "latest", 0.0, 0.95, 8, 0),
              "compare": lambda: experiments.compare(ws, "def f():", "main", "latest", "exp", "latest", 0.0, 8, 7),
              }[tab]()
    _close_while_it_waits(stream)


def test_heartbeats_add_no_text(monkeypatch, tmp_path):
    """A generation slower than the heartbeat streams heartbeats between its pieces: the Complete tab yields its
    text unchanged on each (the old heartbeat repeated the last report, which would append a piece twice)."""
    import torch

    from codeparrot.app import background, complete
    from codeparrot.inference.completion import Completion

    def generate(model, tokenizer, prompt, *, streamer, **kwargs):
        streamer.put(torch.tensor([[1, 2]]))
        for _ in range(3):
            time.sleep(0.12)  # a slow token: two or so heartbeats
            streamer.put(torch.tensor([5]))
        streamer.end()
        return [Completion("xxx", 3, "max_new_tokens")]

    monkeypatch.setattr(background, "HEARTBEAT_S", 0.05, raising=False)
    monkeypatch.setattr(complete, "generate_completions", generate)
    monkeypatch.setattr(complete, "fit_to_context", lambda model, tokenizer, prompt, n: n)
    monkeypatch.setattr(Workspace, "model", lambda self, branch, ckpt: (None, _Tokenizer(), f"{branch}@0123"))
    texts = [text for text, _ in complete.stream_completion(Workspace(str(tmp_path)), "def f():", "main", "latest",
                                                             0.0, 0.95, 8, 0)]
    assert texts[-1] == "def f():xxx" and len(texts) > 5, texts  # heartbeats were streamed
    assert all(texts[-1].startswith(text) for text in texts) and texts == sorted(texts, key=len), texts


def test_the_losses_status_line_moves_on_between_reports(monkeypatch, tmp_path):
    """A losses computation that reports seldom (a checkpoint's evaluation can take minutes) still streams its
    status line, with the last thing it reported, at every heartbeat: the request stays closable and the page
    shows it alive."""
    from codeparrot.app import background, experiments

    def quiet_plot(ws, branches, dataset, steps, progress, should_stop):
        progress(0.5, desc="exp: step 10 (1/2)")
        time.sleep(0.3)
        return "losses.png", "2 point(s)"

    monkeypatch.setattr(background, "HEARTBEAT_S", 0.05, raising=False)
    monkeypatch.setattr(experiments, "losses_plot", quiet_plot)
    *updates, last = experiments.stream_losses(Workspace(str(tmp_path)), ["exp"], "valid", 2)
    assert last == ("losses.png", "2 point(s)")
    statuses = [status for _, status in updates if status.startswith("exp: step 10 (1/2) … ")]
    assert len(statuses) >= 3, updates

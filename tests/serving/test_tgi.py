"""TGI's API through the clients that speak it: `huggingface_hub.InferenceClient`, the `text_generation` client and
llm-ls' exact `tgi` wire format, all against a server on 127.0.0.1, all answering what scripts/generate.py answers."""

from __future__ import annotations

import json
import threading
import urllib.request

import pytest

from codeparrot.fim import fim_prompt

from .conftest import NEW_TOKENS

PROMPT = "def add(a, b):"


@pytest.fixture
def hub(served, monkeypatch):
    """An InferenceClient on the served URL. The suite runs with HF_HUB_OFFLINE=1, which the Hub client applies to
    every URL, loopback included: lifted for this client only (it talks to 127.0.0.1, checked below)."""
    import huggingface_hub.constants
    from huggingface_hub import InferenceClient

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    return InferenceClient(model=served.url)


def post(url: str, body: dict) -> tuple[int, object]:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def test_hub_client_plain_stream_and_details_equal_generate_py(off_loopback, hub, generate_py):
    expected = generate_py(PROMPT)
    assert expected.startswith("\n    return a + b")  # the memorized body: the comparison is not vacuous
    assert hub.text_generation(PROMPT, max_new_tokens=NEW_TOKENS) == expected
    assert "".join(hub.text_generation(PROMPT, max_new_tokens=NEW_TOKENS, stream=True)) == expected
    out = hub.text_generation(PROMPT, max_new_tokens=NEW_TOKENS, details=True)
    assert out.generated_text == expected and out.details.finish_reason == "eos_token"
    assert out.details.tokens[-1].special and out.details.generated_tokens == len(out.details.tokens)
    events = list(hub.text_generation(PROMPT, max_new_tokens=NEW_TOKENS, details=True, stream=True))
    assert "".join(e.token.text for e in events) == events[-1].generated_text == expected
    assert events[-1].details.finish_reason == "eos_token" and all(e.details is None for e in events[:-1])


def test_hub_client_stop_sequence_sampling_and_extras(hub, generate_py):
    """TGI keeps the stop sequence; best_of, top_n_tokens, decoder_input_details and seeds come back as TGI says."""
    expected = generate_py(PROMPT)
    out = hub.text_generation(PROMPT, max_new_tokens=NEW_TOKENS, stop=["\ndef"], details=True)
    assert out.generated_text == expected[:expected.index("\ndef") + 4]
    assert out.details.finish_reason == "stop_sequence"
    sampled = hub.text_generation(PROMPT, max_new_tokens=8, do_sample=True, seed=5, details=True,
                                  top_n_tokens=2, decoder_input_details=True)
    assert sampled.details.seed == 5 and len(sampled.details.top_tokens[0]) == 2
    assert [t.id for t in sampled.details.prefill][0] == 0 and sampled.details.prefill[0].logprob is None
    again = hub.text_generation(PROMPT, max_new_tokens=8, do_sample=True, seed=5)
    assert again == sampled.generated_text
    best = hub.text_generation(PROMPT, max_new_tokens=6, best_of=2, do_sample=True, details=True)
    assert len(best.details.best_of_sequences) == 1
    full = hub.text_generation(PROMPT, max_new_tokens=NEW_TOKENS, return_full_text=True)
    assert full == PROMPT + expected


def test_stream_sends_each_token_when_it_is_chosen(served, monkeypatch, generate_py):
    """Each token event used to wait until the next token existed (in case it was the last, which carries the whole
    text): every token, the first included, reached the client a decoding step late. Here every step after the
    prefill waits until the client has read the first event; the last event still ends where the stop sequence
    does, spanning tokens."""
    gate, real_step = threading.Event(), served.state.engine.batch.step
    monkeypatch.setattr(served.state.engine.batch, "step", lambda tokens: gate.wait(10) and real_step(tokens))
    body = {"inputs": PROMPT, "parameters": {"max_new_tokens": NEW_TOKENS, "stop": ["\ndef"]}}
    request = urllib.request.Request(served.url + "/generate_stream", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=3) as answer:
            first = answer.readline()  # before any decoding step: the prefill's token
            gate.set()
            lines = [first] + answer.read().split(b"\n")
    finally:
        gate.set()
    events = [json.loads(line[5:]) for line in lines if line.startswith(b"data:")]
    expected = generate_py(PROMPT)
    assert events[0]["token"]["text"] and events[-1]["details"]["finish_reason"] == "stop_sequence"
    assert "".join(e["token"]["text"] for e in events) == events[-1]["generated_text"] == \
        expected[:expected.index("\ndef") + 4]


def test_hub_client_errors_are_typed(hub):
    from huggingface_hub.errors import ValidationError

    with pytest.raises(ValidationError, match="must be at most"):
        hub.text_generation(PROMPT, max_new_tokens=10**9)
    with pytest.raises(ValidationError, match="not supported"):
        hub.text_generation(PROMPT, max_new_tokens=4, repetition_penalty=1.2)


def test_text_generation_client(served, generate_py):
    pytest.importorskip("text_generation", reason="text-generation is not installed: `make install` installs it (with "
                        "--no-deps, see pyproject.toml's dev extra)")
    from text_generation import Client
    from text_generation.errors import ValidationError

    client = Client(served.url, timeout=60)
    expected = generate_py(PROMPT)
    answer = client.generate(PROMPT, max_new_tokens=NEW_TOKENS)  # it posts to "/" and reads [answer]
    assert answer.generated_text == expected and answer.details.finish_reason == "eos_token"
    stream = list(client.generate_stream(PROMPT, max_new_tokens=NEW_TOKENS))
    assert "".join(r.token.text for r in stream) == stream[-1].generated_text == expected
    with pytest.raises(ValidationError, match="must be at most"):  # the server's 422, typed by the client
        client.generate(PROMPT, max_new_tokens=10**9)


def test_llm_ls_tgi_wire_format(served, generate_py):
    """llm-ls builds the FIM prompt itself and POSTs {"inputs", "parameters"} with return_full_text false to the
    configured URL (…/generate); its `tgi` backend accepts one object only (a list is an error there)."""
    prefix, suffix = "def add(a, b):\n    return ", "\n\ndef sub(a, b):\n    return a - b\n"
    prompt = fim_prompt(prefix, suffix)
    body = {"inputs": prompt, "parameters": {"max_new_tokens": 16, "return_full_text": False}}
    status, answer = post(served.url + "/generate", body)
    assert status == 200 and isinstance(answer, dict) and set(answer) == {"generated_text"}
    assert answer["generated_text"] == generate_py(prefix, new_tokens=16, suffix=suffix)
    status, compat = post(served.url + "/", body)  # TGI's compatibility route: a list
    assert status == 200 and compat == [answer]
    # llm-vscode's default requestBody samples (temperature 0.2, top_p 0.95): still one object, any text
    body["parameters"].update(temperature=0.2, top_p=0.95)
    status, sampled = post(served.url + "/generate", body)
    assert status == 200 and isinstance(sampled["generated_text"], str)


def test_info_and_health(served):
    with urllib.request.urlopen(served.url + "/health", timeout=10) as answer:
        assert answer.status == 200
    with urllib.request.urlopen(served.url + "/info", timeout=10) as answer:
        info = json.loads(answer.read())
    assert info["model_id"] == "memorized" and info["max_total_tokens"] == 64 and info["max_input_tokens"] == 63
    assert info["fim"] == {"prefix": "<fim_prefix>", "suffix": "<fim_suffix>", "middle": "<fim_middle>"}


def test_load_generator_of_the_benchmark(served):
    from codeparrot.tools.benchmarks.serving import percentile, run_load

    payloads = [{"inputs": PROMPT, "parameters": {"max_new_tokens": 4}}, {"inputs": "x =", "parameters": {}}]
    result = run_load(served.url + "/generate", clients=3, total_requests=7, payloads=payloads)
    assert result.errors == [] and len(result.latencies) == 7 and result.rate > 0
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5 and percentile([5.0], 95) == 5.0


def test_every_connection_stayed_on_loopback(off_loopback):
    """The clients above (the Hub client included, with its offline switch lifted) reached nothing but 127.0.0.1."""
    assert off_loopback() == []

"""OpenAI's completions API through the `openai` SDK, llm-ls' `openai` wire format and Continue's streamed FIM
requests, against a server on 127.0.0.1; answers equal scripts/generate.py's for the same greedy settings."""

from __future__ import annotations

import json
import threading
import urllib.request

import pytest

from codeparrot.fim import fim_prompt
from codeparrot.humaneval.stopping import STOP_STRINGS

from .conftest import NEW_TOKENS

PROMPT = "def add(a, b):"
PREFIX, SUFFIX = "def add(a, b):\n    return ", "\n\ndef sub(a, b):\n    return a - b\n"


@pytest.fixture(scope="module")
def client(served):
    from openai import OpenAI

    return OpenAI(base_url=served.url + "/v1", api_key="unused", max_retries=0, timeout=60)


def test_sdk_completion_plain_and_streamed_equal_generate_py(off_loopback, client, generate_py):
    expected = generate_py(PROMPT)
    answer = client.completions.create(model="memorized", prompt=PROMPT, max_tokens=NEW_TOKENS, temperature=0)
    choice = answer.choices[0]
    assert (choice.text, choice.finish_reason, answer.model) == (expected, "stop", "memorized")
    assert answer.usage.completion_tokens == len(client.completions.create(
        model="x", prompt=PROMPT, max_tokens=NEW_TOKENS, temperature=0, logprobs=0).choices[0].logprobs.tokens)
    chunks = list(client.completions.create(model="memorized", prompt=PROMPT, max_tokens=NEW_TOKENS, temperature=0,
                                            stream=True))
    assert "".join(c.choices[0].text for c in chunks) == expected
    assert [c.choices[0].finish_reason for c in chunks][-1] == "stop"


def test_sdk_suffix_is_fill_in_the_middle(client, generate_py):
    """`suffix` becomes the model's PSM prompt; the answer is what generate.py writes for that prompt."""
    expected = generate_py(PREFIX, new_tokens=16, suffix=SUFFIX)
    answer = client.completions.create(model="memorized", prompt=PREFIX, suffix=SUFFIX, max_tokens=16, temperature=0)
    assert answer.choices[0].text == expected
    chunks = client.completions.create(model="memorized", prompt=PREFIX, suffix=SUFFIX, max_tokens=16, temperature=0,
                                       stream=True, stream_options={"include_usage": True})
    chunks = list(chunks)
    assert "".join(c.choices[0].text for c in chunks if c.choices) == expected
    assert chunks[-1].choices == [] and chunks[-1].usage.total_tokens == answer.usage.total_tokens


def test_suffix_prompt_keeps_sentinel_strings_in_code_as_text(client, tiny_models):
    """Code that holds the string `<fim_middle>` or `<|endoftext|>` (a tokenizer's tests, this repository) is
    encoded as training encoded it, as plain text: the prompt is `fim_prompt_ids`' to the token."""
    from transformers import AutoTokenizer

    from codeparrot.fim import fim_prompt_ids

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_models["memorized"]))
    prefix, suffix = 'tok = "<fim_middle>"\nend = "<|endoftext|>"\n', SUFFIX
    answer = client.completions.create(model="m", prompt=prefix, suffix=suffix, max_tokens=2, temperature=0)
    assert answer.usage.prompt_tokens == len(fim_prompt_ids(tokenizer, prefix, suffix))


def test_sdk_stop_list_cuts_like_humaneval(client, generate_py):
    """OpenAI cuts the stop sequence away: with HumanEval's stop strings the text is generate.py's default cut,
    streamed or not (a stream holds back a tail that may still become a stop string)."""
    expected = generate_py(PROMPT, stop=True)
    stop = list(STOP_STRINGS)
    answer = client.completions.create(model="m", prompt=PROMPT, max_tokens=NEW_TOKENS, temperature=0, stop=stop)
    assert answer.choices[0].text == expected == "\n    return a + b\n"
    streamed = client.completions.create(model="m", prompt=PROMPT, max_tokens=NEW_TOKENS, temperature=0, stop=stop,
                                         stream=True)
    assert "".join(c.choices[0].text for c in streamed) == expected


def test_sdk_n_prompts_seed_echo_logprobs_and_models(client):
    answer = client.completions.create(model="m", prompt=[PROMPT, "x ="], n=2, max_tokens=5, temperature=0.9,
                                       seed=11)
    assert sorted(c.index for c in answer.choices) == [0, 1, 2, 3]
    again = client.completions.create(model="m", prompt=[PROMPT, "x ="], n=2, max_tokens=5, temperature=0.9, seed=11)
    assert [c.text for c in again.choices] == [c.text for c in answer.choices]
    echoed = client.completions.create(model="m", prompt=PROMPT, max_tokens=3, temperature=0, echo=True, logprobs=2)
    lp = echoed.choices[0].logprobs
    assert echoed.choices[0].text.startswith(PROMPT) and "".join(lp.tokens).startswith(PROMPT)
    assert lp.token_logprobs[0] is not None and len(lp.top_logprobs[-1]) == 2
    assert [m.id for m in client.models.list()] == ["memorized"]


def test_sdk_errors_are_typed(client):
    import openai

    with pytest.raises(openai.BadRequestError, match="at most 16 per request"):
        client.completions.create(model="m", prompt=PROMPT, n=10**6)
    with pytest.raises(openai.BadRequestError, match="temperature"):
        client.completions.create(model="m", prompt=PROMPT, temperature=3)


def _post(url: str, body: dict) -> tuple[int, bytes]:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as answer:
        return answer.status, answer.read()


def test_llm_ls_openai_wire_format(served, generate_py):
    """llm-ls' `openai` backend: its requestBody plus prompt (FIM built by llm-ls), model and stream false;
    it reads choices[].text (and, on errors, `detail[].loc/msg/type`)."""
    prompt = fim_prompt(PREFIX, SUFFIX)
    body = {"max_tokens": 16, "temperature": 0, "prompt": prompt, "model": "codeparrot", "stream": False}
    status, raw = _post(served.url + "/v1/completions", body)
    assert status == 200
    assert json.loads(raw)["choices"][0]["text"] == generate_py(PREFIX, new_tokens=16, suffix=SUFFIX)
    body["max_tokens"] = 10**9
    request = urllib.request.Request(served.url + "/v1/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(request, timeout=60)
    detail = json.loads(err.value.read())["detail"][0]
    assert err.value.code == 400 and detail["loc"] == "max_tokens" and "at most" in detail["msg"]


def test_continue_streamed_fim_request(served, generate_py):
    """Continue (provider openai, useLegacyCompletionsEndpoint) sends its rendered FIM template with stream true and
    stop words; it reads `data:` chunks until `data: [DONE]`."""
    prompt = fim_prompt(PREFIX, SUFFIX)
    body = {"model": "codeparrot", "prompt": prompt, "max_tokens": 16, "temperature": 0, "stream": True,
            "stop": ["<fim_prefix>", "<fim_suffix>", "<fim_middle>", "<|endoftext|>", "\n\n\n"]}
    status, raw = _post(served.url + "/v1/completions", body)
    lines = [line for line in raw.decode().split("\n") if line]
    assert status == 200 and lines[-1] == "data: [DONE]" and all(line.startswith("data: ") for line in lines)
    chunks = [json.loads(line[6:]) for line in lines[:-1]]
    text = "".join(c["choices"][0]["text"] for c in chunks)
    assert text == generate_py(PREFIX, new_tokens=16, suffix=SUFFIX).split("\n\n\n")[0]


def test_streamed_choices_end_each_when_it_ends(served, client, monkeypatch):
    """With n > 1, a choice's last chunk (its finish_reason, and the text it held back in case it became a stop
    string) waited until all n sequences had ended. Here sequence 0 ends at its second token (EOS) holding its first
    token's text (the start of a stop string); decoding steps after that one wait until the client has read its end.
    """
    from codeparrot.serving import sampling

    first = client.completions.create(model="m", prompt=PROMPT, max_tokens=1, temperature=0).choices[0].text
    eos, real_choose = served.state.tokenizer.eos_token_id, sampling.TokenChooser.choose

    def choose(self, logits, rows):
        picked = real_choose(self, logits, rows)
        self.calls = getattr(self, "calls", 0) + 1
        if self.n == 2 and self.calls == 2 and rows[0] == 0:
            picked[0] = eos
        return picked

    steps, gate, real_step = [], threading.Event(), served.state.engine.batch.step

    def step(tokens):
        steps.append(1)
        return (len(steps) < 2 or gate.wait(10)) and real_step(tokens)

    monkeypatch.setattr(sampling.TokenChooser, "choose", choose)
    monkeypatch.setattr(served.state.engine.batch, "step", step)
    body = {"prompt": PROMPT, "n": 2, "max_tokens": 6, "temperature": 0, "stream": True, "stop": [first + "@@"]}
    request = urllib.request.Request(served.url + "/v1/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    chunks = []
    try:
        with urllib.request.urlopen(request, timeout=3) as answer:
            while not any(c["index"] == 0 and c["finish_reason"] for c in chunks):  # a timeout here is the bug
                line = answer.readline()
                if line.startswith(b"data: {"):
                    chunks += json.loads(line[6:])["choices"]
            early = list(chunks)
            gate.set()
            rest = answer.read().decode().split("\n")
    finally:
        gate.set()
    chunks += [choice for line in rest if line.startswith("data: {") for choice in json.loads(line[6:])["choices"]]
    assert not any(c["index"] == 1 and c["finish_reason"] for c in early)  # sequence 1 still running
    zero = [c for c in chunks if c["index"] == 0]
    assert "".join(c["text"] for c in zero) == first and zero[-1]["finish_reason"] == "stop"
    assert [c["finish_reason"] for c in chunks if c["index"] == 1][-1] == "length"
    assert [line for line in rest if line][-1] == "data: [DONE]"


def test_every_connection_stayed_on_loopback(off_loopback):
    """The clients above (the Hub client included, with its offline switch lifted) reached nothing but 127.0.0.1."""
    assert off_loopback() == []

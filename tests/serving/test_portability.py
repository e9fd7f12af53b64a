"""The path past one machine: a checkpoint is a plain transformers GPT-2 folder with the FIM tokens in its tokenizer,
so TGI or vLLM can serve it as it is. What they rely on is checked here: `AutoModelForCausalLM` and
`pipeline("text-generation")` load it with no custom code, and the tokenizer knows each sentinel as one token."""

from __future__ import annotations

import json
import urllib.request

import pytest

from codeparrot.fim import FIM_TOKENS, fim_prompt

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_plain_transformers_loads_and_continues_like_the_server(tiny_models, served, memorized_code):
    from transformers import AutoModelForCausalLM, AutoTokenizer, pipeline

    folder = tiny_models["memorized"]
    config = json.loads((folder / "config.json").read_text())
    assert config["model_type"] == "gpt2" and "auto_map" not in config  # no trust_remote_code anywhere
    model = AutoModelForCausalLM.from_pretrained(folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    assert type(model).__name__ == "GPT2LMHeadModel"
    ids = {token: tokenizer(token, add_special_tokens=False)["input_ids"] for token in FIM_TOKENS}
    assert all(len(i) == 1 for i in ids.values()) and set(FIM_TOKENS) <= set(tokenizer.all_special_tokens)
    assert len(tokenizer(fim_prompt("a", "b"), add_special_tokens=False)["input_ids"]) == 5

    generator = pipeline("text-generation", model=model, tokenizer=tokenizer, device="cpu")
    # The server puts EOS before the prompt (a file starts there); a pipeline user writes it as text.
    out = generator(tokenizer.eos_token + "def add(a, b):", max_new_tokens=30, do_sample=False,
                    return_full_text=False)[0]["generated_text"]
    assert out == memorized_code[len("def add(a, b):"):]
    body = json.dumps({"inputs": "def add(a, b):", "parameters": {"max_new_tokens": 30}}).encode()
    request = urllib.request.Request(served.url + "/generate", data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as answer:  # the served model is this folder
        assert json.loads(answer.read())["generated_text"] == out

"""Infilling at inference (`generate_completions(suffix=...)`, `scripts/generate.py --suffix/--suffix-file`): the PSM
prompt, a middle that ends at EOS or at a FIM sentinel and never contains one, streaming, and the errors.

A tiny GPT-2 memorizes three FIM documents (as token rows, in the layout training produces), so greedy decoding
from each PSM prompt gives a known middle and a known ending: EOS, the `<fim_pad>` sentinel as a token, or a
sentinel spelled out in plain tokens.
"""

from __future__ import annotations

import json

import pytest

from codeparrot.errors import CodeParrotError, run_cli
from codeparrot.fim import fim_prompt_ids, fim_token_ids
from codeparrot.fim.encoding import plain_text_encoder
from codeparrot.inference.completion import CompletionStreamer, generate_completions, infill_stops
from codeparrot.repository.model import load_model_and_tokenizer

from ..fim.helpers import memorizing_model, old_style_tokenizer

pytestmark = pytest.mark.usefixtures("one_torch_thread")

# (prefix, suffix, middle, how the middle ends in training)
CASES = {
    "eos": ("def add(a, b):\n", "\n\ndef sub(a, b):\n    return a - b\n", "    return a + b\n\nif a:\n    b = 1",
            "eos"),
    "sentinel": ("def mul(a, b):\n", "\n", "    return a * b", "pad"),
    "spelled": ("x = 1\n", "\nz = 3\n", "y = 2  # <fim_middle> oops", "eos"),
}


@pytest.fixture(scope="module")
def fim_model(tmp_path_factory, tiny_models):
    from codeparrot.tokenizer import load_tokenizer

    tok = load_tokenizer(str(tiny_models["random"]))
    ids, enc = fim_token_ids(tok), plain_text_encoder(tok)
    rows = []
    for prefix, suffix, middle, end in CASES.values():
        rows.append(fim_prompt_ids(tok, prefix, suffix) + enc.batch([middle])[0]
                    + [tok.eos_token_id if end == "eos" else ids.pad])
    folder = memorizing_model(tok, rows, tmp_path_factory.mktemp("fim-model"))
    return folder, load_model_and_tokenizer(str(folder), device="cpu")


def test_middle_ends_at_eos_and_no_humaneval_stop_string_cuts_it(fim_model):
    _, (model, tok) = fim_model
    prefix, suffix, middle, _ = CASES["eos"]
    [c] = generate_completions(model, tok, prefix, suffix=suffix, temperature=0, max_new_tokens=40)
    assert c.text == middle and c.stop_reason == "eos"  # "\nif" would have cut a HumanEval completion


def test_middle_ends_at_a_sentinel_token_and_never_contains_one(fim_model):
    _, (model, tok) = fim_model
    prefix, suffix, middle, _ = CASES["sentinel"]
    chunks: list[str] = []
    streamer = CompletionStreamer(tok, write=chunks.append, stop_strings=infill_stops(tok)[0],
                                  stop_ids=infill_stops(tok)[1])
    [c] = generate_completions(model, tok, prefix, suffix=suffix, temperature=0, max_new_tokens=40, streamer=streamer)
    assert c.text == middle and c.stop_reason == "sentinel <fim_pad>"
    assert "".join(chunks) == streamer.text == c.text


def test_a_sentinel_spelled_in_plain_tokens_is_cut_too_and_never_streamed(fim_model):
    _, (model, tok) = fim_model
    prefix, suffix, middle, _ = CASES["spelled"]
    chunks: list[str] = []
    stop_strings, stop_ids = infill_stops(tok)
    streamer = CompletionStreamer(tok, write=chunks.append, stop_strings=stop_strings, stop_ids=stop_ids)
    [c] = generate_completions(model, tok, prefix, suffix=suffix, temperature=0, max_new_tokens=40, streamer=streamer)
    assert c.text == "y = 2  # " and c.stop_reason == "stop string '<fim_middle>'"
    assert all("<" not in chunk for chunk in chunks) and "".join(chunks) == c.text  # the "<fim_" was held back


def test_cli_suffix_and_suffix_file(fim_model, tmp_path, capsys, load_script):
    folder, _ = fim_model
    prefix, suffix, middle, _ = CASES["eos"]
    script = load_script("generate")
    out = tmp_path / "infill.json"
    assert script.main(["--model", str(folder), "--prompt", prefix, "--suffix", suffix, "--temperature", "0",
                        "--max-new-tokens", "40", "--device", "cpu", "--output", str(out)]) == 0
    captured = capsys.readouterr()
    assert captured.out == prefix + middle + suffix  # the middle streamed in place, nothing stripped
    assert "infilled between the prompt" in captured.err
    record = json.loads(out.read_text())
    assert record["suffix"] == suffix and record["completions"][0]["completion"] == middle
    suffix_file = tmp_path / "after.py"
    suffix_file.write_text(CASES["sentinel"][1], encoding="utf-8")
    assert script.main(["--model", str(folder), "--prompt", CASES["sentinel"][0], "--suffix-file", str(suffix_file),
                        "--temperature", "0", "--max-new-tokens", "40", "--device", "cpu", "--quiet"]) == 0
    out_text = capsys.readouterr().out
    assert out_text.endswith(CASES["sentinel"][0] + CASES["sentinel"][2] + CASES["sentinel"][1])
    assert "ended by sentinel <fim_pad>" in out_text


def test_infilling_without_the_fim_tokens_is_a_one_line_error(tmp_path, stdlib_texts, capsys, load_script):
    from codeparrot.repository.model import ModelConfig, build_model, to_gpt2_config

    old = old_style_tokenizer(stdlib_texts[:10], vocab_size=300)
    folder = tmp_path / "old"  # an untrained model is enough: the error comes before any generation
    build_model(to_gpt2_config(ModelConfig(n_layer=1, n_embd=32, n_head=2, n_positions=64), old), seed=0) \
        .save_pretrained(folder)
    old.save_pretrained(folder)
    script = load_script("generate")
    capsys.readouterr()  # saving printed a progress bar
    with pytest.raises(SystemExit) as exit_info:
        run_cli(lambda: script.main(["--model", str(folder), "--prompt", "x", "--suffix", "y", "--device", "cpu"]))
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.startswith("error: --suffix (infilling) needs the FIM tokens")
    assert err.count("\n") == 1
    model, tok = load_model_and_tokenizer(str(folder), device="cpu")
    assert generate_completions(model, tok, "x", temperature=0, max_new_tokens=2)  # left to right still works
    with pytest.raises(CodeParrotError, match="needs the FIM tokens"):
        generate_completions(model, tok, "x", suffix="y", temperature=0, max_new_tokens=2)
    with pytest.raises(SystemExit):
        run_cli(lambda: script.main(["--model", str(folder), "--prompt", "-", "--suffix", "-"]))
    assert "both read stdin" in capsys.readouterr().err

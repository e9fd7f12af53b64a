"""scripts/generate.py and codeparrot.inference.completion: streaming, HumanEval stop rules, prompts, seeds, errors.

A real (tiny) GPT-2 (conftest's `tiny_models`) is trained for a second to memorize two functions, so greedy
decoding from the first signature deterministically produces the first body followed by "\\ndef sub": the stop
rule has something real to cut. An untrained model of the same shape gives noisy samples for the seed tests.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys

import pytest
import torch

from codeparrot.errors import CodeParrotError, run_cli
from codeparrot.inference.completion import CompletionStreamer, build_prompt_ids, generate_completions
from codeparrot.repository.model import load_model_and_tokenizer

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def stream_ids(tok, ids: list[int]) -> tuple[list[str], CompletionStreamer]:
    """The pieces a `CompletionStreamer` writes for `ids` after an EOS prompt, as generate feeds it, and it."""
    written: list[str] = []
    streamer = CompletionStreamer(tok, write=written.append)
    streamer.put(torch.tensor([[tok.eos_token_id]]))  # the prompt
    for i in ids:
        streamer.put(torch.tensor([i]))
    streamer.end()
    return written, streamer

def test_prompt_is_eos_plus_stripped_prompt(memorized):
    _, tok = memorized
    ids = build_prompt_ids(tok, "\n  def add(a, b):\n\n")
    assert ids[0] == tok.eos_token_id
    assert tok.decode(ids[1:]) == "def add(a, b):"
    assert tok.decode(build_prompt_ids(tok, " x\n", strip=False)[1:]) == " x\n"


def test_streamer_writes_while_the_model_is_still_generating(memorized):
    model, tok = memorized
    forwards = [0]
    hook = model.register_forward_pre_hook(lambda *_: forwards.__setitem__(0, forwards[0] + 1))
    chunks: list[tuple[int, str]] = []  # (forward passes done when the chunk was written, text)
    try:
        streamer = CompletionStreamer(tok, write=lambda s: chunks.append((forwards[0], s)), prefix="PROMPT")
        [completion] = generate_completions(model, tok, "def add(a, b):", temperature=0, max_new_tokens=40,
                                            streamer=streamer)
    finally:
        hook.remove()
    assert chunks[0] == (0, "PROMPT")  # the prefix is shown as generation starts, before any token
    text_chunks = chunks[1:]
    assert len({n for n, _ in text_chunks}) >= 3, f"output arrived in one burst: {text_chunks}"
    assert text_chunks[0][0] < forwards[0], "first text only appeared after the last forward pass"
    assert "".join(s for _, s in text_chunks) == completion.text == streamer.text


def test_stop_string_ends_the_sequence_and_is_cut(memorized, memorized_code):
    model, tok = memorized
    forwards = [0]
    hook = model.register_forward_pre_hook(lambda *_: forwards.__setitem__(0, forwards[0] + 1))
    try:
        [c] = generate_completions(model, tok, "def add(a, b):", temperature=0, max_new_tokens=50)
    finally:
        hook.remove()
    assert c.text == "\n    return a + b\n"  # cut at the first "\ndef", the blank line before it kept
    assert c.stop_reason == "stop string '\\ndef'"
    # one forward pass per generated token: generation stopped at the token that completed "\ndef"
    assert c.num_tokens <= forwards[0] <= c.num_tokens + 1, (forwards[0], c.num_tokens)
    assert c.num_tokens == len(tok("\n    return a + b\n\ndef", add_special_tokens=False)["input_ids"])
    # Without stop rules the model writes the second function and ends with EOS.
    [free] = generate_completions(model, tok, "def add(a, b):", temperature=0, max_new_tokens=50, stop=False)
    assert free.text == memorized_code[len("def add(a, b):"):] and free.stop_reason == "eos"


def test_streamer_holds_back_stop_prefixes_and_split_characters(memorized):
    _, tok = memorized
    completion = "\n    s = 'café 😀'\n    return s\nprint(s)\n"
    ids = tok(completion, add_special_tokens=False)["input_ids"]
    assert len(ids) > 10
    written, streamer = stream_ids(tok, ids)
    assert "".join(written) == "\n    s = 'café 😀'\n    return s"
    assert not any("\ufffd" in w for w in written), "a split UTF-8 character was printed half-decoded"
    # no chunk ever showed the newline that turned out to start "\nprint"
    assert all(not "".join(written[:k]).endswith("\n") for k in range(1, len(written) + 1))
    # Without stop rules everything streams, and `end()` flushes what was held back.
    written.clear()
    streamer = CompletionStreamer(tok, write=written.append, stop=False)
    streamer.put(torch.tensor([[tok.eos_token_id]]))
    for i in ids:
        streamer.put(torch.tensor([i]))
    streamer.end()
    assert "".join(written) == completion


def test_same_seed_same_samples_other_seed_others(tiny_models):
    model, tok = load_model_and_tokenizer(str(tiny_models["random"]), device="cpu")
    kw = dict(max_new_tokens=20, temperature=1.0, top_p=0.95, num_return_sequences=3, stop=False)
    a = generate_completions(model, tok, "import os", seed=7, **kw)
    b = generate_completions(model, tok, "import os", seed=7, **kw)
    c = generate_completions(model, tok, "import os", seed=8, **kw)
    assert [x.text for x in a] == [x.text for x in b]
    assert [x.text for x in a] != [x.text for x in c]
    assert len({x.text for x in a}) > 1, "three samples from an untrained model should differ"


def test_cli_reads_prompt_from_stdin_and_writes_json(tiny_models, tmp_path, capsys, monkeypatch, load_script):
    out = tmp_path / "samples.json"
    monkeypatch.setattr(sys, "stdin", io.StringIO("def add(a, b):\n"))
    script = load_script("generate")
    assert script.main(["--model", str(tiny_models["memorized"]), "--prompt", "-", "--temperature", "0",
                        "--max-new-tokens", "40", "--device", "cpu", "--output", str(out)]) == 0
    captured = capsys.readouterr()
    assert captured.out == "def add(a, b):\n    return a + b\n"  # the stripped prompt, then the completion
    record = json.loads(out.read_text())
    [sample] = record["completions"]
    assert sample["completion"] == "\n    return a + b\n" and sample["stop_reason"] == "stop string '\\ndef'"
    assert record["prompt"] == "def add(a, b):\n" and record["settings"]["temperature"] == 0
    assert "stop string" in captured.err and "tokens/s" in captured.err


def test_output_records_the_commit_sampled_and_the_dtype_even_if_the_branch_moves(tiny_models, tmp_path, capsys,
                                                                                monkeypatch, load_script):
    """--output recorded the model and the revision as given: a branch name, which moves as training pushes
    checkpoints, so the saved samples could not be traced to weights. It records the commit the revision named
    and the dtype the weights were loaded in, and samples exactly that commit: here the branch moves on to other
    weights right after it was resolved, and the completion still comes from the commit recorded."""
    from codeparrot.inference import completion
    from codeparrot.repository.refs import open_repository

    repo = open_repository(str(tmp_path / "repo"), create=True)
    repo.commit_folder(tiny_models["random"], "main", "initial model")
    repo.create_branch("exp-1")
    repo.commit_folder(tiny_models["memorized"], "exp-1", "step 10")
    memorized = repo.resolve_revision("exp-1")
    resolve = completion.pinned_commit

    def resolve_then_push(model, revision):  # training pushes a checkpoint right after the run resolved its branch
        commit = resolve(model, revision)
        repo.commit_folder(tiny_models["random"], "exp-1", "step 20")
        return commit

    monkeypatch.setattr(completion, "pinned_commit", resolve_then_push)
    out = tmp_path / "samples.json"
    assert load_script("generate").main(["--model", str(tmp_path / "repo"), "--revision", "exp-1", "--prompt",
                                         "def add(a, b):", "--temperature", "0", "--max-new-tokens", "40",
                                         "--device", "cpu", "--output", str(out)]) == 0
    record = json.loads(out.read_text())
    assert (record["revision"], record["commit"], record["dtype"]) == ("exp-1", memorized, "float32")
    assert record["completions"][0]["completion"] == "\n    return a + b\n"  # the memorized weights sampled
    assert repo.resolve_revision("exp-1") != memorized and capsys.readouterr().out.endswith("return a + b\n")
    # a plain folder has no commit to pin: recorded as none, the dtype still
    monkeypatch.setattr(completion, "pinned_commit", resolve)
    assert load_script("generate").main(["--model", str(tiny_models["memorized"]), "--prompt", "def add(a, b):",
                                         "--max-new-tokens", "4", "--device", "cpu", "--output", str(out)]) == 0
    record = json.loads(out.read_text())
    assert record["commit"] is None and record["dtype"] == "float32"
    from codeparrot.repository.provenance import weights_fingerprint

    assert record["weights"] == weights_fingerprint(str(tiny_models["memorized"]), None)  # the files, named instead
    assert record["weights"]["model.safetensors"].startswith("sha256:")


def test_cli_help_documents_every_flag(scripts_env, python, repo_root):
    result = subprocess.run([python, str(repo_root / "scripts" / "generate.py"), "--help"], capture_output=True,
                            text=True, env=scripts_env, timeout=60)
    assert result.returncode == 0
    for flag in ("--model", "--revision", "--prompt", "--prompt-file", "--max-new-tokens", "--temperature",
                 "--top-p", "--num-return-sequences", "--seed", "--no-stop", "--output"):
        assert flag in result.stdout


def test_cli_prompt_file_and_several_samples(tiny_models, tmp_path, capsys, load_script):
    script = load_script("generate")
    prompt = tmp_path / "prompt.py"
    prompt.write_text("def add(a, b):\n", encoding="utf-8")
    assert script.main(["--model", str(tiny_models["memorized"]), "--prompt-file", str(prompt), "--temperature", "0.1",
                        "--num-return-sequences", "2", "--max-new-tokens", "40", "--seed", "1",
                        "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("──── sample 1/2 (live) ────\ndef add(a, b):\n    return a + b\n")
    assert "──── sample 2/2 · " in out and "ended by stop string '\\ndef'" in out
    assert "def sub" not in out


def test_missing_model_revision_and_bad_requests_are_one_line_errors(tiny_models, tmp_path, capsys, monkeypatch,
                                                                     memorized, load_script):
    from codeparrot.repository.refs import open_repository

    script = load_script("generate")
    # a missing model folder
    with pytest.raises(SystemExit) as exit_info:
        run_cli(lambda: script.main(["--model", str(tmp_path / "nope"), "--prompt", "x"]))
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "nope" in err and err.count("\n") == 1
    # a real local checkpoint repository: the branch loads, an unknown revision is named in the error
    monkeypatch.setenv("CODEPARROT_CACHE", str(tmp_path / "cache"))
    repo = open_repository(str(tmp_path / "repo"), create=True)
    repo.commit_folder(tiny_models["random"], "main", "initial model")
    repo.create_branch("exp-1")
    repo.commit_folder(tiny_models["memorized"], "exp-1", "step 10")
    model, tok = load_model_and_tokenizer(str(tmp_path / "repo"), "exp-1", device="cpu")
    [c] = generate_completions(model, tok, "def add(a, b):", temperature=0, max_new_tokens=30)
    assert c.text == "\n    return a + b\n"
    with pytest.raises(CodeParrotError, match="no-such-branch"):
        load_model_and_tokenizer(str(tmp_path / "repo"), "no-such-branch", device="cpu")
    with pytest.raises(CodeParrotError, match="revision"):  # a plain folder has no revisions
        load_model_and_tokenizer(str(tiny_models["random"]), "main", device="cpu")
    model, tok = memorized
    with pytest.raises(CodeParrotError, match="context of 64 tokens"):
        generate_completions(model, tok, "x = 1\n" * 40, max_new_tokens=10)
    with pytest.raises(CodeParrotError, match="greedy"):
        generate_completions(model, tok, "x", temperature=0, num_return_sequences=2)
    with pytest.raises(CodeParrotError, match="prompt-file"):
        script.main(["--model", str(tiny_models["random"]), "--prompt-file", str(tmp_path / "missing.py")])


def test_special_token_strings_in_the_prompt_stay_plain_text(memorized):
    """Training tokenized documents as plain text (codeparrot.fim.encoding): a prompt that spells out
    `<|endoftext|>` or a FIM sentinel must reach the model as those characters, not as the special ids."""
    from codeparrot.fim.encoding import plain_text_encoder

    _, tok = memorized
    prompt = 'END = "<|endoftext|>"\nMIDDLE = "<fim_middle>"'
    ids = build_prompt_ids(tok, prompt)
    assert ids[0] == tok.eos_token_id  # the one EOS: "a new file starts here"
    assert ids[1:] == plain_text_encoder(tok).batch([prompt])[0]
    assert not set(ids[1:]) & set(tok.added_tokens_decoder), "a special-token string became a special id"
    assert tok.decode(ids[1:], skip_special_tokens=False) == prompt


def _generate_argv(tmp_path, *flags):
    # A model folder that does not exist: an error about it would mean the flags were checked only after loading.
    return ["--model", str(tmp_path / "no-model"), "--device", "cpu", *flags]


def test_a_prompt_that_is_not_utf8_is_a_one_line_error_before_the_model_loads(tmp_path, scripts_env, python,
                                                                              repo_root, load_script):
    # The real command line once (stdin's raw bytes through a pipe); argv carries such a byte as a lone surrogate
    # (Python's surrogateescape), checked in-process.
    argv = [python, str(repo_root / "scripts" / "generate.py"), *_generate_argv(tmp_path), "--prompt", "-"]
    result = subprocess.run(argv, input=b"def f():\n    x\xff", capture_output=True, env=scripts_env, timeout=120)
    assert result.returncode == 2, result.stderr.decode(errors="replace")
    assert result.stderr.decode() == "error: --prompt - (stdin): not UTF-8 text (invalid byte at offset 14, line 2)\n"
    with pytest.raises(CodeParrotError, match=r"^--prompt: not UTF-8 text \(invalid byte at offset 14, line 2\)$"):
        load_script("generate").main(_generate_argv(tmp_path, "--prompt", "def f():\n    x\udcff"))


def test_a_suffix_that_is_not_utf8_is_a_one_line_error(tmp_path, monkeypatch, load_script):
    script = load_script("generate")
    with pytest.raises(CodeParrotError, match=r"^--suffix: not UTF-8 text \(invalid byte at offset 2, line 1\)$"):
        script.main(_generate_argv(tmp_path, "--prompt", "x", "--suffix", "ab\udcfe"))  # how argv carries 0xfe
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"\n\xfe"), encoding="utf-8",
                                                       errors="surrogateescape"))
    with pytest.raises(CodeParrotError, match=r"^--suffix - \(stdin\): not UTF-8 .*offset 1, line 2\)$"):
        script.main(_generate_argv(tmp_path, "--prompt", "x", "--suffix", "-"))


@pytest.mark.parametrize("flags, message", [
    (["--temperature", "nan"], "^--temperature: expected a finite number, got nan$"),
    (["--temperature", "inf"], "^--temperature: expected a finite number, got inf$"),
    (["--temperature=-inf"], "^--temperature: expected a finite number, got -inf$"),
    (["--top-p", "nan"], "^--top-p: expected a finite number, got nan$"),
    (["--top-p", "inf"], "^--top-p: expected a finite number, got inf$"),
    (["--seed", str(2**64)], r"--seed must be in \[-2\*\*63, 2\*\*64 - 1\]"),
    ([f"--seed={-2**63 - 1}"], r"--seed must be in \[-2\*\*63, 2\*\*64 - 1\]"),
])
def test_non_finite_and_out_of_range_settings_are_refused_before_the_model_loads(flags, message, tmp_path,
                                                                                 load_script):
    with pytest.raises(CodeParrotError, match=message):
        load_script("generate").main(_generate_argv(tmp_path, "--prompt", "x", *flags))


def test_generate_completions_checks_the_same_settings(memorized):
    model, tok = memorized
    for kw in ({"temperature": float("nan")}, {"temperature": float("inf")}, {"seed": 2**64}, {"seed": -2**63 - 1}):
        with pytest.raises(CodeParrotError, match=next(iter(kw))):
            generate_completions(model, tok, "x", max_new_tokens=2, **kw)
    # both ends of the range are seeds torch takes (the app passes negative numbers on, too)
    for seed in (2**64 - 1, -2**63):
        assert generate_completions(model, tok, "x", max_new_tokens=2, temperature=1.0, seed=seed)


def test_output_that_is_a_directory_is_refused_before_the_model_loads(tmp_path, load_script):
    with pytest.raises(CodeParrotError, match=f"^--output {tmp_path} is a directory"):
        load_script("generate").main(_generate_argv(tmp_path, "--prompt", "x", "--output", str(tmp_path)))


def test_the_checkpoints_generation_config_is_ignored_and_the_cli_says_so(tiny_models, memorized, tmp_path, capsys,
                                                                            load_script):
    """A third-party checkpoint's generation_config.json (here a repetition penalty, a banned token and
    min_new_tokens, as some Hub models ship) must not change what the flags ask for: `generate` fills every setting
    it is not passed from it, so before, greedy and sampled completions silently changed. The model's own config is
    left as it was, and scripts/generate.py says once which settings it ignored."""
    import shutil

    from codeparrot.inference.decoding import checkpoint_note

    plain_model, tok = memorized
    folder = tmp_path / "third-party"
    shutil.copytree(tiny_models["memorized"], folder)
    model, _ = load_model_and_tokenizer(str(folder), device="cpu")
    first = tok("\n", add_special_tokens=False)["input_ids"][0]  # the memorized body's first token
    model.generation_config.update(repetition_penalty=5.0, bad_words_ids=[[first]], min_new_tokens=30)
    model.generation_config.save_pretrained(folder)
    model, _ = load_model_and_tokenizer(str(folder), device="cpu")
    assert model.generation_config.bad_words_ids == [[first]]  # what a checkpoint shipping the file loads with
    kw = dict(max_new_tokens=40, stop=False)
    for sampling in ({"temperature": 0}, {"temperature": 0.8, "seed": 1}):
        expected = generate_completions(plain_model, tok, "def add(a, b):", **kw, **sampling)
        assert generate_completions(model, tok, "def add(a, b):", **kw, **sampling) == expected
    assert model.generation_config.repetition_penalty == 5.0
    assert checkpoint_note(plain_model, tok.eos_token_id) is None  # our own checkpoints: nothing to say
    capsys.readouterr()
    assert load_script("generate").main(["--model", str(folder), "--prompt", "def add(a, b):", "--temperature", "0",
                                         "--max-new-tokens", "40", "--device", "cpu"]) == 0
    captured = capsys.readouterr()
    assert captured.out == "def add(a, b):\n    return a + b\n"
    [note] = [line for line in captured.err.splitlines() if line.startswith("note:")]
    assert f"bad_words_ids=[[{first}]]" in note and "min_new_tokens=30" in note and "repetition_penalty=5.0" in note
    assert "ignored: only the flags decide" in note


def test_a_special_token_the_model_emits_stays_in_the_streamed_and_final_completion(memorized):
    """A FIM sentinel the model emits in a left-to-right completion was skipped when decoding: the code around it
    was glued together and shown (and scored) as code the model never wrote. It stays as its text now, in the
    stream and in the completion alike."""
    _, tok = memorized
    sentinel = tok.convert_tokens_to_ids("<fim_middle>")
    ids = (tok("\n    return a", add_special_tokens=False)["input_ids"] + [sentinel]
           + tok(" + b\n", add_special_tokens=False)["input_ids"])
    written, streamer = stream_ids(tok, ids)
    assert "".join(written) == streamer.text == "\n    return a<fim_middle> + b\n"

"""/complete and /infill through the HTTP API (gradio_client), served for real on 127.0.0.1: streamed token by
token, cut at a stop string, one model per commit however it is named, every bad input a one-line status."""

from __future__ import annotations

import pytest

from codeparrot.humaneval.stopping import STOP_STRINGS

from .conftest import SIGNATURE


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

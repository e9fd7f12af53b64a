"""The Infill tab (API `/infill`): the code before and after the cursor, the middle written by a checkpoint between
them (fill-in-the-middle), streamed in place.

The model reads the PSM prompt `EOS <fim_prefix> before <fim_suffix> after <fim_middle>` (codeparrot/fim; nothing
stripped: the cursor's indentation matters) and writes the middle until EOS or a FIM sentinel, which is never
shown (`codeparrot.inference.completion` with `suffix=`). The page shows the whole file, before + middle + after,
growing in place as the middle streams, and the middle alone. A checkpoint whose tokenizer lacks the FIM tokens
(trained before they were reserved) is a one-line message.
"""

from __future__ import annotations

import time
from contextlib import closing

from codeparrot.app.background import HEARTBEAT
from codeparrot.app.complete import new_tokens, sampling_controls, seed_or_none, stream_generation
from codeparrot.app.pickers import revision_picker
from codeparrot.app.workspace import Workspace, guarded
from codeparrot.errors import CodeParrotError
from codeparrot.fim.prompt import fim_prompt_ids
from codeparrot.inference.completion import generate_completions, infill_stops
from codeparrot.repository.model import model_context

EXAMPLE_BEFORE = 'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n'
EXAMPLE_AFTER = "\n\nprint(fibonacci(10))\n"
WHAT = "infilling"


def _check_input(ws: Workspace, before: str | None, after: str | None) -> tuple[str, str]:
    # Each side is bounded even when blank: the model reads it all (nothing is stripped).
    before = ws.check_size(before, "code before the cursor")
    after = ws.check_size(after, "code after the cursor")
    if not (before + after).strip():
        raise CodeParrotError("the code before and after the cursor is empty; type or paste some code first")
    return before, after


def stream_infill(ws: Workspace, before: str, after: str, branch: str, checkpoint: str, temperature: float,
                  top_p: float, max_new_tokens: float, seed: float | None):
    """Yield (before + middle so far + after, middle so far, status line) until the middle is final."""
    before, after = _check_input(ws, before, after)
    max_new_tokens = new_tokens(max_new_tokens)
    seed = seed_or_none(seed)  # refused before the model loads
    model, tokenizer, label = ws.model(branch, checkpoint)
    room = model_context(model) - len(fim_prompt_ids(tokenizer, before, after, WHAT))  # FIM tokens checked here
    if room < 1:
        raise CodeParrotError(f"the code before and after the cursor fills the model's whole context of "
                              f"{model_context(model)} tokens; shorten it")
    max_new = min(max_new_tokens, room)
    stop_strings, stop_ids = infill_stops(tokenizer, WHAT)
    start = time.perf_counter()
    middle = ""
    with closing(stream_generation(  # closed with this generator: a cancelled request stops the generation
            tokenizer, lambda streamer: generate_completions(
                model, tokenizer, before, max_new_tokens=max_new, temperature=float(temperature),
                top_p=float(top_p), seed=seed, streamer=streamer, suffix=after),
            name="codeparrot-infill", stop_strings=stop_strings, stop_ids=stop_ids)) as stream:
        for piece, completions in stream:
            if completions is None:
                middle += "" if piece is HEARTBEAT else piece  # a heartbeat: yield the same, to stay closable
                yield before + middle + after, middle, f"filling in with {label} …"
    done = completions[0]
    yield before + done.text + after, done.text, (f"{label} · middle of {done.num_tokens} tokens in "
                                                  f"{time.perf_counter() - start:.1f} s · ended by {done.stop_reason}")


def build_infill_tab(ws: Workspace) -> None:
    import gradio as gr

    gr.Markdown("Give the code before and after the cursor; the checkpoint writes the middle (fill-in-the-middle) "
                "until it ends it (EOS). Needs a checkpoint trained with FIM (`data.fim_rate` > 0) to be useful, "
                "and a tokenizer with the FIM tokens.")
    branch, checkpoint = revision_picker(ws)
    with gr.Row():
        # Textboxes, not gr.Code: the text must be exact (Code strips whitespace, and the cursor's indentation
        # at the end of the code before it is part of the prompt).
        before = gr.Textbox(EXAMPLE_BEFORE, label="code before the cursor", lines=6, elem_id="infill-before",
                            elem_classes=["cp-code"])
        after = gr.Textbox(EXAMPLE_AFTER, label="code after the cursor", lines=6, elem_id="infill-after",
                           elem_classes=["cp-code"])
    temperature, top_p, max_new, seed = sampling_controls(max_new_tokens=64)
    button = gr.Button("Fill in the middle", variant="primary", elem_id="infill-button")
    status = gr.Markdown(elem_id="infill-status")
    output = gr.Textbox(label="before + middle + after (the middle written in place)", lines=12, max_lines=40,
                        interactive=False, elem_id="infill-output", elem_classes=["cp-code"])
    middle = gr.Textbox(label="the middle alone", lines=3, max_lines=20, interactive=False, elem_id="infill-middle",
                        elem_classes=["cp-code"])

    @guarded(lambda line: ("", "", line))
    def infill(before, after, branch, checkpoint, temperature, top_p, max_new_tokens, seed):
        yield from stream_infill(ws, before, after, branch, checkpoint, temperature, top_p, max_new_tokens, seed)

    button.click(infill, [before, after, branch, checkpoint, temperature, top_p, max_new, seed],
                 [output, middle, status], api_name="infill")

"""The Complete tab (API `/complete`): a prompt completed by a checkpoint, streamed, cut by HumanEval's stop rules.

The text shown is `prompt + completion` exactly as the HumanEval harness would execute it: the model reads
`EOS + prompt.strip()` and `codeparrot.inference.completion.CompletionStreamer` only ever shows text that no
later stop string can cut away, so every streamed state is a prefix of the final one.
"""

from __future__ import annotations

import threading
import time
from contextlib import closing
from typing import Callable, TypeVar

from codeparrot.app.background import HEARTBEAT, in_background
from codeparrot.app.pickers import revision_picker
from codeparrot.app.whole_number import whole_number
from codeparrot.app.workspace import Workspace, guarded
from codeparrot.errors import CodeParrotError
from codeparrot.inference.completion import CompletionStreamer, build_prompt_ids, generate_completions
from codeparrot.repository.model import model_context

EXAMPLE_PROMPT = 'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n'
_GENERATION_LOCK = threading.Lock()  # torch's global RNG: a seeded request must not interleave with another
_LOCK_POLL_S = 0.05  # how often a generation waiting for the lock checks whether its request was cancelled
T = TypeVar("T")


def fit_to_context(model, tokenizer, prompt: str, max_new_tokens: int) -> int:
    """`max_new_tokens` capped so that prompt + completion fit the model's context (the slider's range is the
    same for every checkpoint; a small model's context is not); a prompt that fills the context is an error."""
    room = model_context(model) - len(build_prompt_ids(tokenizer, prompt))
    if room < 1:
        raise CodeParrotError(f"the prompt fills the model's whole context of {model_context(model)} tokens; "
                              f"shorten it")
    return min(max_new_tokens, room)  # max_new_tokens >= 1: `new_tokens` refused less


def new_tokens(max_new_tokens) -> int:
    """The max new tokens field's value, at least 1: the slider starts at 1, but the HTTP API can send 0 or
    less, which used to be raised to 1 quietly (one token generated that nobody asked for)."""
    return whole_number(max_new_tokens, "max new tokens", within=(1, None))


def exclusively(generate: Callable[[], T], cancelled: threading.Event | None = None) -> T:
    """`generate()` under the generation lock. Every generation of the app (any tab, all through
    `stream_generation`) goes through here: Gradio runs different events at the same time, and
    `generate_completions` seeds torch's global RNG, so a seeded generation beside another one would not be
    reproducible.

    Once `cancelled` is set (its request was cancelled while queued behind another generation), it stops waiting
    for the lock and raises `GenerationCancelled` without generating: left waiting, it would take the lock after
    the other generation and run its first forward pass (and seed the RNG) for nobody."""
    while not _GENERATION_LOCK.acquire(timeout=_LOCK_POLL_S):
        if cancelled is not None and cancelled.is_set():
            raise GenerationCancelled("cancelled while waiting for another generation to end")
    try:
        if cancelled is not None and cancelled.is_set():  # cancelled as the lock came free
            raise GenerationCancelled("cancelled while waiting for another generation to end")
        return generate()
    finally:
        _GENERATION_LOCK.release()


def seed_or_none(seed: float | None) -> int | None:
    """The seed field's value: None (random) for an empty field or a negative number."""
    if seed is None:
        return None
    seed = whole_number(seed, "the seed")
    return None if seed < 0 else seed


class GenerationCancelled(Exception):
    """Raised inside `generate()` once nobody waits for its text any more (`stream_generation`)."""


class _CancellableStreamer(CompletionStreamer):
    """A `CompletionStreamer` that ends `generate()` once `cancelled` is set: `generate()` calls `put` once per
    new token, so raising there stops it after the token it is on (`generate_completions` takes no stopping
    criteria, and a criterion would not be asked before the next forward pass either)."""

    def __init__(self, tokenizer, cancelled: threading.Event, **kwargs):
        super().__init__(tokenizer, **kwargs)
        self.cancelled = cancelled

    def put(self, value) -> None:
        if self.cancelled.is_set():
            raise GenerationCancelled("the request that wanted this text was cancelled or its client left")
        super().put(value)


def stream_generation(tokenizer, generate: Callable[[CompletionStreamer], list], name: str, **stops):
    """Run `generate(streamer)` on a thread, under the generation lock, while this generator yields
    `(piece, None)` for each decoded piece as it arrives and, last, `(None, completions)` (what `generate`
    returned). An error in the thread is raised here, in the request's thread. `stops`: the streamer's
    `stop_strings` / `stop_ids`.

    Between pieces it also yields `(HEARTBEAT, None)` (`in_background`) whenever none came for a while: waiting
    for the lock behind another tab's generation, or for a slow first token. Its consumer adds nothing for it but
    yields what it shows, unchanged, so that the handler Gradio iterates stays closable there too.

    Closing this generator early stops the generation at its next token (`in_background`), or before it starts
    if it still waits for the lock: Gradio closes a streaming handler's generator when its client cancels or
    disconnects, and a generation left running would hold the lock, so everyone queued behind it, until
    max_new_tokens, for nobody."""

    def work(cancelled: threading.Event, write: Callable[[str], None]) -> list:
        streamer = _CancellableStreamer(tokenizer, cancelled, write=write, **stops)
        return exclusively(lambda: generate(streamer), cancelled)

    return in_background(work, name)


def sampling_controls(max_new_tokens: int):
    """The row of sampling settings the generating tabs share: (temperature, top_p, max_new, seed) components."""
    import gradio as gr

    with gr.Row():
        temperature = gr.Slider(0.0, 2.0, value=0.2, step=0.05, label="temperature (0 = greedy)")
        top_p = gr.Slider(0.05, 1.0, value=0.95, step=0.05, label="top-p")
        max_new = gr.Slider(1, 512, value=max_new_tokens, step=1, label="max new tokens")
        seed = gr.Number(0, precision=0, label="seed (-1 = random)")
    return temperature, top_p, max_new, seed


def stream_completion(ws: Workspace, prompt: str, branch: str, checkpoint: str, temperature: float, top_p: float,
                      max_new_tokens: float, seed: float | None):
    """Yield (prompt + completion so far, status line) until the completion is final."""
    if prompt is None or not prompt.strip():
        raise CodeParrotError("the prompt is empty; type the start of a function to complete")
    ws.check_text(prompt, "prompt")
    max_new_tokens = new_tokens(max_new_tokens)
    seed = seed_or_none(seed)  # refused before the model loads
    model, tokenizer, label = ws.model(branch, checkpoint)
    max_new_tokens = fit_to_context(model, tokenizer, prompt, max_new_tokens)
    start = time.perf_counter()
    text = prompt
    # closing(): when Gradio closes this generator (cancel, disconnect), the generation stops now, not at garbage
    # collection
    with closing(stream_generation(
            tokenizer, lambda streamer: generate_completions(
                model, tokenizer, prompt, max_new_tokens=int(max_new_tokens), temperature=float(temperature),
                top_p=float(top_p), seed=seed, streamer=streamer), name="codeparrot-complete")) as stream:
        for piece, completions in stream:
            if completions is None:
                text += "" if piece is HEARTBEAT else piece  # a heartbeat: yield the same, to stay closable
                yield text, f"generating with {label} …"
    done = completions[0]
    yield prompt + done.text, (f"{label} · {done.num_tokens} tokens in {time.perf_counter() - start:.1f} s · ended by "
                               f"{done.stop_reason}")


def build_complete_tab(ws: Workspace) -> None:
    import gradio as gr

    gr.Markdown("Type the start of a Python function; the checkpoint completes it token by token and stops "
                "exactly where HumanEval would (a new top-level `def`, `class`, `if`, `print` or `#`, or EOS).")
    branch, checkpoint = revision_picker(ws)
    prompt = gr.Code(EXAMPLE_PROMPT, language="python", label="prompt", lines=6, interactive=True,
                     elem_id="complete-prompt")
    temperature, top_p, max_new, seed = sampling_controls(max_new_tokens=128)
    button = gr.Button("Complete", variant="primary", elem_id="complete-button")
    status = gr.Markdown(elem_id="complete-status")
    # A Textbox, not gr.Code: Code strips leading/trailing whitespace, and the text must be exact.
    output = gr.Textbox(label="prompt + completion (what HumanEval would execute)", lines=12, max_lines=40,
                        interactive=False, elem_id="complete-output", elem_classes=["cp-code"])

    @guarded(lambda line: ("", line))
    def complete(prompt, branch, checkpoint, temperature, top_p, max_new_tokens, seed):
        yield from stream_completion(ws, prompt, branch, checkpoint, temperature, top_p, max_new_tokens, seed)

    button.click(complete, [prompt, branch, checkpoint, temperature, top_p, max_new, seed], [output, status],
                 api_name="complete")

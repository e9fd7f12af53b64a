"""The Highlight tab (API `/highlight`): every token of pasted or uploaded code coloured by the model's loss.

Scoring and the page are `codeparrot.inference.highlight` (`score_file` with the same default sliding window as
`scripts/highlight.py`: the model's full context, stride context/2; `render_html`: legend, hover tooltips with
the probability and top alternatives, most surprising lines). The API returns that page's HTML; the tab shows it
in an isolated frame so its styles cannot clash with the app's.
"""

from __future__ import annotations

import os
from pathlib import Path

from codeparrot.app.pickers import revision_picker
from codeparrot.app.workspace import Workspace, guarded
from codeparrot.errors import CodeParrotError
from codeparrot.inference.highlight import most_surprising, render_html, score_file

N_LINES = 10
LINE_HEADERS = ["line", "mean loss (nats)", "code", "worst token", "its p", "model expected"]
# The frame shows the page (the component's value) and is refilled whenever the value changes.
FRAME_TEMPLATE = ('<iframe class="cp-highlight" title="token loss page" '
                  'style="width:100%;height:620px;border:1px solid #ddd;border-radius:6px;background:#fff"></iframe>')
FRAME_JS = ("const show = () => { const f = element.querySelector('iframe.cp-highlight'); "
            "if (f) { f.srcdoc = props.value || ''; } }; show(); watch('value', show);")


def read_upload(path: str | os.PathLike, max_bytes: int) -> str:
    """An uploaded file's text: UTF-8, not binary, within `max_bytes`, else a one-line error naming it."""
    path = Path(path)
    name = path.name
    size = path.stat().st_size
    if size > max_bytes:
        raise CodeParrotError(f"{name} is {size:,} bytes, over the upload limit of {max_bytes:,} bytes")
    data = path.read_bytes()
    if b"\0" in data:
        raise CodeParrotError(f"{name} is a binary file (it contains NUL bytes), not Python source")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data[: err.start].count(b"\n") + 1
        raise CodeParrotError(f"{name} is not UTF-8 text (invalid byte at offset {err.start}, line {line})") from None


def highlight_code(ws: Workspace, code: str | None, upload: str | None, branch: str, checkpoint: str
                   ) -> tuple[str, list[list], str]:
    """(the HTML page, most surprising lines as table rows, status line). An upload wins over pasted code."""
    if upload:
        text, title = read_upload(upload, ws.max_upload_bytes), Path(upload).name
        if not text.strip():
            raise CodeParrotError(f"{title} is empty; nothing to score")
    else:
        text, title = ws.check_text(code, "code"), "pasted code"
    model, tokenizer, label = ws.model(branch, checkpoint)
    scores = score_file(model, tokenizer, text, top_k=5)
    page = render_html(scores, title=title, subtitle=f"model {ws.ref} · {label}", n_lines=N_LINES)
    rows = [[s.line, round(s.mean_loss, 3), s.text.strip()[:100], repr(s.worst.text), f"{s.worst.prob:.2g}",
             repr(s.worst.top[0][0]) if s.worst.top else ""] for s in most_surprising(scores.lines, N_LINES)]
    status = (f"{label} · {len(scores.tokens):,} tokens · mean loss {scores.mean_loss:.3f} nats/token · "
              f"{scores.bits_per_byte:.3f} bits/byte")
    return page, rows, status


def build_highlight_tab(ws: Workspace) -> None:
    import gradio as gr

    gr.Markdown("Paste code or upload a `.py` file: each token is coloured by how surprised the checkpoint is "
                "(its loss); hover a token for its probability and the model's top alternatives.")
    branch, checkpoint = revision_picker(ws)
    with gr.Row():
        code = gr.Code(language="python", label="code", lines=10, interactive=True, elem_id="highlight-code")
        upload = gr.File(label=f"or upload a .py file (UTF-8, at most {ws.max_upload_bytes:,} bytes)",
                         file_types=[".py"], type="filepath", elem_id="highlight-upload")
    button = gr.Button("Highlight", variant="primary", elem_id="highlight-button")
    status = gr.Markdown(elem_id="highlight-status")
    page = gr.HTML("", html_template=FRAME_TEMPLATE, js_on_load=FRAME_JS, elem_id="highlight-page")
    lines = gr.Dataframe(headers=LINE_HEADERS, label="most surprising lines", interactive=False,
                         elem_id="highlight-lines")

    @guarded(lambda line: ("", [], line))
    def highlight(code, upload, branch, checkpoint):
        return highlight_code(ws, code, upload, branch, checkpoint)

    button.click(highlight, [code, upload, branch, checkpoint], [page, lines, status], api_name="highlight")

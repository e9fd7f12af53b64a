"""codeparrot.inference.highlight / scripts/highlight.py: exact sliding-window losses and a page that shows the file
faithfully in a real browser (Debian's headless chromium)."""

from __future__ import annotations

import base64
import html.parser
import json
import re
import shutil
import subprocess

import pytest
import torch

from codeparrot.errors import CodeParrotError
from codeparrot.fim.encoding import plain_text_encoder
from codeparrot.inference.highlight import _ticks, most_surprising, render_html, score_file, score_token_ids
from codeparrot.repository.model import load_model_and_tokenizer

# Everything that breaks naive rendering: a leading newline, CRLF and a lone CR, tabs, trailing spaces, a
# form feed, markup and entities, a multi-byte emoji split over several byte tokens, the EOS text itself.
TRICKY = ("\n# -*- coding: utf-8 -*-\r\nimport os\t\t# tab  \r\n\x0c\nclass Café:\n"
          "    '''<b>bold</b> &amp; \"quotes\" </pre></code></span> <script>alert(1)</script>'''\n"
          "    emoji = '😀🐍'   \n    eos = '<|endoftext|>'\r    x = a < b and c > d & e\n"
          "\tdef f(self):\n\t\treturn {'k': [1, 2, 3]}  # no newline at the end")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.usefixtures("one_torch_thread")


class _CodeText(html.parser.HTMLParser):
    """Text content of <code id="code"> and the number of token spans in it (Python's own HTML parser)."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.depth, self.text, self.spans = 0, [], 0

    def handle_starttag(self, tag, attrs):
        if self.depth or (tag == "code" and ("id", "code") in attrs):
            self.depth += 1
            self.spans += tag == "span" and ("class" in dict(attrs))

    def handle_endtag(self, tag):
        if self.depth:
            self.depth -= 1

    def handle_data(self, data):
        if self.depth:
            self.text.append(data)


def test_sliding_window_matches_brute_force_and_hf_loss(tiny_models, memorized_code):
    model, tok = load_model_and_tokenizer(str(tiny_models["random_ctx32"]), device="cpu")  # context 32
    ids = [tok.eos_token_id] + tok(memorized_code * 3, add_special_tokens=False)["input_ids"]
    assert len(ids) > 80

    def loss_given(begin: int, t: int) -> float:  # -log p(ids[t] | ids[begin:t]), one forward per target
        logits = model(torch.tensor([ids[begin:t]])).logits[0, -1]
        return float(-torch.log_softmax(logits, -1)[ids[t]])

    C = 32
    with torch.no_grad():
        # stride 1: every target sees min(t, C) tokens, the most the model allows
        exact = torch.tensor([loss_given(max(0, t - C), t) for t in range(1, len(ids))])
        got, top_p, top_i = score_token_ids(model, ids, context=C, stride=1, top_k=3)
        torch.testing.assert_close(got, exact, atol=1e-4, rtol=1e-4)
        # stride 8: windows end after targets C, C+8, ... (the last at the end) and read the C ids before
        # their last target, so target t in the window ending at e sees ids[e - 1 - C : t]
        ends = list(range(C + 1, len(ids), 8)) + [len(ids)]
        ref = [loss_given(0, t) if t <= C else loss_given(next(e for e in ends if e > t) - 1 - C, t)
               for t in range(1, len(ids))]
        got8, _, _ = score_token_ids(model, ids, context=C, stride=8, top_k=3)
        torch.testing.assert_close(got8, torch.tensor(ref), atol=1e-4, rtol=1e-4)
        # within one window: the mean equals transformers' own causal-LM loss
        short = torch.tensor([ids[:C]])
        hf = model(short, labels=short).loss
        mine, _, _ = score_token_ids(model, ids[:C], context=C, stride=4, top_k=1)
        assert abs(float(mine.mean()) - float(hf)) < 1e-5
    # top-k: probabilities sorted, and the actual token's probability appears when it is the argmax
    assert torch.all(top_p[:, :-1] >= top_p[:, 1:])
    is_top = top_i[:, 0] == torch.tensor(ids[1:])
    torch.testing.assert_close(top_p[is_top, 0], torch.exp(-got[is_top]))


def test_page_text_is_the_file_exactly_and_self_contained(tiny_models):
    model, tok = load_model_and_tokenizer(str(tiny_models["random_ctx32"]), device="cpu")
    scores = score_file(model, tok, TRICKY, stride=16, top_k=5)  # several windows (context 32)
    assert "".join(TRICKY[s.start:s.end] for s in scores.spans) == TRICKY
    assert [t.token_id for t in scores.tokens] == plain_text_encoder(tok).batch([TRICKY])[0]  # as in training
    assert any(len(s.tokens) > 1 for s in scores.spans), "the emoji should span several byte tokens"
    page = render_html(scores, "tricky.py", "test")
    parser = _CodeText()
    parser.feed(page)
    assert "".join(parser.text) == TRICKY
    assert parser.spans == len(scores.spans)
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:|//)|<link|@import|url\(""", page), "external asset"
    assert "<script>alert" not in page


def test_surprising_lines_find_the_edited_line(tiny_models, memorized, memorized_code, tmp_path, capsys, load_script):
    model, tok = memorized
    edited = memorized_code.replace("return a - b", "return sorted(vars(a))[7] ** b")
    scores = score_file(model, tok, edited, top_k=4)
    top = most_surprising(scores.lines, 2, by="mean")
    assert top[0].line == 5 and "sorted" in top[0].text
    assert most_surprising(scores.lines, 1, by="max")[0].line == 5
    memorized_lines = [s for s in scores.lines if s.line in (1, 2)]
    assert all(s.mean_loss < 0.5 for s in memorized_lines)  # the memorized part is unsurprising
    # the script: writes the page atomically and prints the edited line first
    src = tmp_path / "edited.py"
    src.write_bytes(edited.encode())
    out = tmp_path / "page.html"
    script = load_script("highlight")
    assert script.main([str(src), "--model", str(tiny_models["memorized"]), "--output", str(out), "--lines", "2",
                        "--device", "cpu"]) == 0
    printed = capsys.readouterr().out
    first = printed.splitlines()[2]
    assert "line     5" in first and "sorted(vars(a))" in first
    assert out.is_file() and not list(tmp_path.glob(".page.html*"))
    assert '<a href="#L5">line 5</a>' in out.read_text()


def test_bad_inputs_are_one_line_errors(tiny_models, tmp_path, load_script):
    script = load_script("highlight")
    bad = tmp_path / "latin1.py"
    bad.write_bytes(b"x = 1\ny = '\xe9'\n")
    with pytest.raises(CodeParrotError, match=r"not UTF-8.*line 2"):
        script.main([str(bad), "--model", str(tiny_models["random_ctx32"]), "--output", str(tmp_path / "o.html")])
    empty = tmp_path / "empty.py"
    empty.write_text("")
    with pytest.raises(CodeParrotError, match="empty"):
        script.main([str(empty), "--model", str(tiny_models["random_ctx32"]), "--output", str(tmp_path / "o.html")])
    with pytest.raises(CodeParrotError, match="missing.py"):
        script.main([str(tmp_path / "missing.py"), "--model", str(tiny_models["random_ctx32"]), "--output", "o.html"])
    model, tok = load_model_and_tokenizer(str(tiny_models["random_ctx32"]), device="cpu")
    with pytest.raises(CodeParrotError, match="stride"):
        score_file(model, tok, "x = 1\n", stride=33)
    with pytest.raises(CodeParrotError, match="context"):
        score_file(model, tok, "x = 1\n", context=33)
    # 0 is refused, not taken for "the default" (stride/context or ...)
    with pytest.raises(CodeParrotError, match="--stride must be in"):
        score_file(model, tok, "x = 1\n", stride=0)
    with pytest.raises(CodeParrotError, match="--context must be in"):
        score_file(model, tok, "x = 1\n", context=0)
    scores = score_file(model, tok, "x = 1\n", top_k=2)
    for bad in (float("nan"), float("inf"), 0.0):
        with pytest.raises(CodeParrotError, match="--max-loss must be a finite number > 0"):
            render_html(scores, "f.py", "test", max_loss=bad)
    assert not (tmp_path / "o.html").exists()


def test_special_token_strings_in_the_file_are_scored_as_plain_text(tiny_models):
    """The file is scored as training tokenized it: `<|endoftext|>` and `<fim_middle>` in the code are characters,
    never the special ids (which would score an end of document inside the file)."""
    model, tok = load_model_and_tokenizer(str(tiny_models["random_ctx32"]), device="cpu")
    text = 'EOS = "<|endoftext|>"\nMIDDLE = "<fim_middle>"\n'
    scores = score_file(model, tok, text, top_k=2)
    ids = [t.token_id for t in scores.tokens]
    assert ids == plain_text_encoder(tok).batch([text])[0]
    assert not set(ids) & set(tok.added_tokens_decoder), "a special-token string was scored as a special id"
    assert "".join(text[s.start:s.end] for s in scores.spans) == text


@pytest.mark.parametrize("flags, message", [
    (["--max-loss", "nan"], "^--max-loss: expected a finite number, got nan$"),
    (["--max-loss", "inf"], "^--max-loss: expected a finite number, got inf$"),
    (["--max-loss", "0"], "--max-loss must be a finite number > 0"),
    (["--stride", "0"], "--stride must be at least 1"),
    (["--context", "0"], "--context must be at least 2"),
    (["--context", "1"], "--context must be at least 2"),
    (["--context", "8", "--stride", "9"], r"--stride must be at most --context \(8\)"),
])
def test_bad_flags_are_refused_before_the_model_loads(flags, message, tmp_path, load_script):
    src = tmp_path / "f.py"
    src.write_text("x = 1\n")
    # a model that does not exist: an error about it would mean the flag was checked only after loading (and
    # the --max-loss ones only after scoring the whole file)
    argv = [str(src), "--model", str(tmp_path / "no-model"), "--output", str(tmp_path / "o.html"), *flags]
    with pytest.raises(CodeParrotError, match=message):
        load_script("highlight").main(argv)


def test_output_that_is_a_directory_is_refused_before_the_model_loads(tmp_path, load_script):
    src = tmp_path / "f.py"
    src.write_text("x = 1\n")
    with pytest.raises(CodeParrotError, match=f"^--output {tmp_path} is a directory"):
        load_script("highlight").main([str(src), "--model", str(tmp_path / "no-model"), "--output", str(tmp_path)])


@pytest.mark.parametrize("max_loss", [5e-324, 1e-300, 0.01, 0.7, 1, 3, 8, 13, 1e10, 1.7e308])
def test_legend_ticks_for_any_finite_max_loss(max_loss, tiny_models):
    ticks = _ticks(max_loss)
    assert 2 <= len(ticks) <= 9 and ticks[0] == 0 and ticks[-1] <= max_loss * (1 + 1e-9)
    steps = [b - a for a, b in zip(ticks, ticks[1:])]
    assert all(abs(s - steps[0]) <= 1e-9 * steps[0] for s in steps)  # evenly spaced
    if max_loss == 8:
        assert ticks == [0, 1, 2, 3, 4, 5, 6, 7, 8]  # the default scale
    model, tok = load_model_and_tokenizer(str(tiny_models["random_ctx32"]), device="cpu")
    page = render_html(score_file(model, tok, "x = 1\n", top_k=2), "f.py", "test", max_loss=max_loss)
    assert page.count('<span style="left:') == len(ticks)


# The probe is appended to a copy of the page: it runs in the browser after layout and reports what was
# rendered (text as base64 of UTF-8 so that CR, NUL-free control characters and emoji survive the DOM dump).
_PROBE = """<script>
window.addEventListener("load", () => {
  const code = document.getElementById("code");
  const spans = [...code.querySelectorAll("span.t")];
  const bg = s => getComputedStyle(s).backgroundColor;
  const out = document.createElement("pre");
  out.id = "probe";
  out.textContent = JSON.stringify({
    text: btoa(unescape(encodeURIComponent(code.textContent))),
    spans: spans.length,
    rows: spans.map(s => [parseFloat(s.dataset.loss), bg(s), s.title.length > 0 ? s.title.split("\\n")[0] : ""]),
    codeHeight: code.getBoundingClientRect().height,
  });
  document.body.appendChild(out);
});
</script>"""


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install chromium; CI installs it)")
def test_rendered_in_a_real_browser(memorized, memorized_code, tmp_path):
    model, tok = memorized
    text = memorized_code.replace("return a - b", "return a ** b  # café 😀") + TRICKY
    scores = score_file(model, tok, text, top_k=5)
    page = tmp_path / "page.html"
    page.write_text(render_html(scores, "t.py", "browser test").replace("</body>", _PROBE + "</body>"),
                    encoding="utf-8")
    profile = tmp_path / "chromium-profile"
    result = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         f"--user-data-dir={profile}", "--dump-dom", page.as_uri()],
        capture_output=True, text=True, timeout=120)
    match = re.search(r'<pre id="probe">(.*?)</pre>', result.stdout, re.S)
    assert match, f"chromium rendered no probe (exit {result.returncode}): {result.stderr[-2000:]}"
    probe = json.loads(html.unescape(match.group(1)))
    assert base64.b64decode(probe["text"]).decode("utf-8") == text  # every character, CR and tab included
    assert probe["spans"] == len(scores.spans) and probe["codeHeight"] > 100
    rows = probe["rows"]
    low = {bg for loss, bg, _ in rows if loss < 0.1}
    high = {bg for loss, bg, _ in rows if loss > 8}
    assert low == {"rgb(255, 255, 255)"}, low  # well-predicted tokens stay plain
    assert high and "rgb(255, 255, 255)" not in high  # surprising ones are coloured
    assert all(re.match(r"""^['"].*['"] p=\d""", title) for _, _, title in rows)  # hover text on every token


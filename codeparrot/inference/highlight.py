"""Where does the model get surprised? Per-token loss over a source file, rendered as a self-contained HTML page.

Scoring mirrors training: the file is tokenized like a training document, preceded by EOS (so its very
first token is scored too), and every token t gets loss_t = -log p(token_t | tokens before it) in nats.
Files longer than the context are scored with a sliding window: each window reads `context` tokens and
scores only its last `stride` targets, so every token after the first window sees at least
`context - stride + 1` tokens of context (stride 1 = every token with the full context, the exact but
slowest reference; stride = context = non-overlapping chunks, the cheapest).

Rendering is exact: each token's raw bytes come from the byte-level vocabulary, consecutive tokens that
split one UTF-8 character are merged into one span, and the concatenated spans are checked to equal the
file before any HTML is written. Carriage returns are written as `&#13;` because HTML parsers turn a raw
CR (or CRLF) into LF.
"""

from __future__ import annotations

import html
import math
import sys
from bisect import bisect_right
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers.convert_slow_tokenizer import bytes_to_unicode

from codeparrot.atomic_io import atomic_write_text
from codeparrot.errors import CodeParrotError
from codeparrot.fim.encoding import plain_text_encoder
from codeparrot.inference.completion import read_source_file
from codeparrot.inference.config import HighlightConfig
from codeparrot.repository.model import load_model_and_tokenizer, model_context


@dataclass
class TokenScore:
    """One token of the file: its text, its loss and what the model expected instead."""

    token_id: int
    text: str  # the token's bytes as text (a partial UTF-8 character shows as \\x escapes)
    loss: float  # -log p(token | context), nats
    prob: float
    top: list[tuple[str, float]]  # the model's top-k (token text, probability), most likely first


@dataclass
class Span:
    """A run of file text covered by one token, or by several that split a single UTF-8 character."""

    start: int  # character offsets into the file text
    end: int
    tokens: list[TokenScore]
    line: int  # 1-based line the span belongs to (its first character that is not a line break)

    @property
    def loss(self) -> float:
        """Colour by the worst token: a merged character is as surprising as its least likely byte run."""
        return max(t.loss for t in self.tokens)


@dataclass
class LineScore:
    line: int  # 1-based
    text: str
    mean_loss: float
    max_loss: float
    num_tokens: int
    worst: TokenScore


@dataclass
class FileScores:
    """Everything the page and the terminal summary show."""

    text: str
    spans: list[Span]
    lines: list[LineScore] = field(default_factory=list)

    @property
    def tokens(self) -> list[TokenScore]:
        return [t for s in self.spans for t in s.tokens]

    @property
    def mean_loss(self) -> float:
        toks = self.tokens
        return sum(t.loss for t in toks) / max(1, len(toks))

    @property
    def bits_per_byte(self) -> float:
        return sum(t.loss for t in self.tokens) / math.log(2) / max(1, len(self.text.encode("utf-8")))


# ----------------------------------------------------------------------------------------------- scoring
@torch.inference_mode()
def score_token_ids(model, ids: list[int], context: int, stride: int, top_k: int = 5, progress: bool = False
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sliding-window next-token scores for `ids[1:]` given everything before (ids[0] is the EOS prefix).

    Returns (losses (N,), top_probs (N, k), top_ids (N, k)) with N = len(ids) - 1, row i for target ids[i+1].
    """
    if not 1 <= stride <= context:
        raise CodeParrotError(f"--stride must be in [1, context] = [1, {context}], got {stride}")
    n = len(ids) - 1
    device = next(model.parameters()).device
    losses = torch.full((n,), float("nan"))
    top_probs = torch.empty(n, top_k)
    top_ids = torch.empty(n, top_k, dtype=torch.long)
    windows = [] if n < 1 else _windows(len(ids), context, stride)
    bar = None
    if progress and len(windows) > 1:
        from tqdm.auto import tqdm

        bar = tqdm(total=n, unit="tok", desc="scoring", dynamic_ncols=True, disable=None)  # none in a log file
    for begin, first, end in windows:
        # Input ids[begin:end-1] (at most `context` tokens); its last end-first positions predict the new
        # targets ids[first:end], so only those logits are computed.
        window = torch.tensor([ids[begin:end - 1]], device=device)  # (1, W <= context)
        keep = end - first
        try:
            logits = model(input_ids=window, logits_to_keep=keep).logits[0]  # (keep, V)
        except TypeError:  # a model class without logits_to_keep: slice the full logits
            logits = model(input_ids=window).logits[0, -keep:]
        logp = torch.log_softmax(logits.float(), dim=-1)
        targets = torch.tensor(ids[first:end], device=device)
        losses[first - 1:end - 1] = -logp.gather(1, targets[:, None])[:, 0].cpu()
        p, i = logp.topk(top_k, dim=-1)
        top_probs[first - 1:end - 1] = p.exp().cpu()
        top_ids[first - 1:end - 1] = i.cpu()
        if bar is not None:
            bar.update(keep)
    if bar is not None:
        bar.close()
    return losses, top_probs, top_ids


def _windows(length: int, context: int, stride: int) -> list[tuple[int, int, int]]:
    """(begin, first_target, end) per window over `length` ids. The first window scores targets
    1..min(context, length-1) from the ids before them; each next one ends `stride` targets later (the last
    at `length`) and reads the `context` ids before its last target, so each new target t sees ids[begin:t],
    at least context - stride + 1 of them."""
    out = []
    first, end = 1, min(context + 1, length)
    while True:
        out.append((max(0, end - 1 - context), first, end))
        if end >= length:
            return out
        first, end = end, min(end + stride, length)


# -------------------------------------------------------------------------------------- tokens -> spans
class TokenBytes:
    """Raw bytes of each token id of a byte-level BPE tokenizer (special and added tokens: their content)."""

    def __init__(self, tokenizer):

        self.tokenizer = tokenizer
        self.byte_of = {ch: b for b, ch in bytes_to_unicode().items()}
        self.added = {i: t.content for i, t in tokenizer.added_tokens_decoder.items()}
        self.cache: dict[int, bytes] = {}
        self.shown: dict[int, str] = {}

    def __call__(self, token_id: int) -> bytes:
        if token_id not in self.cache:
            if token_id in self.added:
                self.cache[token_id] = self.added[token_id].encode("utf-8")
            else:
                piece = self.tokenizer.convert_ids_to_tokens(token_id)
                try:
                    self.cache[token_id] = bytes(self.byte_of[ch] for ch in piece)
                except KeyError:
                    raise CodeParrotError(f"token {token_id} ({piece!r}) is not a byte-level BPE token; highlighting "
                                          f"needs a GPT-2-style byte-level tokenizer") from None
        return self.cache[token_id]

    def display(self, token_id: int) -> str:
        """The token as text; bytes of a partial UTF-8 character show as \\x escapes."""
        text = self.shown.get(token_id)
        if text is None:
            text = self.shown[token_id] = self(token_id).decode("utf-8", errors="backslashreplace")
        return text


def build_spans(text: str, token_ids: list[int], tokens: list[TokenScore], token_bytes: TokenBytes) -> list[Span]:
    """Group tokens into spans of whole characters and place them on the file's lines; check exactness."""
    line_starts = [0] + [i + 1 for i, ch in enumerate(text) if ch == "\n"]
    spans: list[Span] = []
    pending: list[TokenScore] = []
    buf = b""
    pos = 0
    for tid, tok in zip(token_ids, tokens):
        buf += token_bytes(tid)
        pending.append(tok)
        try:
            piece = buf.decode("utf-8")
        except UnicodeDecodeError:  # this token ends inside a character: merge with the next one
            continue
        if text[pos:pos + len(piece)] != piece:
            raise CodeParrotError(f"tokenization does not reproduce the file at character {pos} (line "
                                  f"{bisect_right(line_starts, pos)}): the tokenizer normalizes text, so the "
                                  f"page could not show the file faithfully")
        anchor = pos + next((j for j, ch in enumerate(piece) if ch not in "\r\n"), 0)
        spans.append(Span(pos, pos + len(piece), pending, bisect_right(line_starts, anchor)))
        pos += len(piece)
        pending, buf = [], b""
    if pending or pos != len(text):
        raise CodeParrotError(f"tokenization covers {pos} of {len(text)} characters of the file; cannot render it")
    return spans


def score_file(model, tokenizer, text: str, context: int | None = None, stride: int | None = None,
               top_k: int = 5, progress: bool = False) -> FileScores:
    """Per-token loss of `model` on `text` (EOS-prefixed, as in training), grouped into spans and lines."""

    max_context = model_context(model)
    context = max_context if context is None else context  # 0 is an error, not "the default"
    if not 2 <= context <= max_context:
        raise CodeParrotError(f"--context must be in [2, {max_context}] (the model's context), got {context}")
    stride = max(1, context // 2) if stride is None else stride
    vocab = model.config.vocab_size
    if not 1 <= top_k <= vocab:
        raise CodeParrotError(f"--top-k must be in [1, {vocab}], got {top_k}")
    # Plain text, as training tokenized documents: a literal "<|endoftext|>" in the file is scored as the
    # characters the model saw in training, not as an end-of-document token it never saw inside a file.
    ids = [tokenizer.eos_token_id] + plain_text_encoder(tokenizer).batch([text])[0]
    losses, top_p, top_i = score_token_ids(model, ids, context, stride, top_k, progress)
    tb = TokenBytes(tokenizer)
    # Python lists first: indexing tensors element by element costs ~10x more per token.
    loss_list, top_p_list, top_i_list = losses.tolist(), top_p.tolist(), top_i.tolist()
    tokens = [TokenScore(tid, tb.display(tid), loss, math.exp(-loss),
                         [(tb.display(a), p) for a, p in zip(alt_ids, alt_p)])
              for tid, loss, alt_ids, alt_p in zip(ids[1:], loss_list, top_i_list, top_p_list)]
    spans = build_spans(text, ids[1:], tokens, tb)
    return FileScores(text, spans, rank_lines(text, spans))


def rank_lines(text: str, spans: list[Span]) -> list[LineScore]:
    """Every non-blank line with its mean and max token loss (tokens belong to the line of their first
    character that is not a line break, so "\\n    return" counts for the `return` line)."""
    lines = text.split("\n")
    per_line: dict[int, list[TokenScore]] = {}
    for span in spans:
        per_line.setdefault(span.line, []).extend(span.tokens)
    out = []
    for no, toks in per_line.items():
        if not lines[no - 1].strip():
            continue
        worst = max(toks, key=lambda t: t.loss)
        out.append(LineScore(no, lines[no - 1], sum(t.loss for t in toks) / len(toks), worst.loss, len(toks), worst))
    return out


def most_surprising(lines: list[LineScore], n: int, by: str = "mean") -> list[LineScore]:
    """The `n` lines with the highest mean (or max) token loss, ties broken by line number."""
    if by not in ("mean", "max"):
        raise CodeParrotError(f"--rank-by must be 'mean' or 'max', got {by!r}")
    key = (lambda s: (-s.mean_loss, s.line)) if by == "mean" else (lambda s: (-s.max_loss, s.line))
    return sorted(lines, key=key)[:max(0, n)]


def format_lines(lines: list[LineScore], by: str = "mean", width: int = 80) -> str:
    """Terminal table of surprising lines: number, score, the line, the worst token and the model's guess."""
    rows = [f"most surprising lines (by {by} token loss, nats; p = probability of the actual token):"]
    for s in lines:
        code = s.text.strip().replace("\t", " ")
        code = code if len(code) <= width else code[:width - 1] + "…"
        guess = s.worst.top[0] if s.worst.top else ("?", 0.0)
        rows.append(f"  line {s.line:>5}  {s.mean_loss if by == 'mean' else s.max_loss:6.2f}  {code}")
        rows.append(f"{'':>20}worst {s.worst.text!r} p={s.worst.prob:.2g}; model expected {guess[0]!r} "
                    f"p={guess[1]:.2g}")
    return "\n".join(rows)


# ------------------------------------------------------------------------------------------------- HTML
# Sequential white -> yellow -> orange -> brown scale: well-predicted code stays plain, surprises stand out.
_STOPS = [(0.0, (255, 255, 255)), (0.12, (255, 247, 188)), (0.3, (254, 227, 145)), (0.5, (254, 196, 79)),
          (0.7, (254, 153, 41)), (0.85, (236, 112, 20)), (1.0, (204, 76, 2))]
N_BUCKETS = 24


def bucket_colour(i: int) -> str:
    """Colour of bucket i of N_BUCKETS (linear interpolation between the stops)."""
    x = i / (N_BUCKETS - 1)
    for (x0, c0), (x1, c1) in zip(_STOPS, _STOPS[1:]):
        if x <= x1:
            f = (x - x0) / (x1 - x0)
            return "#%02x%02x%02x" % tuple(round(a + (b - a) * f) for a, b in zip(c0, c1))
    return "#%02x%02x%02x" % _STOPS[-1][1]


def _text(s: str) -> str:
    """Escape file text for an HTML text node, keeping every character (CR would become LF if written raw)."""
    return html.escape(s, quote=False).replace("\r", "&#13;")


def _attr(s: str) -> str:
    """Escape for a double-quoted attribute (only &, <, >, " need it; line breaks as references)."""
    return (s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")
            .replace("\r", "&#13;").replace("\n", "&#10;"))


def _tooltip(span: Span) -> str:
    parts = []
    for t in span.tokens:
        alts = "\n".join(f"{'▶' if a == t.text else '  '} {a!r} {p:.2%}" for a, p in t.top)
        parts.append(f"{t.text!r} p={t.prob:.2%} loss={t.loss:.2f}\ntop {len(t.top)}:\n{alts}")
    return "\n\n".join(parts)


def render_html(scores: FileScores, title: str, subtitle: str, max_loss: float = 8.0, n_lines: int = 10,
                rank_by: str = "mean") -> str:
    """A self-contained page: the file with each token coloured by loss (0 .. max_loss nats, clipped),
    a legend, hover tooltips, line numbers and a list of the most surprising lines."""
    if not (math.isfinite(max_loss) and max_loss > 0):
        raise CodeParrotError(f"--max-loss must be a finite number > 0, got {max_loss}")
    code = []
    for span in scores.spans:
        # Clipped before scaling: loss / a tiny max_loss can overflow to inf, which int() refuses.
        b = min(N_BUCKETS - 1, int(min(span.loss / max_loss, 1.0) * N_BUCKETS))
        code.append(f'<span class="t b{b}" data-loss="{span.loss:.3f}" title="{_attr(_tooltip(span))}">'
                    f'{_text(scores.text[span.start:span.end])}</span>')
    # A final "\n" ends the last line rather than starting an empty one (the browser draws no line for it).
    n_file_lines = max(1, scores.text.count("\n") + (0 if scores.text.endswith("\n") else 1))
    gutter = "\n".join(f'<a id="L{i}" href="#L{i}">{i}</a>' for i in range(1, n_file_lines + 1))
    css_buckets = "\n".join(f".b{i}{{background:{bucket_colour(i)}}}" for i in range(N_BUCKETS))
    gradient = ", ".join(f"{bucket_colour(i)} {100 * i / (N_BUCKETS - 1):.1f}%" for i in range(N_BUCKETS))
    ticks = "".join(f'<span style="left:{100 * v / max_loss:.2f}%">{v:g}<br><small>p={math.exp(-v):.2g}</small></span>'
                    for v in _ticks(max_loss))
    worst = "".join(f'<li><a href="#L{s.line}">line {s.line}</a> <b>{(s.mean_loss if rank_by == "mean" else s.max_loss):.2f}</b>'
                    f' <code>{_text(s.text.strip()[:120])}</code></li>'
                    for s in most_surprising(scores.lines, n_lines, rank_by))
    n_tok = sum(len(s.tokens) for s in scores.spans)
    stats = (f"{n_tok:,} tokens · mean loss {scores.mean_loss:.3f} nats/token (perplexity "
             f"{math.exp(min(scores.mean_loss, 700)):.2f}) · {scores.bits_per_byte:.3f} bits/byte")
    return _PAGE.format(title=_text(title), subtitle=_text(subtitle), stats=stats, css_buckets=css_buckets,
                        gradient=gradient, ticks=ticks, max_loss=f"{max_loss:g}", worst=worst, by=rank_by,
                        gutter=gutter, code="".join(code))


def _ticks(max_loss: float) -> list[float]:
    """Legend ticks 0, step, 2 step, ... <= max_loss: 2 to 9 of them, the step 1, 2 or 5 times a power of ten.
    For max_loss in [p, 10p) (p a power of ten) one of 0.1p, 0.2p, 0.5p, p, 2p leaves at most 8 steps."""
    power = 10.0 ** math.floor(math.log10(max_loss))
    if power < 10 * sys.float_info.min:  # a step of 0.1 power would be subnormal (inexact, or 0): just the ends
        return [0.0, max_loss]
    step = next(m * power for m in (0.1, 0.2, 0.5, 1, 2) if max_loss / power / m <= 8 + 1e-9)
    return [i * step for i in range(int(max_loss / step + 1e-9) + 1)]


_PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title} · token loss</title>
<style>
body {{ font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 1.5rem; color: #222; }}
h1 {{ font-size: 1.3rem; margin: 0 0 .2rem; }}
.sub, .stats {{ color: #555; margin: .1rem 0; }}
.legend {{ margin: 1rem 0 2.2rem; max-width: 42rem; }}
.bar {{ height: 14px; border: 1px solid #999; background: linear-gradient(to right, {gradient}); }}
.ticks {{ position: relative; height: 1rem; font-size: .75rem; color: #444; }}
.ticks span {{ position: absolute; transform: translateX(-50%); text-align: center; line-height: 1.05; }}
details {{ margin: .5rem 0 1rem; }} details li {{ margin: .15rem 0; }}
details code {{ background: #f4f4f4; padding: 0 .3rem; }}
.wrap {{ display: flex; border: 1px solid #ddd; overflow-x: auto; }}
pre {{ margin: 0; padding: .5rem .75rem; font: 13px/1.45 ui-monospace, "DejaVu Sans Mono", Menlo, monospace; }}
pre.gutter {{ text-align: right; color: #999; background: #f6f6f6; border-right: 1px solid #ddd; user-select: none; }}
pre.gutter a {{ color: inherit; text-decoration: none; }} pre.gutter a:target {{ color: #c00; font-weight: bold; }}
pre.code {{ flex: 1; tab-size: 8; }}
.t {{ border-radius: 2px; }} .t:hover {{ outline: 1px solid #333; }}
{css_buckets}
.b20, .b21, .b22, .b23 {{ color: #fff; }}
</style></head>
<body>
<h1>{title}</h1>
<p class="sub">{subtitle}</p>
<p class="stats">{stats}</p>
<div class="legend">Token loss, nats (−log p of the actual token; {max_loss}+ clipped). Hover a token for its
probability and the model's most likely alternatives.
<div class="bar"></div><div class="ticks">{ticks}</div></div>
<details open><summary>Most surprising lines (by {by} token loss)</summary><ol>{worst}</ol></details>
<div class="wrap"><pre class="gutter" aria-hidden="true">{gutter}</pre><pre class="code"><code id="code">{code}</code></pre></div>
</body></html>
"""


def run_highlight(cfg: HighlightConfig) -> FileScores:
    """scripts/highlight.py: score `cfg.file`, write the HTML page to `cfg.output` and print the summary line
    and the most surprising lines."""
    path = Path(cfg.file)  # the output was checked writable by the script, before this module loaded
    text = read_source_file(path)
    if not text:
        raise CodeParrotError(f"{path}: the file is empty; nothing to score")
    if Path(cfg.output).resolve() == path.resolve():
        raise CodeParrotError(f"--output {cfg.output} is the input file; choose another path for the page")
    model, tokenizer = load_model_and_tokenizer(cfg.model, cfg.revision, cfg.device)
    scores = score_file(model, tokenizer, text, context=cfg.context, stride=cfg.stride, top_k=cfg.top_k,
                        progress=True)
    where = cfg.model + (f"@{cfg.revision}" if cfg.revision else "")
    page = render_html(scores, title=path.name, subtitle=f"{path} · model {where}", max_loss=cfg.max_loss,
                       n_lines=cfg.lines, rank_by=cfg.rank_by)
    atomic_write_text(cfg.output, page)
    print(f"{path}: {len(scores.tokens):,} tokens, mean loss {scores.mean_loss:.3f} nats/token, "
          f"{scores.bits_per_byte:.3f} bits/byte -> {cfg.output}")
    if cfg.lines:
        print(format_lines(most_surprising(scores.lines, cfg.lines, cfg.rank_by), cfg.rank_by))
    sys.stdout.flush()
    return scores

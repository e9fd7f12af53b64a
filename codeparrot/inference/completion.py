"""Code completion from a checkpoint: HumanEval's prompt format and stop rules, streamed to the terminal.

The prompt is `EOS + prompt.strip()` exactly as the HumanEval harness builds it (training joins files with
EOS, so EOS marks "a new file starts here"). A sequence is finished at EOS or when its completion contains
one of the HumanEval stop strings (`codeparrot.humaneval.stopping` owns them and the cut); the streamer never prints
text that a later stop string would cut away, so what streams is exactly the final truncated completion.

Infilling (`suffix=`, `--suffix`): the model is given the PSM prompt `EOS <fim_prefix> prompt <fim_suffix> suffix
<fim_middle>` (codeparrot/fim; nothing stripped) and writes the middle. A middle ends at EOS, as the model learned,
or at a FIM sentinel, as a token or spelled out in plain tokens (cut before it, so a middle never contains one);
HumanEval's stop strings do not apply (a middle may well hold a `\ndef`).

Models are loaded with `codeparrot.repository.model.load_model_and_tokenizer` (any repository reference
plus an optional revision), as everywhere else. How tokens are drawn and decoded is `codeparrot.inference.decoding`,
shared with HumanEval: only the arguments decide (a checkpoint's generation_config.json is ignored, and
scripts/generate.py says so once), and a special token the model emits mid-completion stays in the text.
"""

from __future__ import annotations

import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import torch
from transformers.generation.streamers import BaseStreamer

from codeparrot.atomic_io import atomic_write_json
from codeparrot.errors import CodeParrotError
from codeparrot.fim.encoding import plain_text_encoder
from codeparrot.fim.prompt import fim_prompt_ids
from codeparrot.fim.tokens import FIM_TOKENS, fim_token_ids
from codeparrot.humaneval.stopping import STOP_STRINGS, finished_completion, truncate_completion
from codeparrot.inference.config import GenerateConfig, check_sampling
from codeparrot.inference.decoding import DECODE_KWARGS, checkpoint_note, flags_only
from codeparrot.repository.model import load_model_and_tokenizer, model_context
from codeparrot.repository.provenance import load_revision, pinned_commit, weights_dtype, weights_fingerprint


# ---------------------------------------------------------------------------------------------- prompts
def build_prompt_ids(tokenizer, prompt: str, strip: bool = True) -> list[int]:
    """HumanEval's prompt: EOS, then the (stripped) prompt tokenized as plain text, the way training tokenized
    documents (codeparrot.fim.encoding): a literal `<|endoftext|>` or `<fim_middle>` in the code stays text."""
    text = prompt.strip() if strip else prompt
    return [tokenizer.eos_token_id] + plain_text_encoder(tokenizer).batch([text])[0]


def decode_utf8(data: bytes, where: str) -> str:
    """`data` as UTF-8 text, or a one-line error naming `where` (a flag and/or path) with the offset and line of
    the first invalid byte."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data[: err.start].count(b"\n") + 1
        raise CodeParrotError(f"{where}: not UTF-8 text (invalid byte at offset {err.start}, line {line})") \
            from None


def check_utf8(text: str, where: str) -> str:
    """`text` unchanged if it is valid Unicode text, else the one-line error of `decode_utf8`. Command-line
    arguments (and stdin read as text) carry bytes that are not UTF-8 as lone surrogates (Python's
    surrogateescape), which the tokenizer would refuse with a TypeError only after the model has loaded."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        # Everything before the first surrogate is valid: its UTF-8 length is the offset of the bad byte.
        start = len(text[: err.start].encode("utf-8"))
        line = text.count("\n", 0, err.start) + 1
        raise CodeParrotError(f"{where}: not UTF-8 text (invalid byte at offset {start}, line {line})") from None
    return text


def read_source_file(path: str | Path, flag: str = "") -> str:
    """A code file's exact text (UTF-8, no newline translation), or a one-line error naming `flag` (e.g.
    "--prompt-file "), the path and, for an invalid byte, its offset and line."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as err:
        raise CodeParrotError(f"{flag}{path}: {err.strerror or err}") from None
    return decode_utf8(data, f"{flag}{path}")


def read_stdin(flag: str) -> str:
    """All of stdin as UTF-8 text, decoded like a file (`read_source_file`) whatever the locale; an invalid byte
    is a one-line error naming `flag`."""
    where = f"{flag} - (stdin)"
    buffer = getattr(sys.stdin, "buffer", None)  # absent when stdin was replaced by a text stream (tests)
    if buffer is None:
        return check_utf8(sys.stdin.read(), where)
    return decode_utf8(buffer.read(), where)


def read_prompt(prompt: str | None, prompt_file: str | None) -> str:
    """`--prompt TEXT`, `--prompt -` (stdin) or `--prompt-file PATH` as text."""
    if prompt_file is not None:
        return read_source_file(prompt_file, "--prompt-file ")
    if prompt == "-":
        return read_stdin("--prompt")
    if prompt is None:
        raise CodeParrotError("give a prompt: --prompt TEXT, --prompt - (read stdin) or --prompt-file PATH")
    return check_utf8(prompt, "--prompt")


def read_suffix(suffix: str | None, suffix_file: str | None) -> str | None:
    """`--suffix TEXT`, `--suffix -` (stdin) or `--suffix-file PATH` as text; None when neither is given."""
    if suffix_file is not None:
        return read_source_file(suffix_file, "--suffix-file ")
    if suffix == "-":
        return read_stdin("--suffix")
    return None if suffix is None else check_utf8(suffix, "--suffix")


def infill_stops(tokenizer, what: str = "--suffix (infilling)") -> tuple[tuple[str, ...], tuple[int, ...]]:
    """(stop strings, stop ids) of a middle: the sentinels as ids (and as text, should the model spell one out in
    plain tokens); a one-line error when the tokenizer has no FIM tokens."""
    return FIM_TOKENS, fim_token_ids(tokenizer, what).all()


# -------------------------------------------------------------------------------------------- streaming
class CompletionStreamer(BaseStreamer):
    """A `generate()` streamer that writes one sequence's completion as it grows, cut like HumanEval.

    `generate` calls `put` first with the prompt ids (batch, prompt_len) and then once per step with the
    new tokens (batch,). Only sequence `sequence` is streamed. Text is written only once it is final:
    a trailing partial UTF-8 character (decoded as U+FFFD) and a trailing prefix of a stop string (e.g. a
    lone "\\n" that may become "\\ndef") are held back until the next token decides. Hence the streamed text
    is always a prefix of, and at the end equal to, the truncated completion (`self.text`).
    """

    def __init__(self, tokenizer, write: Callable[[str], None] | None = None, stop: bool = True,
                 sequence: int = 0, prefix: str = "", stop_strings: Sequence[str] | None = None,
                 stop_ids: Sequence[int] = ()):
        # `stop_strings` replaces HumanEval's (infilling: the sentinels); `stop_ids` end a sequence like EOS.
        self.tokenizer = tokenizer
        self.write = write or _write_stdout
        self.stop_strings: tuple[str, ...] = (tuple(STOP_STRINGS if stop_strings is None else stop_strings)
                                              if stop else ())
        self.stop_ids = frozenset(stop_ids)
        self.sequence = sequence
        self.prefix = prefix  # written when generation starts (after all checks passed), e.g. the prompt
        self.eos_id = tokenizer.eos_token_id
        self.ids: list[int] = []
        self.text = ""  # what has been written so far
        self.finished = False
        self._got_prompt = False

    def put(self, value: torch.Tensor) -> None:
        if not self._got_prompt:  # the first call carries the prompt ids: show `prefix` instead
            self._got_prompt = True
            if self.prefix:
                self.write(self.prefix)
            return
        if self.finished:
            return
        token = int(value.reshape(value.shape[0], -1)[self.sequence, -1])
        if token == self.eos_id or token in self.stop_ids:
            self._finish()
            return
        self.ids.append(token)
        full = self.tokenizer.decode(self.ids, **DECODE_KWARGS)
        cut = truncate_completion(full, self.stop_strings) if self.stop_strings else full
        if len(cut) < len(full):  # a stop string appeared: the completion is final
            self._emit(cut)
            self.finished = True
            return
        self._emit(self._settled_prefix(full))

    def end(self) -> None:
        self._finish()

    def _finish(self) -> None:
        if not self.finished:
            full = self.tokenizer.decode(self.ids, **DECODE_KWARGS)
            self._emit(truncate_completion(full, self.stop_strings) if self.stop_strings else full)
            self.finished = True

    def _settled_prefix(self, full: str) -> str:
        """`full` minus a trailing partial character (decoded as U+FFFD) and minus the longest suffix that is
        the beginning of a stop string: text that the next tokens may still change or cut away."""
        end = len(full)
        while end > 0 and full[end - 1] == "\ufffd":
            end -= 1
        hold = 0
        for s in self.stop_strings:
            for k in range(min(len(s) - 1, end), hold, -1):  # longest proper prefix of s ending at `end`
                if full.endswith(s[:k], 0, end):
                    hold = k
                    break
        return full[:end - hold]

    def _emit(self, text: str) -> None:
        if len(text) > len(self.text):
            self.write(text[len(self.text):])
            self.text = text


def _write_stdout(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


# ------------------------------------------------------------------------------------------- generation
@dataclass
class Completion:
    """One generated sample: the truncated completion (prompt excluded) and why it ended."""

    text: str
    num_tokens: int  # generated tokens up to and including the one that finished it
    stop_reason: str  # "stop string '\\ndef'", "eos", "sentinel <fim_pad>" (infilling) or "max_new_tokens"


def generate_completions(model, tokenizer, prompt: str, *, max_new_tokens: int = 128, temperature: float = 0.2,
                         top_p: float = 0.95, num_return_sequences: int = 1, seed: int | None = None,
                         stop: bool = True, strip_prompt: bool = True,
                         streamer: BaseStreamer | None = None, suffix: str | None = None) -> list[Completion]:
    """Sample `num_return_sequences` completions of `prompt` (temperature 0 = greedy), HumanEval-style; with
    `suffix`, middles between `prompt` and `suffix` (module docstring; `stop` and `strip_prompt` do not apply).

    Each sequence finishes on its own (EOS or a stop string); generation ends when all have. With `seed`,
    the result is reproducible on the same device and software. Only these arguments decide how tokens are
    drawn: the checkpoint's generation config is ignored (`codeparrot.inference.decoding.flags_only`).
    """
    if max_new_tokens < 1:
        raise CodeParrotError(f"--max-new-tokens must be at least 1, got {max_new_tokens}")
    if num_return_sequences < 1:
        raise CodeParrotError(f"--num-return-sequences must be at least 1, got {num_return_sequences}")
    check_sampling(temperature, top_p, seed)
    if temperature == 0 and num_return_sequences > 1:
        raise CodeParrotError(f"--temperature 0 is greedy decoding: all {num_return_sequences} samples would be "
                              f"identical; use a positive temperature or --num-return-sequences 1")
    stop_strings, stop_ids = STOP_STRINGS if stop else (), ()
    if suffix is None:
        prompt_ids = build_prompt_ids(tokenizer, prompt, strip=strip_prompt)
    else:
        stop_strings, stop_ids = infill_stops(tokenizer)
        prompt_ids = fim_prompt_ids(tokenizer, prompt, suffix, "--suffix (infilling)")
    context = model_context(model)
    if len(prompt_ids) + max_new_tokens > context:
        raise CodeParrotError(f"the prompt is {len(prompt_ids)} tokens (EOS included); with --max-new-tokens "
                              f"{max_new_tokens} that exceeds the model's context of {context} tokens")
    device = next(model.parameters()).device
    input_ids = torch.tensor([prompt_ids], device=device)  # (1, prompt_len); generate expands it
    criteria = None
    if stop_strings or stop_ids:  # per sequence: a row finishes at EOS / a stop id, or once it has a stop string
        from transformers import StoppingCriteriaList

        from codeparrot.humaneval.stopping import StopStringsCriteria

        criteria = StopStringsCriteria(tokenizer, len(prompt_ids), stop_strings, stop_ids=stop_ids)
    # top_k=0 switches off transformers' default top-k of 50: the protocol is nucleus sampling only.
    sampling = {"do_sample": True, "temperature": temperature, "top_p": top_p, "top_k": 0} if temperature > 0 \
        else {"do_sample": False}
    if seed is not None:
        torch.manual_seed(seed)  # seeds CPU and every CUDA device
    with torch.inference_mode(), flags_only(model):  # the checkpoint's generation config adds nothing
        out = model.generate(input_ids, attention_mask=torch.ones_like(input_ids), max_new_tokens=max_new_tokens,
                             num_return_sequences=num_return_sequences,
                             eos_token_id=[tokenizer.eos_token_id, *stop_ids] if stop_ids else tokenizer.eos_token_id,
                             pad_token_id=tokenizer.eos_token_id, streamer=streamer,
                             stopping_criteria=StoppingCriteriaList([criteria]) if criteria else None,
                             **sampling)
    new = out[:, len(prompt_ids):].tolist()  # (num_return_sequences, <= max_new_tokens)
    finished = criteria.finished_at if criteria is not None and criteria.finished_at else [None] * len(new)
    return [_to_completion(tokenizer, ids, stop_strings, stop_ids, n) for ids, n in zip(new, finished)]


def _to_completion(tokenizer, ids: list[int], stop_strings: Sequence[str], stop_ids: Sequence[int],
                   finished_at: int | None) -> Completion:
    """One generated row (padding after its end included) as a `Completion`, cut by `codeparrot.humaneval.stopping`."""

    text, reason = finished_completion(tokenizer, ids, stop_strings, stop_ids=stop_ids)
    ends = {tokenizer.eos_token_id, *stop_ids}
    end = next((i for i, t in enumerate(ids) if t in ends), None)
    n = finished_at if finished_at is not None else (end + 1 if end is not None else len(ids))
    if reason == "stop":  # name the stop string that cut it: it starts right where the text ends
        full = tokenizer.decode(ids[:end] if end is not None else ids, **DECODE_KWARGS)
        hit = next((s for s in stop_strings if full.startswith(s, len(text))), full[len(text):len(text) + 8])
        return Completion(text, n, f"stop string {hit!r}")
    if reason == "sentinel":
        return Completion(text, n, f"sentinel {tokenizer.convert_ids_to_tokens(ids[end])}")
    return Completion(text, n, "eos" if reason == "eos" else "max_new_tokens")


def timed_generation(fn: Callable[[], list[Completion]]) -> tuple[list[Completion], float]:
    """Run `fn` and return its completions with the wall time in seconds."""
    start = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - start


def format_samples(prompt_text: str, completions: Sequence[Completion], start: int = 0, suffix: str = "") -> str:
    """Samples `start..` as blocks with a header each, prompt (and an infilling suffix) included, for the terminal."""
    blocks = []
    for i, c in enumerate(completions[start:], start=start):
        header = f"──── sample {i + 1}/{len(completions)} · {c.num_tokens} tokens · ended by {c.stop_reason} ────"
        body = prompt_text + c.text + suffix
        blocks.append(f"{header}\n{body}" + ("" if body.endswith("\n") else "\n"))
    return "\n".join(blocks)


def run_generate(cfg: GenerateConfig) -> list[Completion]:
    """scripts/generate.py: complete `cfg`'s prompt (or, with a suffix, fill in the middle), streaming sample 1
    live unless `cfg.quiet`; the summary (tokens/s, seed, why each sample ended) goes to stderr and, with
    `cfg.output`, everything to a JSON file."""
    prompt = read_prompt(cfg.prompt, cfg.prompt_file)
    suffix = read_suffix(cfg.suffix, cfg.suffix_file)
    seed = cfg.seed if cfg.seed is not None else random.SystemRandom().randrange(2**31)
    # The commit the revision names now is the one loaded and recorded: a branch moves as training pushes
    # checkpoints, and a saved generation must name the weights that made it (as HumanEval's samples do).
    commit = pinned_commit(cfg.model, cfg.revision)
    weights = weights_fingerprint(cfg.model, commit) if cfg.output else None  # before loading: what is loaded
    model, tokenizer = load_model_and_tokenizer(cfg.model, load_revision(cfg.model, cfg.revision, commit), cfg.device)
    if note := checkpoint_note(model, tokenizer.eos_token_id):
        print(note, file=sys.stderr)
    infill = suffix is not None
    stop_strings, stop_ids = infill_stops(tokenizer) if infill else (None, ())  # fails before any generation
    shown_prompt = prompt.strip() if cfg.strip_prompt and not infill else prompt
    n = cfg.num_return_sequences

    streamer = None
    if not cfg.quiet:  # the streamer shows the header and prompt once generation really starts
        header = f"──── sample 1/{n} (live) ────\n" if n > 1 else ""
        streamer = CompletionStreamer(tokenizer, stop=cfg.stop or infill, prefix=header + shown_prompt,
                                      stop_strings=stop_strings, stop_ids=stop_ids)
    completions, seconds = timed_generation(lambda: generate_completions(
        model, tokenizer, prompt, max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature,
        top_p=cfg.top_p, num_return_sequences=n, seed=seed, stop=cfg.stop, strip_prompt=cfg.strip_prompt,
        streamer=streamer, suffix=suffix))
    suffix_text = suffix or ""
    if streamer is not None:
        sys.stdout.write(suffix_text)  # the middle streamed in place: the code after the cursor follows it
        if not (shown_prompt + streamer.text + suffix_text).endswith("\n"):
            print()
        if streamer.text != completions[0].text:  # cannot happen unless decoding is not prefix-stable
            print("warning: the live stream differs from the final sample 1; the final one is:", file=sys.stderr)
            print(format_samples(shown_prompt, completions[:1], suffix=suffix_text))
        if n > 1:
            print()
            print(format_samples(shown_prompt, completions, start=1, suffix=suffix_text), end="")
    else:
        print(format_samples(shown_prompt, completions, suffix=suffix_text), end="")

    total = sum(c.num_tokens for c in completions)
    reasons = ", ".join(c.stop_reason for c in completions)
    infilled = (f"; infilled between the prompt ({len(prompt)} characters) and the suffix ({len(suffix)}): "
                f"{', '.join(f'{len(c.text)}' for c in completions)} characters" if infill else "")
    print(f"[{n} sample(s), {total} tokens in {seconds:.2f} s ({total / max(seconds, 1e-9):.1f} tokens/s); "
          f"seed {seed}; ended by: {reasons}{infilled}]", file=sys.stderr)
    if cfg.output:
        atomic_write_json(cfg.output, {
            # commit: None for a plain folder or a worktree with changes (nothing to pin): then `weights`, the
            # fingerprint of the files loaded, names them; dtype: float32 on a CPU, the saved one on a GPU, and
            # another dtype gives other samples from the same seed
            "model": cfg.model, "revision": cfg.revision, "commit": commit,
            **({"weights": weights} if weights is not None else {}), "dtype": weights_dtype(model),
            "prompt": prompt, "seed": seed,
            **({"suffix": suffix} if infill else {}),
            "settings": {"max_new_tokens": cfg.max_new_tokens, "temperature": cfg.temperature,
                         "top_p": cfg.top_p, "num_return_sequences": n, "stop": cfg.stop,
                         "strip_prompt": cfg.strip_prompt},
            "seconds": round(seconds, 3),
            "completions": [{"completion": c.text, "num_tokens": c.num_tokens, "stop_reason": c.stop_reason}
                            for c in completions]})
    return completions

"""When a HumanEval completion ends, and where it is cut.

A completion (the generated text after the prompt) ends at EOS or as soon as it contains one of the stop
strings below: each marks the start of a new top-level statement, i.e. the function body is over. The
completion is then cut at the FIRST stop string found IN THE COMPLETION; the prompt is never looked at
or cut, and a completion without any stop string is kept whole. (The original CodeParrot script decoded
prompt + completion together and cut the function signature away when no stop string appeared, and kept
extra blocks in other cases.)

`StopStringsCriteria` is the per-sequence stopping criterion for `model.generate`: each row of the batch is
finished on its own (a finished row stays finished; `generate` pads it and stops when all rows are done).
Only the newest few tokens of each row are decoded per step, enough to see a stop string that is split
across several tokens, so a step costs O(batch) small decodes instead of re-decoding every completion.

Infilling (codeparrot/fim) does not use HumanEval's stop strings: a middle ends at EOS, as the model learned, at
a FIM sentinel id (`stop_ids`), or at a sentinel spelled out in plain tokens (the sentinels as stop strings), so
a middle never contains one.

Any other special token the model emits (a FIM sentinel in a left-to-right completion) neither ends the completion
nor vanishes from it: it is decoded as its text, which is what the model wrote there, so the program holding it
fails as it would; a stop string is never seen across it ("\n<fim_pad>def" holds no "\ndef").
"""

from __future__ import annotations

from typing import Sequence

import torch
from transformers import StoppingCriteria

from codeparrot.inference.decoding import DECODE_KWARGS

# CodeParrot's / Codex's stop strings: a new class, function, comment, decorator, print or if at column 0.
STOP_STRINGS: tuple[str, ...] = ("\nclass", "\ndef", "\n#", "\n@", "\nprint", "\nif")


def truncate_completion(completion: str, stop_strings: Sequence[str] = STOP_STRINGS) -> str:
    """`completion` cut right before the earliest occurrence of any stop string (the whole text if none).

    `completion` must be the generated text only: a stop string inside the prompt is not a reason to cut.
    """
    cut = len(completion)
    for stop in stop_strings:
        if not stop:
            continue
        at = completion.find(stop, 0, cut + len(stop) - 1)  # only an earlier occurrence can win
        if at != -1 and at < cut:
            cut = at
    return completion[:cut]


def _max_stop_bytes(stop_strings: Sequence[str]) -> int:
    return max((len(s.encode("utf-8")) for s in stop_strings), default=0)


class StopStringsCriteria(StoppingCriteria):
    """Per-sequence stopping for `generate`: a row is done at EOS or once its completion holds a stop string.

    `prompt_len` is the (left-padded) prompt length, i.e. `input_ids.shape[1]` at the first call: every row's
    completion is `input_ids[row, prompt_len:]` because left padding puts all prompts' ends at the same
    column. Each call decodes, per unfinished row, only the last `window` generated tokens: a stop string of
    b UTF-8 bytes that was completed by the newest token starts at most b tokens back (every token is at
    least one byte), so `window = max bytes + 1` tokens always contain it. A window that starts inside a
    multi-byte character decodes to U+FFFD there, which can neither create nor hide an ASCII stop string.

    `finished_at[row]` records how many tokens the row had generated when it finished (None while running).
    `stop_ids`: further token ids that finish a row like EOS (the FIM sentinels when infilling).
    """

    def __init__(self, tokenizer, prompt_len: int, stop_strings: Sequence[str] = STOP_STRINGS,
                 eos_token_id: int | None = None, window: int | None = None, stop_ids: Sequence[int] = ()):
        self.tokenizer = tokenizer
        self.prompt_len = int(prompt_len)
        self.stop_strings = tuple(s for s in stop_strings if s)
        self.eos_token_id = tokenizer.eos_token_id if eos_token_id is None else eos_token_id
        self.end_ids = {t for t in (self.eos_token_id, *stop_ids) if t is not None}
        self.window = window if window is not None else _max_stop_bytes(self.stop_strings) + 1
        self.finished_at: list[int | None] = []

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor | None = None,
                 **kwargs) -> torch.BoolTensor:
        batch, length = input_ids.shape  # (batch, prompt_len + generated so far)
        generated = length - self.prompt_len
        if len(self.finished_at) != batch:
            self.finished_at = [None] * batch
        if generated <= 0:
            return torch.zeros(batch, dtype=torch.bool, device=input_ids.device)
        start = max(self.prompt_len, length - self.window)
        tails = input_ids[:, start:].tolist()  # (batch, <= window): one device->host copy per step
        for row, tail in enumerate(tails):
            if self.finished_at[row] is not None:
                continue  # finished rows stay finished, whatever padding follows
            if tail[-1] in self.end_ids:
                self.finished_at[row] = generated
                continue
            if self.stop_strings:
                text = self.tokenizer.decode(tail, **DECODE_KWARGS)
                if any(stop in text for stop in self.stop_strings):
                    self.finished_at[row] = generated
        done = [f is not None for f in self.finished_at]
        return torch.tensor(done, dtype=torch.bool, device=input_ids.device)


def finished_completion(tokenizer, generated_ids: Sequence[int], stop_strings: Sequence[str] = STOP_STRINGS,
                        eos_token_id: int | None = None, stop_ids: Sequence[int] = ()) -> tuple[str, str]:
    """Decode one row of generated ids (padding after its end included) into (completion, finish reason).

    The row is cut at the first EOS (or id of `stop_ids`), decoded exactly, and truncated at the first stop
    string. The reason is "stop" (a stop string cut it), "eos", "sentinel" (an id of `stop_ids`: a FIM
    sentinel), or "length" (ran out of new tokens).
    """
    eos = tokenizer.eos_token_id if eos_token_id is None else eos_token_id
    ids = list(generated_ids)
    end_ids = {t for t in (eos, *stop_ids) if t is not None}
    end = next((i for i, t in enumerate(ids) if t in end_ids), None)
    ended_by = None
    if end is not None:
        ended_by = "eos" if ids[end] == eos else "sentinel"
        ids = ids[:end]
    text = tokenizer.decode(ids, **DECODE_KWARGS)
    cut = truncate_completion(text, stop_strings)
    if len(cut) < len(text):
        return cut, "stop"
    return cut, ended_by or "length"

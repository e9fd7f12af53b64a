"""Generated ids to text, one token at a time: incremental decoding, stop strings, and what a stream may send yet.

A byte-level BPE token can end inside a UTF-8 character, so the text of one token alone is not always text. The
decoder below is the one TGI uses (`decode_token` with a prefix and a read offset): it decodes a short window of
recent ids twice, with and without the newest ones, and emits the difference once it no longer ends in U+FFFD (a
character still incomplete). The emitted pieces join up to the decoded text of all ids; `full_text()` is that
decode, done once at the end. Decoding is the Rust tokenizer's own `decode` (what transformers' `decode` calls, minus
its Python layers: several times faster, and this runs twice per token), exact as scripts/generate.py's
(`DECODE_KWARGS`: no clean-up of spaces before punctuation). The ids that end a sequence never reach a generated
sequence's decoder; any other special token does, and is kept as its text, as generate.py keeps it
(`codeparrot.inference.decoding`): dropping it would glue the text around it. The server ends every sequence at EOS
and at the FIM sentinels (serving/server.py), so with CodeParrot's tokenizers no special token is left to keep,
while generate.py and HumanEval end a left-to-right completion at EOS only and show a sentinel the model wrote as
its text. The prompt's decoder skips special tokens (its leading EOS is no text of the prompt).

Stop strings are looked for in the text, not in ids (a stop string can span several tokens and a token can hold
more than a stop string), and only in the part the newest token could have completed. Where the stop string ends up
(kept: TGI; cut away: OpenAI) is the protocol's choice; `held_back` tells a stream how much of the tail must wait
because the next token may turn it into a stop string that would be cut.
"""

from __future__ import annotations

from typing import Sequence


class IncrementalDecoder:
    """The text of one generated sequence as its ids arrive (`add` returns the new text, maybe "")."""

    def __init__(self, tokenizer, skip_special_tokens: bool = True):
        self._decoder = tokenizer.backend_tokenizer
        self._skip_special = skip_special_tokens
        self.ids: list[int] = []
        self.text = ""  # everything emitted so far: a prefix of the decoded text of `ids`
        self._prefix = 0  # ids[_prefix:_read] is the context re-decoded with each new token
        self._read = 0

    def add(self, token_id: int) -> str:
        self.ids.append(token_id)
        before = self._decode(self.ids[self._prefix:self._read])
        after = self._decode(self.ids[self._prefix:])
        if len(after) > len(before) and not after.endswith("\ufffd"):
            piece = after[len(before):]
            self._prefix, self._read = self._read, len(self.ids)
            self.text += piece
            return piece
        return ""

    def full_text(self) -> str:
        """The decoded text of every id (a trailing incomplete character shows as U+FFFD, as `decode` does)."""
        return self._decode(self.ids)

    def _decode(self, ids: Sequence[int]) -> str:
        return self._decoder.decode(ids, skip_special_tokens=self._skip_special) if ids else ""


def find_stop(text: str, stops: Sequence[str], start: int = 0) -> tuple[int, str] | None:
    """The first stop string in `text[start:]` as (its offset in `text`, the string); the earliest wins, then the
    shortest (the one that was complete first). None when there is none."""
    best: tuple[int, str] | None = None
    for stop in stops:
        at = text.find(stop, start)
        if at != -1 and (best is None or (at, len(stop)) < (best[0], len(best[1]))):
            best = (at, stop)
    return best


def stop_search_start(previous_length: int, stops: Sequence[str]) -> int:
    """Where to look for a stop string after the text grew from `previous_length` characters: any stop string that
    is new must end past `previous_length`, so it starts at most `longest - 1` characters before it."""
    longest = max((len(s) for s in stops), default=1)
    return max(0, previous_length - longest + 1)


def held_back(text: str, stops: Sequence[str], sent: int = 0) -> int:
    """How many trailing characters of `text` a stream must hold: the longest suffix that is a proper prefix of a
    stop string (e.g. a final "\\n" when "\\ndef" is a stop string), since the next token may complete it.

    `sent`: characters of `text` already sent. No stop string can begin inside them (they were released only after
    this check), so only the unsent tail is tried: the cost per token is that tail's length, not the stop strings'
    (60,000-character stop strings made every token of a stream cost milliseconds, on the server's event loop)."""
    hold = 0
    for stop in stops:
        for k in range(min(len(stop) - 1, len(text) - sent), hold, -1):
            if text.endswith(stop[:k]):
                hold = k
                break
    return hold

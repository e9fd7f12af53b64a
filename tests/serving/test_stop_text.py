"""codeparrot/serving/text.py: what a stream may send while stop strings can still complete."""

from __future__ import annotations

import random

from codeparrot.serving.text import find_stop, held_back, stop_search_start


def stream(pieces: list[str], stops: list[str], tail_only: bool) -> list[int]:
    """How much of the text the OpenAI stream has sent after each piece (openai_api's `token`)."""
    text, sent, history = "", 0, []
    for piece in pieces:
        before, text = text, text + piece
        ready = len(text) - (held_back(text, stops, sent) if tail_only else held_back(text, stops))
        hit = find_stop(text, stops, stop_search_start(len(before), stops))
        if hit is not None:
            ready = min(ready, hit[0])
        sent = max(sent, ready)
        history.append(sent)
        if hit is not None:
            break
    return history


def test_looking_at_the_unsent_tail_only_sends_exactly_what_looking_at_everything_sends():
    rng = random.Random(0)
    for _ in range(2000):  # a 3-letter alphabet: stop strings and their prefixes occur all the time
        pieces = ["".join(rng.choice("ab\n") for _ in range(rng.randint(1, 3))) for _ in range(rng.randint(1, 30))]
        stops = ["".join(rng.choice("ab\n") for _ in range(rng.randint(1, 6))) for _ in range(rng.randint(1, 3))]
        assert stream(pieces, stops, tail_only=True) == stream(pieces, stops, tail_only=False), (pieces, stops)


class Stop(str):
    """A stop string that records the length of every prefix taken of it (`stop[:k]`)."""

    taken: list[int] = []

    def __getitem__(self, key):
        if isinstance(key, slice):
            Stop.taken.append(len(range(*key.indices(len(self)))))
        return str.__getitem__(self, key)


def test_a_token_s_work_does_not_grow_with_the_stop_strings_length():
    """60,000-character stop strings (a body the server accepts) made every streamed token try every prefix of each
    against the text: milliseconds per token on the event loop. Only the unsent tail can start a stop string."""
    stops = [Stop("x" * 60_000 + str(i)) for i in range(16)]
    text = "y" * 8_000
    Stop.taken.clear()
    assert held_back(text, stops, sent=len(text) - 3) == 0
    assert Stop.taken and max(Stop.taken) <= 3
    Stop.taken.clear()
    assert held_back(text + "xx", stops, sent=len(text)) == 2  # a held tail is still found

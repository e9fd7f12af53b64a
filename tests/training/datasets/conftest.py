"""Fixtures shared by the training-dataset tests: the code tokenizer, held-out code they stream, and a tokenizer
wrapper that watches what the datasets tokenize."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def tokenizer(code_tokenizer):
    return code_tokenizer


@pytest.fixture(scope="module")
def texts(held_out_code):
    return held_out_code


class WatchedTokenizer:
    """The public tokenizer interface the datasets use (batch `__call__`, `decode` for FIM, EOS, vocabulary) around a
    real tokenizer. Remembers every text it tokenized (`seen`, to check which process tokenized what) and counts its
    batch calls (`calls`); with `fail_after=n` the call after the n-th raises KeyboardInterrupt (a killed run,
    as far as the output is concerned)."""

    def __init__(self, inner, fail_after: int | None = None):
        self.inner, self.fail_after = inner, fail_after
        self.seen: list[str] = []
        self.calls = 0
        self.eos_token_id = inner.eos_token_id

    def __len__(self):
        return len(self.inner)

    def get_vocab(self):
        return self.inner.get_vocab()

    def decode(self, ids, **kwargs):
        return self.inner.decode(ids, **kwargs)

    def __call__(self, texts, add_special_tokens=False, **kwargs):  # kwargs: split_special_tokens (plain text)
        if self.fail_after is not None and self.calls >= self.fail_after:
            raise KeyboardInterrupt
        self.calls += 1
        self.seen.extend(texts)
        return self.inner(texts, add_special_tokens=add_special_tokens, **kwargs)


@pytest.fixture(scope="session")
def watched_tokenizer():
    """The `WatchedTokenizer` class: `watched_tokenizer(tokenizer, fail_after=None)`."""
    return WatchedTokenizer

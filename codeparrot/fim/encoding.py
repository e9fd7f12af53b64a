"""Document text to token ids with every special-token string kept as plain text: only the code that means to
insert `<|endoftext|>` or a FIM sentinel (the datasets' EOS joins, the FIM transform, the infilling prompt) does.

Why: source files contain these strings (a tokenizer's own tests, a model card, this repository). A tokenizer's
default encoding matches the special tokens first, so a file holding `"<fim_middle>"` would put the sentinel id
into the training stream (teaching the model to expect a middle there) and `"<|endoftext|>"` would cut the file
in two. Here such a string is encoded as the bytes it is made of (`tokenizers`' `encode_special_tokens = True`;
in transformers the per-call `split_special_tokens=True`), so `decode(encode(text)) == text` and no special id
ever comes from document text.

The backend's flag is a property of the `tokenizers.Tokenizer` object that transformers resets on each of its
own calls, so the encoder works on a private copy of the backend with the flag set (built once per tokenizer
object, lazily: about 0.3 s for a 32,768-entry vocabulary; not pickled, rebuilt in a DataLoader worker).
"""

from __future__ import annotations

import weakref
from typing import Sequence

_CACHE: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


class PlainTextEncoder:
    """`batch(texts)` -> ids per text, special-token strings encoded as text, no special tokens added;
    `decode(ids)` -> the exact text (special ids, if any, as their strings)."""

    def __init__(self, tokenizer, weak: bool = False):
        # `weak`: the shared cache's encoders must not keep their tokenizer (the cache's key) alive.
        self._tokenizer = weakref.ref(tokenizer) if weak else (lambda: tokenizer)
        self._backend = None

    @property
    def tokenizer(self):
        return self._tokenizer()

    def _plain_backend(self):
        """A copy of the `tokenizers` backend that matches no special token in text, or None when the tokenizer
        has no plain backend (or one with truncation/padding configured): then transformers' call is used."""
        if self._backend is None:
            backend = getattr(self.tokenizer, "backend_tokenizer", None)
            if backend is None and hasattr(self.tokenizer, "encode_batch_fast"):
                backend = self.tokenizer  # a raw tokenizers.Tokenizer
            if backend is None or backend.truncation is not None or backend.padding is not None:
                self._backend = False
            else:
                copy = type(backend).from_str(backend.to_str())
                copy.encode_special_tokens = True
                self._backend = copy
        return self._backend or None

    def batch(self, texts: Sequence[str]) -> list[list[int]]:
        """One batched call; the same ids as `tokenizer(texts, add_special_tokens=False,
        split_special_tokens=True)["input_ids"]`."""
        if not texts:
            return []
        backend = self._plain_backend()
        if backend is not None:
            return [enc.ids for enc in backend.encode_batch_fast(list(texts), add_special_tokens=False)]
        return self.tokenizer(list(texts), add_special_tokens=False, split_special_tokens=True)["input_ids"]

    def decode(self, ids: Sequence[int]) -> str:
        """The exact text of `ids` (byte-level: no clean-up, special tokens kept as their strings)."""
        backend = self._plain_backend()
        if backend is not None:
            return backend.decode(list(ids), skip_special_tokens=False)
        return self.tokenizer.decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def decode_batch(self, batch: Sequence[Sequence[int]]) -> list[str]:
        """`decode` of each ids list, in one call where the backend allows."""
        if not batch:
            return []
        backend = self._plain_backend()
        if backend is not None:
            return backend.decode_batch([list(ids) for ids in batch], skip_special_tokens=False)
        return [self.decode(ids) for ids in batch]

    def __getstate__(self) -> dict:
        return {"tokenizer": self.tokenizer}  # the backend's flag does not survive pickling: rebuilt lazily

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["tokenizer"])


def plain_text_encoder(tokenizer) -> PlainTextEncoder:
    """The `PlainTextEncoder` of `tokenizer`, shared by every caller in this process (one backend copy each)."""
    if isinstance(tokenizer, PlainTextEncoder):
        return tokenizer
    try:
        encoder = _CACHE.get(tokenizer)
    except TypeError:  # not weakly referenceable: no sharing
        return PlainTextEncoder(tokenizer)
    if encoder is None:
        encoder = PlainTextEncoder(tokenizer, weak=True)
        _CACHE[tokenizer] = encoder
    return encoder

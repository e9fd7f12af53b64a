"""The FIM training transform both data paths share: which documents are rearranged, where they are split, and
the token layout of a rearranged document.

For each document (one source file, before it is joined to the others with EOS):

    with probability `rate`: two split points drawn uniformly over its characters (0..len, sorted), so
        text = prefix + middle + suffix, each piece tokenized on its own, then
        PSM (probability 1 - spm_rate): <fim_prefix> prefix <fim_suffix> suffix <fim_middle> middle EOS
        SPM (probability spm_rate):     <fim_prefix> <fim_suffix> suffix <fim_middle> prefix middle EOS
    otherwise: text EOS, exactly as without FIM.

Character-level split points (the Megatron-LM trainer BigCode used; SantaCoder's fine-tuning script split
tokens): a split point is an index into the Python string, i.e. a code point boundary, so no sentinel ever
splits a UTF-8 character, and the middle the model learns to write ends where a user's cursor can be, not at a
token boundary of the whole file. The pieces are tokenized separately (`PlainTextEncoder`: their own text only,
no special id from the text), which is how an infilling prompt is tokenized at inference. In SPM, prefix and
middle are two separately tokenized pieces too (BigCode's layout): the model sees the prefix end at a token
boundary, as it does when given an SPM prompt.

Where the randomness comes from: every draw of a document is a function of (seed, epoch, the document's text)
only, a keyed BLAKE2b hash of them read as four 64-bit uniforms (rearrange? SPM? two split points). No RNG
state is advanced per document, so the transform is the same whichever process, DataLoader worker or reader
tokenizes the document, after any resume, in either data path; a new epoch draws new split points. (Two
identical files in one epoch get the same split: the corpus is deduplicated anyway.) A document of no
characters is never rearranged.

`<fim_pad>` is never produced: rearranged documents are packed like any other (sequences are cut from the
EOS-joined stream), so nothing is padded and nothing needs masking out of the loss.
"""

from __future__ import annotations

import hashlib
import itertools
import struct
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from codeparrot.errors import CodeParrotError
from codeparrot.fim.encoding import PlainTextEncoder, plain_text_encoder
from codeparrot.fim.tokens import FimTokenIds, fim_token_ids

_U64 = 1 << 64
_PERSON = b"codeparrot-fim"  # BLAKE2b personalization: these draws are independent of any other hash of the text


@dataclass(frozen=True)
class FimSplit:
    """One rearranged document: text = prefix + middle + suffix; `spm` = suffix first."""

    prefix: str
    middle: str
    suffix: str
    spm: bool


def _uniforms(seed: int, epoch: int, text: str) -> tuple[int, int, int, int]:
    """Four uniform 64-bit integers determined by (seed, epoch, text) alone."""
    h = hashlib.blake2b(digest_size=32, person=_PERSON)
    h.update(struct.pack("<QQ", seed % _U64, epoch % _U64))
    h.update(text.encode("utf-8", "surrogatepass"))  # lone surrogates (JSON allows them) must not crash a draw
    return struct.unpack("<4Q", h.digest())


def check_rates(rate: float, spm_rate: float, prefix: str = "data.") -> None:
    """One-line errors for rates outside [0, 1]."""
    for name, value in (("fim_rate", rate), ("fim_spm_rate", spm_rate)):
        if not 0.0 <= value <= 1.0:
            raise CodeParrotError(f"{prefix}{name} must be in [0, 1], got {value!r}")


class FimTransform:
    """The transform at `rate` (fraction of documents rearranged) and `spm_rate` (fraction of those in SPM),
    seeded by `seed`, writing the sentinel ids `ids`. `FimTransform.for_tokenizer` builds it (or None when the
    rate is 0) and is where a tokenizer without the FIM tokens is a one-line error."""

    def __init__(self, rate: float, spm_rate: float, seed: int, ids: FimTokenIds):
        check_rates(rate, spm_rate)
        self.rate, self.spm_rate, self.seed, self.ids = float(rate), float(spm_rate), int(seed), ids
        # u < threshold has probability threshold / 2**64; rate 1 must always pass (u < 2**64 always holds)
        self._fim_below = _U64 if rate >= 1.0 else int(rate * _U64)
        self._spm_below = _U64 if spm_rate >= 1.0 else int(spm_rate * _U64)

    @classmethod
    def for_tokenizer(cls, tokenizer, rate: float, spm_rate: float, seed: int,
                      what: str = "data.fim_rate") -> "FimTransform | None":
        check_rates(rate, spm_rate)
        if rate == 0:
            return None
        return cls(rate, spm_rate, seed, fim_token_ids(tokenizer, f"{what} {rate:g}"))

    def describe(self) -> dict:
        """What a data position records: a resume with other rates would continue another stream."""
        return {"fim_rate": self.rate, "fim_spm_rate": self.spm_rate}

    # --- the draws --------------------------------------------------------------------------------------------
    def split(self, text: str, epoch: int) -> FimSplit | None:
        """How document `text` is rearranged in `epoch`, or None when it is left as it is."""
        if not text:
            return None
        u_fim, u_spm, u_a, u_b = _uniforms(self.seed, epoch, text)
        if u_fim >= self._fim_below:
            return None
        n = len(text)
        a, b = sorted(((u_a * (n + 1)) >> 64, (u_b * (n + 1)) >> 64))  # uniform in 0..n (multiply-shift)
        return FimSplit(text[:a], text[a:b], text[b:], u_spm < self._spm_below)

    # --- the layout ---------------------------------------------------------------------------------------------
    def arrange(self, split: FimSplit, prefix: Sequence[int], middle: Sequence[int], suffix: Sequence[int],
                eos_id: int) -> list[int]:
        """The ids of a rearranged document from its pieces' ids, EOS last (module docstring)."""
        ids = self.ids
        if split.spm:
            return [ids.prefix, ids.suffix, *suffix, ids.middle, *prefix, *middle, eos_id]
        return [ids.prefix, *prefix, ids.suffix, *suffix, ids.middle, *middle, eos_id]

    def encode_documents(self, encoder: PlainTextEncoder, texts: Sequence[str], epoch: int,
                         eos_id: int) -> list[list[int]]:
        """Each text's ids followed by EOS, the rearranged ones in FIM layout; one batched tokenizer call."""
        encoder = plain_text_encoder(encoder)
        splits = [self.split(text, epoch) for text in texts]
        pieces: list[str] = []
        for text, s in zip(texts, splits):
            pieces.extend((text,) if s is None else (s.prefix, s.middle, s.suffix))
        encoded = iter(encoder.batch(pieces))
        docs = []
        for s in splits:
            if s is None:
                docs.append([*next(encoded), eos_id])
            else:
                prefix, middle, suffix = next(encoded), next(encoded), next(encoded)
                docs.append(self.arrange(s, prefix, middle, suffix, eos_id))
        return docs

    def encode_with_eos(self, encoder, texts: Sequence[str], epoch: int, eos_id: int,
                        dtype: np.dtype) -> np.ndarray:
        """`encode_documents` flattened: 1-D array d1 EOS d2 EOS ... (the ConstantLengthDataset's buffer)."""
        docs = self.encode_documents(encoder, texts, epoch, eos_id)
        return np.fromiter(itertools.chain.from_iterable(docs), dtype=dtype, count=sum(map(len, docs)))


def untransform(ids: Sequence[int], fim: FimTokenIds, decode) -> tuple[str, bool, bool]:
    """(text, rearranged?, spm?) of one document's ids (EOS excluded), `decode` mapping ids to text: the inverse
    of the layout, for tests and for looking at training data (`--inspect-batches`)."""
    ids = list(ids)
    if not ids or ids[0] != fim.prefix:
        return decode(ids), False, False
    if len(ids) > 1 and ids[1] == fim.suffix:  # SPM: <P><S> suffix <M> prefix+middle
        m = ids.index(fim.middle, 2)
        return decode(ids[m + 1:]) + decode(ids[2:m]), True, True
    s = ids.index(fim.suffix, 1)
    m = ids.index(fim.middle, s + 1)
    return decode(ids[1:s]) + decode(ids[m + 1:]) + decode(ids[s + 1:m]), True, False

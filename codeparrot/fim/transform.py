"""The FIM training transform both data paths share, applied per training sequence (context-level FIM, as in
the Megatron-LM trainer BigCode used for SantaCoder and StarCoder).

Files are tokenized as they are and joined with EOS; the stream is cut into sequences of L tokens; then each
sequence [L] is rearranged on its own:

    sequence = f1 EOS f2 EOS ... EOS fk        (f1: the end of a file begun in an earlier sequence, fk: the start
                                                of one that runs on; either may be a whole file or empty)
    each non-empty fragment fi, decoded to its text, with probability `rate`: two split points drawn uniformly
        over its characters (0..len, sorted), text = prefix + middle + suffix, each piece tokenized on its own,
        PSM (probability 1 - spm_rate): <fim_prefix> prefix <fim_suffix> suffix <fim_middle> middle
        SPM (probability spm_rate):     <fim_prefix> <fim_suffix> suffix <fim_middle> prefix middle
    otherwise fi's ids as they are; the EOS ids stay where they were;
    the result cut back to L tokens (the rearranged pieces are a few tokens longer: 3 sentinels, and text split
    in three tokenizes into slightly more tokens; what runs past L is dropped, as Megatron-LM does).

Why per sequence and not per file: a file longer than a sequence, rearranged whole before packing, puts its
middle in later sequences than its `<fim_prefix>` and `<fim_suffix>`, where those tokens train as plain text
with the sentinels out of view (80% of middle tokens on the standard library at L = 1,024; GitHub files average
about 9 KB, some 2,500 tokens). Here every `<fim_middle>` has its prefix and suffix in the same sequence. The FIM
paper found this context-level variant slightly better than the document-level one.

Kept as they are (the draw is not used): a fragment whose rearranged ids would be fewer than its own (possible
in principle: BPE on three pieces is not monotone), so a sequence is never shorter than L, `<fim_pad>` is never
produced and nothing needs masking out of the loss; a fragment whose `<fim_middle>` would land past L - 2 (the
last one, pushed out by the pieces before it: no middle token would be trained, only sentinels without their
middle); a fragment cut inside a UTF-8 character at the sequence's edge (its text decodes with U+FFFD and does
not re-encode to its ids): rearranging it would replace those bytes.

Character-level split points (Megatron-LM's; SantaCoder's fine-tuning script split tokens): a split point is an
index into the Python string, a code point boundary, so no sentinel splits a UTF-8 character, and the middle the
model learns to write ends where a user's cursor can be. Pieces are tokenized with `PlainTextEncoder` (their own
text only, no special id from the text), as an infilling prompt is at inference. In SPM the prefix and the middle
are two separately tokenized pieces too (BigCode's layout).

Where the randomness comes from: a fragment's draws are a function of (seed, epoch, the fragment's text) only, a
keyed BLAKE2b hash read as four 64-bit uniforms (rearrange? SPM? two split points). No RNG state advances, so a
sequence is transformed the same whichever process, DataLoader worker or reader makes it, after any resume, in
either data path (the transform is a function of the sequence's ids and epoch); a new epoch draws anew.
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from codeparrot.errors import CodeParrotError
from codeparrot.fim.encoding import PlainTextEncoder, plain_text_encoder
from codeparrot.fim.tokens import FimTokenIds, fim_token_ids

_U64 = 1 << 64
_PERSON = b"codeparrot-fim"  # BLAKE2b personalization: these draws are independent of any other hash of the text
LEVEL = "context"  # what a data position records: positions of the earlier per-file transform are refused


@dataclass(frozen=True)
class FimSplit:
    """One rearranged fragment: text = prefix + middle + suffix; `spm` = suffix first."""

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


def fragments(sequence: np.ndarray, eos_id: int) -> list[tuple[int, int]]:
    """(start, end) of every non-empty EOS-free run of `sequence` [L], in order."""
    cuts = [-1, *np.flatnonzero(sequence == eos_id).tolist(), len(sequence)]
    return [(a + 1, b) for a, b in zip(cuts[:-1], cuts[1:]) if b > a + 1]


class FimTransform:
    """The transform at `rate` (fraction of fragments rearranged) and `spm_rate` (fraction of those in SPM),
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
        return {"fim_rate": self.rate, "fim_spm_rate": self.spm_rate, "fim_level": LEVEL}

    # --- the draws --------------------------------------------------------------------------------------------
    def split(self, text: str, epoch: int) -> FimSplit | None:
        """How fragment `text` is rearranged in `epoch`, or None when it is left as it is."""
        if not text:
            return None
        u_fim, u_spm, u_a, u_b = _uniforms(self.seed, epoch, text)
        if u_fim >= self._fim_below:
            return None
        n = len(text)
        a, b = sorted(((u_a * (n + 1)) >> 64, (u_b * (n + 1)) >> 64))  # uniform in 0..n (multiply-shift)
        return FimSplit(text[:a], text[a:b], text[b:], u_spm < self._spm_below)

    # --- the layout ---------------------------------------------------------------------------------------------
    def arrange(self, split: FimSplit, prefix: Sequence[int], middle: Sequence[int],
                suffix: Sequence[int]) -> list[int]:
        """The ids of a rearranged fragment from its pieces' ids (module docstring)."""
        ids = self.ids
        if split.spm:
            return [ids.prefix, ids.suffix, *suffix, ids.middle, *prefix, *middle]
        return [ids.prefix, *prefix, ids.suffix, *suffix, ids.middle, *middle]

    def rearrange(self, encoder: PlainTextEncoder, sequences: np.ndarray, epoch: int, eos_id: int) -> np.ndarray:
        """`sequences` [n, L] (cut from one EOS-joined stream of `epoch`) with their fragments rearranged, each
        still [L] (module docstring); one batched decode and one batched tokenizer call for all of them."""
        encoder = plain_text_encoder(encoder)
        sequences = np.asarray(sequences)
        spans = [fragments(seq, eos_id) for seq in sequences]
        texts = iter(encoder.decode_batch([seq[a:b].tolist() for seq, frags in zip(sequences, spans)
                                           for a, b in frags]))
        plans = []  # per sequence: [(start, end, FimSplit | None)]
        for frags in spans:
            plans.append([(a, b, self.split(next(texts), epoch)) for a, b in frags])
        pieces = iter(encoder.batch([p for plan in plans for _, _, s in plan if s is not None
                                     for p in (s.prefix, s.middle, s.suffix)]))
        out = sequences.copy()
        for row, (seq, plan) in enumerate(zip(sequences, plans)):
            parts, pos, grown = [], 0, 0  # grown: tokens the rearranged pieces so far added
            for a, b, s in plan:
                if s is None:
                    continue
                new = self.arrange(s, next(pieces), next(pieces), next(pieces))
                if (len(new) < b - a  # never shorter: no padding
                        or a + grown + new.index(self.ids.middle) > len(seq) - 2  # no middle token left to train
                        or not self._exact(encoder, s, seq[a:b])):  # never a piece cut inside a character
                    continue
                parts += [seq[pos:a], np.asarray(new, dtype=seq.dtype)]
                pos, grown = b, grown + len(new) - (b - a)
            changed = pos > 0
            if changed:
                parts.append(seq[pos:])
                out[row] = np.concatenate(parts)[: len(seq)]
        return out

    @staticmethod
    def _exact(encoder: PlainTextEncoder, split: FimSplit, ids: np.ndarray) -> bool:
        """False when the fragment's text is not its bytes: a UTF-8 character cut at the sequence's edge decodes
        to U+FFFD (checked by re-encoding, only then: a file may hold U+FFFD itself)."""
        text = split.prefix + split.middle + split.suffix
        return "\ufffd" not in text or encoder.batch([text])[0] == ids.tolist()


def untransform(ids: Sequence[int], fim: FimTokenIds, decode) -> tuple[str, bool, bool]:
    """(text, rearranged?, spm?) of one whole rearranged or kept fragment's ids (no EOS), `decode` mapping ids
    to text: the inverse of the layout, for tests and for looking at training data."""
    ids = list(ids)
    if not ids or ids[0] != fim.prefix:
        return decode(ids), False, False
    if len(ids) > 1 and ids[1] == fim.suffix:  # SPM: <P><S> suffix <M> prefix+middle
        m = ids.index(fim.middle, 2)
        return decode(ids[m + 1:]) + decode(ids[2:m]), True, True
    s = ids.index(fim.suffix, 1)
    m = ids.index(fim.middle, s + 1)
    return decode(ids[1:s]) + decode(ids[m + 1:]) + decode(ids[s + 1:m]), True, False

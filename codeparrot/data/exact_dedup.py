"""Exact deduplication: a 64-bit hash of each file's content with every whitespace character removed.

Definition (CodeParrot's): two files are duplicates when `"".join(text.split())` is equal, i.e. they differ
only in whitespace (indentation, line endings, trailing spaces). The first occurrence in input order is kept.

How it is fast and exact
- `strip_whitespace` gives exactly the bytes of `"".join(text.split()).encode()` without building one
  Python string per word: ASCII whitespace is deleted from the UTF-8 bytes with one `bytes.translate` (C
  speed; bytes of multi-byte UTF-8 characters are all >= 0x80, so none is touched), and only a file holding
  one of the 19 non-ASCII whitespace characters `str.split()` knows (NBSP, U+2000..U+200A, ...) takes
  the `split()` path. `str.split()` also splits on the ASCII separators 0x1C..0x1F, so they are deleted too.
- The digest is the first 8 bytes of BLAKE2b: over the real export's 20M files the chance that two different
  files share a digest is about n^2 / 2^65 = 1e-5.

Memory: `DigestSet` keeps the digests in sorted uint64 numpy runs (an LSM tree: small runs merge into larger
ones as they fill), 8 bytes per unique file (plus a transient copy of the largest run while it merges), not a
Python set of bytes objects (about 100 bytes per file).
"""

from __future__ import annotations

import hashlib
import re

import numpy as np

# Every character for which str.isspace() is true (what str.split() splits on), ASCII and not.
ASCII_WHITESPACE = b"\t\n\x0b\x0c\r\x1c\x1d\x1e\x1f "
_UNICODE_WHITESPACE = re.compile("[\x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]")


def strip_whitespace(text: str) -> bytes:
    """UTF-8 bytes of `text` with every whitespace character removed (== `"".join(text.split()).encode()`)."""
    if text.isascii() or _UNICODE_WHITESPACE.search(text) is None:
        return text.encode("utf-8", "surrogatepass").translate(None, ASCII_WHITESPACE)
    return "".join(text.split()).encode("utf-8", "surrogatepass")


def digest_of_stripped(stripped: bytes) -> int:
    """The 64-bit digest of already whitespace-stripped bytes (BLAKE2b, first 8 bytes, little-endian)."""
    return int.from_bytes(hashlib.blake2b(stripped, digest_size=8).digest(), "little")


def content_digest(text: str) -> int:
    """Whitespace-insensitive 64-bit digest of a file's content: equal for files that differ only in whitespace."""
    return digest_of_stripped(strip_whitespace(text))


class DigestSet:
    """A set of uint64 digests in sorted numpy runs; `add_batch` answers "first time seen?" for a batch.

    Runs are merged like a binary counter (a run merges into its left neighbour once it is at least half that
    size), so there are O(log n) runs, each lookup is one `searchsorted` per run, and every digest is re-sorted
    O(log n) times in total (numpy's radix sort for uint64, linear per merge).
    """

    def __init__(self) -> None:
        self._runs: list[np.ndarray] = []  # sorted, pairwise disjoint uint64 arrays, largest first

    def __len__(self) -> int:
        return sum(len(run) for run in self._runs)

    @property
    def nbytes(self) -> int:
        """Bytes held by the digests (8 per unique file)."""
        return sum(run.nbytes for run in self._runs)

    def __contains__(self, digest: int) -> bool:
        key = np.uint64(digest)
        for run in self._runs:
            pos = int(np.searchsorted(run, key))
            if pos < len(run) and run[pos] == key:
                return True
        return False

    def add_batch(self, digests) -> np.ndarray:
        """Add a batch (in input order); bool[len(digests)], True where the digest was never seen before,
        neither earlier in this batch nor in an earlier batch."""
        batch = np.asarray(digests, dtype=np.uint64).reshape(-1)
        new = np.zeros(len(batch), dtype=bool)
        if not len(batch):
            return new
        unique, first = np.unique(batch, return_index=True)  # sorted distinct digests, first position of each
        seen = np.zeros(len(unique), dtype=bool)
        for run in self._runs:
            pos = np.minimum(np.searchsorted(run, unique), len(run) - 1)
            seen |= run[pos] == unique
        new[first[~seen]] = True
        self._push(unique[~seen])
        return new

    def _push(self, run: np.ndarray) -> None:
        if not len(run):
            return
        self._runs.append(run)
        while len(self._runs) >= 2 and 2 * len(self._runs[-1]) >= len(self._runs[-2]):
            right, left = self._runs.pop(), self._runs.pop()
            merged = np.concatenate([left, right])
            merged.sort(kind="stable")  # radix sort for integers
            self._runs.append(merged)


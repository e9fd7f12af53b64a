"""MinHash near-deduplication over identifier-token sets, vectorized with numpy: signatures here, LSH
clustering in `codeparrot.data.lsh` (its public names are importable from this module too).

Definitions (CodeParrot's): a file's tokens are the non-empty pieces of `re.split("[^A-Za-z_0-9]", text)`;
a file with fewer than `min_tokens` tokens (a count, not distinct) gets no signature and is never clustered;
the MinHash is over the SET of tokens (no n-grams); with `shingle_size` n > 1 (StarCoder2/BigCode: 5) it is over
the set of runs of n consecutive tokens instead. Two files are joined when they are LSH candidates (equal
in one band) and their estimated Jaccard (fraction of equal signature slots) is >= `threshold`; clusters are
the connected components, so they do not depend on input order, batching or worker count.

Speed
- Tokens, per window of ~1 MiB of text: `bytes.translate` maps every byte outside [A-Za-z_0-9] (so every
  byte of a non-ASCII character) to a space; token boundaries, token hashes (unaligned 8-byte loads, see
  `_token_hashes`) and per-file dedup (one sort of file<<32|hash) are numpy passes: no Python object per token.
- Each distinct token of a piece is permuted once by the `num_perm` functions `h(x) = ((a*x + b) mod 2^64)
  >> 32`, random 64-bit a, b (Dietzfelbinger's multiply-add-shift: strongly universal for 32-bit keys like
  `(a*x + b) mod p`, in plain wrapping uint64 arithmetic), a [V, num_perm] broadcast; a file's signature is
  the per-slot min over its rows of that table.
- Clustering speed and memory: `codeparrot.data.lsh`.
"""

from __future__ import annotations

import hashlib
import sys
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from codeparrot.data.lsh import SENTINEL, candidate_params, check_num_perm, find_clusters, lsh_params
from codeparrot.errors import CodeParrotError

__all__ = ["SENTINEL", "MinHasher", "NearDedupResult", "candidate_params", "estimated_jaccard", "find_clusters",
           "identifier_tokens", "lsh_params", "near_dedup"]

_LITTLE = sys.byteorder == "little"
_TOKEN_BYTES = bytes(c if (48 <= c <= 57 or 65 <= c <= 90 or 97 <= c <= 122 or c == 95) else 32 for c in range(256))
_WINDOW_BYTES = 1 << 20  # text tokenized and hashed at once (a single larger file is one window)
_TOKEN_ROWS_PER_PIECE = 32768  # (file, token) rows per hash table: [V <= 32768, num_perm] uint32, 32 MiB


def identifier_tokens(text: str) -> list[bytes]:
    """The `[A-Za-z_0-9]+` tokens of `text` as UTF-8 bytes, in order (CodeParrot's `re.split` pieces).

    Non-ASCII characters are separators, as in the regex: every byte of their UTF-8 encoding is >= 0x80.
    Lone surrogates (possible in decoded JSON) are encoded with `surrogatepass` and are separators too.
    """
    return text.encode("utf-8", "surrogatepass").translate(_TOKEN_BYTES).split()


# murmur3's finalizers (bijections, so no new collisions): (dtype, shifts, multipliers).
_FMIX32 = (np.uint32, (16, 13, 16), (0x85EBCA6B, 0xC2B2AE35))
_FMIX64 = (np.uint64, (33, 33, 33), (0xFF51AFD7ED558CCD, 0xC4CEB9FE1A85EC53))


def _fmix(h: np.ndarray, params=_FMIX64) -> np.ndarray:
    """murmur3's finalizer, in place (`h` must already have the params' dtype). The 32-bit one destroys the
    near-linear structure that multiply-shift leaves between similar tokens, which would bias the linear MinHash
    functions; the 64-bit one mixes the folded word hashes."""
    dtype, (s1, s2, s3), (m1, m2) = params
    h ^= h >> dtype(s1)
    h *= dtype(m1)
    h ^= h >> dtype(s2)
    h *= dtype(m2)
    h ^= h >> dtype(s3)
    return h


_LONG_TOKEN = 64  # tokens longer than this are hashed one by one (blake2b) instead of 8 bytes per round
_LOW_BYTES = np.array([(1 << (8 * k)) - 1 for k in range(8)] + [2**64 - 1], dtype=np.uint64)  # [9] masks


def _token_hashes(buf: bytes, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """uint32 hash of every token `buf[starts[i]:ends[i]]`, vectorized, stable across processes.

    A token's first 8 bytes are one unaligned little-endian uint64 load (a 1-byte-stride view of `buf`),
    masked to its length: exact for tokens up to 8 bytes, most identifiers. Tokens up to 64 bytes fold in
    8 more bytes per round with murmur3's finalizer; longer ones (hex blobs, minified data) get blake2b, one
    call each, so a 1 MB token costs one call, not 125k rounds. Multiply-shift then takes 32 bits: two
    different tokens collide with probability about 2^-31, far below MinHash's own noise."""
    padded = buf + bytes(8)
    words = np.ndarray(shape=(len(buf) + 1,), dtype="<u8", buffer=padded, strides=(1,))  # words[i] = buf[i:i+8]
    lengths = ends - starts
    h = words[starts] & _LOW_BYTES[np.minimum(lengths, 8)]  # [T] uint64
    long = np.flatnonzero((lengths > 8) & (lengths <= _LONG_TOKEN))
    if len(long):
        folded = _fmix(h[long] ^ (lengths[long].astype(np.uint64) << np.uint64(56)))
        offset, sub = 8, np.arange(len(long))
        while len(sub):
            rest = lengths[long[sub]] - offset
            word = words[starts[long[sub]] + offset] & _LOW_BYTES[np.minimum(rest, 8)]
            folded[sub] = _fmix(folded[sub] ^ word)
            offset, sub = offset + 8, sub[rest > 8]
        h[long] = folded
    for i in np.flatnonzero(lengths > _LONG_TOKEN).tolist():
        digest = hashlib.blake2b(buf[starts[i] : ends[i]], digest_size=8).digest()
        h[i] = int.from_bytes(digest, "little")
    h *= np.uint64(0x9E3779B97F4A7C15)
    return (h >> np.uint64(32)).astype(np.uint32)


def _shingle_hashes(h: np.ndarray, files: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
    """uint32 hashes of every run of `size` consecutive tokens within one file, and their file indices.
    `h` [T] uint32 token hashes in text order, `files` [T] their file index (every file has >= size tokens).
    Each round folds the next token into the high word and mixes (murmur3's 64-bit finalizer, a bijection)."""
    count = len(h) - size + 1
    g = h[:count].astype(np.uint64)
    for k in range(1, size):
        g = _fmix(g ^ (h[k : k + count].astype(np.uint64) << np.uint64(32)))
    same_file = files[:count] == files[size - 1 :]  # [count]: the run does not cross a file boundary
    g = g[same_file] * np.uint64(0x9E3779B97F4A7C15)
    return (g >> np.uint64(32)).astype(np.uint32), files[:count][same_file]


def _distinct_tokens(datas: list[bytes], min_tokens: int, shingle_size: int = 1
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Distinct token (or `shingle_size`-token shingle) hashes of each UTF-8 file: (file index intp[T], hash
    uint32[T], bool[files] with >= min_tokens tokens), sorted by file then hash; files under min_tokens contribute
    nothing. One numpy pass over the joined window replaces a Python list + set of token objects per file (3x
    faster)."""
    buf = b" " + b" ".join(datas).translate(_TOKEN_BYTES) + b" "  # non-identifier bytes -> spaces
    ident = np.frombuffer(buf, dtype=np.uint8) != 32
    edges = np.flatnonzero(ident[1:] != ident[:-1]) + 1  # token starts and ends, interleaved
    starts, ends = edges[0::2], edges[1::2]
    file_starts = np.ones(len(datas) + 1, dtype=np.intp)  # file j is buf[file_starts[j] : file_starts[j+1] - 1]
    np.cumsum(np.fromiter(map(len, datas), dtype=np.intp, count=len(datas)) + 1, out=file_starts[1:])
    file_starts[1:] += 1
    counts = np.diff(np.searchsorted(starts, file_starts))  # tokens per file (a count, not distinct)
    ok = counts >= min_tokens
    keep = np.repeat(ok, counts)
    # One sort of (file << 32 | hash) dedups within each file and groups the files in order.
    files = np.repeat(np.arange(len(datas), dtype=np.uint64), np.where(ok, counts, 0))
    hashes = _token_hashes(buf, starts[keep], ends[keep])
    if shingle_size > 1 and len(hashes):
        hashes, files = _shingle_hashes(hashes, files, shingle_size)
    key = files << np.uint64(32)
    key |= hashes
    key.sort()
    key = key[np.r_[True, key[1:] != key[:-1]]] if len(key) else key
    return (key >> np.uint64(32)).astype(np.intp), key.astype(np.uint32), ok


class MinHasher:
    """Computes MinHash signatures of files' identifier-token sets. Picklable (plain ints and arrays), so it
    can be sent to multiprocessing workers; the same seed gives the same signatures in any process."""

    def __init__(self, num_perm: int = 256, seed: int = 42, min_tokens: int = 10, shingle_size: int = 1):
        check_num_perm(num_perm)
        if not isinstance(min_tokens, (int, np.integer)) or min_tokens < 1:
            raise CodeParrotError(f"near dedup: min_tokens must be an integer >= 1, got {min_tokens!r}")
        if not isinstance(shingle_size, (int, np.integer)) or not 1 <= shingle_size <= min_tokens:
            raise CodeParrotError(f"near dedup: shingle_size must be an integer in [1, min_tokens={min_tokens}], "
                                  f"got {shingle_size!r}")
        self.shingle_size = int(shingle_size)
        self.num_perm = int(num_perm)
        self.seed = int(seed)
        self.min_tokens = int(min_tokens)
        rng = np.random.default_rng(self.seed)
        # multiply-add-shift parameters, uniform over [0, 2^64): [num_perm] uint64 each
        self._a = rng.integers(0, np.iinfo(np.uint64).max, size=self.num_perm, dtype=np.uint64, endpoint=True)
        self._b = rng.integers(0, np.iinfo(np.uint64).max, size=self.num_perm, dtype=np.uint64, endpoint=True)

    def __repr__(self) -> str:
        return (f"MinHasher(num_perm={self.num_perm}, seed={self.seed}, min_tokens={self.min_tokens}, "
                f"shingle_size={self.shingle_size})")

    def _permuted(self, base: np.ndarray) -> np.ndarray:
        """[V, num_perm] uint32, contiguous: every hash function applied to every token hash in `base`."""
        x = _fmix(base.astype(np.uint32, copy=True), _FMIX32).astype(np.uint64)[:, None]  # [V, 1]
        out = np.empty((len(base), self.num_perm), dtype=np.uint32)
        step = 256  # [256, P] uint64 scratch stays in cache
        scratch = np.empty((min(step, len(base)), self.num_perm), dtype=np.uint64)
        for lo in range(0, len(base), step):
            y = scratch[: min(step, len(base) - lo)]
            np.multiply(x[lo : lo + step], self._a, out=y)  # wraps mod 2^64 (intended)
            y += self._b
            # `>> 32`: on little-endian the high word of each uint64 is the odd uint32 of the view.
            out[lo : lo + step] = y.view(np.uint32)[:, 1::2] if _LITTLE else y >> np.uint64(32)
        return out

    def _window(self, rows: list[int], datas: list[bytes], out: np.ndarray, valid: np.ndarray) -> None:
        """Signatures of one window of files into `out[rows]`: distinct tokens are hashed once per piece of
        <= _TOKEN_ROWS_PER_PIECE (file, token) rows into a [V, P] table, then each file takes the per-slot
        min over its rows of that table (a file split across pieces is min-combined)."""
        files, tokens, ok = _distinct_tokens(datas, self.min_tokens, self.shingle_size)
        rows_arr = np.asarray(rows, dtype=np.intp)
        valid[rows_arr[ok]] = True
        for lo in range(0, len(tokens), _TOKEN_ROWS_PER_PIECE):
            seg_files = files[lo : lo + _TOKEN_ROWS_PER_PIECE]
            base, ids = np.unique(tokens[lo : lo + _TOKEN_ROWS_PER_PIECE], return_inverse=True)  # [V], [W]
            table = self._permuted(base)  # [V, P]
            cuts = np.flatnonzero(np.r_[True, seg_files[1:] != seg_files[:-1]]).tolist() + [len(seg_files)]
            for start, stop in zip(cuts[:-1], cuts[1:]):
                # One file at a time: its gathered rows stay in cache (a [W, P] gather + reduceat is 8x slower).
                row = out[rows_arr[seg_files[start]]]
                np.minimum(row, table[ids[start:stop]].min(axis=0), out=row)

    def signatures(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """(uint32[n, num_perm] signatures, bool[n] valid). Rows of files with fewer than `min_tokens`
        tokens are all `SENTINEL` (0xFFFFFFFF) and marked invalid."""
        n = len(texts)
        out = np.full((n, self.num_perm), SENTINEL, dtype=np.uint32)
        valid = np.zeros(n, dtype=bool)
        rows: list[int] = []
        datas: list[bytes] = []
        size = 0
        for i, text in enumerate(texts):
            if not isinstance(text, str):
                raise CodeParrotError(f"near dedup: text {i} is a {type(text).__name__}, not a str")
            # Lone surrogates (possible in decoded JSON) pass through as bytes >= 0x80: separators.
            datas.append(text.encode("utf-8", "surrogatepass"))
            rows.append(i)
            size += len(datas[-1])
            if size >= _WINDOW_BYTES:
                self._window(rows, datas, out, valid)
                rows, datas, size = [], [], 0
        if rows:
            self._window(rows, datas, out, valid)
        return out, valid

    def signature(self, text: str) -> np.ndarray | None:
        """uint32[num_perm] signature of one file, or None when it has fewer than `min_tokens` tokens."""
        sig, valid = self.signatures([text])
        return sig[0] if valid[0] else None


def estimated_jaccard(sig_a: np.ndarray, sig_b: np.ndarray) -> float:
    """Fraction of equal slots of two signatures: an unbiased estimate of their sets' Jaccard similarity."""
    return float(np.count_nonzero(np.asarray(sig_a) == np.asarray(sig_b))) / len(sig_a)


@dataclass
class NearDedupResult:
    """Outcome of `near_dedup`: which files to keep and the clusters (row indices, ascending)."""

    keep: np.ndarray  # bool[n]: False for every cluster member but the first
    clusters: list[np.ndarray]  # connected components of size >= 2, sorted by first member
    valid: np.ndarray  # bool[n]: files that had a signature (>= min_tokens tokens)

    @property
    def num_removed(self) -> int:
        return int(len(self.keep) - np.count_nonzero(self.keep))


def near_dedup(
    texts: Sequence[str], num_perm: int = 256, threshold: float = 0.85, min_tokens: int = 10, seed: int = 42
) -> NearDedupResult:
    """Signatures + clusters + keep mask (the first file of each cluster is kept) in one call."""
    signatures, valid = MinHasher(num_perm, seed, min_tokens).signatures(texts)
    clusters = find_clusters(signatures, threshold, valid)
    keep = np.ones(len(texts), dtype=bool)
    for cluster in clusters:
        keep[cluster[1:]] = False
    return NearDedupResult(keep=keep, clusters=clusters, valid=valid)


KEEP_POLICIES = ("first", "most-copies")


MAX_COPIES = 2**63 - 1  # copies are kept in int64 columns (the local engine's array, Ray's Arrow blocks)


def copies_of(record: dict) -> int:
    """A record's `copies` (BigQuery's count of identical copies across repositories: the popularity signal of the
    export) as an int >= 0, or -1 when it is missing or not a non-negative integer (ranked below every count).
    Counts beyond int64 are capped at MAX_COPIES; a string counts when it is ASCII digits ("²" is not)."""
    value = record.get("copies")
    if isinstance(value, bool):
        return -1
    if isinstance(value, str):
        digits = value.strip()
        if not (digits.isascii() and digits.isdigit()):
            return -1
        value = int(digits) if len(digits) <= 19 else MAX_COPIES  # 19 digits: past int64 either way
    return min(value, MAX_COPIES) if isinstance(value, int) and value >= 0 else -1


def kept_member(cluster: np.ndarray, copies: np.ndarray | None, policy: str) -> int:
    """The member of `cluster` (rows ascending, i.e. input order) that stays: "first" the first in input order
    (CodeParrot's); "most-copies" the one with the highest `copies[row]`, ties to the smallest row (argmax returns
    the first maximum). Deterministic: rows are input order on both engines."""
    if policy == "first":
        return int(cluster[0])
    if policy != "most-copies" or copies is None:
        raise CodeParrotError(f"near dedup: unknown keep policy {policy!r} (or no copies given)")
    return int(cluster[int(np.argmax(copies[cluster]))])

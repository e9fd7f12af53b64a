"""MinHash LSH near-deduplication over identifier-token sets, vectorized with numpy.

Definitions (CodeParrot's): a file's tokens are the non-empty pieces of `re.split("[^A-Za-z_0-9]", text)`;
a file with fewer than `min_tokens` tokens (a count, not distinct) gets no signature and is never clustered;
the MinHash is over the SET of tokens (no n-grams). Two files are joined when they are LSH candidates (equal
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
- LSH: per band, one uint32 key per file; buckets come from one argsort. Buckets whose members are already
  one component are skipped; small buckets check each member against the first, then the pairs still
  split; large ones go through leaders (`_link_large_bucket`). Verified pairs join a vectorized union-find.
  The default banding is recall-first (`candidate_params`: 20 x 12 at 0.85 / 256) because every candidate
  is verified; `params=lsh_params(...)` gives CodeParrot's datasketch banding (13 x 19).

Memory (the real export is 20M files)
- Signatures: uint32 x num_perm = 1 KiB per file at 256 permutations. `find_clusters` accepts an
  `np.memmap` (`np.lib.format.open_memmap`): it reads row chunks once, then the rows of candidate pairs.
- In RAM while clustering: band keys 4 B x 20 bands + union-find parent and row index 8 B + per-band sort
  scratch: about 90 bytes per file measured (tracemalloc slope, `codeparrot.benchmarks.near_dedup`), i.e.
  about 1.7 GiB for 20M files, plus fixed scratch of a few tens of MiB.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import math
import sys
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from codeparrot.errors import CodeParrotError

logger = logging.getLogger(__name__)

_LITTLE = sys.byteorder == "little"
SENTINEL = np.uint32(0xFFFFFFFF)  # the signature row of a file without one (every slot at the max)
_TOKEN_BYTES = bytes(c if (48 <= c <= 57 or 65 <= c <= 90 or 97 <= c <= 122 or c == 95) else 32 for c in range(256))
_WINDOW_BYTES = 1 << 20  # text tokenized and hashed at once (a single larger file is one window)
_TOKEN_ROWS_PER_PIECE = 32768  # (file, token) rows per hash table: [V <= 32768, num_perm] uint32, 32 MiB
_SIG_ROWS_PER_CHUNK = 8192  # signature rows read at once when hashing bands (8 MiB at 256 permutations)
_PAIRS_PER_CHUNK = 8192  # candidate pairs verified at once (2 x 8 MiB of gathered rows)
_SMALL_BUCKET = 64  # larger buckets go through leaders (`_link_large_bucket`) instead of all pairs
_LARGE_BUCKET_PAIR_BUDGET = 1 << 22  # exhaustive cross-component pairs allowed in one large bucket


def identifier_tokens(text: str) -> list[bytes]:
    """The `[A-Za-z_0-9]+` tokens of `text` as UTF-8 bytes, in order (CodeParrot's `re.split` pieces).

    Non-ASCII characters are separators, as in the regex: every byte of their UTF-8 encoding is >= 0x80.
    Lone surrogates (possible in decoded JSON) are encoded with `surrogatepass` and are separators too.
    """
    return text.encode("utf-8", "surrogatepass").translate(_TOKEN_BYTES).split()


def _fmix32(h: np.ndarray) -> np.ndarray:
    """murmur3's 32-bit finalizer (a bijection, so no new collisions): destroys the near-linear structure
    that multiply-shift leaves between similar tokens, which would bias the linear MinHash functions."""
    h = h.astype(np.uint32, copy=True)
    h ^= h >> np.uint32(16)
    h *= np.uint32(0x85EBCA6B)
    h ^= h >> np.uint32(13)
    h *= np.uint32(0xC2B2AE35)
    h ^= h >> np.uint32(16)
    return h


def _fmix64(h: np.ndarray) -> np.ndarray:
    """murmur3's 64-bit finalizer, in place."""
    h ^= h >> np.uint64(33)
    h *= np.uint64(0xFF51AFD7ED558CCD)
    h ^= h >> np.uint64(33)
    h *= np.uint64(0xC4CEB9FE1A85EC53)
    h ^= h >> np.uint64(33)
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
        folded = _fmix64(h[long] ^ (lengths[long].astype(np.uint64) << np.uint64(56)))
        offset, sub = 8, np.arange(len(long))
        while len(sub):
            rest = lengths[long[sub]] - offset
            word = words[starts[long[sub]] + offset] & _LOW_BYTES[np.minimum(rest, 8)]
            folded[sub] = _fmix64(folded[sub] ^ word)
            offset, sub = offset + 8, sub[rest > 8]
        h[long] = folded
    for i in np.flatnonzero(lengths > _LONG_TOKEN).tolist():
        digest = hashlib.blake2b(buf[starts[i] : ends[i]], digest_size=8).digest()
        h[i] = int.from_bytes(digest, "little")
    h *= np.uint64(0x9E3779B97F4A7C15)
    return (h >> np.uint64(32)).astype(np.uint32)


def _distinct_tokens(datas: list[bytes], min_tokens: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Distinct token hashes of each UTF-8 file: (file index intp[T], token hash uint32[T], bool[files] with
    >= min_tokens tokens), sorted by file then hash; files under min_tokens contribute nothing. One numpy
    pass over the joined window replaces a Python list + set of token objects per file (3x faster)."""
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
    key = np.repeat(np.arange(len(datas), dtype=np.uint64) << np.uint64(32), np.where(ok, counts, 0))
    key |= _token_hashes(buf, starts[keep], ends[keep])
    key.sort()
    key = key[np.r_[True, key[1:] != key[:-1]]] if len(key) else key
    return (key >> np.uint64(32)).astype(np.intp), key.astype(np.uint32), ok


class MinHasher:
    """Computes MinHash signatures of files' identifier-token sets. Picklable (plain ints and arrays), so it
    can be sent to multiprocessing workers; the same seed gives the same signatures in any process."""

    def __init__(self, num_perm: int = 256, seed: int = 42, min_tokens: int = 10):
        if not isinstance(num_perm, (int, np.integer)) or num_perm < 2:
            raise CodeParrotError(f"near dedup: num_perm must be an integer >= 2, got {num_perm!r}")
        if not isinstance(min_tokens, (int, np.integer)) or min_tokens < 1:
            raise CodeParrotError(f"near dedup: min_tokens must be an integer >= 1, got {min_tokens!r}")
        self.num_perm = int(num_perm)
        self.seed = int(seed)
        self.min_tokens = int(min_tokens)
        rng = np.random.default_rng(self.seed)
        # multiply-add-shift parameters, uniform over [0, 2^64): [num_perm] uint64 each
        self._a = rng.integers(0, np.iinfo(np.uint64).max, size=self.num_perm, dtype=np.uint64, endpoint=True)
        self._b = rng.integers(0, np.iinfo(np.uint64).max, size=self.num_perm, dtype=np.uint64, endpoint=True)

    def __repr__(self) -> str:
        return f"MinHasher(num_perm={self.num_perm}, seed={self.seed}, min_tokens={self.min_tokens})"

    def _permuted(self, base: np.ndarray) -> np.ndarray:
        """[V, num_perm] uint32, contiguous: every hash function applied to every token hash in `base`."""
        x = _fmix32(base).astype(np.uint64)[:, None]  # [V, 1]
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
        files, tokens, ok = _distinct_tokens(datas, self.min_tokens)
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


@functools.lru_cache(maxsize=32)
def _lsh_error_table(threshold: float, num_perm: int, fp_weight: float, fn_weight: float):
    """(bands, rows, weighted error) for every (b, r) with b*r <= num_perm; the integrals of datasketch's
    optimizer, computed exactly: the integrands are polynomials of degree <= b*r <= num_perm, and Gauss-Legendre
    with m nodes is exact up to degree 2m-1."""
    nodes, weights = np.polynomial.legendre.leggauss(num_perm // 2 + 2)
    bands, rows = [], []
    for b in range(1, num_perm + 1):
        for r in range(1, num_perm // b + 1):
            bands.append(b)
            rows.append(r)
    b_arr = np.array(bands, dtype=np.float64)[:, None]
    r_arr = np.array(rows, dtype=np.float64)[:, None]

    def collide(s: np.ndarray) -> np.ndarray:  # [pairs, nodes]: P(candidate | Jaccard s) = 1-(1-s^r)^b
        return 1.0 - (1.0 - s[None, :] ** r_arr) ** b_arr

    # Map the nodes from [-1, 1] to [0, t] (false positives) and [t, 1] (false negatives).
    s_fp = (nodes + 1.0) * threshold / 2.0
    s_fn = threshold + (nodes + 1.0) * (1.0 - threshold) / 2.0
    fp = collide(s_fp) @ weights * threshold / 2.0
    fn = (1.0 - collide(s_fn)) @ weights * (1.0 - threshold) / 2.0
    error = fp * fp_weight + fn * fn_weight
    error.flags.writeable = False  # cached: shared by every caller
    return tuple(bands), tuple(rows), error


def _check_threshold(threshold: float, num_perm: int) -> None:
    if not isinstance(threshold, (int, float, np.floating)) or not 0.0 < threshold <= 1.0:
        raise CodeParrotError(f"near dedup: threshold must be in (0, 1], got {threshold!r}")
    if not isinstance(num_perm, (int, np.integer)) or num_perm < 2:
        raise CodeParrotError(f"near dedup: num_perm must be an integer >= 2, got {num_perm!r}")


def lsh_params(threshold: float, num_perm: int, weights: tuple[float, float] = (0.5, 0.5)) -> tuple[int, int]:
    """(bands, rows) minimizing the weighted false-positive + false-negative probability mass, as datasketch's
    MinHashLSH chooses them (CodeParrot's 0.85 / 256 gives 13 bands x 19 rows)."""
    _check_threshold(threshold, num_perm)
    bands, rows, error = _lsh_error_table(float(threshold), int(num_perm), float(weights[0]), float(weights[1]))
    best = int(np.argmin(error))  # first minimum, in datasketch's (b, r) scan order
    return bands[best], rows[best]


def candidate_params(threshold: float, num_perm: int, min_recall: float = 0.95) -> tuple[int, int]:
    """(bands, rows) that `find_clusters` uses by default: recall-first banding for LSH with verification.

    datasketch's `lsh_params` balances false positives against false negatives because its candidates are
    the answer; here every candidate is verified on the full signature, so a false candidate costs only a
    comparison, while a missed one is lost for good. 13 x 19 catches a pair at Jaccard 0.85 with probability
    0.46 (0.85 at 0.90); this picks, among the bandings that catch a pair AT the threshold with probability
    >= `min_recall`, the one with the least false-candidate mass below it (the least verification work).
    For 0.85 / 256: 20 bands x 12 rows (0.95 at 0.85, 0.999 at 0.90)."""
    _check_threshold(threshold, num_perm)
    bands, rows, fp_mass = _lsh_error_table(float(threshold), int(num_perm), 1.0, 0.0)
    b, r = np.array(bands, dtype=np.float64), np.array(rows, dtype=np.float64)
    recall = 1.0 - (1.0 - threshold**r) ** b
    ok = recall >= min_recall
    best = int(np.flatnonzero(ok)[np.argmin(fp_mass[ok])]) if ok.any() else int(np.argmax(recall))
    return bands[best], rows[best]


def _band_keys(signatures: np.ndarray, valid_rows: np.ndarray, bands: int, rows: int) -> np.ndarray:
    """[bands, len(valid_rows)] uint32: one key per band per file, the high word of sum_j slot_j * c_j
    (mod 2^64) with fixed random odd c. Different band contents collide with probability about 2^-32 (about
    50k random pairs per band among 20M files); a collision only costs a verification on the full signatures,
    never a wrong edge, and 4-byte keys halve the index."""
    mult = np.random.default_rng(0x5EED).integers(1, 1 << 63, size=rows, dtype=np.uint64) * np.uint64(2) + np.uint64(1)
    keys = np.empty((bands, len(valid_rows)), dtype=np.uint32)
    for lo in range(0, len(valid_rows), _SIG_ROWS_PER_CHUNK):
        chunk = np.asarray(signatures[valid_rows[lo : lo + _SIG_ROWS_PER_CHUNK], : bands * rows])
        chunk = chunk.astype(np.uint64).reshape(len(chunk), bands, rows)  # [C, bands, rows]
        keys[:, lo : lo + len(chunk)] = ((chunk * mult).sum(axis=2, dtype=np.uint64) >> np.uint64(32)).T
    return keys


def _roots(parent: np.ndarray, nodes: np.ndarray) -> np.ndarray:
    """Union-find roots of `nodes` (vectorized pointer chasing)."""
    r = parent[nodes]
    while True:
        up = parent[r]
        if np.array_equal(up, r):
            return r
        r = up


def _union(parent: np.ndarray, u: np.ndarray, v: np.ndarray) -> None:
    """Join the components of every edge (u[i], v[i]). Roots hook to the smaller root, so a component's root
    is always its smallest member; each round every remaining edge hooks its larger root, so it ends."""
    while len(u):
        ru, rv = _roots(parent, u), _roots(parent, v)
        cross = ru != rv
        u, v = np.minimum(ru[cross], rv[cross]), np.maximum(ru[cross], rv[cross])
        np.minimum.at(parent, v, u)


def _verify_and_join(signatures: np.ndarray, parent: np.ndarray, u: np.ndarray, v: np.ndarray, need: int) -> None:
    """Join the pairs (u[i], v[i]) that are not joined yet and have at least `need` equal slots."""
    pending = _roots(parent, u) != _roots(parent, v)
    u, v = u[pending], v[pending]
    ok = np.zeros(len(u), dtype=bool)
    for lo in range(0, len(u), _PAIRS_PER_CHUNK):
        a = np.asarray(signatures[u[lo : lo + _PAIRS_PER_CHUNK]])  # [chunk, P]
        b = np.asarray(signatures[v[lo : lo + _PAIRS_PER_CHUNK]])
        ok[lo : lo + len(a)] = np.count_nonzero(a == b, axis=1) >= need
    _union(parent, u[ok], v[ok])


def _split_buckets(parent: np.ndarray, members: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """bool per bucket (`members[starts[g]:starts[g+1]]`, all buckets): members in more than one component."""
    roots = _roots(parent, members)
    return np.minimum.reduceat(roots, starts) != np.maximum.reduceat(roots, starts)


def _bucket_pairs(starts: np.ndarray, sizes: np.ndarray, all_pairs: bool) -> tuple[np.ndarray, np.ndarray]:
    """Position pairs (i < j) inside the buckets [starts[g], starts[g] + sizes[g]): each member with the
    first (a star), or all pairs, built one offset d at a time over the buckets larger than d: O(pairs)
    numpy work, no Python loop over buckets."""
    us, vs = [np.zeros(0, np.intp)], [np.zeros(0, np.intp)]
    for d in range(1, int(sizes.max(initial=1))):
        big = sizes > d
        starts, sizes = starts[big], sizes[big]
        if not all_pairs:  # star: (first, first + d)
            us.append(starts)
            vs.append(starts + d)
            continue
        counts = sizes - d  # positions p with p + d still inside the bucket: start + [0, size - d)
        offsets = np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts)
        first = np.repeat(starts, counts) + offsets
        us.append(first)
        vs.append(first + d)
    return np.concatenate(us), np.concatenate(vs)


def _link_large_bucket(signatures: np.ndarray, parent: np.ndarray, members: np.ndarray, need: int) -> None:
    """Join the components of one large bucket (members ascending) without comparing all k^2 pairs.

    Leader pass: each member is compared with the leaders (members similar to no earlier leader), a block
    of members at a time: O(k x leaders). It can only miss edges between two non-leaders of different
    components, so if the bucket is still split afterwards, its cross-component pairs are verified
    exhaustively (work = cross pairs, within `_LARGE_BUCKET_PAIR_BUDGET`): the result is exact."""
    roots = _roots(parent, members)
    if (roots == roots[0]).all():  # joined meanwhile by another bucket of this band
        return
    sig = np.asarray(signatures[members])  # [k, P]
    k = len(members)
    # Local union-find over positions; members already joined (same global root) start joined.
    first, inverse = np.unique(roots, return_index=True, return_inverse=True)[1:]
    local = first[inverse.reshape(-1)].astype(np.intp)
    leaders = [0]
    edges_u, edges_v = [], []
    lo, compared, truncated = 1, 0, False  # compared: member-leader checks (k^2/2 if all are dissimilar)
    while lo < k:
        if compared > _LARGE_BUCKET_PAIR_BUDGET:
            logger.warning("near dedup: an LSH bucket of %d mutually dissimilar files exceeds the comparison "
                           "budget after %d files; the rest are linked through other bands only", k, lo)
            k, truncated = lo, True
            break
        hi = min(lo + max(1, min(64, (1 << 24) // (len(leaders) * sig.shape[1]))), k)  # [B, L, P] <= 16 MiB
        compared += (hi - lo) * len(leaders)
        eq = np.count_nonzero(sig[lo:hi, None, :] == sig[None, leaders, :], axis=2) >= need  # [B, leaders]
        b_idx, l_idx = np.nonzero(eq)
        edges_u.append(lo + b_idx)
        edges_v.append(np.asarray(leaders)[l_idx])
        n_before = len(leaders)
        for pos in (lo + np.flatnonzero(~eq.any(axis=1))).tolist():  # no earlier leader: check new ones
            new = leaders[n_before:]
            hits = np.count_nonzero(sig[new] == sig[pos], axis=1) >= need if new else np.zeros(0, bool)
            if hits.any():
                edges_u.append(np.full(int(hits.sum()), pos))
                edges_v.append(np.asarray(new)[hits])
            else:
                leaders.append(pos)
        lo = hi
    _union(local, np.concatenate(edges_u + [np.zeros(0, np.intp)]), np.concatenate(edges_v + [np.zeros(0, np.intp)]))
    comp = _roots(local, np.arange(k))
    members = members[:k]
    labels = np.unique(comp)
    if len(labels) > 1 and not truncated:
        groups = sorted((np.flatnonzero(comp == c) for c in labels), key=len)  # positions per component
        sizes = np.array([len(g) for g in groups], dtype=np.int64)
        cross_pairs = int((sizes * (sizes.sum() - np.cumsum(sizes))).sum())  # each group vs the later ones
        if cross_pairs > _LARGE_BUCKET_PAIR_BUDGET:
            logger.warning(
                "near dedup: an LSH bucket of %d files stays split in %d components; verifying its %d "
                "cross-component pairs exceeds the budget, keeping the leaders' components",
                k, len(labels), cross_pairs)
        else:  # each component's members against the members of the larger components
            for g, group in enumerate(groups[:-1]):
                rest = np.concatenate(groups[g + 1 :])
                rest_sig = sig[rest]  # [rest, P]
                step = max(1, (1 << 24) // (len(rest) * sig.shape[1]))  # [step, rest, P] bool <= 16 MiB
                for i0 in range(0, len(group), step):
                    i = group[i0 : i0 + step]
                    eq = np.count_nonzero(sig[i, None, :] == rest_sig[None], axis=2)  # [step, rest]
                    a, b = np.nonzero(eq >= need)
                    _union(parent, members[i[a]], members[rest[b]])
    _union(parent, members, members[comp])


def find_clusters(
    signatures: np.ndarray,
    threshold: float = 0.85,
    valid: np.ndarray | None = None,
    *,
    params: tuple[int, int] | None = None,
) -> list[np.ndarray]:
    """Connected components (size >= 2) of the LSH candidate pairs with estimated Jaccard >= `threshold`.

    `signatures`: uint32[n, num_perm], rows = files in input order (an `np.memmap` works). `valid`: bool[n];
    rows with False are never clustered; when None, rows that are entirely `SENTINEL` (what
    `MinHasher.signatures` writes for files without a signature) are treated as invalid. Each cluster is
    sorted ascending; clusters are sorted by their first member. `params`: (bands, rows) of the LSH
    candidate search; default `candidate_params(threshold, num_perm)` (20 x 12 at 0.85 / 256, recall-first);
    `lsh_params(threshold, num_perm)` gives CodeParrot's / datasketch's 13 x 19.
    """
    if not isinstance(signatures, np.ndarray) or signatures.ndim != 2 or signatures.dtype != np.uint32:
        raise CodeParrotError(
            f"near dedup: signatures must be a uint32 array [files, num_perm], got "
            f"{getattr(signatures, 'dtype', type(signatures).__name__)} of shape {getattr(signatures, 'shape', '?')}")
    n, num_perm = signatures.shape
    _check_threshold(threshold, num_perm)
    bands, rows = params if params is not None else candidate_params(threshold, num_perm)
    if not (isinstance(bands, (int, np.integer)) and isinstance(rows, (int, np.integer))
            and bands >= 1 and rows >= 1 and bands * rows <= num_perm):
        raise CodeParrotError(f"near dedup: LSH params {params!r} need bands * rows <= num_perm = {num_perm}")
    need = math.ceil(threshold * num_perm - 1e-9)  # equal slots needed: estimated Jaccard >= threshold
    if valid is None and n:
        valid = np.ones(n, dtype=bool)
        for lo in range(0, n, _SIG_ROWS_PER_CHUNK):
            valid[lo : lo + _SIG_ROWS_PER_CHUNK] = ~(signatures[lo : lo + _SIG_ROWS_PER_CHUNK] == SENTINEL).all(1)
    valid = np.asarray(valid if valid is not None else np.zeros(0), dtype=bool)
    if valid.shape != (n,):
        raise CodeParrotError(f"near dedup: valid has shape {valid.shape}, expected ({n},) like the signatures")
    index_dtype = np.int32 if n < 2**31 else np.int64  # 4 bytes per file where it fits
    valid_rows = np.flatnonzero(valid).astype(index_dtype)
    parent = np.arange(n, dtype=index_dtype)
    if len(valid_rows) < 2:
        return []
    keys = _band_keys(signatures, valid_rows, bands, rows)  # [bands, m]
    for band in range(bands):
        order = np.argsort(keys[band], kind="stable")  # equal keys stay in ascending row order
        sorted_keys = keys[band][order]
        starts = np.flatnonzero(np.r_[True, sorted_keys[1:] != sorted_keys[:-1]])  # every bucket
        del sorted_keys
        members = valid_rows[order]  # rows in bucket order
        del order
        sizes = np.diff(np.r_[starts, len(members)])
        small = sizes <= _SMALL_BUCKET
        # Small buckets, in two rounds: each member against the bucket's first member (joins a bucket of
        # near duplicates with k-1 checks), then every pair still in different components.
        for all_pairs in (False, True):
            todo = small & _split_buckets(parent, members, starts)
            u, v = _bucket_pairs(starts[todo], sizes[todo], all_pairs)
            _verify_and_join(signatures, parent, members[u], members[v], need)
        large = ~small & _split_buckets(parent, members, starts)
        for start, size in zip(starts[large].tolist(), sizes[large].tolist()):
            _link_large_bucket(signatures, parent, members[start : start + size], need)
    del keys
    return _components(parent, valid)


def _components(parent: np.ndarray, valid: np.ndarray) -> list[np.ndarray]:
    """Components of size >= 2 as ascending row arrays, ordered by first member (= the root)."""
    labels = _roots(parent, np.arange(len(parent), dtype=parent.dtype))
    sizes = np.bincount(labels, minlength=len(parent))
    rows = np.flatnonzero((sizes[labels] >= 2) & valid)
    rows = rows[np.argsort(labels[rows], kind="stable")]
    cuts = np.flatnonzero(np.diff(labels[rows])) + 1
    return [c for c in np.split(rows, cuts) if len(c) >= 2] if len(rows) else []


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

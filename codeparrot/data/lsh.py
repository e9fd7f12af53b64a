"""LSH clustering for near-deduplication: banding parameters, candidate pairs from band buckets, and
union-find components of the verified pairs (signatures come from `codeparrot.data.near_dedup.MinHasher`).

Two files are joined when they are LSH candidates (equal in one band) and their estimated Jaccard (fraction of
equal signature slots) is >= `threshold`; clusters are the connected components, so they do not depend on input
order, batching or worker count.

Speed
- Per band, one uint32 key per file; buckets come from one argsort. Buckets whose members are already one
  component are skipped; small buckets check each member against the first, then the pairs still split; large
  ones go through leaders (`_link_large_bucket`). Verified pairs join a vectorized union-find.
- The default banding is recall-first (`candidate_params`: 20 x 12 at 0.85 / 256) because every candidate is
  verified; `params=lsh_params(...)` gives CodeParrot's datasketch banding (13 x 19).

Memory (the real export is 20M files)
- Signatures: uint32 x num_perm = 1 KiB per file at 256 permutations. `find_clusters` accepts an `np.memmap`
  (`np.lib.format.open_memmap`): it reads row chunks once, then the rows of candidate pairs.
- In RAM while clustering: band keys 4 B x 20 bands + union-find parent and row index 8 B + per-band sort
  scratch: about 90 bytes per file measured (tracemalloc slope, `codeparrot.tools.benchmarks.near_dedup`), i.e.
  about 1.7 GiB for 20M files, plus fixed scratch of a few tens of MiB.
"""

from __future__ import annotations

import functools
import logging
import math

import numpy as np

from codeparrot.errors import CodeParrotError

logger = logging.getLogger("codeparrot.data.near_dedup")  # one logger for the whole near-dedup stage

SENTINEL = np.uint32(0xFFFFFFFF)  # the signature row of a file without one (every slot at the max)
_SIG_ROWS_PER_CHUNK = 8192  # signature rows read at once when hashing bands (8 MiB at 256 permutations)
_PAIRS_PER_CHUNK = 8192  # candidate pairs verified at once (2 x 8 MiB of gathered rows)
_SMALL_BUCKET = 64  # larger buckets go through leaders (`_link_large_bucket`) instead of all pairs
_LARGE_BUCKET_PAIR_BUDGET = 1 << 22  # exhaustive cross-component pairs allowed in one large bucket


def check_num_perm(num_perm) -> None:
    """One-line error unless `num_perm` (signature slots) is an integer >= 2."""
    if not isinstance(num_perm, (int, np.integer)) or num_perm < 2:
        raise CodeParrotError(f"near dedup: num_perm must be an integer >= 2, got {num_perm!r}")


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
    check_num_perm(num_perm)


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


def band_keys(signatures: np.ndarray, valid_rows: np.ndarray, bands: int, rows: int) -> np.ndarray:
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


def component_roots(parent: np.ndarray, nodes: np.ndarray) -> np.ndarray:
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
        ru, rv = component_roots(parent, u), component_roots(parent, v)
        cross = ru != rv
        u, v = np.minimum(ru[cross], rv[cross]), np.maximum(ru[cross], rv[cross])
        np.minimum.at(parent, v, u)


def _verify_and_join(signatures: np.ndarray, parent: np.ndarray, u: np.ndarray, v: np.ndarray, need: int) -> None:
    """Join the pairs (u[i], v[i]) that are not joined yet and have at least `need` equal slots."""
    pending = component_roots(parent, u) != component_roots(parent, v)
    u, v = u[pending], v[pending]
    ok = np.zeros(len(u), dtype=bool)
    for lo in range(0, len(u), _PAIRS_PER_CHUNK):
        a = np.asarray(signatures[u[lo : lo + _PAIRS_PER_CHUNK]])  # [chunk, P]
        b = np.asarray(signatures[v[lo : lo + _PAIRS_PER_CHUNK]])
        ok[lo : lo + len(a)] = np.count_nonzero(a == b, axis=1) >= need
    _union(parent, u[ok], v[ok])


def _split_buckets(parent: np.ndarray, members: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """bool per bucket (`members[starts[g]:starts[g+1]]`, all buckets): members in more than one component."""
    roots = component_roots(parent, members)
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
    roots = component_roots(parent, members)
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
    comp = component_roots(local, np.arange(k))
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


def banding(threshold: float, num_perm: int, params: tuple[int, int] | None = None) -> tuple[int, int, int]:
    """(bands, rows, equal slots needed) of the candidate search `find_clusters` runs (see its `params`)."""
    _check_threshold(threshold, num_perm)
    bands, rows = params if params is not None else candidate_params(threshold, num_perm)
    if not (isinstance(bands, (int, np.integer)) and isinstance(rows, (int, np.integer))
            and bands >= 1 and rows >= 1 and bands * rows <= num_perm):
        raise CodeParrotError(f"near dedup: LSH params {params!r} need bands * rows <= num_perm = {num_perm}")
    return bands, rows, math.ceil(threshold * num_perm - 1e-9)  # equal slots: estimated Jaccard >= threshold


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
    bands, rows, need = banding(threshold, num_perm, params)
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
    keys = band_keys(signatures, valid_rows, bands, rows)  # [bands, m]
    for band in range(bands):
        order = np.argsort(keys[band], kind="stable")  # equal keys stay in ascending row order
        sorted_keys = keys[band][order]
        starts = np.flatnonzero(np.r_[True, sorted_keys[1:] != sorted_keys[:-1]])  # every bucket
        del sorted_keys
        members = valid_rows[order]  # rows in bucket order
        del order
        link_buckets(signatures, parent, members, starts, need)
    del keys
    return _components(parent, valid)


def link_buckets(signatures: np.ndarray, parent: np.ndarray, members: np.ndarray, starts: np.ndarray,
                 need: int) -> None:
    """Join, in the union-find `parent`, every pair of rows that share a bucket and have at least `need` equal
    signature slots. `members`: rows (each bucket's ascending), bucket g = members[starts[g]:starts[g+1]].

    The result is the components of those verified pairs whatever the buckets' order or grouping (one band, or
    several bands' buckets at once as `distributed_clustering` does); pairs already joined are not compared."""
    if not len(starts):
        return
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


def _components(parent: np.ndarray, valid: np.ndarray) -> list[np.ndarray]:
    """Components of size >= 2 as ascending row arrays, ordered by first member (= the root)."""
    labels = component_roots(parent, np.arange(len(parent), dtype=parent.dtype))
    sizes = np.bincount(labels, minlength=len(parent))
    rows = np.flatnonzero((sizes[labels] >= 2) & valid)
    rows = rows[np.argsort(labels[rows], kind="stable")]
    cuts = np.flatnonzero(np.diff(labels[rows])) + 1
    return [c for c in np.split(rows, cuts) if len(c) >= 2] if len(rows) else []

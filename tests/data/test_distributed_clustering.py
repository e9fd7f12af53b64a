"""The partitioned clustering (`distributed_clustering`, what `--ray-clustering distributed` runs in Ray tasks)
finds exactly `lsh.find_clusters`' clusters, and its connected-components rounds agree with a union-find, for
every number of blocks and partitions."""

from __future__ import annotations

import numpy as np
import pytest

from codeparrot.data import distributed_clustering as dc
from codeparrot.data.lsh import banding, find_clusters

THRESHOLD, NUM_PERM = 0.85, 256


def _planted_signatures(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Signatures with every shape of cluster the linking has a path for: near copies, a chain whose ends are
    not similar, two files similar to each other but not to their bucket's first member, a bucket of 80 files
    (the large-bucket path) holding two similar groups, files without a signature, and random files."""
    rng = np.random.default_rng(seed)
    bands, rows, _ = banding(THRESHOLD, NUM_PERM)
    first_band = np.arange(rows)  # slots kept equal so that the planted files share band 0's bucket
    free = np.arange(rows, NUM_PERM)

    def changed(sig, count, exclude=()):
        out = sig.copy()
        slots = rng.choice(np.setdiff1d(free, exclude), count, replace=False)
        out[slots] = rng.integers(0, 2**32 - 1, count, dtype=np.uint32)
        return out, slots

    sigs = [rng.integers(0, 2**32 - 1, NUM_PERM, dtype=np.uint32) for _ in range(300)]  # unrelated files
    base = rng.integers(0, 2**32 - 1, NUM_PERM, dtype=np.uint32)
    sigs += [changed(base, 10)[0] for _ in range(5)]  # near copies
    a = rng.integers(0, 2**32 - 1, NUM_PERM, dtype=np.uint32)  # chain a ~ b ~ c, a !~ c
    b, used = changed(a, 30)
    c, _ = changed(b, 30, exclude=used)
    sigs += [c, a, b]
    f = rng.integers(0, 2**32 - 1, NUM_PERM, dtype=np.uint32)  # x ~ y, neither ~ f (f comes first)
    x, used = changed(f, 60)
    y, _ = changed(x, 10, exclude=used)
    sigs += [f, x, y]
    big = rng.integers(0, 2**32 - 1, NUM_PERM, dtype=np.uint32)
    for i in range(80):  # one 80-file bucket: mostly dissimilar, two groups of near copies inside
        member = big.copy()
        member[free] = rng.integers(0, 2**32 - 1, len(free), dtype=np.uint32)
        if i % 10 == 3:
            member[free] = big[free]
        if i % 10 == 7:
            member[free] = base[free]
        sigs.append(member)
    sigs += [np.full(NUM_PERM, 0xFFFFFFFF, np.uint32)] * 3  # no signature (never clustered)
    order = rng.permutation(len(sigs))
    signatures = np.stack(sigs)[order]
    assert first_band.max() < bands * rows
    return signatures, ~(signatures == 0xFFFFFFFF).all(axis=1)


def _partitioned_clusters(signatures: np.ndarray, valid: np.ndarray, blocks: int, partitions: int):
    """The three steps as `ray_clustering` schedules them, run in this process; ids are not row numbers."""
    bands, rows, need = banding(THRESHOLD, NUM_PERM)
    ids = np.cumsum(np.random.default_rng(1).integers(1, 5, len(signatures)))  # sorted, with gaps
    by_id = dict(zip(ids.tolist(), range(len(ids))))
    block_rows = np.array_split(np.flatnonzero(valid), blocks)
    parts = [dc.band_key_parts(ids[r], signatures[r], bands, rows, partitions) for r in block_rows]
    edges = []
    for p in range(partitions):
        members, starts = dc.shared_buckets([block[p] for block in parts])
        member_ids = np.unique(members)
        member_sigs = signatures[[by_id[i] for i in member_ids.tolist()]].reshape(len(member_ids), NUM_PERM)
        edges.append(dc.link_partition(members, starts, member_ids, member_sigs, need))
    stars = dc.components(np.concatenate(edges), partitions)
    return dc.clusters_from_stars(stars, ids)


@pytest.mark.parametrize("blocks,partitions", [(1, 1), (3, 2), (7, 5)])
def test_partitioned_clustering_finds_exactly_find_clusters_clusters(blocks, partitions):
    signatures, valid = _planted_signatures()
    expected = find_clusters(signatures, THRESHOLD, valid)
    sizes = sorted(len(c) for c in expected)
    assert sizes == [2, 3, 8, 13]  # x ~ y, the chain, a group inside the large bucket, the copies + the other
    got = _partitioned_clusters(signatures, valid, blocks, partitions)
    assert [c.tolist() for c in got] == [c.tolist() for c in expected]


def _union_find_components(edges: np.ndarray) -> dict[int, int]:
    parent: dict[int, int] = {}

    def root(x):
        while parent.setdefault(x, x) != x:
            x = parent[x]
        return x

    for u, v in zip(edges["u"].tolist(), edges["v"].tolist()):
        ru, rv = root(u), root(v)
        parent[max(ru, rv)] = min(ru, rv)
    return {node: root(node) for node in list(parent)}


@pytest.mark.parametrize("partitions", [1, 3, 8])
def test_star_rounds_agree_with_a_union_find(partitions):
    rng = np.random.default_rng(partitions)
    path = np.arange(0, 400, 2)  # a long path in shuffled order: the case that needs the most rounds
    random_u = rng.integers(1000, 1300, 250)
    u = np.r_[path[:-1], random_u, 5000]
    v = np.r_[path[1:], rng.integers(1000, 1300, 250), 5000]  # and a self loop
    edges = np.zeros(len(u), dc.EDGE)
    edges["u"], edges["v"] = u, v
    edges = edges[rng.permutation(len(edges))]
    stars = dc.components(edges, partitions)
    expected = {node: root for node, root in _union_find_components(edges).items() if node != root}
    assert dict(zip(stars["u"].tolist(), stars["v"].tolist())) == expected
    assert len(stars) == len(expected)  # each node once


def test_no_edges_no_clusters():
    assert dc.clusters_from_stars(dc.components(np.zeros(0, dc.EDGE), 4), np.arange(5)) == []


def test_distributed_clustering_needs_the_ray_engine():
    from codeparrot.data.preprocess_config import PreprocessConfig
    from codeparrot.errors import CodeParrotError

    with pytest.raises(CodeParrotError, match="--ray-clustering distributed needs --engine ray"):
        PreprocessConfig(inputs=["in"], output_dir="out", ray_clustering="distributed").validate()
    PreprocessConfig(inputs=["in"], output_dir="out", engine="ray", ray_clustering="distributed").validate()

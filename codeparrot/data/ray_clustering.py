"""`--ray-clustering distributed`: the near-duplicate clusters of `preprocess.py --engine ray` computed by Ray
tasks (`codeparrot.data.distributed_clustering` holds the steps; this module schedules them), so that neither
the LSH index nor the signatures pass through the driver.

Data movement, per kept file with a signature (20 bands at 0.85 / 256 permutations):
- band keys: 12 bytes x bands (240 B) from the block tasks to the partition tasks, through the object store;
- signatures: 1 KiB, fetched by a partition task only for files that share a bucket with another file, once
  per partition that holds such a bucket;
- edges: at most one 16-byte edge per clustered file and partition into the rounds, and one per clustered file
  at the end, which is all the driver receives (it writes `duplicate_clusters.json` from them).

The driver itself keeps only the object references; each round is a task per partition.
"""

from __future__ import annotations

import logging

import numpy as np

from codeparrot.data import distributed_clustering as dc
from codeparrot.data.lsh import banding
from codeparrot.data.ray_blocks import ray_task, rows_with_ids, rows_with_signature, signature_matrix
from codeparrot.errors import CodeParrotError

logger = logging.getLogger("codeparrot.data.near_dedup")
_MAX_ROUNDS = 200  # large-star/small-star needs O(log^2 n) rounds; far more means a bug, not a big corpus


def _block_band_keys(block, bands: int, rows: int, num_perm: int, partitions: int):
    """Step 1 on one block of filter/MinHash results: the band keys of its kept files with a signature."""
    block = rows_with_signature(block)
    parts = dc.band_key_parts(block["id"].to_numpy(), signature_matrix(block, num_perm), bands, rows, partitions)
    return tuple(parts) if partitions > 1 else parts[0]


def _signatures_of(block, ids: np.ndarray, num_perm: int) -> tuple[np.ndarray, np.ndarray]:
    """(ids found, their signatures) of the sorted `ids` held by one block."""
    block = rows_with_ids(block, ids)
    return block["id"].to_numpy(), signature_matrix(block, num_perm)


def _link(blocks_box: list, ranges: list[tuple[int, int]], num_perm: int, need: int, *parts):
    """Step 2 for one partition: its shared buckets, their members' signatures fetched from the blocks that
    hold them, linked into a spanning forest of verified edges."""
    import ray

    members, starts = dc.shared_buckets(list(parts))
    member_ids = np.unique(members)
    sigs = np.zeros((len(member_ids), num_perm), np.uint32)
    if len(member_ids):
        wanted = [(block, member_ids[(member_ids >= lo) & (member_ids <= hi)])
                  for block, (lo, hi) in zip(blocks_box[0], ranges)]
        for found, found_sigs in ray.get([ray_task(_signatures_of).remote(block, ids, num_perm)
                                          for block, ids in wanted if len(ids)]):
            sigs[np.searchsorted(member_ids, found)] = found_sigs
    return dc.link_partition(members, starts, member_ids, sigs, need)


def _large_star(partitions: int, *parts):
    out, done = dc.large_star(np.concatenate(parts))
    return (done, out, *dc.by_larger_end(out, partitions))


def _small_star(partitions: int, *parts):
    out = dc.by_both_ends(dc.small_star(np.concatenate(parts)), partitions)
    return tuple(out) if partitions > 1 else out[0]


def _both_ends(partitions: int, edges):
    out = dc.by_both_ends(edges, partitions)
    return tuple(out) if partitions > 1 else out[0]


def _as_lists(refs, partitions: int) -> list:
    return refs if partitions > 1 else [refs]


def distributed_clusters(blocks: list, ranges: list[tuple[int, int]], kept_ids: np.ndarray, threshold: float,
                         num_perm: int, partitions: int) -> list[np.ndarray]:
    """The clusters `lsh.find_clusters` finds on the kept files' signatures (rows = positions in the sorted
    `kept_ids`), computed by Ray tasks. `blocks`: the filter/MinHash result blocks (object refs); `ranges`: each
    block's kept id range; `partitions`: tasks per step."""
    import ray

    bands, rows, need = banding(threshold, num_perm)
    p = max(1, int(partitions))
    keys = [_as_lists(ray_task(_block_band_keys, p).remote(block, bands, rows, num_perm, p), p)
            for block, (lo, hi) in zip(blocks, ranges) if lo <= hi]
    forests = [ray_task(_link).remote([blocks], ranges, num_perm, need, *[k[i] for k in keys]) for i in range(p)]
    parts = [_as_lists(ray_task(_both_ends, p).remote(p, forest), p) for forest in forests]
    for rounds in range(1, _MAX_ROUNDS + 1):
        results = [ray_task(_large_star, p + 2).remote(p, *[row[i] for row in parts]) for i in range(p)]
        done = ray.get([r[0] for r in results])
        if all(done):  # every partition was already stars around their smallest ids: the answer
            stars = np.concatenate(ray.get([r[1] for r in results]))
            logger.info("near dedup: distributed clustering of %d files in %d partitions, %d star rounds",
                        len(kept_ids), p, rounds)
            return dc.clusters_from_stars(stars, kept_ids)
        parts = [_as_lists(ray_task(_small_star, p).remote(p, *[r[2 + i] for r in results]), p) for i in range(p)]
    raise CodeParrotError(f"near dedup: distributed connected components did not converge in {_MAX_ROUNDS} rounds")

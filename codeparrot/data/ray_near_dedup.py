"""Near dedup in the Ray engine (`codeparrot.data.ray_engine`, stage 4 of its docstring): the kept files clustered
as the local engine does, on the driver (their signatures, one block at a time, into a memory-mapped file in id
order, then `lsh.find_clusters`) or, with `--ray-clustering distributed`, by Ray tasks (`ray_clustering`); one
member kept per cluster, and the members' repo_name and path read by a task on the block that holds each.
"""

from __future__ import annotations

import math
import os
import time
from pathlib import Path

import numpy as np

from codeparrot.data.cluster_report import clusters_report, member_entry, member_fields, near_duplicates_to_drop
from codeparrot.data.lsh import banding, find_clusters
from codeparrot.data.preprocess_config import PreprocessConfig
from codeparrot.data.preprocess_stats import Totals
from codeparrot.data.ray_blocks import ray_task, rows_with_ids, signature_matrix
from codeparrot.data.ray_clustering import distributed_clusters
from codeparrot.data.ray_read import Locations

_PARTITION_BYTES = 256 << 20  # band keys per clustering partition at most (--ray-clustering distributed)


def _member_fields(block, ids: np.ndarray) -> dict[int, tuple]:
    """id -> (repo_name, path) of the near-duplicate cluster members (sorted `ids`) in one block: what the
    driver prints about them, never the files themselves."""
    found = rows_with_ids(block, ids)
    return {int(i): member_fields(raw) for i, raw in zip(found["id"].to_pylist(), found["raw"].to_pylist())}


def _block_signatures(block, num_perm: int) -> tuple[np.ndarray, np.ndarray]:
    """(kept ids, their signatures uint32[kept, num_perm]) of one block (it holds only kept files)."""
    return block["id"].to_numpy(), signature_matrix(block, num_perm)


def near_dedup(cfg: PreprocessConfig, blocks: list, ranges: list[tuple[int, int]], kept: dict, drop: np.ndarray,
                locate: Locations, tmp: Path, totals: Totals) -> dict:
    """Cluster the kept files as the local engine does (same rows, same order, same `find_clusters`); marks
    `drop` and returns the content of `duplicate_clusters.json`. `ranges`: each block's kept id range."""
    import ray

    ids, n = kept["id"], len(kept["id"])
    t = time.perf_counter()
    clusters: list[np.ndarray] = []
    if n and cfg.ray_clustering == "distributed":  # Ray tasks: no index and no signature on the driver
        bands = banding(cfg.jaccard_threshold, cfg.num_perm)[0]
        partitions = max(int(ray.cluster_resources().get("CPU", 1)), math.ceil(n * bands * 12 / _PARTITION_BYTES))
        clusters = distributed_clusters(blocks, ranges, ids, cfg.jaccard_threshold, cfg.num_perm, partitions)
    elif n:
        sig_path = tmp / ".signatures.u32"
        sigs = np.lib.format.open_memmap(sig_path, mode="w+", dtype=np.uint32, shape=(n, cfg.num_perm))
        for block in blocks:  # one block's signatures on the driver at a time
            block_ids, block_sigs = ray.get(ray_task(_block_signatures).remote(block, cfg.num_perm))
            sigs[np.searchsorted(ids, block_ids)] = block_sigs
        sigs.flush()
        clusters = find_clusters(sigs, cfg.jaccard_threshold, kept["has_sig"])
        del sigs
        os.unlink(sig_path)
    totals.seconds["clustering"] = time.perf_counter() - t
    totals.files["clustering"] = n
    drop |= near_duplicates_to_drop(clusters, n, kept["copies"], cfg.near_dedup_keep)
    totals.near_duplicates = int(drop.sum())
    rows = np.sort(np.concatenate(clusters)) if clusters else np.zeros(0, dtype=np.int64)
    members: dict[int, dict] = {}
    if len(rows):
        wanted, fields = ids[rows], {}
        for block, (lo, hi) in zip(blocks, ranges):
            mine = wanted[(wanted >= lo) & (wanted <= hi)]
            if len(mine):
                fields.update(ray.get(ray_task(_member_fields).remote(block, mine)))
        for row in rows.tolist():
            rid = int(ids[row])
            members[row] = member_entry(fields[rid], str(locate(rid)), not drop[row])
    return clusters_report(cfg, clusters, drop, members)

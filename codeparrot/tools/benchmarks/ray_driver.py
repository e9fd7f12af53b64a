"""Memory of the Ray engine's driver per input file, measured on synthetic numbers (no Ray needed): everything
the driver holds from the read to the shard assignment, run with the engine's own functions on n files.

Per file, the driver gets only fixed-size numbers (`codeparrot.data.ray_engine`): the ids and digests of the
valid records (exact dedup), the kept files' id, digest, size, has-signature flag and copies, and, one block at a time,
their signatures, which go to a memory-mapped file (page cache, not the driver's heap) for `find_clusters`;
then, per clustered file, its entry of `duplicate_clusters.json` (repo_name, path, input location).
The figure is the slope of tracemalloc's peak between two sizes, so fixed buffers do not count as per-file
memory; the memory-mapped signatures (4 x num_perm bytes per survivor, on the driver's disk) are reported apart.
"""

from __future__ import annotations

import tempfile
import time
import tracemalloc
from pathlib import Path

import numpy as np

from codeparrot.data.cluster_report import clusters_report, member_entry, near_duplicates_to_drop
from codeparrot.data.exact_dedup import first_ids
from codeparrot.data.lsh import find_clusters
from codeparrot.tools.benchmarks.common import BenchRow
from codeparrot.tools.benchmarks.near_dedup import synthetic_signatures

BLOCK = 65_536  # files per block summary / signature block, as the driver receives them
DUPLICATES = 0.3  # share of exact duplicates among the valid records


class _Cfg:  # the settings `clusters_report` copies into the file
    jaccard_threshold, num_perm, shingle_size, near_dedup_keep = 0.85, 256, 5, "most-copies"


def _driver_peak(n: int, folder: Path) -> tuple[int, float]:
    """(tracemalloc peak bytes, seconds) of the driver's steps for n valid records."""
    from codeparrot.data.ray_engine import _concat_sorted, _valid_split

    rng = np.random.default_rng(n)
    sig_rows = synthetic_signatures(n, giant=1000)  # built before the measurement (>= the survivors)
    tracemalloc.start()
    start = time.perf_counter()
    try:
        # replay_bad: (id, digest) of every valid record, 16 bytes each; exact dedup on them
        ids = np.arange(n, dtype=np.int64)
        digests = rng.integers(0, 2**63, size=n, dtype=np.uint64)
        copies = rng.random(n) < DUPLICATES
        digests[copies] = digests[rng.integers(0, n, size=int(copies.sum()))]
        winners = first_ids(digests, ids)
        del ids, digests
        # block summaries of the kept files (all winners kept here: the worst case)
        parts = [{"id": winners[i:i + BLOCK], "digest": rng.integers(0, 2**63, size=len(winners[i:i + BLOCK]),
                                                                     dtype=np.uint64),
                  "nbytes": np.full(len(winners[i:i + BLOCK]), 5000, np.int64),
                  "has_sig": np.ones(len(winners[i:i + BLOCK]), bool),
                  "copies": rng.integers(1, 100, size=len(winners[i:i + BLOCK]), dtype=np.int64)}
                 for i in range(0, len(winners), BLOCK)]
        kept = _concat_sorted(parts)
        del parts
        m = len(kept["id"])
        sigs = np.lib.format.open_memmap(folder / f"sig-{n}.npy", mode="w+", dtype=np.uint32, shape=(m, 256))
        for i in range(0, m, BLOCK):  # one block's signatures on the driver at a time
            sigs[i:i + BLOCK] = sig_rows[i:min(i + BLOCK, m)]
        sigs.flush()
        del sig_rows  # the benchmark's copy, not the driver's
        clusters = find_clusters(sigs, 0.85, kept["has_sig"])
        drop = near_duplicates_to_drop(clusters, m, kept["copies"], _Cfg.near_dedup_keep)
        # duplicate_clusters.json: one entry per clustered file (its repo_name and path, as a task returns them)
        rows = np.sort(np.concatenate(clusters)) if clusters else np.zeros(0, np.int64)
        members = {row: member_entry((f"owner{row % 1000}/repo{row % 7919}", f"src/pkg/module_{row}.py"),
                                     f"/data/export/file-{row >> 16:06d}.json.gz:{row & 0xFFFF}", not drop[row])
                   for row in rows.tolist()}
        report = clusters_report(_Cfg, clusters, drop, members)
        del members, report
        is_valid = _valid_split(kept["digest"], 0.01)
        by_split = [kept["id"][~drop & ~is_valid], kept["id"][~drop & is_valid]]
        del sigs, by_split
        return tracemalloc.get_traced_memory()[1], time.perf_counter() - start
    finally:
        tracemalloc.stop()


def driver_bytes_per_file(small: int, large: int) -> tuple[float, float, float]:
    """(bytes per file, seconds per file, peak bytes at `large`): slope of the driver's peak between the two sizes."""
    with tempfile.TemporaryDirectory(prefix="codeparrot-bench-driver-") as tmp:
        low, _ = _driver_peak(small, Path(tmp))
        high, seconds = _driver_peak(large, Path(tmp))
    return (high - low) / (large - small), seconds / large, high


def rows(quick: bool = False) -> list[BenchRow]:
    small, large = (50_000, 200_000) if quick else (250_000, 1_000_000)
    per_file, seconds, peak = driver_bytes_per_file(small, large)
    note = (f"tracemalloc peak slope {small:,}->{large:,} synthetic files ({DUPLICATES:.0%} exact duplicates, the "
            f"rest kept and clustered); peak {peak / 2**20:,.0f} MiB at {large:,}; 20M files ~ "
            f"{per_file * 20e6 / 2**30:.1f} GiB, plus 1 KiB/survivor of memory-mapped signatures on the driver's "
            f"disk; {seconds * 1e6:.1f} us/file on the driver")
    return [BenchRow("preprocess --engine ray: driver memory per input file", "bytes/file", per_file, per_file,
                     per_file, 1, note)]


if __name__ == "__main__":
    import sys

    for row in rows(quick="--quick" in sys.argv):
        print(row)

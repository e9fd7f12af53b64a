"""Memory of the Ray engine's driver per input file, measured on synthetic numbers (no Ray needed): everything
the driver holds from the read to the shard assignment, run with the engine's own functions on n files.

Per file, the driver gets only fixed-size numbers (`codeparrot.data.ray_engine`): each block's ids and digests
(exact dedup, `ray_read.ExactDedup`: 8 bytes per distinct file stay), the kept files' id, digest, size,
has-signature flag and copies, and, one block at a time, their signatures, which go to a memory-mapped file (page
cache, not the driver's heap) for `find_clusters`;
then, per clustered file, its entry of `duplicate_clusters.json` (repo_name, path, input location).
The figure is the slope of tracemalloc's peak between two sizes, so fixed buffers do not count as per-file
memory; the memory-mapped signatures (4 x num_perm bytes per survivor, on the driver's disk) are reported apart.
"""

from __future__ import annotations

import tempfile
import time
import tracemalloc
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from codeparrot.config import doc
from codeparrot.data import distributed_clustering as dc
from codeparrot.data.cluster_report import clusters_report, member_entry, near_duplicates_to_drop
from codeparrot.data.lsh import find_clusters
from codeparrot.errors import CodeParrotError
from codeparrot.tools.benchmarks.common import AreaFlags, BenchRow, area_cli, print_rows
from codeparrot.tools.benchmarks.near_dedup import synthetic_signatures

BLOCK = 65_536  # files per block summary / signature block, as the driver receives them
DUPLICATES = 0.3  # share of exact duplicates among the valid records


class _Cfg:  # the settings `clusters_report` copies into the file
    jaccard_threshold, num_perm, shingle_size, near_dedup_keep = 0.85, 256, 5, "most-copies"


CLUSTERED = 0.13  # --ray-clustering distributed: share of kept files in clusters (CodeParrot's 2.7M of 20M)
CLUSTER_SIZE = 4


def _synthetic_stars(kept_ids: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """What `ray_clustering.distributed_clusters` hands the driver: one (file, smallest id of its cluster) edge
    per clustered non-root file, for CLUSTERED of the kept files in clusters of CLUSTER_SIZE."""
    chosen = kept_ids[rng.random(len(kept_ids)) < CLUSTERED]
    chosen = chosen[rng.permutation(len(chosen))][: len(chosen) // CLUSTER_SIZE * CLUSTER_SIZE]
    groups = np.sort(chosen.reshape(-1, CLUSTER_SIZE), axis=1)
    stars = np.zeros(groups.shape[0] * (CLUSTER_SIZE - 1), dc.EDGE)
    stars["u"], stars["v"] = groups[:, 1:].reshape(-1), np.repeat(groups[:, 0], CLUSTER_SIZE - 1)
    return stars


def _digest(rows: np.ndarray) -> np.ndarray:
    """A distinct pseudo-random uint64 per file number (splitmix64's finalizer): the same number, the same digest."""
    x = rows.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    x ^= x >> np.uint64(30)
    x *= np.uint64(0xBF58476D1CE4E5B9)
    x ^= x >> np.uint64(27)
    return x


def _driver_peak(n: int, folder: Path, clustering: str = "driver") -> tuple[int, float]:
    """(tracemalloc peak bytes, seconds) of the driver's steps for n valid records; `clustering` as
    `--ray-clustering` (distributed: no signatures nor LSH index on the driver, only the clusters' edges)."""
    from codeparrot.data.licenses import LicenseFilter
    from codeparrot.data.preprocess_stats import Totals
    from codeparrot.data.ray_engine import _valid_split
    from codeparrot.data.ray_pass1 import concat_sorted
    from codeparrot.data.ray_read import ExactDedup, read_units
    from codeparrot.data.records import BadRecords

    rng = np.random.default_rng(n)
    # built before the measurement (>= the survivors)
    sig_rows = synthetic_signatures(n, giant=1000) if clustering == "driver" else None
    stars = _synthetic_stars(np.arange(n, dtype=np.int64), rng) if clustering != "driver" else None
    tracemalloc.start()
    start = time.perf_counter()
    try:
        # exact dedup as the engine's driver does it, each block's numbers in input order (`ExactDedup`); then
        # the block summaries of the kept files (all winners kept here: the worst case)
        dedup = ExactDedup([folder / "in.jsonl"], read_units([folder / "in.jsonl"]), BadRecords(), Totals(),
                           LicenseFilter("all"))
        parts = []
        for first in range(0, n, BLOCK):
            rows = np.arange(first, min(first + BLOCK, n), dtype=np.int64)
            copies = rng.random(len(rows)) < DUPLICATES  # a copy of a random earlier file
            source = np.where(copies, (rng.random(len(rows)) * rows).astype(np.int64), rows)
            empty = np.full(len(rows), "", dtype=object)
            winners = dedup.winners_of({"id": rows + 1, "bad": empty, "detail": empty, "digest": _digest(source),
                                        "nbytes": np.full(len(rows), 5000, np.int64), "license": empty})
            del rows, copies, source, empty
            parts.append({"id": winners, "digest": rng.integers(0, 2**63, size=len(winners), dtype=np.uint64),
                          "nbytes": np.full(len(winners), 5000, np.int64), "has_sig": np.ones(len(winners), bool),
                          "copies": rng.integers(1, 100, size=len(winners), dtype=np.int64)})
        kept = concat_sorted(parts)
        del parts
        m = len(kept["id"])
        sigs = None
        if clustering == "driver":
            sigs = np.lib.format.open_memmap(folder / f"sig-{n}.npy", mode="w+", dtype=np.uint32, shape=(m, 256))
            for i in range(0, m, BLOCK):  # one block's signatures on the driver at a time
                sigs[i:i + BLOCK] = sig_rows[i:min(i + BLOCK, m)]
            sigs.flush()
            del sig_rows  # the benchmark's copy, not the driver's
            clusters = find_clusters(sigs, 0.85, kept["has_sig"])
        else:  # the edges the tasks send: those between kept files (16 bytes each, received by the driver)
            pos_u, pos_v = np.searchsorted(kept["id"], stars["u"]), np.searchsorted(kept["id"], stars["v"])
            found = (kept["id"][np.minimum(pos_u, m - 1)] == stars["u"]) & (
                kept["id"][np.minimum(pos_v, m - 1)] == stars["v"])
            del pos_u, pos_v
            stars = stars[found]
            clusters = dc.clusters_from_stars(stars, kept["id"])
            del stars, found
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


def driver_bytes_per_file(small: int, large: int, clustering: str = "driver") -> tuple[float, float, float]:
    """(bytes per file, seconds per file, peak bytes at `large`): slope of the driver's peak between the two sizes."""
    with tempfile.TemporaryDirectory(prefix="codeparrot-bench-driver-") as tmp:
        low, _ = _driver_peak(small, Path(tmp), clustering)
        high, seconds = _driver_peak(large, Path(tmp), clustering)
    return (high - low) / (large - small), seconds / large, high


def rows(quick: bool = False) -> list[BenchRow]:
    small, large = (50_000, 200_000) if quick else (250_000, 1_000_000)
    out = []
    for clustering in ("driver", "distributed"):
        per_file, seconds, peak = driver_bytes_per_file(small, large, clustering)
        what = ("the rest kept and clustered on the driver" if clustering == "driver" else
                f"the rest kept, {CLUSTERED:.0%} of them in clusters of {CLUSTER_SIZE} found by Ray tasks")
        disk = (", plus 1 KiB/survivor of memory-mapped signatures on the driver's disk" if clustering == "driver"
                else ", nothing on its disk")
        note = (f"tracemalloc peak slope {small:,}->{large:,} synthetic files ({DUPLICATES:.0%} exact duplicates, "
                f"{what}); peak {peak / 2**20:,.0f} MiB at {large:,}; 20M files ~ {per_file * 20e6 / 2**30:.1f} GiB"
                f"{disk}; {seconds * 1e6:.1f} us/file on the driver")
        out.append(BenchRow(f"preprocess --engine ray: driver memory per input file, --ray-clustering {clustering}",
                            "bytes/file", per_file, per_file, per_file, 1, note))
    return out


@dataclass
class RayDriverFlags(AreaFlags):
    files: int | None = doc(None, "instead of the rows: one run at this many files, --ray-clustering distributed "
                                  "(e.g. 20000000: the driver's peak at CodeParrot's scale)")


def _main(flags: RayDriverFlags) -> None:
    if flags.files is None:
        print_rows(rows(quick=flags.quick))
        return
    if flags.files < 1:
        raise CodeParrotError(f"--files {flags.files}: give a number of files of at least 1")
    with tempfile.TemporaryDirectory(prefix="codeparrot-bench-driver-") as tmp:
        peak, seconds = _driver_peak(flags.files, Path(tmp), "distributed")
    print(f"{flags.files:,} files, --ray-clustering distributed: driver peak {peak / 2**30:.2f} GiB "
          f"(tracemalloc), {seconds:.0f} s on the driver")


if __name__ == "__main__":
    area_cli(__doc__, _main, RayDriverFlags)

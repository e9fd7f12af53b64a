"""What near dedup decides and reports once the clusters are known, the same for both engines: which members
are dropped (`near_duplicates_to_drop`), each member's entry in `duplicate_clusters.json` (`member_entry`, from
its raw line), and the file's content (`clusters_report`, written by `preprocess_stats.write_clusters`)."""

from __future__ import annotations

import json

import numpy as np

from codeparrot.data.near_dedup import kept_member
from codeparrot.data.preprocess_config import PreprocessConfig


def near_duplicates_to_drop(clusters: list[np.ndarray], n: int, copies: np.ndarray | None = None,
                            policy: str = "first") -> np.ndarray:
    """bool[n]: the rows to drop. Each cluster's rows are in input order; one member stays (`near_dedup.kept_member`:
    the first, or with policy "most-copies" the highest `copies[row]`, ties to the first), the others are dropped."""
    drop = np.zeros(n, dtype=bool)
    for cluster in clusters:
        drop[cluster] = True
        drop[kept_member(cluster, copies, policy)] = False
    return drop


def member_fields(raw: bytes) -> tuple:
    """(repo_name, path) of a cluster member, from its raw JSON line (None where a field is missing)."""
    record = json.loads(raw)
    return record.get("repo_name"), record.get("path")


def member_entry(fields: tuple, where: str, kept: bool) -> dict:
    """A member's entry in `duplicate_clusters.json`: its `member_fields`, where it was read, whether it was kept."""
    return {"repo_name": fields[0], "path": fields[1], "input": where, "kept": kept}


def clusters_report(cfg: PreprocessConfig, clusters: list[np.ndarray], drop: np.ndarray, members: dict[int, dict]) -> dict:
    """The content of `duplicate_clusters.json`; `members` maps each clustered row to its `member_entry`."""
    not_first = sum(bool(drop[c[0]]) for c in clusters)  # clusters whose kept file is not the first (most-copies)
    return {"num_clusters": len(clusters), "files_in_clusters": len(members), "near_duplicates": int(drop.sum()),
            "jaccard_threshold": cfg.jaccard_threshold, "num_perm": cfg.num_perm, "shingle_size": cfg.shingle_size,
            "keep": cfg.near_dedup_keep, "clusters_keeping_a_later_file": not_first,
            "clusters": [[members[int(r)] for r in c] for c in clusters]}

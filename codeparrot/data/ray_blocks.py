"""What the Ray engine (`ray_engine`) and its distributed clustering (`ray_clustering`) both do with the blocks
of filter/MinHash results (pyarrow tables of the kept files: `id`, `raw`, `has_sig` and `sig` columns): the Ray
task wrapper, rows picked by id, and the signature column as a matrix."""

from __future__ import annotations

import functools

import numpy as np

# CPUs per task (Ray's default, stated): the tokenizer's Rust pool in a filter task gets as many threads, so N
# concurrent tasks on a node never run N x all-core pools (as `local_engine._init_worker`).
TASK_CPUS = 1


@functools.cache
def ray_task(fn, num_returns: int = 1):
    """`fn` as a Ray task of `TASK_CPUS` CPUs returning `num_returns` objects (made when first used: ray is
    imported only by `ray_cluster.start_ray`)."""
    import ray

    return ray.remote(num_cpus=TASK_CPUS, num_returns=num_returns)(fn)


def rows_with_ids(block, ids: np.ndarray):
    """The rows of `block` whose id is in the sorted array `ids`."""
    mine = block["id"].to_numpy()
    pos = np.minimum(np.searchsorted(ids, mine), max(len(ids) - 1, 0))
    return block.filter(ids[pos] == mine) if len(ids) else block.slice(0, 0)


def rows_with_signature(block):
    """The rows of the kept files that have a MinHash signature (enough identifier tokens)."""
    return block.filter(block["has_sig"])


def signature_matrix(block, num_perm: int) -> np.ndarray:
    """uint32[rows, num_perm]: the `sig` list column of kept rows (each holds num_perm values: the signature, or
    all slots at the sentinel for a file without one, as `has_sig` says)."""
    import pyarrow.compute as pc

    return pc.list_flatten(block["sig"]).to_numpy().reshape(len(block), num_perm)

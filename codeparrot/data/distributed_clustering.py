"""Near-duplicate clustering in partitions, for a cluster of machines: the same clusters as `lsh.find_clusters`,
computed by tasks that each see one hash partition of the data (`codeparrot.data.ray_clustering` schedules them;
these functions are plain numpy, so they are tested without Ray).

`find_clusters` defines the answer: the connected components of the graph whose edges are the pairs of files
that share an LSH band key and have at least `need` equal signature slots. Here the same graph is built and
reduced in three steps, none of which needs all files in one place:

1. `band_key_parts` (a task per block of files): each file's key in every band (`lsh.band_keys`, the same keys),
   as (bucket = band << 32 | key, id) rows hash-partitioned by bucket. 12 bytes per file and band move.
2. `link_partition` (a task per partition): the buckets with two or more files, their members' signatures
   fetched from the blocks that hold them, linked by `lsh.link_buckets` into a local union-find. Out comes a
   spanning forest of the verified edges as (id, smallest id of its local component) pairs: at most one edge
   per clustered file and partition.
3. Connected components of those edges in rounds (`large_star` / `small_star`, Kiveris et al. 2014, as BigCode's
   Spark near-dedup): each round is a shuffle by node; every rule moves an edge towards the smallest id of its
   component, so the rounds end with each component as a star around its smallest id (`large_star` says when).

The components are those of `find_clusters`, so clusters, kept files and shards are byte-identical; the only
exception is an LSH bucket so large that `lsh._link_large_bucket` stops at its comparison budget (a warning is
logged either way), where which pairs get compared depends on what is already joined.
"""

from __future__ import annotations

import numpy as np

from codeparrot.data.lsh import band_keys, component_roots, link_buckets

EDGE = np.dtype([("u", np.int64), ("v", np.int64)])  # one undirected edge, or (node, neighbour) in a star round
BUCKET_ROW = np.dtype([("bucket", np.uint64), ("id", np.int64)])


def _partition_of(values: np.ndarray, partitions: int) -> np.ndarray:
    """A hash partition per value (splitmix64's finalizer, so that consecutive ids or keys spread evenly)."""
    x = values.astype(np.uint64, copy=True)
    with np.errstate(over="ignore"):
        x ^= x >> np.uint64(30)
        x *= np.uint64(0xBF58476D1CE4E5B9)
        x ^= x >> np.uint64(27)
        x *= np.uint64(0x94D049BB133111EB)
        x ^= x >> np.uint64(31)
    return (x % np.uint64(partitions)).astype(np.int64)


def _split(rows: np.ndarray, part: np.ndarray, partitions: int) -> list[np.ndarray]:
    """`rows` grouped by their partition number (stable), one array per partition."""
    order = np.argsort(part, kind="stable")
    cuts = np.searchsorted(part[order], np.arange(1, partitions))
    return [np.ascontiguousarray(p) for p in np.split(rows[order], cuts)]


def band_key_parts(ids: np.ndarray, signatures: np.ndarray, bands: int, rows: int,
                   partitions: int) -> list[np.ndarray]:
    """Step 1 for one block: ids int64[m] (files with a signature), signatures uint32[m, num_perm] ->
    per partition, BUCKET_ROW rows (band << 32 | band key, id)."""
    out = np.zeros(len(ids) * bands, dtype=BUCKET_ROW)
    if len(ids):
        keys = band_keys(signatures, np.arange(len(ids)), bands, rows)  # [bands, m], as find_clusters computes
        out["bucket"] = ((np.arange(bands, dtype=np.uint64)[:, None] << np.uint64(32)) | keys).reshape(-1)
        out["id"] = np.tile(ids.astype(np.int64), bands)
    return _split(out, _partition_of(out["bucket"], partitions), partitions)


def shared_buckets(parts: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Step 2a: one partition's BUCKET_ROW rows from every block -> (member ids in bucket order, each bucket's
    ascending; start of each bucket), keeping only buckets of two or more files."""
    table = np.concatenate(parts) if parts else np.zeros(0, BUCKET_ROW)
    table = table[np.lexsort((table["id"], table["bucket"]))]
    bucket = table["bucket"]
    starts = np.flatnonzero(np.r_[True, bucket[1:] != bucket[:-1]]) if len(table) else np.zeros(0, np.int64)
    sizes = np.diff(np.r_[starts, len(table)])
    shared = np.repeat(sizes >= 2, sizes)
    members = table["id"][shared]
    kept_sizes = sizes[sizes >= 2]
    return members, np.cumsum(kept_sizes) - kept_sizes


def link_partition(members: np.ndarray, starts: np.ndarray, member_ids: np.ndarray, signatures: np.ndarray,
                   need: int) -> np.ndarray:
    """Step 2b: the verified edges of one partition's shared buckets as a spanning forest, EDGE rows (id,
    smallest id of its component in this partition). `member_ids`: the sorted unique ids of `members`, whose
    signatures are the rows of `signatures` (uint32[len(member_ids), num_perm])."""
    positions = np.searchsorted(member_ids, members)  # ascending ids -> ascending positions
    parent = np.arange(len(member_ids), dtype=np.int64)
    link_buckets(signatures, parent, positions, starts, need)
    roots = component_roots(parent, np.arange(len(parent)))  # the smallest position of each component
    joined = np.flatnonzero(roots != np.arange(len(roots)))
    edges = np.zeros(len(joined), EDGE)
    edges["u"], edges["v"] = member_ids[joined], member_ids[roots[joined]]
    return edges


# --- step 3: connected components in rounds ------------------------------------------------------------------

def by_both_ends(edges: np.ndarray, partitions: int) -> list[np.ndarray]:
    """Each edge once in each direction, (node, neighbour) partitioned by node: what `large_star` reads."""
    both = np.zeros(2 * len(edges), EDGE)
    both["u"], both["v"] = np.r_[edges["u"], edges["v"]], np.r_[edges["v"], edges["u"]]
    return _split(both, _partition_of(both["u"], partitions), partitions)


def by_larger_end(edges: np.ndarray, partitions: int) -> list[np.ndarray]:
    """Each edge once as (larger end, smaller end), partitioned by the larger end: what `small_star` reads."""
    out = np.zeros(len(edges), EDGE)
    out["u"], out["v"] = np.maximum(edges["u"], edges["v"]), np.minimum(edges["u"], edges["v"])
    return _split(out, _partition_of(out["u"], partitions), partitions)


def _neighbourhoods(pairs: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(node, neighbour) pairs -> (the pairs without repeats and self loops, sorted; each row's group start;
    the minimum neighbour of the row's node, per row)."""
    pairs = np.unique(pairs[pairs["u"] != pairs["v"]])  # structured: sorted by (u, v)
    if not len(pairs):
        return pairs, np.zeros(0, np.int64), np.zeros(0, np.int64)
    starts = np.flatnonzero(np.r_[True, pairs["u"][1:] != pairs["u"][:-1]])
    sizes = np.diff(np.r_[starts, len(pairs)])
    return pairs, starts, np.repeat(pairs["v"][starts], sizes)  # sorted by v inside a node: first = min


def large_star(pairs: np.ndarray) -> tuple[np.ndarray, bool]:
    """One node partition of a large-star step: every neighbour larger than the node is linked to the smallest
    of the node's closed neighbourhood. In: (node, neighbour) both directions; out: undirected EDGE rows, and
    whether the input already was stars around their smallest ids (every node a centre, with no smaller
    neighbour, or a leaf, with exactly one neighbour, smaller): then the output is the same stars."""
    pairs, starts, smallest = _neighbourhoods(pairs)
    sizes = np.diff(np.r_[starts, len(pairs)])
    is_star = bool(np.all((smallest[starts] > pairs["u"][starts]) | (sizes == 1)))
    larger = pairs["v"] > pairs["u"]
    out = np.zeros(int(larger.sum()), EDGE)
    out["u"], out["v"] = pairs["v"][larger], np.minimum(smallest[larger], pairs["u"][larger])
    return out, is_star


def small_star(pairs: np.ndarray) -> np.ndarray:
    """One node partition of a small-star step: a node and its smaller neighbours are all linked to the
    smallest of them. In: (larger end, smaller end); out: undirected EDGE rows."""
    pairs, starts, smallest = _neighbourhoods(pairs)
    out = np.zeros(len(pairs) + len(starts), EDGE)
    out["u"][: len(pairs)], out["v"][: len(pairs)] = pairs["v"], smallest  # each smaller neighbour -> the min
    out["u"][len(pairs):], out["v"][len(pairs):] = pairs["u"][starts], smallest[starts]  # the node itself
    return out[out["u"] != out["v"]]


def components(edges: np.ndarray, partitions: int = 1, max_rounds: int = 200) -> np.ndarray:
    """Connected components of `edges` by large-star/small-star rounds in one process (what
    `ray_clustering` runs with one task per partition): EDGE rows (node, smallest id of its component)."""
    parts = by_both_ends(edges, partitions)
    for _ in range(max_rounds):
        stepped = [large_star(p) for p in parts]
        if all(is_star for _, is_star in stepped):
            return np.concatenate([out for out, _ in stepped] or [np.zeros(0, EDGE)])
        larger = [by_larger_end(out, partitions) for out, _ in stepped]
        smaller = [small_star(np.concatenate([row[k] for row in larger])) for k in range(partitions)]
        parts = [np.concatenate(x) for x in zip(*(by_both_ends(s, partitions) for s in smaller))]
    raise RuntimeError(f"connected components did not converge in {max_rounds} rounds")


def clusters_from_stars(stars: np.ndarray, ids: np.ndarray) -> list[np.ndarray]:
    """EDGE rows (node, component's smallest id) -> clusters as `find_clusters` returns them: ascending row
    numbers into the sorted `ids`, clusters ordered by their first member."""
    if not len(stars):
        return []
    stars = np.unique(stars)
    nodes = np.concatenate([stars["u"], np.unique(stars["v"])])
    roots = np.concatenate([stars["v"], np.unique(stars["v"])])
    order = np.lexsort((nodes, roots))
    nodes, roots = nodes[order], roots[order]
    cuts = np.flatnonzero(roots[1:] != roots[:-1]) + 1
    return [np.searchsorted(ids, group) for group in np.split(nodes, cuts)]

"""MinHash LSH near dedup: CodeParrot's definitions, agreement with brute-force exact Jaccard, exact
connected components, determinism across order/batching/processes, and bad input."""

from __future__ import annotations

import itertools
import logging
import math
import multiprocessing
import pickle
import random
import re

import numpy as np
import pytest

import codeparrot.data.lsh as nd_lsh
import codeparrot.data.near_dedup as nd
from codeparrot.data.near_dedup import MinHasher, estimated_jaccard, find_clusters, lsh_params, near_dedup
from codeparrot.errors import CodeParrotError


def reference_tokens(text: str) -> set[str]:
    """CodeParrot's definition, written independently of the module (str regex, not bytes.translate): the
    non-empty pieces of `re.split("[^A-Za-z_0-9]", text)` are exactly the `[A-Za-z_0-9]+` runs."""
    return set(re.findall("[A-Za-z_0-9]+", text))


def exact_jaccard_matrix(texts: list[str]) -> np.ndarray:
    """[n, n] exact Jaccard of the token sets, brute force over all pairs (an incidence-matrix product)."""
    sets = [reference_tokens(t) for t in texts]
    vocab = {tok: k for k, tok in enumerate(sorted(set().union(*sets)))}
    incidence = np.zeros((len(texts), len(vocab)), dtype=np.float32)  # counts < 2^24 stay exact
    for i, s in enumerate(sets):
        incidence[i, [vocab[t] for t in s]] = 1.0
    inter = (incidence @ incidence.T).astype(np.int64)
    sizes = np.diag(inter)
    union = sizes[:, None] + sizes[None, :] - inter
    return np.where(union > 0, inter / np.maximum(union, 1), 0.0)


def components(n: int, edges) -> list[list[int]]:
    """Connected components (size >= 2) of an edge list, by a plain list union-find: the reference."""
    parent = list(range(n))

    def find(x):
        while parent[x] != x:
            x = parent[x]
        return x

    for i, j in edges:
        ri, rj = find(i), find(j)
        if ri != rj:
            parent[max(ri, rj)] = min(ri, rj)
    groups: dict[int, list[int]] = {}
    for i in range(n):
        groups.setdefault(find(i), []).append(i)
    return sorted(g for g in groups.values() if len(g) >= 2)


def same_cluster_pairs(clusters) -> set[tuple[int, int]]:
    return {pair for c in clusters for pair in itertools.combinations(sorted(int(x) for x in c), 2)}


# --- the generated near-duplicate corpus -------------------------------------------------------------------

def make_variant(text: str, rng: random.Random) -> str:
    """A plausible near-copy: identifiers renamed, comments added, top-level blocks reordered, lines edited;
    each with a random intensity so that the exact Jaccard to the original lands on both sides of 0.85."""
    names = sorted(t for t in reference_tokens(text) if t[0].isalpha() and len(t) > 3)
    edits = rng.sample(["rename", "comment", "reorder", "delete"], rng.randint(1, 3))
    if "rename" in edits and names:
        renamed = {n: n + "_v2" for n in rng.sample(names, max(1, int(len(names) * rng.uniform(0.0, 0.2))))}
        text = re.sub("[A-Za-z_0-9]+", lambda m: renamed.get(m.group(), m.group()), text)
    if "comment" in edits:
        lines = text.splitlines()
        for _ in range(rng.randint(1, 12)):
            words = " ".join(f"note{rng.randint(0, 10**6)}" for _ in range(rng.randint(1, 5)))
            lines.insert(rng.randint(0, len(lines)), f"# {words}")
        text = "\n".join(lines)
    if "reorder" in edits:
        blocks = re.split(r"\n(?=def |class )", text)
        head, rest = blocks[0], blocks[1:]
        rng.shuffle(rest)
        text = "\n".join([head, *rest])
    if "delete" in edits:
        lines = text.splitlines()
        keep = [line for line in lines if rng.random() > rng.uniform(0.0, 0.15)]
        text = "\n".join(keep)
    return text


@pytest.fixture(scope="module")
def corpus(stdlib_texts) -> list[str]:
    """About 300 files: the ~200 stdlib files, plus 1-3 variants of 80 of them, shuffled."""
    rng = random.Random(1234)
    texts = list(stdlib_texts)
    for base in rng.sample(stdlib_texts, 80):
        texts.extend(make_variant(base, rng) for _ in range(rng.randint(1, 3)))
    rng.shuffle(texts)
    return texts


# --- tests ---------------------------------------------------------------------------------------------------

def test_codeparrot_case_keeps_two_files():
    result = near_dedup(["a " * 20, "a " * 30, "b " * 7])
    assert result.keep.tolist() == [True, False, True]  # "b "*7 has 7 tokens: never clustered, kept
    assert [c.tolist() for c in result.clusters] == [[0, 1]]
    assert result.valid.tolist() == [True, True, False]
    assert result.num_removed == 1


def test_tokens_match_codeparrot_regex():
    texts = [
        "def café(x_1, y):\n\treturn x_1+y  # naïve 😀 λ=3\r\n",
        "résumé = {'clé': 0xFF, \"ß\": __name__}",
        "日本語のコメント\nvalue=1",
        "lone \ud800 surrogate_ok",
        "",
        "   \n\t ",
    ]
    for text in texts:
        ours = [t.decode("ascii") for t in nd.identifier_tokens(text)]
        assert ours == [t for t in re.split("[^A-Za-z_0-9]", text) if t], text


@pytest.fixture(scope="module")
def corpus_jaccard(corpus) -> np.ndarray:
    return exact_jaccard_matrix(corpus)


def test_vectorized_token_hashes_match_token_sets(corpus):
    """Per-file distinct hashes = distinct tokens, and shared hashes = shared tokens (no collisions), for
    real files plus tokens that differ only late, only in length, or are far longer than 8 bytes."""
    tricky = [
        " ".join(["a" * 20 + "x", "a" * 20 + "y", "abcdefgh", "abcdefgh_", "abcdefg", "x" * 300, "x" * 301]),
        " ".join(["a" * 20 + "x", "abcdefgh_", "x" * 301, "longer_identifier_name_number_one", "ß_ok"]),
        " ".join(["y" * 64, "y" * 65, "y" * 63 + "z", "y" * 64 + "z", "x" * 300]),  # around the 64-byte switch
    ]
    texts = corpus[:40] + tricky
    files, hashes, ok = nd._distinct_tokens([t.encode("utf-8", "surrogatepass") for t in texts], 1)
    assert ok.all()
    got = [set(hashes[files == i].tolist()) for i in range(len(texts))]
    ref = [reference_tokens(t) for t in texts]
    assert [len(g) for g in got] == [len(r) for r in ref]
    for i, j in itertools.combinations(range(len(texts)), 2):
        assert len(got[i] & got[j]) == len(ref[i] & ref[j]), (i, j)


def test_precision_recall_against_brute_force_exact_jaccard(corpus, corpus_jaccard):
    """Pairs in the same cluster vs the reference: connected components of exact Jaccard >= 0.85. Averaged
    over 3 seeds: one seed's errors are correlated across pairs, so one seed is a noisy single draw."""
    counts = [len(re.findall("[A-Za-z_0-9]+", t)) for t in corpus]
    eligible = np.array([c >= 10 for c in counts])
    similar = (corpus_jaccard >= 0.85) & eligible[:, None] & eligible[None, :]
    ref_edges = [(int(i), int(j)) for i, j in zip(*np.nonzero(np.triu(similar, 1)))]
    ref_pairs = same_cluster_pairs(components(len(corpus), ref_edges))
    assert len(ref_pairs) >= 50, "the generated corpus must hold near duplicates"

    def precision_recall(clusters) -> tuple[float, float]:
        got = same_cluster_pairs(clusters)
        return len(ref_pairs & got) / max(1, len(got)), len(ref_pairs & got) / len(ref_pairs)

    ours, codeparrot_banding = [], []
    for seed in (42, 1, 2):
        result = near_dedup(corpus, seed=seed)
        ours.append(precision_recall(result.clusters))
        # The keep mask keeps exactly one file per cluster and every file outside clusters.
        assert result.num_removed == sum(len(c) - 1 for c in result.clusters)
        sigs, valid = MinHasher(seed=seed).signatures(corpus)
        codeparrot_banding.append(precision_recall(find_clusters(sigs, 0.85, valid, params=lsh_params(0.85, 256))))
    precision, recall = np.mean(ours, axis=0)
    cp_precision, cp_recall = np.mean(codeparrot_banding, axis=0)
    print(f"\nnear dedup vs exact Jaccard >= 0.85 on {len(corpus)} files, {len(ref_pairs)} reference pairs, "
          f"mean of seeds 42/1/2: precision {precision:.3f}, recall {recall:.3f} (per seed: "
          + ", ".join(f"{p:.3f}/{r:.3f}" for p, r in ours)
          + f"); with CodeParrot's 13 x 19 banding: precision {cp_precision:.3f}, recall {cp_recall:.3f}")
    assert precision >= 0.9 and recall >= 0.9
    assert min(min(pr) for pr in ours) >= 0.85


def test_lsh_params_match_datasketch():
    lsh = pytest.importorskip("datasketch.lsh")
    assert lsh_params(0.85, 256) == (13, 19)  # CodeParrot's published banding
    for threshold, num_perm in [(0.85, 256), (0.7, 128), (0.5, 64), (0.95, 100)]:
        assert lsh_params(threshold, num_perm) == lsh._optimal_param(threshold, num_perm, 0.5, 0.5)


def test_estimated_jaccard_tracks_exact_jaccard(corpus, corpus_jaccard):
    """Over 20 seeds (errors of one seed are correlated across pairs through shared common tokens, so
    unbiasedness is checked per pair across seeds): estimates are unbiased with the binomial spread."""
    rng = np.random.default_rng(0)
    counts = np.array([len(reference_tokens(t)) for t in corpus])
    i_all, j_all = np.nonzero(np.triu(corpus_jaccard > 0.1, 1) & (counts[:, None] >= 10) & (counts[None, :] >= 10))
    # ~60 pairs spread over the whole similarity range 0.1..1
    bins = np.digitize(corpus_jaccard[i_all, j_all], np.linspace(0.1, 1.0, 10))
    pick = np.concatenate([rng.permutation(np.flatnonzero(bins == b))[:7] for b in np.unique(bins)])
    pairs_i, pairs_j = i_all[pick], j_all[pick]
    exact = corpus_jaccard[pairs_i, pairs_j]
    files = np.unique(np.r_[pairs_i, pairs_j])
    where = {int(f): k for k, f in enumerate(files)}
    estimates = []
    for seed in range(20):
        sigs, _ = MinHasher(seed=seed).signatures([corpus[f] for f in files])
        a = sigs[[where[int(i)] for i in pairs_i]]
        b = sigs[[where[int(j)] for j in pairs_j]]
        estimates.append(np.count_nonzero(a == b, axis=1) / 256)
    assert estimated_jaccard(a[0], b[0]) == estimates[-1][0]  # the public helper is the same estimator
    est = np.array(estimates)  # [seeds, pairs]
    sigma = np.sqrt(np.maximum(exact * (1 - exact), 1e-4) / 256)
    assert len(exact) >= 40 and exact.min() < 0.3 and exact.max() > 0.9
    assert (np.abs(est - exact) <= 5 * sigma + 1 / 256).all()
    assert np.mean(np.abs(est - exact) <= 0.08) >= 0.98
    assert (np.abs(est.mean(axis=0) - exact) <= 4 * sigma / np.sqrt(len(est)) + 1 / 256).all()  # unbiased
    assert 0.8 < np.std((est - exact) / sigma) < 1.2  # the spread MinHash promises, no more


def test_same_seed_same_signatures_and_batching_does_not_matter(corpus, monkeypatch):
    sigs, valid = MinHasher(seed=3).signatures(corpus[:60])
    again, _ = MinHasher(seed=3).signatures(corpus[:60])
    other, _ = MinHasher(seed=4).signatures(corpus[:60])
    assert np.array_equal(sigs, again)
    assert not np.array_equal(sigs[valid], other[valid])
    one_by_one = np.stack([MinHasher(seed=3).signatures([t])[0][0] for t in corpus[:60]])
    assert np.array_equal(sigs, one_by_one)
    # Tiny windows and pieces: files are split over several hash tables; the signatures must not change.
    monkeypatch.setattr(nd, "_TOKEN_ROWS_PER_PIECE", 37)
    monkeypatch.setattr(nd, "_WINDOW_BYTES", 5000)
    assert np.array_equal(MinHasher(seed=3).signatures(corpus[:60])[0], sigs)


def test_shuffled_input_gives_the_same_clusters(corpus):
    def cluster_texts(texts):
        return sorted(sorted(texts[i] for i in c) for c in near_dedup(texts).clusters)

    shuffled = list(corpus)
    random.Random(99).shuffle(shuffled)
    assert cluster_texts(corpus) == cluster_texts(shuffled)
    assert len(cluster_texts(corpus)) >= 20


def test_short_and_empty_files_are_never_clustered():
    hasher = MinHasher(min_tokens=10)
    nine = "x = y + z(a, b)  # c d e f"  # 9 tokens
    assert len(nd.identifier_tokens(nine)) == 9
    assert hasher.signature(nine) is None
    assert hasher.signature("") is None
    assert hasher.signature("ééé ∑ 日本 " * 50) is None  # no ASCII identifier token at all
    assert hasher.signature("same " * 10) is not None  # a count, not distinct tokens
    result = near_dedup([nine] * 5 + ["", "", "same " * 10, "same " * 12])
    assert [c.tolist() for c in result.clusters] == [[7, 8]]
    assert result.keep.tolist() == [True] * 8 + [False]
    sigs, valid = hasher.signatures([nine, "", "same " * 10])
    assert valid.tolist() == [False, False, True] and (sigs[:2] == nd.SENTINEL).all()
    # Without a `valid` mask, rows MinHasher left without a signature are recognized and never joined.
    assert [c.tolist() for c in find_clusters(np.concatenate([sigs, sigs]))] == [[2, 5]]


def test_empty_and_all_invalid_inputs():
    assert near_dedup([]).clusters == [] and near_dedup([]).keep.shape == (0,)
    assert find_clusters(np.zeros((0, 256), dtype=np.uint32)) == []
    result = near_dedup(["", "x", "short file"])
    assert result.clusters == [] and result.keep.all() and not result.valid.any()


def _worker_signatures(payload: bytes) -> np.ndarray:
    hasher, texts = pickle.loads(payload)
    return hasher.signatures(texts)[0]


def test_minhasher_pickles_to_a_fresh_process(corpus):
    hasher = MinHasher(num_perm=64, seed=11)
    texts = corpus[:20] + ["naïve café = ünïcode + token_α " * 5]
    payload = pickle.dumps((hasher, texts))
    # spawn: a fresh interpreter with its own str-hash salt, like a pipeline worker on any platform
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        remote = pool.apply(_worker_signatures, (payload,))
    assert np.array_equal(remote, hasher.signatures(texts)[0])


# --- find_clusters against a brute force over the signatures themselves ---------------------------------------

def random_walk_signatures(seed: int, families: int = 12, length: int = 40, step: int = 14) -> np.ndarray:
    """Families of signatures where each member mutates `step` random slots of the previous one: neighbours
    are near duplicates, members far apart are not, so components only form through chains. Plus noise rows."""
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(families):
        sig = rng.integers(0, 2**32 - 1, size=256, dtype=np.uint32)
        for _ in range(length):
            sig = sig.copy()
            sig[rng.choice(256, step, replace=False)] = rng.integers(0, 2**32 - 1, size=step, dtype=np.uint32)
            rows.append(sig)
    rows.extend(rng.integers(0, 2**32 - 1, size=(100, 256), dtype=np.uint32))
    out = np.stack(rows)
    return out[rng.permutation(len(out))]


def brute_force_clusters(sigs: np.ndarray, threshold: float, params=None) -> list[list[int]]:
    """The definition, literally: pairs equal in some band with enough equal slots, then components."""
    bands, rows = params or nd.candidate_params(threshold, sigs.shape[1])
    need = math.ceil(threshold * sigs.shape[1] - 1e-9)
    edges = []
    for i in range(len(sigs) - 1):
        eq = sigs[i + 1 :] == sigs[i]  # [later rows, P]
        candidate = eq[:, : bands * rows].reshape(len(eq), bands, rows).all(axis=2).any(axis=1)
        edges += [(i, i + 1 + int(j)) for j in np.flatnonzero(candidate & (eq.sum(axis=1) >= need))]
    return components(len(sigs), edges)


@pytest.fixture(scope="module")
def walk():
    sigs = random_walk_signatures(seed=5)
    return sigs, brute_force_clusters(sigs, 0.85)


@pytest.mark.parametrize("small_bucket", [64, 3])  # 3: nearly every bucket takes the large-bucket path
def test_find_clusters_equals_brute_force_components(monkeypatch, walk, small_bucket):
    monkeypatch.setattr(nd_lsh, "_SMALL_BUCKET", small_bucket)
    sigs, expected = walk
    assert [c.tolist() for c in find_clusters(sigs, 0.85)] == expected
    assert sum(len(c) > 5 for c in expected) >= 3  # chains did form multi-step components
    # Input order does not matter: permute the rows, map the clusters back.
    perm = np.random.default_rng(1).permutation(len(sigs))
    back = sorted(sorted(int(perm[i]) for i in c) for c in find_clusters(sigs[perm], 0.85))
    assert back == expected
    # CodeParrot's own banding (13 x 19) follows the same definition with its bands.
    codeparrot = lsh_params(0.85, 256)
    assert [c.tolist() for c in find_clusters(sigs, 0.85, params=codeparrot)] == \
        brute_force_clusters(sigs, 0.85, codeparrot)


def test_find_clusters_reads_memmap(tmp_path, walk):
    sigs, expected = walk
    mm = np.lib.format.open_memmap(tmp_path / "sigs.npy", mode="w+", dtype=np.uint32, shape=sigs.shape)
    mm[:] = sigs
    mm.flush()
    del mm
    loaded = np.load(tmp_path / "sigs.npy", mmap_mode="r")
    assert [c.tolist() for c in find_clusters(loaded, 0.85)] == expected


def leader_trap() -> np.ndarray:
    """Four files in one bucket, in this order: L1, L2, a, b with a~L1, b~L2, a~b, and no other similar pair.
    Leaders alone give {L1, a} and {L2, b}; only the a-b pair (two non-leaders) joins them. Every band where
    a and b agree holds all four (their differing slots cycle through each touched band), so no band
    offers the a-b pair in a small bucket."""
    bands, rows = nd.candidate_params(0.85, 256)
    rng = np.random.default_rng(0)
    base = rng.integers(0, 2**32 - 1, size=256, dtype=np.uint32)
    touched = np.arange(rows, rows + rows * math.ceil(84 / rows))  # whole bands after band 0
    role = np.array(["A", "B", "E1", "E1", "E1", "E2", "E2", "E2"])[np.arange(len(touched)) % 8]
    slots = {r: touched[role == r] for r in ("A", "B", "E1", "E2")}
    sigs = np.tile(base, (4, 1))

    def fresh(slot_ids):
        return rng.integers(0, 2**32 - 1, size=len(slot_ids), dtype=np.uint32)

    sigs[2, slots["A"]] = fresh(slots["A"])  # a
    sigs[3, slots["B"]] = fresh(slots["B"])  # b
    sigs[0, slots["A"]], sigs[0, slots["E1"]] = sigs[2, slots["A"]], fresh(slots["E1"])  # L1 = a + E1
    sigs[1, slots["B"]], sigs[1, slots["E2"]] = sigs[3, slots["B"]], fresh(slots["E2"])  # L2 = b + E2
    return sigs


def test_large_bucket_finds_edges_between_non_leaders(monkeypatch, caplog):
    sigs = leader_trap()
    need = math.ceil(0.85 * 256)
    similar = {(i, j) for i, j in itertools.combinations(range(4), 2) if (sigs[i] == sigs[j]).sum() >= need}
    assert similar == {(0, 2), (1, 3), (2, 3)}
    assert brute_force_clusters(sigs, 0.85) == [[0, 1, 2, 3]]
    for small_bucket in (64, 3):  # the all-pairs path, then the leader path with its exhaustive pass
        monkeypatch.setattr(nd_lsh, "_SMALL_BUCKET", small_bucket)
        assert [c.tolist() for c in find_clusters(sigs, 0.85)] == [[0, 1, 2, 3]]
    # Over the pair budget the leader components stand (each a real connection) and a warning says so.
    monkeypatch.setattr(nd_lsh, "_LARGE_BUCKET_PAIR_BUDGET", 0)
    with caplog.at_level(logging.WARNING, logger="codeparrot.data.near_dedup"):
        assert [c.tolist() for c in find_clusters(sigs, 0.85)] == [[0, 2], [1, 3]]
    assert "stays split" in caplog.text


def test_bad_input_is_a_one_line_error():
    with pytest.raises(CodeParrotError, match="uint32"):
        find_clusters(np.zeros((3, 256), dtype=np.int64))
    with pytest.raises(CodeParrotError, match="valid"):
        find_clusters(np.zeros((3, 256), dtype=np.uint32), valid=np.ones(4, dtype=bool))
    with pytest.raises(CodeParrotError, match="threshold"):
        find_clusters(np.zeros((3, 256), dtype=np.uint32), threshold=1.5)
    with pytest.raises(CodeParrotError, match="num_perm"):
        MinHasher(num_perm=1)
    with pytest.raises(CodeParrotError, match="text 1"):
        MinHasher().signatures(["fine " * 20, b"bytes"])


def test_huge_bucket_of_dissimilar_files_is_bounded(monkeypatch, caplog):
    """100 unrelated files that share one band (an adversarial bucket) plus a near-duplicate pair at its end:
    over the comparison budget the bucket is cut short with a warning, and the pair is still found through
    its other bands."""
    monkeypatch.setattr(nd_lsh, "_LARGE_BUCKET_PAIR_BUDGET", 0)
    rng = np.random.default_rng(3)
    sigs = rng.integers(0, 2**32 - 1, size=(100, 256), dtype=np.uint32)
    bands, rows = nd.candidate_params(0.85, 256)
    sigs[:, :rows] = sigs[0, :rows]  # everyone shares band 0
    sigs[99] = sigs[98]
    sigs[99, 200:210] = 7  # 10 slots differ: estimated Jaccard 0.96
    with caplog.at_level(logging.WARNING, logger="codeparrot.data.near_dedup"):
        assert [c.tolist() for c in find_clusters(sigs, 0.85)] == [[98, 99]]
    assert "comparison budget" in caplog.text

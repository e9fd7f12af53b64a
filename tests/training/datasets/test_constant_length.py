"""ConstantLengthDataset: chunking, EOS joins, the carried tail, sharding, shuffling, epochs and exact resume.

The reference everywhere is the tokenizer's own batch call on the texts, joined with EOS by hand
(`eos_joined`), never the dataset's helper.
"""

from __future__ import annotations

import gzip
import io
from collections import Counter

import numpy as np
import pytest
import torch

from codeparrot.errors import CodeParrotError
from codeparrot.training.datasets.constant_length import ConstantLengthDataset

L = 64  # sequence length: small, so the final partial chunk is a small part of the stream


@pytest.fixture(scope="module")
def shards(tmp_path_factory, texts, write_shards):
    return write_shards(tmp_path_factory.mktemp("clean") / "train", texts, 4)


def flat(seqs):
    return torch.cat(list(seqs)).numpy() if seqs else np.empty(0, dtype=np.int64)


def complete_docs(tokenizer, seqs):
    """Decoded documents of a stream, split at EOS; the last (cut) piece is dropped."""
    return tokenizer.decode(flat(seqs).tolist()).split("<|endoftext|>")[:-1]


def test_chunks_are_the_eos_joined_tokenization_minus_the_last_partial_chunk(tokenizer, shards, texts,
                                                                             eos_joined):
    seqs = list(ConstantLengthDataset(tokenizer, str(shards), seq_length=L, num_of_sequences=8))
    ref = eos_joined(tokenizer, texts)
    assert all(s.shape == (L,) and s.dtype == torch.int64 for s in seqs)
    assert len(seqs) == len(ref) // L
    np.testing.assert_array_equal(flat(seqs), ref[: len(seqs) * L])


def test_files_are_joined_with_eos(tokenizer, shards, texts):
    seqs = list(ConstantLengthDataset(tokenizer, shards, seq_length=L, num_of_sequences=8))
    docs = complete_docs(tokenizer, seqs)
    assert docs == texts[: len(docs)] and len(docs) >= len(texts) - 1  # exact round trip, file by file
    assert (flat(seqs) == tokenizer.eos_token_id).sum() == len(docs)


def test_tail_carries_over_buffer_boundaries(tokenizer, shards):
    # ~64 characters per buffer: almost every file gets its own tokenizer call and leaves a tail behind.
    tiny = list(ConstantLengthDataset(tokenizer, shards, seq_length=L, num_of_sequences=1, chars_per_token=1.0))
    one_buffer = list(ConstantLengthDataset(tokenizer, shards, seq_length=L, num_of_sequences=10**6))
    assert len(tiny) == len(one_buffer)
    assert all(torch.equal(a, b) for a, b in zip(tiny, one_buffer))


@pytest.mark.parametrize("n_shards,world_size", [(4, 2), (1, 2), (3, 4)], ids=["by-shard", "by-record", "3-of-4"])
def test_ranks_tokenize_disjoint_parts_that_cover_everything(tokenizer, tmp_path, texts, n_shards, world_size,
                                                             write_shards, eos_joined, watched_tokenizer):
    folder = write_shards(tmp_path / "data", texts, n_shards)
    seen = []
    for rank in range(world_size):
        recorder = watched_tokenizer(tokenizer)
        seqs = list(ConstantLengthDataset(recorder, folder, seq_length=L, num_of_sequences=4, rank=rank,
                                          world_size=world_size))
        # what this rank yields is exactly the EOS-joined tokenization of what it (alone) tokenized
        mine = eos_joined(tokenizer, recorder.seen)
        np.testing.assert_array_equal(flat(seqs), mine[: len(seqs) * L])
        seen.append(recorder.seen)
    counts = Counter(t for part in seen for t in part)
    assert set(counts) == set(texts) and max(counts.values()) == 1  # every file tokenized exactly once
    assert all(part for part in seen)  # nobody idles, even with fewer shards than ranks


def test_dataloader_workers_split_a_rank_like_more_ranks(tokenizer, shards):
    from codeparrot.training.datasets.loader import build_dataloader

    ds = ConstantLengthDataset(tokenizer, shards, seq_length=L, num_of_sequences=4, rank=1, world_size=2)
    from_workers = [row for batch in build_dataloader(ds, batch_size=3, num_workers=2) for row in batch]
    # rank 1 of 2 with 2 workers = readers 2 and 3 of 4
    as_ranks = [s for r in (2, 3) for s in ConstantLengthDataset(tokenizer, shards, seq_length=L, num_of_sequences=4,
                                                                 rank=r, world_size=4)]
    key = lambda t: t.numpy().tobytes()  # noqa: E731
    assert sorted(map(key, from_workers)) == sorted(map(key, as_ranks)) and len(from_workers) > 0
    others = {key(s) for r in (0, 1) for s in ConstantLengthDataset(tokenizer, shards, seq_length=L,
                                                                    num_of_sequences=4, rank=r, world_size=4)}
    assert not others & set(map(key, from_workers))


def test_infinite_restarts_counts_epochs_and_keeps_the_stream_continuous(tokenizer, tmp_path, texts, write_shards,
                                                                         eos_joined):
    folder = write_shards(tmp_path / "small", texts[:4], 2)
    ref = eos_joined(tokenizer, texts[:4])
    ds = ConstantLengthDataset(tokenizer, folder, seq_length=L, num_of_sequences=2, infinite=True)
    n = 3 * len(ref) // L
    it = iter(ds)
    seqs = [next(it) for _ in range(n)]
    np.testing.assert_array_equal(flat(seqs), np.tile(ref, 3)[: n * L])  # tails carried across epochs too
    assert ds.epoch == 2


def test_shuffle_buffers_are_seeded_permutations(tokenizer, shards, texts):
    def run(**kw):
        return list(ConstantLengthDataset(tokenizer, shards, seq_length=L, num_of_sequences=4, **kw))

    plain = run()
    seq_a, seq_b, seq_c = (run(sequence_shuffle_buffer=50, seed=s) for s in (1, 1, 2))
    key = lambda t: t.numpy().tobytes()  # noqa: E731
    assert [key(s) for s in seq_a] == [key(s) for s in seq_b] != [key(s) for s in seq_c]
    assert [key(s) for s in seq_a] != [key(s) for s in plain]
    assert sorted(map(key, seq_a)) == sorted(map(key, plain))  # same sequences, other order, none lost

    docs = complete_docs(tokenizer, run(shuffle_buffer=10, seed=1))
    assert docs != texts[: len(docs)] and len(set(docs)) == len(docs) >= len(texts) - 1
    assert set(docs) <= set(texts)
    assert complete_docs(tokenizer, run(shuffle_buffer=10, seed=1)) == docs


def roundtrip(state):
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)  # what a checkpoint loader does by default


RESUME_CASES = {
    "plain": dict(num_of_sequences=4),
    "shuffle-buffers": dict(num_of_sequences=4, shuffle_buffer=5, sequence_shuffle_buffer=7, seed=3),
    "infinite-across-epochs": dict(num_of_sequences=4, infinite=True, shuffle_buffer=3, sequence_shuffle_buffer=4),
    # reader 1 of 3: the record count that deals records runs across epochs and must resume with them
    "reader-1-of-3-across-epochs": dict(num_of_sequences=2, infinite=True, shuffle_buffer=3, rank=1, world_size=3),
    # fill-in-the-middle: the transform has no state of its own, the position must still be exact
    "fim-shuffled-across-epochs": dict(num_of_sequences=4, infinite=True, shuffle_buffer=3, sequence_shuffle_buffer=4,
                                       fim_rate=0.5, fim_spm_rate=0.5),
}


@pytest.mark.parametrize("case", RESUME_CASES)
def test_state_round_trip_continues_with_the_next_sequence(tokenizer, tmp_path, texts, case, write_shards,
                                                           eos_joined, watched_tokenizer):
    kw = RESUME_CASES[case]
    folder = write_shards(tmp_path / "d", texts[:12], 3)
    total = 2 * len(eos_joined(tokenizer, texts[:12])) // L if kw.get("infinite") else None
    full_it = iter(ConstantLengthDataset(tokenizer, folder, seq_length=L, **kw))
    full = [s for _, s in zip(range(total), full_it)] if total else list(full_it)
    for k in (0, 1, 13, len(full) // 2 + 5):
        first = watched_tokenizer(tokenizer)
        ds = ConstantLengthDataset(first, folder, seq_length=L, **kw)
        it = iter(ds)
        head = [next(it) for _ in range(k)]
        state = roundtrip(ds.state_dict())
        second = watched_tokenizer(tokenizer)
        resumed = ConstantLengthDataset(second, folder, seq_length=L, **kw)
        resumed.load_state_dict(state)
        rest_it = iter(resumed)
        rest = [s for _, s in zip(range(len(full) - k), rest_it)]
        assert all(torch.equal(a, b) for a, b in zip(head + rest, full)) and len(head + rest) == len(full), k
        if not kw.get("infinite"):  # nothing consumed before the save is tokenized again
            assert not set(first.seen) & set(second.seen)
    assert resumed.epoch >= 1 if kw.get("infinite") else resumed.epoch == 0


def test_state_of_another_split_is_refused(tokenizer, shards):
    ds = ConstantLengthDataset(tokenizer, shards, seq_length=L, num_of_sequences=4, world_size=2)
    it = iter(ds)
    next(it)
    other = ConstantLengthDataset(tokenizer, shards, seq_length=L, num_of_sequences=4, world_size=4)
    other.load_state_dict(ds.state_dict())
    with pytest.raises(CodeParrotError, match="n_readers was 2, now 4"):
        iter(other)


def test_hub_streaming_path_matches_local_shards_and_resumes(tokenizer, shards, texts, watched_tokenizer):
    # The `datasets` streaming path (what a Hub id uses), offline through its "json" builder.
    files = sorted(str(p) for p in shards.iterdir())
    local = list(ConstantLengthDataset(tokenizer, shards, seq_length=L, num_of_sequences=4))
    hub = list(ConstantLengthDataset(tokenizer, files, seq_length=L, num_of_sequences=4, hub_dataset="json"))
    assert len(hub) == len(local) and all(torch.equal(a, b) for a, b in zip(hub, local))

    per_rank = []  # 4 shards over 8 readers: split by record through the library's stream
    for rank in range(8):
        rec = watched_tokenizer(tokenizer)
        list(ConstantLengthDataset(rec, files, seq_length=L, num_of_sequences=4, hub_dataset="json", rank=rank,
                                   world_size=8))
        per_rank.append(rec.seen)
    counts = Counter(t for part in per_rank for t in part)
    assert set(counts) == set(texts) and max(counts.values()) == 1 and all(per_rank)

    ds = ConstantLengthDataset(tokenizer, files, seq_length=L, num_of_sequences=4, hub_dataset="json")
    it = iter(ds)
    head = [next(it) for _ in range(101)]
    resumed = ConstantLengthDataset(tokenizer, files, seq_length=L, num_of_sequences=4, hub_dataset="json")
    resumed.load_state_dict(roundtrip(ds.state_dict()))
    assert all(torch.equal(a, b) for a, b in zip(head + list(resumed), local))


def test_bad_input_is_one_line(tokenizer, tmp_path, shards):
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(CodeParrotError, match=f"no input files .* in {empty}"):
        ConstantLengthDataset(tokenizer, empty)
    (empty / "file-1.json.gz").write_bytes(gzip.compress(b"\n\n"))
    with pytest.raises(CodeParrotError, match=f"no records in {empty}"):
        ConstantLengthDataset(tokenizer, str(empty))
    with pytest.raises(CodeParrotError, match="subfolders train"):
        ConstantLengthDataset(tokenizer, shards.parent)
    with pytest.raises(CodeParrotError, match="does not exist"):
        ConstantLengthDataset(tokenizer, tmp_path / "missing")
    with pytest.raises(CodeParrotError, match="seq_length must be > 0"):
        ConstantLengthDataset(tokenizer, shards, seq_length=0)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "x = 1"}\n')
    with pytest.raises(CodeParrotError, match=r"bad.jsonl:1: missing text column \(no 'content' key; fields: text\)"):
        ConstantLengthDataset(tokenizer, bad)
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"content": "x = 1"}\n{"content": \n')
    with pytest.raises(CodeParrotError, match=r"broken.jsonl:2: malformed JSON"):
        list(ConstantLengthDataset(tokenizer, broken, seq_length=2))

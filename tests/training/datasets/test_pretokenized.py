"""Pretokenized fast path: the token file equals direct tokenization, is resumable and atomic, and the
memory-mapped dataset splits, shuffles, counts epochs and resumes exactly."""

from __future__ import annotations

import json
import os
import subprocess

import numpy as np
import pytest
import torch

from codeparrot.errors import CodeParrotError
from codeparrot.tokenizer import save_tokenizer, train_tokenizer
from codeparrot.training.datasets.constant_length import token_dtype
from codeparrot.training.datasets.pretokenized import (
    INDEX_NAME,
    TOKENS_NAME,
    PretokenizedDataset,
    pretokenize,
    validate_against_tokenizer,
)

L = 64


@pytest.fixture(scope="module")
def shards(tmp_path_factory, texts, write_shards):
    return write_shards(tmp_path_factory.mktemp("clean") / "train", texts, 3)


@pytest.fixture(scope="module")
def pretok(tmp_path_factory, shards, tokenizer):
    out = tmp_path_factory.mktemp("pretok") / "train"
    pretokenize(shards, tokenizer, out, num_workers=1, batch_size=7, progress=False)
    return out


def test_token_file_equals_direct_tokenization(pretok, tokenizer, texts, eos_joined):
    index = json.loads((pretok / INDEX_NAME).read_text())
    tokens = np.fromfile(pretok / TOKENS_NAME, dtype=index["dtype"])
    np.testing.assert_array_equal(tokens.astype(np.int64), eos_joined(tokenizer, texts))
    assert index["dtype"] == "uint16" and index["n_tokens"] == len(tokens) and index["n_records"] == len(texts)
    assert index["eos_token_id"] == tokenizer.eos_token_id and index["vocab_size"] == len(tokenizer)
    assert sum(f["n_records"] for f in index["files"]) == len(texts) and len(index["files"]) == 3


def test_token_dtype_is_uint16_exactly_when_every_id_fits():
    assert token_dtype(1000) == np.uint16 and token_dtype(65536) == np.uint16  # ids 0..65535
    assert token_dtype(65537) == np.uint32 and token_dtype(200_000) == np.uint32


def test_worker_count_does_not_change_the_output(pretok, shards, tokenizer, tmp_path):
    out = tmp_path / "two"
    pretokenize(shards, tokenizer, out, num_workers=2, batch_size=3, progress=False)
    assert (out / TOKENS_NAME).read_bytes() == (pretok / TOKENS_NAME).read_bytes()


def test_interrupted_run_leaves_no_output_and_resumes(pretok, shards, tokenizer, tmp_path, monkeypatch,
                                                      watched_tokenizer):
    import codeparrot.training.datasets.pretokenized as module

    monkeypatch.setattr(module.time, "monotonic", lambda: float(next(clock)))  # progress saved every batch
    clock = iter(range(0, 10**6, 10))
    out = tmp_path / "resumed"
    with pytest.raises(KeyboardInterrupt):
        pretokenize(shards, watched_tokenizer(tokenizer, fail_after=4), out, batch_size=3, progress=False)
    partial = tmp_path / ".resumed.partial"
    assert not out.exists() and partial.is_dir()
    assert json.loads((partial / "progress.json").read_text())["n_tokens"] > 0
    clean_run, resumed_run = watched_tokenizer(tokenizer), watched_tokenizer(tokenizer)
    pretokenize(shards, clean_run, tmp_path / "clean_run", batch_size=3, progress=False)
    index = pretokenize(shards, resumed_run, out, batch_size=3, progress=False)
    assert (out / TOKENS_NAME).read_bytes() == (pretok / TOKENS_NAME).read_bytes()
    # the 4 batches done before the "kill" were not tokenized again
    assert resumed_run.calls == clean_run.calls - 4
    assert not partial.exists() and index["n_records"] == 40
    assert pretokenize(shards, tokenizer, out, progress=False)["reused"]  # same job again: nothing to do


def test_sequences_are_slices_split_disjointly_over_ranks(pretok, tokenizer):
    tokens = np.fromfile(pretok / TOKENS_NAME, dtype=np.uint16).astype(np.int64)
    n = len(tokens) // L
    ordered = list(PretokenizedDataset(pretok, L, shuffle=False))
    assert len(ordered) == n and all(torch.equal(s, torch.from_numpy(tokens[i * L:(i + 1) * L]))
                                     for i, s in enumerate(ordered))
    key = lambda t: t.numpy().tobytes()  # noqa: E731
    parts = [list(map(key, PretokenizedDataset(pretok, L, rank=r, world_size=3, seed=5))) for r in range(3)]
    assert sorted(sum(parts, [])) == sorted(map(key, ordered))  # every sequence exactly once over the ranks
    assert [len(p) for p in parts] == [len(range(r, n, 3)) for r in range(3)]


def test_shuffle_is_a_seeded_permutation_per_epoch(pretok):
    key = lambda t: t.numpy().tobytes()  # noqa: E731
    ds = PretokenizedDataset(pretok, L, infinite=True, seed=1)
    n = ds.n_sequences
    it = iter(ds)
    two_epochs = [key(next(it)) for _ in range(2 * n)]
    assert ds.epoch == 1
    first, second = two_epochs[:n], two_epochs[n:]
    assert sorted(first) == sorted(second) and first != second
    assert first == [key(s) for s in PretokenizedDataset(pretok, L, seed=1)]
    assert first != [key(s) for s in PretokenizedDataset(pretok, L, seed=2)]


@pytest.mark.parametrize("fim", [0.0, 0.5])
@pytest.mark.parametrize("k", [0, 1, 57, 500])
def test_state_round_trip_is_exact_and_tiny(pretok, tokenizer, k, fim):
    """Exact resume at any point, across an epoch; with FIM on too (where the position also carries the packed
    tokens not yet served: less than a sequence plus the rest of the last window's documents, and its sequence
    shuffle buffer)."""
    kw = dict(infinite=True, seed=3, rank=1, world_size=2, tokenizer=tokenizer, fim_rate=fim,
              sequence_shuffle_buffer=5 if fim else 0)
    reference = iter(PretokenizedDataset(pretok, L, **kw))
    full = [next(reference) for _ in range(k + 40)]  # 500 crosses into the next epoch
    ds = PretokenizedDataset(pretok, L, **kw)
    it = iter(ds)
    for _ in range(k):
        next(it)
    state = ds.state_dict()
    if fim:
        assert ds.epoch == (1 if k == 500 else 0) and len(state["carry"]) < L + 2000
        assert len(state["seq_buffer"]) == (5 if k else 0)
    else:
        assert len(json.dumps(state)) < 400  # (epoch, position) and what it must match
    resumed = PretokenizedDataset(pretok, L, **kw)
    resumed.load_state_dict(state)
    rest = iter(resumed)
    assert all(torch.equal(next(rest), expected) for expected in full[k:])


def test_vocabulary_mismatch_and_broken_data_are_refused(pretok, shards, tokenizer, stdlib_texts, tmp_path):
    validate_against_tokenizer(pretok, tokenizer)  # the right one passes
    smaller = train_tokenizer(stdlib_texts[:20], vocab_size=500, show_progress=False)
    with pytest.raises(CodeParrotError, match="vocab_size 1000, the tokenizer has 500"):
        validate_against_tokenizer(pretok, smaller)
    same_size = train_tokenizer(stdlib_texts[100:130], vocab_size=1000, show_progress=False)
    with pytest.raises(CodeParrotError, match="fingerprints differ"):
        validate_against_tokenizer(pretok, same_size)
    with pytest.raises(CodeParrotError, match="fewer than one sequence"):
        PretokenizedDataset(pretok, 10**9)
    with pytest.raises(CodeParrotError, match="seq_length must be > 0"):
        PretokenizedDataset(pretok, 0)
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / INDEX_NAME).write_text((pretok / INDEX_NAME).read_text())
    (broken / TOKENS_NAME).write_bytes((pretok / TOKENS_NAME).read_bytes()[:-10])
    with pytest.raises(CodeParrotError, match="corrupt pretokenized data"):
        PretokenizedDataset(broken, L)
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "notes.txt").write_text("not token data")
    with pytest.raises(CodeParrotError, match="is not a pretokenized folder; refusing to replace it"):
        pretokenize(shards, tokenizer, precious, progress=False)
    assert (precious / "notes.txt").read_text() == "not token data"


def test_cli_pretokenizes_each_split(tmp_path, texts, tokenizer, python, scripts_env, repo_root, write_shards,
                                     eos_joined):
    clean = tmp_path / "clean"
    write_shards(clean / "train", texts[:30], 2)
    write_shards(clean / "valid", texts[30:], 1)
    save_tokenizer(tokenizer, tmp_path / "tok")
    cmd = [python, str(repo_root / "scripts" / "pretokenize.py"), "--dataset", str(clean), "--tokenizer",
           str(tmp_path / "tok"), "--output-dir", str(tmp_path / "pt"), "--num-workers", "1", "--quiet"]
    done = subprocess.run(cmd, env=scripts_env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    for split, part in (("train", texts[:30]), ("valid", texts[30:])):
        tokens = np.fromfile(tmp_path / "pt" / split / TOKENS_NAME, dtype=np.uint16)
        np.testing.assert_array_equal(tokens.astype(np.int64), eos_joined(tokenizer, part))
    missing = subprocess.run(cmd[:3] + [str(tmp_path / "nope")] + cmd[4:], env=scripts_env, capture_output=True,
                             text=True, timeout=120)
    assert missing.returncode == 2 and missing.stderr.strip().splitlines()[-1:] == [
        f"error: input not found: {tmp_path / 'nope'} (the path does not exist)"]
    assert "Traceback" not in missing.stderr
    assert not os.path.exists(tmp_path / "pt" / "nope")

"""The dataset factory and the stateful DataLoader: the right dataset for each kind of path, and a loader
position that is what the caller consumed even with worker processes prefetching ahead."""

from __future__ import annotations

import gzip
import io
import json
import re

import numpy as np
import pytest
import torch

from codeparrot.errors import CodeParrotError
from codeparrot.tokenizer import train_tokenizer
from codeparrot.training.datasets.constant_length import ConstantLengthDataset
from codeparrot.training.datasets.loader import build_dataloader, build_dataset
from codeparrot.training.datasets.pretokenize import pretokenize
from codeparrot.training.datasets.pretokenized import PretokenizedDataset

L = 32


@pytest.fixture(scope="module")
def tokenizer(code_tokenizer):
    return code_tokenizer


@pytest.fixture(scope="module")
def data(tmp_path_factory, stdlib_texts, tokenizer):
    """(clean shards folder, pretokenized folder) of 30 real files cut after ~1,500 characters."""
    texts = [t[: t.find("\n", 1500) + 1] or t for t in stdlib_texts[50:80]]
    root = tmp_path_factory.mktemp("data")
    shards = root / "clean" / "train"
    shards.mkdir(parents=True)
    for s in range(3):
        with gzip.open(shards / f"file-{s + 1:012d}.json.gz", "wt", encoding="utf-8") as f:
            for text in texts[s::3]:
                f.write(json.dumps({"content": text}) + "\n")
    pretokenize(shards, tokenizer, root / "pretok", progress=False)
    return shards, root / "pretok"


def test_factory_picks_the_dataset_for_the_path(data, tokenizer, stdlib_texts):
    shards, pretok = data
    assert isinstance(build_dataset(str(pretok), tokenizer, L), PretokenizedDataset)
    streamed = build_dataset(str(shards), tokenizer, L, shuffle=False)
    assert isinstance(streamed, ConstantLengthDataset) and streamed.shuffle_buffer == 0
    # both paths give the same sequences in stream order
    a = list(build_dataset(str(pretok), tokenizer, L, shuffle=False))
    b = list(streamed)
    assert len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))
    other = train_tokenizer(stdlib_texts[:20], vocab_size=600, show_progress=False)
    with pytest.raises(CodeParrotError, match="pretokenized with vocab_size 1000"):
        build_dataset(str(pretok), other, L)
    with pytest.raises(CodeParrotError, match="does not exist"):
        build_dataset(str(shards.parent / "nope" / "train"), tokenizer, L)
    with pytest.raises(CodeParrotError, match=r"^dataset someone/not-here: no such file or folder, and not a Hub "
                                              r"dataset either \(the Hub is offline: HF_HUB_OFFLINE=1"):
        build_dataset("someone/not-here", tokenizer, L)
    with pytest.raises(CodeParrotError, match="seq_length must be > 0"):
        build_dataset(str(pretok), tokenizer, -1)


def test_a_missing_path_that_is_surely_local_never_asks_the_hub(tokenizer, monkeypatch):
    """`./x`, `/x`, `~/x`, `a/b/c` or a data file's name cannot be a Hub dataset id: "does not exist" at once."""
    import codeparrot.training.datasets.loader as loader

    monkeypatch.setattr(loader, "HubRecordStream", None)  # any Hub attempt fails with a TypeError
    for path in ("./not-here", "/not/here", "~/not-here", "a/b/c", "not-here.jsonl", "someone/train.json.gz"):
        with pytest.raises(CodeParrotError, match=rf"^--data.train {re.escape(path)} does not exist \(no such file"):
            build_dataset(path, tokenizer, L, name="--data.train")


def roundtrip(state):
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)


def make(kind, data, tokenizer, rank=0, world_size=1):
    """kind: "pretokenized" or "constant_length", "+fim" for fill-in-the-middle at rate 0.5."""
    shards, pretok = data
    path = pretok if kind.startswith("pretokenized") else shards
    return build_dataset(str(path), tokenizer, L, rank=rank, world_size=world_size, infinite=True, seed=7,
                         num_of_sequences=4, shuffle_buffer=4, sequence_shuffle_buffer=6,
                         fim_rate=0.5 if kind.endswith("+fim") else 0.0)


@pytest.mark.parametrize("num_workers,snapshot_every", [(0, None), (2, None), (2, 5)])
@pytest.mark.parametrize("kind", ["pretokenized", "constant_length", "pretokenized+fim", "constant_length+fim"])
def test_loader_resumes_at_the_next_batch_the_caller_has_not_seen(data, tokenizer, kind, num_workers,
                                                                  snapshot_every):
    steps, k = 60, 23  # workers prefetch 2 batches each beyond what the caller took at the save
    kw = dict(batch_size=3, num_workers=num_workers, snapshot_every_n_steps=snapshot_every)
    loader = build_dataloader(make(kind, data, tokenizer), **kw)
    reference = [b for _, b in zip(range(steps), loader)]
    assert reference[0].shape == (3, L) and reference[0].dtype == torch.int64

    loader = build_dataloader(make(kind, data, tokenizer), **kw)
    it = iter(loader)
    head = [next(it) for _ in range(k)]
    state = roundtrip(loader.state_dict())
    del it, loader
    resumed = build_dataloader(make(kind, data, tokenizer), **kw)
    resumed.load_state_dict(state)
    tail = [b for _, b in zip(range(steps - k), resumed)]
    assert all(torch.equal(x, y) for x, y in zip(head + tail, reference)) and len(head + tail) == steps


def test_resume_with_another_worker_count_is_refused(data, tokenizer):
    loader = build_dataloader(make("constant_length", data, tokenizer), batch_size=2, num_workers=2)
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    del it
    other = build_dataloader(make("constant_length", data, tokenizer), batch_size=2, num_workers=0)
    with pytest.raises(CodeParrotError, match="saved with num_workers=2; this run has num_workers=0"):
        other.load_state_dict(state)
    two_ranks = build_dataloader(make("constant_length", data, tokenizer, world_size=2), batch_size=2, num_workers=2)
    with pytest.raises(CodeParrotError, match="saved with 2 readers .* this run has 4"):
        two_ranks.load_state_dict(state)
    with pytest.raises(CodeParrotError, match="for a constant_length dataset; this run reads a pretokenized"):
        build_dataloader(make("pretokenized", data, tokenizer), batch_size=2, num_workers=2).load_state_dict(state)


def test_finite_validation_stream_gives_each_sequence_to_one_rank(data, tokenizer):
    shards, pretok = data
    for path in (shards, pretok):
        whole = [b for b in build_dataloader(build_dataset(str(path), tokenizer, L, shuffle=False), 4)]
        per_rank = [[row for b in build_dataloader(build_dataset(str(path), tokenizer, L, shuffle=False, rank=r,
                                                                 world_size=2), 4, num_workers=2) for row in b]
                    for r in range(2)]
        assert all(per_rank)
        if path == pretok:  # same cut into sequences: the ranks partition the single-process stream
            key = lambda t: t.numpy().tobytes()  # noqa: E731
            rows = sorted(key(r) for part in per_rank for r in part)
            assert rows == sorted(key(r) for b in whole for r in b)
        else:  # each rank cuts its own files: the tokens add up to the whole stream's (minus < L per reader)
            n_whole = sum(b.numel() for b in whole)
            n_parts = sum(r.numel() for part in per_rank for r in part)
            assert n_whole - 4 * L < n_parts <= n_whole + 4 * L
        np.testing.assert_array_equal(whole[0][0].numpy(), next(iter(build_dataset(str(path), tokenizer, L,
                                                                                    shuffle=False))).numpy())


def test_datasets_pickle_without_their_open_files(data, tokenizer):
    import pickle

    for ds in (make("pretokenized", data, tokenizer), make("constant_length", data, tokenizer)):
        first = next(iter(ds))  # now holds an open file / memory map
        copy = pickle.loads(pickle.dumps(ds))  # what a spawn-started DataLoader worker receives
        assert torch.equal(next(iter(copy)), first)

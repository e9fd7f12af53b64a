"""Every file once per epoch: the record streams deal files so that readers consumed at the same rate (equal
batches per rank, DataLoader workers in turn) read every file exactly E times over E epochs' worth of data, for
any number of shards and readers, and resume exactly where they stopped.

Driven through the real stream classes (`LocalRecordStream`, and `HubRecordStream` over the `datasets` "json"
builder, which is what a Hub id streams through), crossing epochs the way `ConstantLengthDataset` does.
"""

from __future__ import annotations

import json
from collections import Counter

import pytest

from codeparrot.training.datasets.record_streams import HubRecordStream, LocalRecordStream


def write_uneven_shards(folder, n_shards):
    """`n_shards` JSONL shards of 3..6 records each (uneven on purpose); every record's text is unique."""
    folder.mkdir(parents=True, exist_ok=True)
    files, names = [], []
    for s in range(n_shards):
        path = folder / f"file-{s + 1:012d}.jsonl"
        texts = [f"shard {s} file {i}" for i in range(3 + s % 4)]
        path.write_text("".join(json.dumps({"content": t}) + "\n" for t in texts))
        files.append(str(path))
        names.extend(texts)
    return files, names


def read_equally(open_stream, n_readers, total):
    """Per-text read counts when `total` texts are taken from `n_readers` readers at the same rate (reader k takes
    total // n + (k < total % n), as a round-robin consumer would), each restarting its stream at an epoch end."""
    counts = Counter()
    for k in range(n_readers):
        stream = open_stream(k)
        epoch, taken, want = 0, 0, total // n_readers + (k < total % n_readers)
        while taken < want:
            text = stream.next_text()
            if text is None:
                epoch += 1
                stream.start_epoch(epoch)
                continue
            counts[text] += 1
            taken += 1
        stream.close()
    return counts


SPLITS = [(3, 2), (53, 32), (1, 4), (100, 7)]


@pytest.mark.parametrize("shuffle", [False, True], ids=["in-order", "shuffled"])
@pytest.mark.parametrize("n_shards,n_readers", SPLITS, ids=[f"{s}-shards-{r}-readers" for s, r in SPLITS])
def test_local_shards_read_every_file_once_per_epoch(tmp_path, n_shards, n_readers, shuffle):
    files, names = write_uneven_shards(tmp_path / "train", n_shards)
    for epochs in (1, 3):
        counts = read_equally(lambda k: LocalRecordStream(files, "content", k, n_readers, shuffle_files=shuffle,
                                                          seed=7), n_readers, epochs * len(names))
        assert set(counts) == set(names) and set(counts.values()) == {epochs}, (epochs, Counter(counts.values()))


def test_one_shard_is_split_between_readers_not_read_whole_by_each(tmp_path):
    shard = tmp_path / "one.jsonl"
    names = [f"file {i}" for i in range(10)]
    shard.write_text("".join(json.dumps({"content": t}) + "\n" for t in names))
    parts = [read_equally(lambda _, k=k: LocalRecordStream([str(shard)], "content", k, 4, shuffle_files=False, seed=0), 1,
                          len(names) // 4 + (k < len(names) % 4)) for k in range(4)]
    assert [len(p) for p in parts] == [3, 3, 2, 2] and sum(parts, Counter()) == Counter(names)


HUB_SPLITS = [(3, 2), (1, 4), (100, 7), (53, 32)]


@pytest.mark.slow
@pytest.mark.parametrize("n_shards,n_readers", HUB_SPLITS, ids=[f"{s}-shards-{r}-readers" for s, r in HUB_SPLITS])
def test_hub_stream_reads_every_file_once_per_epoch(tmp_path, n_shards, n_readers):
    files, names = write_uneven_shards(tmp_path / "train", n_shards)
    for epochs in (1, 3):
        counts = read_equally(lambda k: HubRecordStream("json", "train", files, "content", k, n_readers),
                              n_readers, epochs * len(names))
        assert set(counts) == set(names) and set(counts.values()) == {epochs}, (epochs, Counter(counts.values()))


@pytest.mark.parametrize("kind", ["local", "hub"])
def test_streams_resume_exactly_across_epochs_with_several_readers(tmp_path, kind):
    files, names = write_uneven_shards(tmp_path / "train", 5)

    def open_stream():  # reader 2 of 3: its records change from epoch to epoch as the global count runs on
        if kind == "hub":
            return HubRecordStream("json", "train", files, "content", 2, 3, batch_size=4)
        return LocalRecordStream(files, "content", 2, 3, shuffle_files=True, seed=1)

    def take(stream, epoch, n):
        out = []
        while len(out) < n:
            text = stream.next_text()
            if text is None:
                epoch += 1
                stream.start_epoch(epoch)
            else:
                out.append(text)
        return out, epoch

    n = 3 * len(names) // 3  # three epochs' worth of this reader
    full, _ = take(open_stream(), 0, n)
    assert len(set(full[: len(names) // 3])) == len(names) // 3  # no repeat inside its first epoch
    for k in (0, 1, 7, len(names) // 3, n - 5):
        stream = open_stream()
        head, epoch = take(stream, 0, k)
        state = json.loads(json.dumps(stream.state_dict()))  # plain data
        resumed = open_stream()
        resumed.load_state_dict(epoch, state)
        rest, _ = take(resumed, epoch, n - k)
        assert head + rest == full, k


def test_a_position_saved_under_the_old_deal_is_refused_with_one_line(tokenizer, tmp_path, texts, write_shards):
    """Version 1 positions counted records per epoch (and dealt whole shards): continuing one with the new deal
    would re-read or skip files, so it is refused rather than resumed wrongly."""
    from codeparrot.errors import CodeParrotError
    from codeparrot.training.datasets.constant_length import ConstantLengthDataset

    folder = write_shards(tmp_path / "d", texts[:6], 2)
    ds = ConstantLengthDataset(tokenizer, folder, seq_length=32, num_of_sequences=2)
    it = iter(ds)
    next(it)
    old = {**ds.state_dict(), "version": 1}
    with pytest.raises(CodeParrotError, match="format version 1; this code reads version 2"):
        ConstantLengthDataset(tokenizer, folder, seq_length=32, num_of_sequences=2).load_state_dict(old)


def test_a_line_over_the_record_limit_stops_its_reader_and_the_others_pass_it(tmp_path, monkeypatch):
    """A corrupt shard with a huge line (no line breaks): every reader scans it in bounded pieces; the reader it
    belongs to stops with one line naming file:line, the others keep its record number and read on."""
    import codeparrot.training.datasets.record_streams as record_streams
    from codeparrot.errors import CodeParrotError

    monkeypatch.setattr(record_streams, "MAX_RECORD_BYTES", 200)
    shard = tmp_path / "shard.jsonl"
    lines = [json.dumps({"content": f"text {i}"}) for i in range(4)]
    lines[1] = json.dumps({"content": "x" * 1000})  # record 1: reader 1's of two
    shard.write_text("\n".join(lines) + "\n")
    other = LocalRecordStream([str(shard)], "content", 0, 2, shuffle_files=False, seed=0)
    assert [other.next_text(), other.next_text(), other.next_text()] == ["text 0", "text 2", None]
    owner = LocalRecordStream([str(shard)], "content", 1, 2, shuffle_files=False, seed=0)
    too_large = rf"^{shard}:2: record too large \(1,015 bytes, over the 200-byte limit\)$"
    with pytest.raises(CodeParrotError, match=too_large):
        owner.next_text()

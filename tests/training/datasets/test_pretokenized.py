"""Pretokenized fast path: the token file equals direct tokenization, is resumable and atomic, and the
memory-mapped dataset splits, shuffles, counts epochs and resumes exactly."""

from __future__ import annotations

import errno
import json
import os
import socket
import subprocess
import sys

import numpy as np
import pytest
import torch

from codeparrot.errors import CodeParrotError
from codeparrot.tokenizer import save_tokenizer, train_tokenizer
from codeparrot.training.datasets.constant_length import token_dtype
from codeparrot.training.datasets.pretokenize import pretokenize
from codeparrot.training.datasets.pretokenized import (
    INDEX_NAME,
    TOKENS_NAME,
    PretokenizedDataset,
    read_index,
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
    import codeparrot.training.datasets.pretokenize as module

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
    """Exact resume at any point, across an epoch, from a position of a few integers; with FIM on too (each
    slice is rearranged as it is read: the position only adds the rates)."""
    kw = dict(infinite=True, seed=3, rank=1, world_size=2, tokenizer=tokenizer, fim_rate=fim)
    reference = iter(PretokenizedDataset(pretok, L, **kw))
    full = [next(reference) for _ in range(k + 40)]  # 500 crosses into the next epoch
    ds = PretokenizedDataset(pretok, L, **kw)
    it = iter(ds)
    for _ in range(k):
        next(it)
    state = ds.state_dict()
    assert ds.epoch == (1 if k == 500 else 0)
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


# --- crash safety and the one-line errors of the writer -------------------------------------------------------
def _interrupted(shards, tokenizer, out, watched_tokenizer, monkeypatch, fail_after=4):
    """A run "killed" after `fail_after` batches, its progress saved after every batch; returns its partial folder."""
    import codeparrot.training.datasets.pretokenize as module

    clock = iter(range(0, 10**6, 10))
    with monkeypatch.context() as patch:
        patch.setattr(module.time, "monotonic", lambda: float(next(clock)))
        with pytest.raises(KeyboardInterrupt):
            pretokenize(shards, watched_tokenizer(tokenizer, fail_after=fail_after), out, batch_size=3,
                        progress=False)
    return out.parent / f".{out.name}.partial"


def test_token_file_is_on_disk_before_each_progress_save(shards, tokenizer, tmp_path, monkeypatch):
    """After a power loss the progress file must never count tokens the disk does not hold: every save of it
    comes after an fsync of the token file that covered them."""
    import codeparrot.training.datasets.pretokenize as module

    out, synced, checked = tmp_path / "synced", {}, []
    real_fsync, real_write_json = os.fsync, module.atomic_write_json

    def fsync(fd):
        st = os.fstat(fd)
        synced[st.st_ino] = st.st_size
        real_fsync(fd)

    def write_json(path, obj):
        if path.name == "progress.json":
            tokens = path.parent / TOKENS_NAME
            checked.append(obj["n_tokens"])
            assert synced.get(tokens.stat().st_ino, 0) >= obj["n_tokens"] * 2, "progress saved before the fsync"
        real_write_json(path, obj)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(module, "atomic_write_json", write_json)
    pretokenize(shards, tokenizer, out, batch_size=7, progress=False)
    assert len(checked) >= 3 and checked[-1] > 0  # one save per shard at least


def test_resume_never_lengthens_a_token_file_shorter_than_its_progress(pretok, shards, tokenizer, tmp_path,
                                                                       monkeypatch, watched_tokenizer, capsys):
    """A token file that lost its tail (written, counted, never reached the disk) would be padded with zeros, a
    valid token id: the run starts over instead, saying why."""
    out = tmp_path / "short"
    partial = _interrupted(shards, tokenizer, out, watched_tokenizer, monkeypatch)
    tokens = partial / TOKENS_NAME
    os.truncate(tokens, tokens.stat().st_size - 100)
    clean_run, resumed_run = watched_tokenizer(tokenizer), watched_tokenizer(tokenizer)
    pretokenize(shards, clean_run, tmp_path / "clean_run", batch_size=3, progress=False)
    pretokenize(shards, resumed_run, out, batch_size=3, progress=False)
    assert (out / TOKENS_NAME).read_bytes() == (pretok / TOKENS_NAME).read_bytes()
    assert resumed_run.calls == clean_run.calls  # everything tokenized again
    err = capsys.readouterr().err
    assert f"{tokens}: " in err and "fewer than the" in err and "from the beginning" in err


@pytest.mark.parametrize("stage", ["fsync", "disk full", "publish", "after publish"])
def test_a_run_stopped_during_its_commit_loses_nothing(pretok, shards, tokenizer, tmp_path, monkeypatch,
                                                       watched_tokenizer, stage):
    """Ctrl-C during the fsync of a finished 60 GB file, a full disk writing the index, a stop at the exchange or
    just after it: the next run finds the tokens (in the partial folder or the output) and tokenizes nothing."""
    import codeparrot.atomic_io as atomic_io
    import codeparrot.training.datasets.pretokenize as module

    out = tmp_path / "committed"
    partial = tmp_path / ".committed.partial"

    def stop(*args, **kwargs):
        raise KeyboardInterrupt

    def disk_full(path, obj):
        if path.name == INDEX_NAME:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real_write_json(path, obj)

    real_write_json, real_rmtree = module.atomic_write_json, module.shutil.rmtree
    with monkeypatch.context() as patch:
        if stage == "fsync":
            patch.setattr(atomic_io, "fsync_tree", stop)
        elif stage == "disk full":
            patch.setattr(module, "atomic_write_json", disk_full)
        elif stage == "publish":
            patch.setattr(atomic_io, "_publish", stop)
        else:
            patch.setattr(module.shutil, "rmtree", lambda path, **kw: stop() if path == partial and out.exists()
                          else real_rmtree(path, **kw))  # stopped before the partial folder is removed
        with pytest.raises(CodeParrotError if stage == "disk full" else KeyboardInterrupt) as stopped:
            pretokenize(shards, tokenizer, out, batch_size=7, progress=False)
    if stage == "disk full":
        assert str(stopped.value) == (f"{out}: cannot write (No space left on device): free space (or raise the "
                                      f"file-size limit) and re-run the same command, it resumes from {partial}")
    assert (partial / TOKENS_NAME).read_bytes() == (pretok / TOKENS_NAME).read_bytes()
    assert (out / INDEX_NAME).is_file() == (stage == "after publish")
    rerun = watched_tokenizer(tokenizer)
    index = pretokenize(shards, rerun, out, batch_size=7, progress=False)
    assert rerun.calls == 0 and index["n_tokens"] == (out / TOKENS_NAME).stat().st_size // 2
    assert (out / TOKENS_NAME).read_bytes() == (pretok / TOKENS_NAME).read_bytes()
    assert not partial.exists() and sorted(p.name for p in out.iterdir()) == [INDEX_NAME, TOKENS_NAME]


@pytest.mark.parametrize("text", ['{"format": "codeparrot-pretok', "[1, 2]"])
def test_a_broken_index_is_one_line_naming_the_folder(shards, tokenizer, tmp_path, text):
    out = tmp_path / "broken"
    out.mkdir()
    (out / INDEX_NAME).write_text(text)
    with pytest.raises(CodeParrotError, match=f"^{out / INDEX_NAME}: unreadable .*: {out} is not a complete "
                                              "pretokenized output; remove it and re-run$"):
        pretokenize(shards, tokenizer, out, progress=False)
    with pytest.raises(CodeParrotError, match="not a readable pretokenized index"):
        PretokenizedDataset(out, L)  # the training side too


def test_a_finished_folder_with_a_cut_token_file_says_to_delete_it(pretok, shards, tokenizer, tmp_path):
    out = tmp_path / "cut"
    out.mkdir()
    (out / INDEX_NAME).write_text((pretok / INDEX_NAME).read_text())  # the same job
    (out / TOKENS_NAME).write_bytes((pretok / TOKENS_NAME).read_bytes()[:-64])
    with pytest.raises(CodeParrotError, match=f"corrupt pretokenized data\\): delete {out} and re-run "
                                              "scripts/pretokenize.py$"):
        pretokenize(shards, tokenizer, out, progress=False)


def test_a_full_disk_is_one_line_and_the_run_resumes(pretok, shards, tokenizer, tmp_path, python, scripts_env,
                                                     repo_root, watched_tokenizer):
    """The file-size limit (`ulimit -f`) stands in for a full disk: the write fails with EFBIG halfway through."""
    import resource

    save_tokenizer(tokenizer, tmp_path / "tok")
    out, partial = tmp_path / "pt", tmp_path / ".pt.partial"
    limit = (pretok / TOKENS_NAME).stat().st_size * 2 // 3  # past the first shard, short of the last

    def small_files():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))

    cmd = [python, str(repo_root / "scripts" / "pretokenize.py"), "--dataset", str(shards), "--tokenizer",
           str(tmp_path / "tok"), "--output-dir", str(out), "--num-workers", "1", "--batch-size", "7", "--quiet"]
    done = subprocess.run(cmd, env=scripts_env, capture_output=True, text=True, timeout=120, preexec_fn=small_files)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        f"error: {partial / TOKENS_NAME}: cannot write (File too large): free space (or raise the file-size limit) "
        f"and re-run the same command, it resumes from {partial}")
    saved = json.loads((partial / "progress.json").read_text())["n_tokens"]
    assert 0 < saved * 2 <= limit
    resumed = watched_tokenizer(tokenizer)
    pretokenize(shards, resumed, out, batch_size=7, progress=False)
    assert (out / TOKENS_NAME).read_bytes() == (pretok / TOKENS_NAME).read_bytes()
    assert 0 < resumed.calls < len(texts_of(shards)) / 7  # the saved shard was not tokenized again


def texts_of(shards):
    """Every record of the gzip JSONL shards in `shards`."""
    import gzip

    return [json.loads(line)["content"] for p in sorted(shards.iterdir()) for line in gzip.open(p, "rt")]


def test_a_second_run_on_the_same_output_waits_for_the_first_naming_it(shards, tokenizer, tmp_path, repo_root,
                                                                       scripts_env):
    """The same command started on every node: the second run waits (one line naming the first) instead of writing
    into the first's partial folder or failing the job, then goes on (here: writes it, the first wrote nothing)."""
    from codeparrot.training.datasets.pretokenize import _exclusive

    out, tok_dir = tmp_path / "shared", tmp_path / "tok"
    save_tokenizer(tokenizer, tok_dir)
    second = None
    with _exclusive(out):  # the first run, holding the lock
        second = subprocess.Popen([sys.executable, "scripts/pretokenize.py", "--tokenizer", str(tok_dir), "--dataset",
                                   str(shards), "--output-dir", str(out), "--quiet"],
                                  cwd=repo_root, env=scripts_env, stderr=subprocess.PIPE, text=True)
        lines = [second.stderr.readline(), second.stderr.readline()]  # "pretokenizing A -> B", then it waits
        waiting = lines[-1]
        assert waiting.startswith(f"waiting for the pretokenize run writing {out} (host {socket.gethostname()}, "
                                  f"pid {os.getpid()}, holding {tmp_path / '.shared.lock'})"), lines
        assert second.poll() is None and not out.exists()
    _, rest = second.communicate(timeout=120)
    assert second.returncode == 0, rest
    assert read_index(out)["n_records"] == len(texts_of(shards))
    assert not (tmp_path / ".shared.lock").exists()  # removed with the run: nothing left beside the output
    (tmp_path / ".shared.lock").write_text("host gone, pid 1\n")  # a killed run's file, no longer locked
    assert pretokenize(shards, tokenizer, out, progress=False)["reused"]


def test_without_locks_the_run_goes_on_with_a_note_and_other_lock_failures_are_one_line(tmp_path, monkeypatch,
                                                                                        capsys):
    import errno

    from codeparrot import file_lock
    from codeparrot.training.datasets.pretokenize import _exclusive

    def failing(code):
        def flock(fd, op):
            raise OSError(code, os.strerror(code))
        return flock

    monkeypatch.setattr(file_lock.fcntl, "flock", failing(errno.ENOLCK))  # NFS without its lock daemon
    with _exclusive(tmp_path / "out"):
        pass
    assert f"note: cannot lock {tmp_path / '.out.lock'}" in capsys.readouterr().err
    monkeypatch.setattr(file_lock.fcntl, "flock", failing(errno.EIO))
    with pytest.raises(CodeParrotError, match=r"^cannot lock .*\.out\.lock: Input/output error$"):
        with _exclusive(tmp_path / "out"):
            pass


def test_tokens_per_second_after_a_resume_counts_every_run_s_time(shards, tokenizer, tmp_path, monkeypatch,
                                                                  watched_tokenizer):
    """All the tokens over all the time spent on them (the printed line and the index say the same), not all the
    tokens over the resumed run's seconds."""
    import codeparrot.training.datasets.pretokenize as module

    clock = iter(range(0, 10**6, 10))  # every reading of the clock: 10 s later
    monkeypatch.setattr(module.time, "perf_counter", lambda: float(next(clock)))
    out = tmp_path / "timed"
    partial = _interrupted(shards, tokenizer, out, watched_tokenizer, monkeypatch, fail_after=6)
    progress = json.loads((partial / "progress.json").read_text())
    index = pretokenize(shards, tokenizer, out, batch_size=3, progress=False)
    assert progress["seconds"] > 0 and index["seconds"] > progress["seconds"]
    assert index["tokens_per_second"] == round(index["n_tokens"] / index["seconds"])


def test_order_is_int32_and_the_same_permutation_as_before(pretok):
    """Half the memory per reader, and the order `default_rng([seed, epoch]).permutation(n)` always gave: saved
    positions of earlier runs still point at the same sequences."""
    ds = PretokenizedDataset(pretok, 8, seed=11, world_size=2, rank=1)
    for epoch in (0, 3):
        order = ds.order(epoch, reader_id=5, n_readers=6)  # rank 1, worker 2 of 3
        before = np.random.default_rng([11, epoch]).permutation(ds.n_sequences)[1::2][2::3]
        assert order.dtype == np.int32 and np.array_equal(order, before)


def test_a_damaged_shard_says_that_replacing_it_restarts_the_job(tmp_path, texts, tokenizer, write_shards):
    clean = write_shards(tmp_path / "clean", texts, 3)
    last = sorted(clean.iterdir())[-1]
    last.write_bytes(last.read_bytes()[: last.stat().st_size // 2])
    with pytest.raises(CodeParrotError, match=f"^{last}: truncated or corrupt .*; replacing, fixing or removing this "
                                              "shard restarts the pretokenize job from the beginning$"):
        pretokenize(clean, tokenizer, tmp_path / "out", batch_size=7, progress=False)


def test_a_token_id_past_the_vocabulary_is_one_line_naming_file_offset_and_id(pretok, tmp_path):
    """Random bytes in tokens.bin (or another tokenizer's data) hold ids the embedding has no row for: on a GPU a
    device-side assert that kills the run, naming nothing. The reader refuses them where it reads them."""
    damaged = tmp_path / "damaged"
    damaged.mkdir()
    (damaged / INDEX_NAME).write_text((pretok / INDEX_NAME).read_text())
    tokens = np.fromfile(pretok / TOKENS_NAME, dtype=np.uint16)
    offset = 2 * L + 5  # in the third sequence
    tokens[offset] = tokens[offset + 1] = 1000  # the vocabulary size: the first id past it
    tokens.tofile(damaged / TOKENS_NAME)
    stream = iter(PretokenizedDataset(damaged, L, shuffle=False))
    next(stream), next(stream)  # the sequences before it are read as they are
    with pytest.raises(CodeParrotError, match=f"^{damaged / TOKENS_NAME}: token id 1000 at token offset {offset} is "
                                              r"not below the vocabulary size 1000 \(the data was pretokenized with "
                                              f"another tokenizer or is damaged\\): delete {damaged} and re-run"):
        next(stream)


@pytest.mark.parametrize("change, problem", [
    ({"n_tokens": None}, "no 'n_tokens' key"),
    ({"vocab_size": None}, "no 'vocab_size' key"),
    ({"dtype": "float99"}, "'dtype' is 'float99', not one of uint16, uint32"),
    ({"n_tokens": "123"}, "'n_tokens' is \"123\", not an integer"),
    ({"n_records": True}, "'n_records' is true, not an integer"),
    ({"n_tokens": -1}, "'n_tokens' is -1, below 0"),
    ({"vocab_size": 70000}, "'vocab_size' 70000 does not fit its dtype uint16"),
    ({"eos_token_id": 1000}, "'eos_token_id' 1000 is not below 'vocab_size' 1000"),
    ({"tokenizer_fingerprint": 7}, "'tokenizer_fingerprint' is 7, not a string"),
])
def test_a_damaged_index_names_the_key(pretok, tokenizer, tmp_path, change, problem):
    """A key removed or of the wrong type used to be a KeyError, a numpy TypeError or a format ValueError."""
    index = json.loads((pretok / INDEX_NAME).read_text())
    index = {k: v for k, v in {**index, **change}.items() if v is not None}
    damaged = tmp_path / "damaged"
    damaged.mkdir()
    (damaged / INDEX_NAME).write_text(json.dumps(index))
    os.link(pretok / TOKENS_NAME, damaged / TOKENS_NAME)
    expected = f"^{damaged / INDEX_NAME}: {problem} \\(damaged pretokenized index\\): delete {damaged} and re-run"
    for read in (read_index, lambda path: validate_against_tokenizer(path, tokenizer),
                 lambda path: PretokenizedDataset(path, L)):
        with pytest.raises(CodeParrotError, match=expected):
            read(damaged)

"""Pretokenized fast path: tokenize the clean shards once, train from a memory-mapped token file.

On disk (`output_dir/`):
    tokens.bin   every record's tokens followed by EOS, records in file order: uint16 when the vocabulary fits
                 in 16 bits (ids < 65,536), else uint32; raw little-endian, no header
    index.json   format/version, dtype, n_tokens, n_records, per-file counts, eos id, vocab size, tokenizer
                 fingerprint (sha256 of its token->id map), text column, and `literal_special_tokens: "text"`:
                 special-token strings inside files (`<|endoftext|>`, `<fim_middle>`) were encoded as plain text
                 (codeparrot/fim/encoding.py), so the only special id in the file is the EOS after each record
                 (folders written before that have no such key: FIM training refuses them)

Writing (`pretokenize`): the parent reads and parses records and hands batches of texts to `num_workers`
processes (one batched tokenizer call each), and appends the returned arrays in order, so the output does not
depend on the worker count. Work goes to a stable sibling `.NAME.partial/` with a progress file (file, line,
tokens written) saved every few seconds: a killed run resumes there (the token file is cut back to the last
recorded length), and only a finished run is renamed into place. A folder that already holds the same data
tokenized by the same tokenizer is left as it is.

Reading (`PretokenizedDataset`): sequence i = tokens[i*L : (i+1)*L] for i < n_tokens // L. Each epoch visits a
permutation of the sequence indices seeded by (seed, epoch); rank r takes positions r::world_size of it and
DataLoader worker w of that rank every workers-th of those, so each sequence belongs to exactly one reader. The
position is (epoch, count consumed): O(1) to save and to restore.

With fill-in-the-middle on (`fim_rate` > 0) the sequences are no longer fixed slices: the reader takes its
windows in the same order, reads every document that starts in each (whole, past the window's end if it
runs on), rearranges some of them and packs them into sequences (`pretokenized_fim.py`).
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import shutil
import sys
import time
from collections import deque
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from codeparrot.atomic_io import atomic_dir, atomic_write_json, ensure_writable_dir
from codeparrot.data.records import iter_record_lines, resolve_data_files
from codeparrot.errors import CodeParrotError
from codeparrot.fim.transform import FimTransform, check_rates
from codeparrot.repository.datasets import open_dataset_repository, publish_pretokenized
from codeparrot.tokenizer import load_tokenizer
from codeparrot.training.config import PretokenizeConfig
from codeparrot.training.datasets.constant_length import encode_with_eos, eos_token_id, token_dtype, vocab_size_of
from codeparrot.training.datasets.record_streams import check_has_records, parse_record
from codeparrot.training.datasets.resumable import (Reader, ResumableIterableDataset, check_fim_matches,
                                                    check_state_matches)
from codeparrot.worker_pool import WatchedResult, start_pool, stop_pool

INDEX_NAME = "index.json"
TOKENS_NAME = "tokens.bin"
FORMAT = "codeparrot-pretokenized"
VERSION = 1
PROGRESS_NAME = "progress.json"
# How special-token strings inside the text were encoded (index key `literal_special_tokens`; absent: by id).
SPECIALS_AS_TEXT = "text"


def tokenizer_fingerprint(tokenizer) -> str:
    """sha256 of the sorted token->id map: stable across library versions, different for any other vocabulary."""
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda item: item[1])
    return hashlib.sha256(json.dumps(vocab, ensure_ascii=False).encode("utf-8")).hexdigest()


def is_pretokenized(path) -> bool:
    """True when `path` is a directory holding a pretokenized index."""
    return os.path.isfile(os.path.join(os.fspath(path), INDEX_NAME))


def read_index(path) -> dict:
    """The index of a pretokenized folder, checked against its token file's size."""
    index_path = os.path.join(os.fspath(path), INDEX_NAME)
    try:
        with open(index_path, encoding="utf-8") as f:
            index = json.load(f)
    except (OSError, ValueError) as err:
        raise CodeParrotError(f"{index_path}: not a readable pretokenized index ({err})") from None
    if index.get("format") != FORMAT or index.get("version") != VERSION:
        raise CodeParrotError(f"{index_path}: not a {FORMAT} v{VERSION} index")
    tokens_path = os.path.join(os.fspath(path), TOKENS_NAME)
    expected = index["n_tokens"] * np.dtype(index["dtype"]).itemsize
    actual = os.path.getsize(tokens_path) if os.path.isfile(tokens_path) else -1
    if actual != expected:
        raise CodeParrotError(f"{tokens_path}: {actual} bytes, index says {expected} (corrupt pretokenized data)")
    return index


def validate_against_tokenizer(path, tokenizer) -> None:
    """CodeParrotError when the data at `path` was tokenized with another vocabulary or EOS id."""
    index = read_index(path)
    mine = {"vocab_size": vocab_size_of(tokenizer), "eos_token_id": eos_token_id(tokenizer)}
    for key, value in mine.items():
        if index[key] != value:
            raise CodeParrotError(f"{path} was pretokenized with {key} {index[key]}, the tokenizer has {value}: "
                                  "re-run scripts/pretokenize.py with this tokenizer")
    if index["tokenizer_fingerprint"] != tokenizer_fingerprint(tokenizer):
        raise CodeParrotError(f"{path} was pretokenized with a different vocabulary of the same size "
                              "(tokenizer fingerprints differ): re-run scripts/pretokenize.py with this tokenizer")


# --- writing ------------------------------------------------------------------------------------------------
_WORKER: dict = {}


def _init_worker(tokenizer, eos_id: int, dtype: str) -> None:
    _WORKER.update(tokenizer=tokenizer, eos_id=eos_id, dtype=np.dtype(dtype))


def _encode_batch(texts: list[str]) -> np.ndarray:
    return encode_with_eos(_WORKER["tokenizer"], texts, _WORKER["eos_id"], _WORKER["dtype"])


def _batches(files: list[str], text_column: str, batch_size: int, start_file: int, start_line: int):
    """(file index, line after the batch, texts) for batches of up to `batch_size` records of one file each,
    starting at line `start_line` of file `start_file` (earlier lines are skipped, not parsed)."""
    for file_idx in range(start_file, len(files)):
        path, texts = files[file_idx], []
        for line, raw in iter_record_lines(path, start_line if file_idx == start_file else 0):
            texts.append(parse_record(raw, text_column, path, line))
            if len(texts) >= batch_size:
                yield file_idx, line, texts
                texts = []
        yield file_idx, -1, texts  # -1: the file is done (possibly with an empty last batch)


def _job_signature(files: list[str], fingerprint: str, dtype: np.dtype, text_column: str) -> dict:
    stats = [os.stat(p) for p in files]
    return {"fingerprint": fingerprint, "dtype": dtype.name, "text_column": text_column,
            "literal_special_tokens": SPECIALS_AS_TEXT,  # a folder encoded the old way is redone
            "files": [[os.path.abspath(p), s.st_size, s.st_mtime_ns] for p, s in zip(files, stats)]}


def pretokenize(data_files, tokenizer, output_dir, text_column: str = "content", num_workers: int = 1,
                batch_size: int = 1000, progress: bool = True) -> dict:
    """Tokenize every record once into `output_dir/tokens.bin` + `index.json` (module docstring); returns the
    index. Resumes an interrupted run of the same job; returns at once if `output_dir` already holds it."""

    if num_workers < 1 or batch_size < 1:
        raise CodeParrotError(f"num_workers and batch_size must be >= 1, got {num_workers} and {batch_size}")
    files = [os.fspath(p) for p in resolve_data_files(data_files)]
    check_has_records(files, text_column, str(data_files))
    output_dir = Path(output_dir)
    ensure_writable_dir(output_dir.parent if str(output_dir.parent) else Path("."))
    eos_id, vocab_size = eos_token_id(tokenizer), vocab_size_of(tokenizer)
    dtype, fingerprint = token_dtype(vocab_size), tokenizer_fingerprint(tokenizer)
    signature = _job_signature(files, fingerprint, dtype, text_column)
    if is_pretokenized(output_dir):
        with open(output_dir / INDEX_NAME, encoding="utf-8") as f:
            existing = json.load(f)
        if existing.get("job") == signature:
            return {**read_index(output_dir), "reused": True}
    elif output_dir.exists() and (not output_dir.is_dir() or any(output_dir.iterdir())):
        raise CodeParrotError(f"{output_dir} exists and is not a pretokenized folder; refusing to replace it")

    partial = output_dir.parent / f".{output_dir.name}.partial"
    progress_path, tokens_path = partial / PROGRESS_NAME, partial / TOKENS_NAME
    state = {"job": signature, "file": 0, "line": 0, "n_tokens": 0, "files": []}
    if progress_path.is_file():
        saved = json.loads(progress_path.read_text(encoding="utf-8"))
        if saved.get("job") == signature and tokens_path.is_file():
            state = saved  # resume the interrupted run
    if state["n_tokens"] == 0 and state["file"] == 0:
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
    per_file = state["files"] or [{"path": p, "n_records": 0, "n_tokens": 0} for p in files]

    start = time.perf_counter()
    bar = tqdm(total=None, unit="tok", unit_scale=True, disable=None if progress else True, desc=f"pretokenize {output_dir.name}",
               initial=state["n_tokens"])
    pool = None
    if num_workers > 1:
        pool = start_pool(num_workers, _init_worker, (tokenizer, eos_id, dtype.name),
                          "fork" if "fork" in multiprocessing.get_all_start_methods() else None)
    else:
        _init_worker(tokenizer, eos_id, dtype.name)
    last_save = time.monotonic()
    try:
        with open(tokens_path, "r+b" if tokens_path.exists() else "wb") as out:
            out.truncate(state["n_tokens"] * dtype.itemsize)  # drop anything written after the last save
            out.seek(0, os.SEEK_END)
            in_flight: deque = deque()  # ordered results; at most 2 × workers batches held (backpressure)

            def write(file_idx: int, line: int, texts: list[str], tokens: np.ndarray) -> None:
                nonlocal last_save
                out.write(tokens.tobytes())
                per_file[file_idx]["n_records"] += len(texts)
                per_file[file_idx]["n_tokens"] += len(tokens)
                state["n_tokens"] += len(tokens)
                state["file"], state["line"] = (file_idx + 1, 0) if line < 0 else (file_idx, line)
                bar.update(len(tokens))
                if line < 0 or time.monotonic() - last_save > 5:
                    out.flush()
                    state["files"] = per_file
                    atomic_write_json(progress_path, state)
                    last_save = time.monotonic()

            for file_idx, line, texts in _batches(files, text_column, batch_size, state["file"], state["line"]):
                if pool is None:
                    write(file_idx, line, texts, _encode_batch(texts))
                    continue
                result = WatchedResult(pool, pool.apply_async(_encode_batch, (texts,)))
                in_flight.append((file_idx, line, texts, result))
                while len(in_flight) > 2 * num_workers or (in_flight and in_flight[0][3].ready()):
                    f_idx, f_line, f_texts, result = in_flight.popleft()
                    write(f_idx, f_line, f_texts, result.get())
            while in_flight:
                f_idx, f_line, f_texts, result = in_flight.popleft()
                write(f_idx, f_line, f_texts, result.get())
    finally:
        bar.close()
        if pool is not None:
            stop_pool(pool)

    seconds = time.perf_counter() - start
    index = {"format": FORMAT, "version": VERSION, "tokens_file": TOKENS_NAME, "dtype": dtype.name,
             "n_tokens": state["n_tokens"], "n_records": sum(f["n_records"] for f in per_file),
             "eos_token_id": eos_id, "vocab_size": vocab_size, "tokenizer_fingerprint": fingerprint,
             "text_column": text_column, "literal_special_tokens": SPECIALS_AS_TEXT, "files": per_file,
             "seconds": round(seconds, 3),
             "tokens_per_second": round(state["n_tokens"] / max(seconds, 1e-9)), "job": signature}
    with atomic_dir(output_dir) as tmp:
        os.rename(tokens_path, tmp / TOKENS_NAME)
        atomic_write_json(tmp / INDEX_NAME, index)
    shutil.rmtree(partial, ignore_errors=True)
    return index


# --- reading ------------------------------------------------------------------------------------------------
class PretokenizedDataset(ResumableIterableDataset):
    """Yields int64 tensors [seq_length] from a pretokenized folder (module docstring): a seeded permutation
    per epoch when `shuffle`, rank r takes r::world_size of it (worker w of that, w::num_workers);
    `infinite` restarts and counts `epoch`. The memory map is opened in the process that iterates.
    `fim_rate` > 0 (with `fim_spm_rate` and the `tokenizer` the data was made with, which must have the FIM
    tokens): fill-in-the-middle training sequences (`pretokenized_fim.py`), shuffled through a buffer of
    `sequence_shuffle_buffer` sequences (used with FIM only: without it the slices are already permuted)."""

    STATE_KIND, STATE_VERSION = "pretokenized", VERSION

    def __init__(self, path, seq_length: int, infinite: bool = False, seed: int = 0, shuffle: bool = True,
                 rank: int = 0, world_size: int = 1, tokenizer=None, fim_rate: float = 0.0,
                 fim_spm_rate: float = 0.5, sequence_shuffle_buffer: int = 0):
        if seq_length <= 0:
            raise CodeParrotError(f"seq_length must be > 0, got {seq_length}")
        self._set_ranks(rank, world_size)
        if not is_pretokenized(path):
            raise CodeParrotError(f"{path} is not a pretokenized folder (no {INDEX_NAME}; see scripts/pretokenize.py)")
        self.path, self.index = os.fspath(path), read_index(path)
        self.seq_length, self.infinite, self.seed, self.shuffle = int(seq_length), infinite, int(seed), shuffle
        self.n_sequences = self.index["n_tokens"] // self.seq_length
        if self.n_sequences == 0:
            raise CodeParrotError(f"{path} holds {self.index['n_tokens']} tokens, fewer than one sequence of "
                                  f"{seq_length}")
        if sequence_shuffle_buffer < 0:
            raise CodeParrotError(f"sequence_shuffle_buffer must be >= 0, got {sequence_shuffle_buffer}")
        self.tokenizer, self.fim, self.sequence_shuffle_buffer = tokenizer, None, int(sequence_shuffle_buffer)
        check_rates(fim_rate, fim_spm_rate)
        if fim_rate > 0:
            if tokenizer is None:
                raise CodeParrotError("FIM on pretokenized data needs the tokenizer (to split documents by character)")
            self.fim = FimTransform.for_tokenizer(tokenizer, fim_rate, fim_spm_rate, self.seed)
            if self.index.get("literal_special_tokens") != SPECIALS_AS_TEXT:
                raise CodeParrotError(f"{path} was pretokenized before special-token strings in files were kept as "
                                      "text (a file's literal <fim_middle> would be a sentinel): re-run "
                                      "scripts/pretokenize.py to train with FIM")

    def order(self, epoch: int, reader_id: int, n_readers: int) -> np.ndarray:
        """Sequence indices reader `reader_id` of `n_readers` visits in `epoch` (rank-major: reader = rank ×
        workers + worker, so rank r's workers together take exactly r::world_size)."""
        if self.shuffle:
            perm = np.random.default_rng([self.seed, epoch]).permutation(self.n_sequences)
        else:
            perm = np.arange(self.n_sequences)
        workers = n_readers // self.world_size
        rank, worker = divmod(reader_id, workers)
        return perm[rank :: self.world_size][worker::workers].copy()

    def _start(self, reader: Reader, state: dict | None):
        if self.fim is not None:
            from codeparrot.training.datasets.pretokenized_fim import PretokenizedFimIterator

            return PretokenizedFimIterator(self, reader.id, reader.count, state)
        return _PretokenizedIterator(self, reader.id, reader.count, state)


class _PretokenizedIterator:
    def __init__(self, ds: PretokenizedDataset, reader_id: int, n_readers: int, state: dict | None):
        self.ds, self.reader_id, self.n_readers = ds, reader_id, n_readers
        mm = np.memmap(os.path.join(ds.path, TOKENS_NAME), dtype=np.dtype(ds.index["dtype"]), mode="r")
        self.tokens = np.asarray(mm)  # plain ndarray view of the map: slicing it skips memmap bookkeeping
        self.epoch, self.pos = 0, 0
        if state is not None and state.get("started"):
            expected = {"reader_id": reader_id, "n_readers": n_readers, "n_tokens": ds.index["n_tokens"],
                        "seq_length": ds.seq_length, "seed": ds.seed, "shuffle": ds.shuffle}
            check_state_matches(state, expected, "data, seq_length, seed")
            check_fim_matches(state, None)
            self.epoch, self.pos = int(state["epoch"]), int(state["pos"])
        self.indices = ds.order(self.epoch, reader_id, n_readers)

    def __iter__(self):
        return self

    def __next__(self) -> torch.Tensor:
        if self.pos >= len(self.indices):
            if not self.ds.infinite:
                raise StopIteration
            if len(self.indices) == 0:
                raise CodeParrotError(f"reader {self.reader_id} of {self.n_readers} has no sequences of "
                                      f"{self.ds.path} ({self.ds.n_sequences} in all): use fewer processes/workers")
            self.epoch, self.pos = self.epoch + 1, 0
            self.indices = self.ds.order(self.epoch, self.reader_id, self.n_readers)
        start = int(self.indices[self.pos]) * self.ds.seq_length
        self.pos += 1
        return torch.from_numpy(self.tokens[start : start + self.ds.seq_length].astype(np.int64))

    def state_dict(self) -> dict:
        return {"kind": "pretokenized", "version": VERSION, "started": True, "epoch": self.epoch, "pos": self.pos,
                "reader_id": self.reader_id, "n_readers": self.n_readers, "n_tokens": self.ds.index["n_tokens"],
                "seq_length": self.ds.seq_length, "seed": self.ds.seed, "shuffle": self.ds.shuffle}


def run_pretokenize(cfg: PretokenizeConfig) -> list[dict]:
    """scripts/pretokenize.py: pretokenize every split `cfg` names, one summary line each; returns the indexes.
    With `cfg.push`, the output folder is then published (`codeparrot.repository.datasets`)."""
    repo = open_dataset_repository(cfg.push, cfg.output_dir) if cfg.push else None  # a bad --push fails before the work
    tokenizer = load_tokenizer(cfg.tokenizer)
    indexes = []
    for shards, out in cfg.jobs():
        print(f"pretokenizing {shards} -> {out} with {cfg.num_workers} worker(s)", file=sys.stderr)
        index = pretokenize(shards, tokenizer, out, text_column=cfg.text_column, num_workers=cfg.num_workers,
                            batch_size=cfg.batch_size, progress=cfg.progress)
        indexes.append(index)
        if index.get("reused"):
            print(f"{out}: already holds this data tokenized by this tokenizer ({index['n_tokens']:,} tokens); "
                  "nothing to do")
            continue
        print(f"{out}: {index['n_tokens']:,} tokens ({index['dtype']}) from {index['n_records']:,} files in "
              f"{len(index['files'])} shard(s); {index['seconds']:.1f} s, {index['tokens_per_second']:,} tokens/s")
    if repo is not None:
        root = Path(cfg.output_dir)
        publish_pretokenized(repo, root, {os.path.relpath(out, root): index
                                          for (_, out), index in zip(cfg.jobs(), indexes)})
    return indexes

"""Pretokenized fast path: tokenize the clean shards once, train from a memory-mapped token file.

On disk (`output_dir/`):
    tokens.bin   every record's tokens followed by EOS, records in file order: uint16 when the vocabulary fits
                 in 16 bits (ids < 65,536), else uint32; raw little-endian, no header
    index.json   format/version, dtype, n_tokens, n_records, per-file counts, eos id, vocab size, tokenizer
                 fingerprint (sha256 of its token->id map), text column, and `literal_special_tokens: "text"`:
                 special-token strings inside files (`<|endoftext|>`, `<fim_middle>`) were encoded as plain text
                 (codeparrot/fim/encoding.py), so the only special id in the file is the EOS after each record
                 (folders written before that have no such key: FIM training refuses them)

Writing: `pretokenize.py` (`scripts/pretokenize.py`).

Reading (`PretokenizedDataset`): sequence i = tokens[i*L : (i+1)*L] for i < n_tokens // L. Each epoch visits a
permutation of the sequence indices seeded by (seed, epoch); rank r takes positions r::world_size of it and
DataLoader worker w of that rank every workers-th of those, so each sequence belongs to exactly one reader. The
position is (epoch, count consumed): O(1) to save and to restore.

With fill-in-the-middle on (`fim_rate` > 0) each slice is rearranged on its own as it is read
(codeparrot/fim/transform.py: context-level FIM, a function of the slice's ids and the epoch), so the order,
the split between readers and the position are the same as without FIM.
"""

from __future__ import annotations

import hashlib
import json
import os

import numpy as np
import torch

from codeparrot.errors import CodeParrotError
from codeparrot.fim.transform import FimTransform, check_rates
from codeparrot.training.datasets.constant_length import eos_token_id, vocab_size_of
from codeparrot.training.datasets.resumable import (
    Reader,
    ResumableIterableDataset,
    check_fim_matches,
    check_state_matches,
)

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


def read_json_object(path) -> dict:
    """The JSON object in the file `path`; OSError or ValueError (also for valid JSON that is not an object)."""
    with open(path, encoding="utf-8") as f:
        obj = json.load(f)
    if not isinstance(obj, dict):
        raise ValueError(f"a JSON {type(obj).__name__}, not an object")
    return obj


# What `tokens.bin` may hold (`token_dtype` picks one by vocabulary size).
DTYPES = ("uint16", "uint32")
# The index keys the readers use, with their JSON types.
_INDEX_KEYS = {"dtype": str, "n_tokens": int, "n_records": int, "vocab_size": int, "eos_token_id": int,
               "tokenizer_fingerprint": str}


def _index_problem(index: dict) -> str | None:
    """What is wrong with the keys the readers use (None: nothing): each present, of its type and in range.
    One place for the schema, so a hand-edited or damaged index is one line naming the key, never a KeyError or
    a numpy TypeError deep in a reader."""
    for key, kind in _INDEX_KEYS.items():
        if key not in index:
            return f"no {key!r} key"
        if not isinstance(index[key], kind) or isinstance(index[key], bool):  # JSON true is no count
            return f"{key!r} is {json.dumps(index[key])[:40]}, not {'a string' if kind is str else 'an integer'}"
    if index["dtype"] not in DTYPES:
        return f"'dtype' is {index['dtype']!r}, not one of {', '.join(DTYPES)}"
    for key in ("n_tokens", "n_records"):
        if index[key] < 0:
            return f"{key!r} is {index[key]}, below 0"
    if not 0 < index["vocab_size"] <= 1 << (8 * np.dtype(index["dtype"]).itemsize):
        return f"'vocab_size' {index['vocab_size']} does not fit its dtype {index['dtype']}"
    if not 0 <= index["eos_token_id"] < index["vocab_size"]:
        return f"'eos_token_id' {index['eos_token_id']} is not below 'vocab_size' {index['vocab_size']}"
    if not isinstance(index.get("literal_special_tokens", SPECIALS_AS_TEXT), str):
        return "'literal_special_tokens' is not a string"
    return None


def read_index(path) -> dict:
    """The index of a pretokenized folder, its schema (`_index_problem`) checked and its token file's size."""
    index_path = os.path.join(os.fspath(path), INDEX_NAME)
    try:
        index = read_json_object(index_path)
    except (OSError, ValueError) as err:
        raise CodeParrotError(f"{index_path}: not a readable pretokenized index ({err})") from None
    if index.get("format") != FORMAT or index.get("version") != VERSION:
        raise CodeParrotError(f"{index_path}: not a {FORMAT} v{VERSION} index")
    if (problem := _index_problem(index)) is not None:
        raise CodeParrotError(f"{index_path}: {problem} (damaged pretokenized index): delete {os.fspath(path)} and "
                              "re-run scripts/pretokenize.py")
    tokens_path = os.path.join(os.fspath(path), TOKENS_NAME)
    expected = index["n_tokens"] * np.dtype(index["dtype"]).itemsize
    actual = os.path.getsize(tokens_path) if os.path.isfile(tokens_path) else -1
    if actual != expected:
        found = f"{actual:,} bytes" if actual >= 0 else "missing"
        raise CodeParrotError(f"{tokens_path}: {found}, index says {expected:,} (corrupt pretokenized data): delete "
                              f"{os.fspath(path)} and re-run scripts/pretokenize.py")
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


# --- reading ------------------------------------------------------------------------------------------------
class PretokenizedDataset(ResumableIterableDataset):
    """Yields int64 tensors [seq_length] from a pretokenized folder (module docstring): a seeded permutation
    per epoch when `shuffle`, rank r takes r::world_size of it (worker w of that, w::num_workers);
    `infinite` restarts and counts `epoch`. The memory map is opened in the process that iterates.
    `fim_rate` > 0 (with `fim_spm_rate` and the `tokenizer` the data was made with, which must have the FIM
    tokens): each sequence rearranged for fill-in-the-middle (codeparrot/fim/transform.py)."""

    STATE_KIND, STATE_VERSION = "pretokenized", VERSION

    def __init__(self, path, seq_length: int, infinite: bool = False, seed: int = 0, shuffle: bool = True,
                 rank: int = 0, world_size: int = 1, tokenizer=None, fim_rate: float = 0.0,
                 fim_spm_rate: float = 0.5):
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
        self.tokenizer, self.fim = tokenizer, None
        # Every id read must be below this (`_PretokenizedIterator.check_ids`): the index's vocabulary, which
        # `validate_against_tokenizer` (build_dataset) has matched to the tokenizer's; a tokenizer given here bounds
        # it too.
        self.vocab_size = self.index["vocab_size"]
        if tokenizer is not None:
            self.vocab_size = min(self.vocab_size, vocab_size_of(tokenizer))
        check_rates(fim_rate, fim_spm_rate)
        if fim_rate > 0:
            if tokenizer is None:
                raise CodeParrotError("FIM on pretokenized data needs the tokenizer (to split files by character)")
            self.fim = FimTransform.for_tokenizer(tokenizer, fim_rate, fim_spm_rate, self.seed)
            if self.index.get("literal_special_tokens") != SPECIALS_AS_TEXT:
                raise CodeParrotError(f"{path} was pretokenized before special-token strings in files were kept as "
                                      "text (a file's literal <fim_middle> would be a sentinel): re-run "
                                      "scripts/pretokenize.py to train with FIM")

    def order(self, epoch: int, reader_id: int, n_readers: int) -> np.ndarray:
        """Sequence indices reader `reader_id` of `n_readers` visits in `epoch` (rank-major: reader = rank ×
        workers + worker, so rank r's workers together take exactly r::world_size)."""
        # int32 where the indices fit: every reader holds the whole permutation while it slices its part (224 MiB
        # for 29M sequences as int64). Shuffling an int32 arange draws the same numbers as `permutation(n)` (the
        # dtype only sets the swap width), so the order, and every saved position, stays as it was.
        perm = np.arange(self.n_sequences, dtype=np.int32 if self.n_sequences < 2**31 else np.int64)
        if self.shuffle:
            np.random.default_rng([self.seed, epoch]).shuffle(perm)
        workers = n_readers // self.world_size
        rank, worker = divmod(reader_id, workers)
        return perm[rank :: self.world_size][worker::workers].copy()

    def _start(self, reader: Reader, state: dict | None):
        return _PretokenizedIterator(self, reader.id, reader.count, state)


class _PretokenizedIterator:
    def __init__(self, ds: PretokenizedDataset, reader_id: int, n_readers: int, state: dict | None):
        self.ds, self.reader_id, self.n_readers = ds, reader_id, n_readers
        mm = np.memmap(os.path.join(ds.path, TOKENS_NAME), dtype=np.dtype(ds.index["dtype"]), mode="r")
        self.tokens = np.asarray(mm)  # plain ndarray view of the map: slicing it skips memmap bookkeeping
        self.eos = int(ds.index["eos_token_id"])
        self.epoch, self.pos = 0, 0
        if state is not None and state.get("started"):
            expected = {"reader_id": reader_id, "n_readers": n_readers, "n_tokens": ds.index["n_tokens"],
                        "seq_length": ds.seq_length, "seed": ds.seed, "shuffle": ds.shuffle}
            check_state_matches(state, expected, "data, seq_length, seed")
            check_fim_matches(state, ds.fim)
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
        sequence = self.tokens[start : start + self.ds.seq_length]
        self.check_ids(sequence, start)
        if self.ds.fim is not None:
            sequence = self.ds.fim.rearrange(self.ds.tokenizer, sequence[None], self.epoch, self.eos)[0]
        return torch.from_numpy(sequence.astype(np.int64))

    def check_ids(self, sequence: np.ndarray, start: int) -> None:
        """Refuse an id at or past the vocabulary size here, on the host, where the file and offset are known:
        the embedding would fail on it (on a GPU a device-side assert that kills the run, naming nothing). One
        vectorized max per sequence: ~2.5 µs each, ~0.5 ms per batch of 192 × 1024 tokens (about twice the
        int64 conversion below), in the loader's workers, next to a training step of a second or so."""
        if int(sequence.max()) >= self.ds.vocab_size:
            at = int(np.argmax(sequence >= self.ds.vocab_size))
            raise CodeParrotError(f"{os.path.join(self.ds.path, TOKENS_NAME)}: token id {int(sequence[at])} at token "
                                  f"offset {start + at} is not below the vocabulary size {self.ds.vocab_size} (the "
                                  "data was pretokenized with another tokenizer or is damaged): delete "
                                  f"{self.ds.path} and re-run scripts/pretokenize.py")

    def state_dict(self) -> dict:
        return {"kind": "pretokenized", "version": VERSION, "started": True, "epoch": self.epoch, "pos": self.pos,
                "reader_id": self.reader_id, "n_readers": self.n_readers, "n_tokens": self.ds.index["n_tokens"],
                "seq_length": self.ds.seq_length, "seed": self.ds.seed, "shuffle": self.ds.shuffle,
                **(self.ds.fim.describe() if self.ds.fim is not None else {})}

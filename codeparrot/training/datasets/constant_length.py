"""ConstantLengthDataset: code files in, fixed-length token sequences out, with an exact resumable position.

What one reader (one rank's one DataLoader worker; see `record_streams` for how readers split the data: by record
of one global stream of epochs, so every file is read once per epoch whatever the shard and reader counts) does:

    records --(file shuffle buffer)--> texts until ~seq_length × chars_per_token × num_of_sequences characters
      --one batched tokenizer call--> t1 EOS t2 EOS ... tn EOS, appended to the carried tail of the last buffer
      --cut--> floor(len / seq_length) chunks [seq_length] + a new tail (< seq_length tokens, carried, not dropped)
        (with `fim_rate` > 0, each chunk rearranged for fill-in-the-middle: codeparrot/fim/transform.py)
      --(sequence shuffle buffer)--> int64 tensors [seq_length]

The position (`state_dict`) is everything needed to continue with the very next sequence without re-reading or
re-tokenizing consumed data: the record cursor, the carried tail, the current buffer's tokens and how many chunks
of it were used, both shuffle buffers, the RNG state (numpy PCG64: four integers) and the epoch. Size: the current
buffer dominates, 2 bytes/token for vocabularies ≤ 65,536 (≈ 2 MiB at CodeParrot's 1024 × 1024), plus
seq_length × 2 bytes per sequence in the sequence shuffle buffer and the texts held in the file shuffle buffer.
With FIM on, the position also names the FIM rates (a resume must keep them): the transform itself has no state,
each fragment's draws being a function of (seed, epoch, text).
Token arrays are stored as torch tensors that are never mutated, so a torchdata StatefulDataLoader snapshot after
every batch only ships what changed (a few integers) except right after a refill.
"""

from __future__ import annotations

import itertools
import os

import numpy as np
import torch

from codeparrot.data.records import resolve_data_files
from codeparrot.errors import CodeParrotError
from codeparrot.fim.encoding import plain_text_encoder
from codeparrot.fim.transform import FimTransform
from codeparrot.training.datasets.record_streams import HubRecordStream, LocalRecordStream, check_has_records
from codeparrot.training.datasets.resumable import (Reader, ResumableIterableDataset, check_fim_matches,
                                                    check_state_matches)

STATE_VERSION = 2  # 2: records dealt by a global count across epochs (record_streams docstring)
EOS_TOKEN = "<|endoftext|>"


def eos_token_id(tokenizer) -> int:
    """The id files are joined with: the tokenizer's EOS, else its `<|endoftext|>`."""
    eos = getattr(tokenizer, "eos_token_id", None)
    if eos is None:
        lookup = getattr(tokenizer, "convert_tokens_to_ids", None) or getattr(tokenizer, "token_to_id")
        eos = lookup(EOS_TOKEN)
        if eos is None or eos == getattr(tokenizer, "unk_token_id", object()):
            raise CodeParrotError(f"tokenizer has no EOS token (and no {EOS_TOKEN})")
    return int(eos)


def vocab_size_of(tokenizer) -> int:
    """Number of ids the tokenizer can produce (base vocabulary + added tokens)."""
    return len(tokenizer) if hasattr(tokenizer, "__len__") else tokenizer.get_vocab_size(with_added_tokens=True)


def token_dtype(vocab_size: int) -> np.dtype:
    """uint16 when every id (0 .. vocab_size - 1) fits in 16 bits, else uint32."""
    return np.dtype(np.uint16) if vocab_size <= 1 << 16 else np.dtype(np.uint32)


def _batch_ids(tokenizer, texts: list[str]) -> list[list[int]]:
    """One batched call (the `tokenizers` backend directly where it can: no attention masks, no length warnings),
    with special-token strings in the text encoded as plain text (`codeparrot.fim.encoding`): only the EOS joins
    (and the FIM transform) put special ids into the stream."""
    return plain_text_encoder(tokenizer).batch(texts)


def encode_with_eos(tokenizer, texts: list[str], eos_id: int, dtype: np.dtype) -> np.ndarray:
    """Tokens of `texts` in one batched call, EOS after each text: 1-D array `t1 EOS t2 EOS ... tn EOS`."""
    if not texts:
        return np.empty(0, dtype=dtype)
    ids = _batch_ids(tokenizer, texts)
    total = sum(map(len, ids)) + len(ids)
    eos = (eos_id,)
    flat = itertools.chain.from_iterable(itertools.chain.from_iterable(zip(ids, itertools.repeat(eos))))
    return np.fromiter(flat, dtype=dtype, count=total)


class ConstantLengthDataset(ResumableIterableDataset):
    """Streams records, tokenizes a buffer of ~seq_length × chars_per_token × num_of_sequences characters in one
    batched call, joins files with EOS and yields int64 tensors [seq_length] (module docstring for the details).

    `data_files`: a directory, glob, file or list of .json/.jsonl(.gz) shards (field `text_column`), or, with
    `hub_dataset`, the Hub dataset's own data files (optional). `hub_dataset`: a Hub dataset id (or a `datasets`
    builder name such as "json") streamed with `datasets`, split `split`.
    `infinite`: restart at the end and count `epoch`. `shuffle_buffer`: records held for file-level shuffling
    (also shuffles the shard order per epoch); `sequence_shuffle_buffer`: sequences held for sequence-level
    shuffling; 0 disables either. Both are seeded by `seed` and the reader.
    `fim_rate`, `fim_spm_rate`: fill-in-the-middle (codeparrot/fim/transform.py; needs a tokenizer with the FIM
    tokens); 0 = off, exactly the left-to-right stream.
    """

    STATE_KIND, STATE_VERSION = "constant_length", STATE_VERSION

    def __init__(self, tokenizer, data_files: str | list[str] | None = None, seq_length: int = 1024,
                 num_of_sequences: int = 1024, chars_per_token: float = 3.6, text_column: str = "content",
                 infinite: bool = False, seed: int = 0, shuffle_buffer: int = 0, sequence_shuffle_buffer: int = 0,
                 rank: int = 0, world_size: int = 1, hub_dataset: str | None = None, split: str = "train",
                 fim_rate: float = 0.0, fim_spm_rate: float = 0.5):
        for name, value in (("seq_length", seq_length), ("num_of_sequences", num_of_sequences),
                            ("chars_per_token", chars_per_token)):
            if not value > 0:
                raise CodeParrotError(f"{name} must be > 0, got {value}")
        for name, value in (("shuffle_buffer", shuffle_buffer), ("sequence_shuffle_buffer", sequence_shuffle_buffer)):
            if value < 0:
                raise CodeParrotError(f"{name} must be >= 0, got {value}")
        self._set_ranks(rank, world_size)
        self.tokenizer, self.seq_length = tokenizer, int(seq_length)
        self.eos_id = eos_token_id(tokenizer)
        self.dtype = token_dtype(vocab_size_of(tokenizer))
        self.max_buffer_chars = int(seq_length * chars_per_token * num_of_sequences)
        self.text_column, self.infinite, self.seed = text_column, infinite, int(seed)
        self.shuffle_buffer, self.sequence_shuffle_buffer = int(shuffle_buffer), int(sequence_shuffle_buffer)
        self.hub_dataset, self.split = hub_dataset, split
        self.fim = FimTransform.for_tokenizer(tokenizer, fim_rate, fim_spm_rate, self.seed)
        if hub_dataset is None:
            if data_files is None:
                raise CodeParrotError("ConstantLengthDataset needs data_files or hub_dataset")
            self.files: list[str] | None = [os.fspath(p) for p in resolve_data_files(data_files)]
            self.label = os.fspath(data_files) if isinstance(data_files, (str, os.PathLike)) else \
                f"{len(self.files)} files"
            check_has_records(self.files, text_column, str(self.label))
        else:
            self.files = None if data_files is None else [os.fspath(p) for p in resolve_data_files(data_files)]
            self.label = hub_dataset
            HubRecordStream(hub_dataset, split, self.files, text_column, 0, 1)  # fail now if it cannot be streamed

    def _open_stream(self, reader_id: int, n_readers: int):
        if self.hub_dataset is not None:
            return HubRecordStream(self.hub_dataset, self.split, self.files, self.text_column, reader_id, n_readers)
        return LocalRecordStream(self.files, self.text_column, reader_id, n_readers,
                                 shuffle_files=self.shuffle_buffer > 0, seed=self.seed)

    def _start(self, reader: Reader, state: dict | None) -> "_ConstantLengthIterator":
        return _ConstantLengthIterator(self, *reader, state)


class _ConstantLengthIterator:
    """One reader's pass(es) over its part of the data; everything it holds is in `state_dict()`."""

    def __init__(self, ds: ConstantLengthDataset, reader_id: int, n_readers: int, worker: int, workers: int,
                 state: dict | None):
        self.ds, self.reader_id, self.n_readers = ds, reader_id, n_readers
        self.where = f"rank {ds.rank} worker {worker} (reader {reader_id} of {n_readers})"
        self.stream = ds._open_stream(reader_id, n_readers)
        L = ds.seq_length
        self.rng = np.random.Generator(np.random.PCG64([ds.seed, reader_id, n_readers]))
        self.epoch, self.yielded, self.records_in_epoch, self.empty_epochs = 0, 0, 0, 0
        self.text_buffer: list[str] = []  # file-level shuffle buffer
        self.tail = np.empty(0, dtype=ds.dtype)  # < L tokens carried into the next buffer
        self.pending = np.empty(0, dtype=ds.dtype)  # current buffer's chunks, flat [n_chunks × L]
        self.pending_pos = 0  # chunks of `pending` already used
        self.seq_buffer = np.empty((ds.sequence_shuffle_buffer, L), dtype=ds.dtype)  # sequence shuffle buffer
        self.seq_fill = 0
        self.exhausted = False  # finite stream ended (only the sequence buffer drains now)
        if state is not None and state.get("started"):
            self._load(state)

    def __iter__(self):
        return self

    # --- the pipeline, stage by stage ----------------------------------------------------------------------
    def _next_text(self) -> str | None:
        """Next record text through the file-level shuffle buffer; None at the end of the epoch."""
        size = self.ds.shuffle_buffer
        if size == 0:
            text = self.stream.next_text()
        else:
            while len(self.text_buffer) < size:
                record = self.stream.next_text()
                if record is None:
                    break
                self.text_buffer.append(record)
            if not self.text_buffer:
                return None
            j = int(self.rng.integers(len(self.text_buffer)))
            self.text_buffer[j], self.text_buffer[-1] = self.text_buffer[-1], self.text_buffer[j]
            text = self.text_buffer.pop()
        if text is not None:
            self.records_in_epoch += 1
        return text

    def _refill(self) -> bool:
        """Tokenize the next buffer of texts onto the tail; False when a finite stream has ended."""
        texts: list[str] = []
        chars = 0
        while chars < self.ds.max_buffer_chars:
            text = self._next_text()
            if text is None:  # end of the epoch
                if texts:
                    break  # tokenize what we have; the next refill crosses into the next epoch
                if not self.ds.infinite:
                    return False
                # Records are dealt by a count that runs across epochs, so with fewer records than readers a
                # reader gets some only every few epochs; none in n_readers epochs in a row means none at all.
                self.empty_epochs = 0 if self.records_in_epoch else self.empty_epochs + 1
                if self.empty_epochs > self.n_readers:
                    raise CodeParrotError(f"{self.where} got no records from {self.ds.label} in "
                                          f"{self.empty_epochs} epochs in a row: the data is empty")
                self.epoch += 1
                self.records_in_epoch = 0
                self.stream.start_epoch(self.epoch)
                continue
            texts.append(text)
            chars += len(text)
        tokens = encode_with_eos(self.ds.tokenizer, texts, self.ds.eos_id, self.ds.dtype)
        if len(self.tail):
            tokens = np.concatenate([self.tail, tokens])
        L = self.ds.seq_length
        n_full = len(tokens) // L * L
        self.pending, self.tail, self.pending_pos = tokens[:n_full], tokens[n_full:].copy(), 0
        if self.ds.fim is not None:  # per sequence, drawn with this buffer's epoch (the carried tail's files included)
            self.pending = self.ds.fim.rearrange(self.ds.tokenizer, self.pending.reshape(-1, L), self.epoch,
                                                 self.ds.eos_id).reshape(-1)
        return True

    def _next_chunk(self) -> np.ndarray | None:
        L = self.ds.seq_length
        while not self.exhausted and self.pending_pos * L >= len(self.pending):
            if not self._refill():
                self.exhausted = True
        if self.exhausted:
            return None
        chunk = self.pending[self.pending_pos * L : (self.pending_pos + 1) * L]
        self.pending_pos += 1
        return chunk

    def __next__(self) -> torch.Tensor:
        size = self.ds.sequence_shuffle_buffer
        if size == 0:
            chunk = self._next_chunk()
            if chunk is None:
                raise StopIteration
        else:
            while self.seq_fill < size and (new := self._next_chunk()) is not None:
                self.seq_buffer[self.seq_fill] = new
                self.seq_fill += 1
            new = None if self.seq_fill < size else self._next_chunk()
            if self.seq_fill == 0:
                raise StopIteration
            j = int(self.rng.integers(self.seq_fill))
            chunk = self.seq_buffer[j].copy()
            if new is not None:  # steady state: the new sequence takes the drawn one's slot
                self.seq_buffer[j] = new
            else:  # draining at the end of a finite stream
                self.seq_fill -= 1
                self.seq_buffer[j] = self.seq_buffer[self.seq_fill]
        self.yielded += 1
        return torch.from_numpy(chunk.astype(np.int64))

    # --- position ------------------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {
            "kind": "constant_length", "version": STATE_VERSION, "started": True,
            "reader_id": self.reader_id, "n_readers": self.n_readers, "seq_length": self.ds.seq_length,
            "source": self.ds.label if self.ds.hub_dataset else len(self.ds.files),
            "epoch": self.epoch, "yielded": self.yielded, "records_in_epoch": self.records_in_epoch,
            "empty_epochs": self.empty_epochs,
            "exhausted": self.exhausted, "stream": self.stream.state_dict(),
            "rng": self.rng.bit_generator.state,
            "text_buffer": list(self.text_buffer),
            "tail": torch.from_numpy(self.tail),
            "pending": torch.from_numpy(self.pending),  # never mutated: snapshots share it
            "pending_pos": self.pending_pos,
            "seq_buffer": torch.from_numpy(self.seq_buffer[: self.seq_fill].copy()),
            **(self.ds.fim.describe() if self.ds.fim is not None else {}),  # absent with FIM off: as before
        }

    def _load(self, state: dict) -> None:
        ds = self.ds
        expected = {"reader_id": self.reader_id, "n_readers": self.n_readers, "seq_length": ds.seq_length,
                    "source": ds.label if ds.hub_dataset else len(ds.files)}
        check_state_matches(state, expected, "data, seq_length")
        check_fim_matches(state, ds.fim)
        if len(state["seq_buffer"]) > ds.sequence_shuffle_buffer:
            raise CodeParrotError(f"data state holds {len(state['seq_buffer'])} shuffled sequences but "
                                  f"sequence_shuffle_buffer is {ds.sequence_shuffle_buffer}")
        self.epoch, self.yielded = int(state["epoch"]), int(state["yielded"])
        self.records_in_epoch, self.exhausted = int(state["records_in_epoch"]), bool(state["exhausted"])
        self.empty_epochs = int(state["empty_epochs"])
        self.stream.load_state_dict(self.epoch, state["stream"])
        self.rng.bit_generator.state = state["rng"]
        self.text_buffer = list(state["text_buffer"])
        self.tail = state["tail"].numpy().astype(ds.dtype)
        self.pending = state["pending"].numpy().astype(ds.dtype)
        self.pending_pos = int(state["pending_pos"])
        self.seq_fill = len(state["seq_buffer"])
        self.seq_buffer[: self.seq_fill] = state["seq_buffer"].numpy()

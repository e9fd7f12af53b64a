"""Where training text comes from: data-file resolution and two record streams with an exact, cheap cursor.

Every stream serves one *reader* (one rank's one DataLoader worker) out of `n_readers`, so no process ever reads,
parses or tokenizes records that belong to another:
- by shard, when there are at least as many files as readers: reader k reads files k, k+n, k+2n, ...;
- by record, when there are fewer: every reader scans all lines, but parses (and later tokenizes) only records
  i with i % n_readers == k (i counts the non-blank lines of the epoch's stream, which every reader sees alike).

Why local shards are not read through `datasets` streaming (datasets 5.2 does have `IterableDataset.state_dict()`,
and `HubRecordStream` below uses it): its JSON resume re-parses the shard from its start up to the saved row; its
record-level node split (`StepExamplesIterable`) tracks its offset only on the Arrow path and realigns wrongly
across shards of uneven length; inside a DataLoader worker it re-splits by shard and idles every worker beyond the
shard count; and its shuffle buffer is documented as lost on resume. Our own cursor is (file position, line):
resuming decompresses the current shard up to that line (gzip has no random access) but parses and tokenizes
nothing that was consumed, and the split by record needs no help from the library.
"""

from __future__ import annotations

import glob
import gzip
import json
import os
import zlib
from pathlib import Path
from typing import IO, Iterable

import numpy as np

from codeparrot.errors import CodeParrotError

DATA_SUFFIXES = (".json", ".jsonl", ".json.gz", ".jsonl.gz")


def _is_data_file(path: str) -> bool:
    return path.endswith(DATA_SUFFIXES) and os.path.isfile(path)


def resolve_data_files(data_files: str | os.PathLike | Iterable[str | os.PathLike]) -> list[str]:
    """Expand a directory (its .json/.jsonl[.gz] files, not recursive), a glob or a list of those into a sorted,
    de-duplicated file list; one-line `CodeParrotError` when a path is missing or nothing matches."""
    items = [data_files] if isinstance(data_files, (str, os.PathLike)) else list(data_files)
    if not items:
        raise CodeParrotError("no dataset path given")
    files: list[str] = []
    for item in items:
        item = os.fspath(item)
        if os.path.isdir(item):
            found = sorted(str(p) for p in Path(item).iterdir() if _is_data_file(str(p)))
            if not found:
                subdirs = sorted(p.name for p in Path(item).iterdir() if p.is_dir())
                hint = f" (it has subfolders {', '.join(subdirs)}: pass one of them)" if subdirs else ""
                raise CodeParrotError(f"no data files ({', '.join(DATA_SUFFIXES)}) in {item}{hint}")
        elif glob.has_magic(item):
            found = sorted(p for p in glob.glob(item, recursive=True) if _is_data_file(p))
            if not found:
                raise CodeParrotError(f"no data files ({', '.join(DATA_SUFFIXES)}) match {item}")
        elif os.path.isfile(item):
            found = [item]
        else:
            raise CodeParrotError(f"dataset path {item} does not exist")
        files.extend(found)
    return list(dict.fromkeys(files))  # keeps first-seen order, drops repeats


def _open_lines(path: str) -> IO[bytes]:
    return gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb")


def parse_record(raw: bytes, text_column: str, path: str, line: int) -> str:
    """The text field of one JSON line; `CodeParrotError` naming file:line when it is not a JSON object with a
    string `text_column`."""
    try:
        record = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as err:
        raise CodeParrotError(f"{path}:{line}: not a JSON record ({err})") from None
    if not isinstance(record, dict):
        raise CodeParrotError(f"{path}:{line}: expected a JSON object per line, got {type(record).__name__}")
    text = record.get(text_column)
    if not isinstance(text, str):
        if text_column not in record:
            raise CodeParrotError(f"{path}:{line}: no '{text_column}' field (fields: {', '.join(sorted(record))})")
        raise CodeParrotError(f"{path}:{line}: '{text_column}' is {type(text).__name__}, not a string")
    return text


def check_has_records(files: list[str], text_column: str, label: str) -> None:
    """Fail early (one line naming `label`) when no file holds a record, or the first record lacks the column.
    Reads only up to the first non-blank line, so it costs nothing on a real corpus."""
    for path in files:
        try:
            with _open_lines(path) as fh:
                for line_no, raw in enumerate(fh, start=1):
                    if not raw.isspace():
                        parse_record(raw, text_column, path, line_no)
                        return
        except (OSError, EOFError, zlib.error) as err:
            raise CodeParrotError(f"{path}: cannot read ({err})") from None
    raise CodeParrotError(f"no records in {label} ({len(files)} file(s), all empty)")


def epoch_file_order(n_files: int, seed: int, epoch: int, shuffle: bool) -> list[int]:
    """File indices in the order an epoch reads them: a permutation seeded by (seed, epoch) when shuffling, so
    every reader of every rank computes the same order without talking to the others."""
    if not shuffle:
        return list(range(n_files))
    return np.random.default_rng([seed, epoch, 0x5EED]).permutation(n_files).tolist()


class LocalRecordStream:
    """This reader's texts of one epoch, in order, with the cursor (file position, line, record counter)."""

    def __init__(self, files: list[str], text_column: str, reader_id: int, n_readers: int,
                 shuffle_files: bool, seed: int):
        self.files, self.text_column = files, text_column
        self.reader_id, self.n_readers = reader_id, n_readers
        self.by_shard = len(files) >= n_readers
        self.shuffle_files, self.seed = shuffle_files, seed
        self._fh: IO[bytes] | None = None
        self.start_epoch(0)

    def start_epoch(self, epoch: int) -> None:
        order = [self.files[i] for i in epoch_file_order(len(self.files), self.seed, epoch, self.shuffle_files)]
        self.epoch_files = order[self.reader_id :: self.n_readers] if self.by_shard else order
        self.file_pos, self.line, self.record = 0, 0, 0
        self.close()

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None

    def _open_current(self, skip_lines: int) -> None:
        path = self.epoch_files[self.file_pos]
        try:
            self._fh = _open_lines(path)
            for _ in range(skip_lines):  # resume: decompress only, no JSON parsing
                if not self._fh.readline():
                    raise CodeParrotError(f"{path}: has fewer than {skip_lines} lines; the data changed since the "
                                          "checkpoint was saved")
        except (OSError, EOFError, zlib.error) as err:
            raise CodeParrotError(f"{path}: cannot read ({err})") from None
        self.line = skip_lines

    def next_text(self) -> str | None:
        """The next text of this reader's part, or None at the end of the epoch."""
        while True:
            if self._fh is None:
                if self.file_pos >= len(self.epoch_files):
                    return None
                self._open_current(0)
            path = self.epoch_files[self.file_pos]
            try:
                raw = self._fh.readline()
            except (OSError, EOFError, zlib.error) as err:
                raise CodeParrotError(f"{path}: truncated or corrupt after line {self.line} ({err})") from None
            if not raw:
                self.close()
                self.file_pos, self.line = self.file_pos + 1, 0
                continue
            self.line += 1
            if raw.isspace():
                continue
            index, self.record = self.record, self.record + 1
            if self.by_shard or index % self.n_readers == self.reader_id:
                return parse_record(raw, self.text_column, path, self.line)

    def state_dict(self) -> dict:
        return {"file_pos": self.file_pos, "line": self.line, "record": self.record}

    def load_state_dict(self, epoch: int, state: dict) -> None:
        self.start_epoch(epoch)
        self.file_pos, self.record = int(state["file_pos"]), int(state["record"])
        if state["line"] and self.file_pos < len(self.epoch_files):
            self._open_current(int(state["line"]))


class HubRecordStream:
    """Texts of a `datasets` streaming dataset (a Hub id, or a builder name such as "json" with `data_files`),
    split across readers by shard (`IterableDataset.shard`) or by record, with an exact cursor: the library's own
    `state_dict()` taken at a batch boundary plus the offset inside that batch (resuming re-reads one batch)."""

    def __init__(self, name: str, split: str, data_files: list[str] | None, text_column: str, reader_id: int,
                 n_readers: int, batch_size: int = 256):
        self.name, self.split, self.data_files, self.text_column = name, split, data_files, text_column
        self.reader_id, self.n_readers, self.batch_size = reader_id, n_readers, batch_size
        self.start_epoch(0)

    def _open(self):
        from datasets import load_dataset  # heavy import, only on this path

        try:
            ds = load_dataset(self.name, data_files=self.data_files, split=self.split, streaming=True)
        except Exception as err:  # the library raises many types (connection, missing split, bad builder...)
            raise CodeParrotError(f"cannot stream dataset {self.name} split {self.split}: "
                                  f"{str(err).splitlines()[0] if str(err) else type(err).__name__}") from None
        self.by_shard = ds.num_shards >= self.n_readers
        if self.by_shard and self.n_readers > 1:
            ds = ds.shard(num_shards=self.n_readers, index=self.reader_id, contiguous=False)
        return ds

    def start_epoch(self, epoch: int) -> None:
        # A fresh library object every epoch: one that had a state loaded would resume from it again.
        self._ds = self._open()
        self._it = None
        self._batch: list = []
        self._pos = 0
        self._batch_base = 0  # stream index of _batch[0] (for the split by record)
        self._hf_state_before: dict | None = None  # library state just before _batch was fetched

    def _fetch(self) -> bool:
        if self._it is None:
            self._it = iter(self._ds.iter(batch_size=self.batch_size))
            before = None  # the library has no state before its first batch: "from the start"
        else:
            before = self._ds.state_dict()
        try:
            batch = next(self._it)
        except StopIteration:
            return False
        if self.text_column not in batch:
            raise CodeParrotError(f"dataset {self.name}: no '{self.text_column}' column "
                                  f"(columns: {', '.join(sorted(batch))})")
        self._batch_base += len(self._batch)
        self._hf_state_before, self._batch, self._pos = before, batch[self.text_column], 0
        return True

    def next_text(self) -> str | None:
        while True:
            while self._pos >= len(self._batch):
                if not self._fetch():
                    return None
            index = self._batch_base + self._pos
            text = self._batch[self._pos]
            self._pos += 1
            if self.by_shard or index % self.n_readers == self.reader_id:
                if not isinstance(text, str):
                    raise CodeParrotError(f"dataset {self.name}: record {index} '{self.text_column}' is "
                                          f"{type(text).__name__}, not a string")
                return text

    def state_dict(self) -> dict:
        return {"hf_state": self._hf_state_before, "pos": self._pos, "batch_base": self._batch_base,
                "started": self._it is not None}

    def load_state_dict(self, epoch: int, state: dict) -> None:
        self.start_epoch(epoch)
        if not state["started"]:
            return
        if state["hf_state"] is not None:
            self._ds.load_state_dict(state["hf_state"])
        self._it = iter(self._ds.iter(batch_size=self.batch_size))
        try:
            batch = next(self._it)
        except StopIteration:
            batch = {self.text_column: []}
        self._batch, self._pos, self._batch_base = batch.get(self.text_column, []), state["pos"], state["batch_base"]
        self._hf_state_before = state["hf_state"]

    def close(self) -> None:
        self._it = None

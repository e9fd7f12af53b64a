"""Where training text comes from: two record streams with an exact, cheap cursor (which files a path names and
how a line is parsed: `codeparrot.data.records`, shared with every other stage).

Every stream serves one *reader* (one rank's one DataLoader worker) out of `n_readers`.

How files are dealt (balanced: every file is read exactly E times over E epochs, for any shard and reader count)
---------------------------------------------------------------------------------------------------------------
A *file* here is one record (one source file, one JSON line); a *shard* is one .json(.gz) file of records. All
readers see the same global stream: epoch 0's shards in that epoch's order (`epoch_file_order`, seeded by
(seed, epoch), so every reader computes it alone), then epoch 1's, and so on, each shard's records in line order.
Record g of that endless stream (g counts non-blank lines from the start of training, *across* epochs) belongs to
reader g % n_readers, and only that reader parses and tokenizes it. So:
- every reader holds 1/n_readers of every epoch's records (±1), whatever the number or sizes of the shards: with
  1 shard and 4 readers each reader reads a quarter of the shard, with 53 shards and 32 readers nobody holds two
  shards while another holds one. Readers are consumed at the same rate (equal batches per rank, workers in
  turn), so they cross epoch boundaries together and over E epochs' worth of batches each file is read E times,
  up to what is in flight at the stopping point (a reader's carried tail and shuffle buffers). The deal is exact
  in files, readers are consumed in tokens: a reader whose share happens to hold longer files runs behind by the
  statistical spread of its share's size (with 165k files per reader and epoch at the published scale and a
  file-size standard deviation assumed at twice the mean, about 0.5% of an epoch); with the shard order shuffled per epoch (training)
  the shares change every epoch and that spread grows like √E, not like E;
- the count continues across epochs, so an epoch whose record count is not a multiple of n_readers does not
  always leave its remainder to the same readers.
The old deal (reader k takes whole shards k, k+n, ... and starts its next epoch on its own) made readers with
fewer shards loop faster: 3 equal shards over 2 readers read 10 of 36 files twice and 3 never in one epoch's
worth of sequences; 53 shards over 32 readers skipped 13.6% of the data in the first epoch.

Cost: every reader *scans* every line of every shard (gzip decompression and a newline split, no JSON parsing
or tokenizing of other readers' records): `iter_record_lines` scans 232 MB/s of gzipped JSON lines on one core of
the 2-core development machine, so CodeParrot's 50 GB / 5.3M files cost about 4 CPU-minutes per reader per
epoch, against about half a day of training per epoch at the published speed (29.5B tokens ≈ 2 epochs in a
day). On the Hub path it means every reader downloads the whole split: for runs with many readers, download the
split once (`hf download --repo-type dataset ...`) and train on the local shards.

The cursor is exact and cheap: local shards keep (file position, line, global record counter), so a resume
decompresses the current shard up to that line but parses and tokenizes nothing that was consumed.

Why local shards are not read through `datasets` streaming (datasets 5.2 does have `IterableDataset.state_dict()`,
and `HubRecordStream` below uses it): its JSON resume re-parses the shard from its start up to the saved row; its
record-level node split (`StepExamplesIterable`) tracks its offset only on the Arrow path and realigns wrongly
across shards of uneven length; inside a DataLoader worker it re-splits by shard and idles every worker beyond the
shard count; and its shuffle buffer is documented as lost on resume.
"""

from __future__ import annotations

from typing import Iterator

import numpy as np

from codeparrot.data.records import (
    MAX_RECORD_BYTES,
    BadRecord,
    LongLine,
    iter_record_lines,
    parse_record_line,
    too_large,
)
from codeparrot.errors import CodeParrotError, first_line


def record_lines(path: str, start_line: int = 0) -> Iterator[tuple[int, bytes | LongLine]]:
    """`iter_record_lines` with preprocess's line limit: a multi-GB line (a corrupt file, one without line breaks)
    is read through in bounded pieces by every reader that scans it, never held whole; `parse_record` refuses it."""
    return iter_record_lines(path, start_line, max_line_bytes=MAX_RECORD_BYTES)


def parse_record(raw: bytes | LongLine, text_column: str, path: str, line: int) -> str:
    """The text field of one JSON line; `CodeParrotError` naming file:line and the reason when it is not a JSON
    object with a string `text_column` (`codeparrot.data.records.parse_record_line`) or is over the line limit."""
    if isinstance(raw, LongLine):
        raise CodeParrotError(f"{path}:{line}: record too large ({too_large(raw.nbytes, MAX_RECORD_BYTES)})")
    try:
        return parse_record_line(raw, text_column)[1]
    except BadRecord as err:
        raise CodeParrotError(f"{path}:{line}: {err}") from None


def check_has_records(files: list[str], text_column: str, label: str) -> None:
    """Fail early (one line naming `label`) when no file holds a record, or the first record lacks the column.
    Reads only up to the first non-blank line, so it costs nothing on a real corpus."""
    for path in files:
        lines = record_lines(path)
        first = next(lines, None)
        lines.close()
        if first is not None:
            parse_record(first[1], text_column, path, first[0])
            return
    raise CodeParrotError(f"no records in {label} ({len(files)} file(s), all empty)")


def epoch_file_order(n_files: int, seed: int, epoch: int, shuffle: bool) -> list[int]:
    """File indices in the order an epoch reads them: a permutation seeded by (seed, epoch) when shuffling, so
    every reader of every rank computes the same order without talking to the others."""
    if not shuffle:
        return list(range(n_files))
    return np.random.default_rng([seed, epoch, 0x5EED]).permutation(n_files).tolist()


class LocalRecordStream:
    """This reader's texts of one epoch, in order, with the cursor (file position, line, global record counter):
    record g of the endless stream of epochs is this reader's when g % n_readers == reader_id (module docstring)."""

    def __init__(self, files: list[str], text_column: str, reader_id: int, n_readers: int,
                 shuffle_files: bool, seed: int):
        self.files, self.text_column = files, text_column
        self.reader_id, self.n_readers = reader_id, n_readers
        self.shuffle_files, self.seed = shuffle_files, seed
        self._lines: Iterator[tuple[int, bytes]] | None = None  # (line number, line) of the open file
        self.record = 0  # records of the global stream scanned so far, all epochs (not reset per epoch)
        self.start_epoch(0)

    def start_epoch(self, epoch: int) -> None:
        self.epoch_files = [self.files[i] for i in epoch_file_order(len(self.files), self.seed, epoch,
                                                                    self.shuffle_files)]
        self.file_pos, self.line = 0, 0
        self.close()

    def close(self) -> None:
        if self._lines is not None:
            self._lines.close()
            self._lines = None

    def next_text(self) -> str | None:
        """The next text of this reader's part, or None at the end of the epoch."""
        while self.file_pos < len(self.epoch_files):
            path = self.epoch_files[self.file_pos]
            if self._lines is None:  # resume: the first `line` lines are decompressed, not parsed
                self._lines = record_lines(path, start_line=self.line)
            for self.line, raw in self._lines:
                index, self.record = self.record, self.record + 1
                if index % self.n_readers == self.reader_id:
                    return parse_record(raw, self.text_column, path, self.line)
            self.close()
            self.file_pos, self.line = self.file_pos + 1, 0
        return None

    def state_dict(self) -> dict:
        return {"file_pos": self.file_pos, "line": self.line, "record": self.record}

    def load_state_dict(self, epoch: int, state: dict) -> None:
        self.start_epoch(epoch)
        self.file_pos, self.line, self.record = int(state["file_pos"]), int(state["line"]), int(state["record"])


class HubRecordStream:
    """Texts of a `datasets` streaming dataset (a Hub id, or a builder name such as "json" with `data_files`),
    dealt to readers by record of the endless stream of epochs like `LocalRecordStream` (module docstring), with
    an exact cursor: the library's own `state_dict()` taken at a batch boundary plus the offset inside that batch
    (resuming re-reads one batch) plus the records of earlier epochs."""

    def __init__(self, name: str, split: str, data_files: list[str] | None, text_column: str, reader_id: int,
                 n_readers: int, batch_size: int = 256):
        self.name, self.split, self.data_files, self.text_column = name, split, data_files, text_column
        self.reader_id, self.n_readers, self.batch_size = reader_id, n_readers, batch_size
        self._epoch_base = 0  # records of the global stream in the epochs before this one
        self._batch_base, self._batch = 0, []
        self.start_epoch(0)

    def _open(self):
        from datasets import load_dataset  # only Hub streams need `datasets` (a GPU image may not carry it)

        try:
            ds = load_dataset(self.name, data_files=self.data_files, split=self.split, streaming=True)
        except Exception as err:  # the library raises many types (connection, missing split, bad builder...)
            raise CodeParrotError(f"cannot stream dataset {self.name} split {self.split}: {first_line(err)}") from None
        return ds

    def start_epoch(self, epoch: int) -> None:
        # A fresh library object every epoch: one that had a state loaded would resume from it again. The
        # records scanned so far (all of the epoch that ended) move into the base of the global count.
        self._epoch_base += self._batch_base + len(self._batch)
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
            index = self._epoch_base + self._batch_base + self._pos
            text = self._batch[self._pos]
            self._pos += 1
            if index % self.n_readers == self.reader_id:
                if not isinstance(text, str):
                    raise CodeParrotError(f"dataset {self.name}: record {index} '{self.text_column}' is "
                                          f"{type(text).__name__}, not a string")
                return text

    def state_dict(self) -> dict:
        return {"hf_state": self._hf_state_before, "pos": self._pos, "batch_base": self._batch_base,
                "epoch_base": self._epoch_base, "started": self._it is not None}

    def load_state_dict(self, epoch: int, state: dict) -> None:
        self._batch_base, self._batch = 0, []
        self.start_epoch(epoch)
        self._epoch_base = int(state["epoch_base"])
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

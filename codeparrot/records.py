"""Reading a BigQuery GitHub export (newline-delimited JSON, optionally gzipped) and writing gzip JSONL shards.

The export is one JSON object per line with `repo_name, path, copies, size, content, license`; only the text
column (`content` by default) is required, other fields pass through untouched. Files are streamed line by
line (never loaded whole), so memory does not grow with the export (180 GB for the real one).

Broken input never stops a run unless `strict=True`: every bad record is counted by reason in `BadRecords`,
which also remembers the first `file:line` of each reason so the user can look at an example. The reasons:

- `malformed JSON`: the line does not parse as JSON (a truncated line, a JSON array file, ...)
- `not a JSON object`: the line parses but is a list, number or string
- `missing text column`: no `content` (or `--text-column`) key
- `non-string text`: the text column is null, a number, a list, ...
- `invalid UTF-8`: the line's bytes are not UTF-8, or the text holds an unpaired surrogate (`"\\ud800"`)
- `NUL bytes`: a raw NUL byte in the line or `\\u0000` in the text (binary files that slipped in)
- `empty file`: an input file without a single record
- `truncated gzip` / `corrupt gzip`: the compressed stream ends early or is damaged; the rest of the file
  is lost, the lines before it are kept
- `unreadable file`: an I/O error while reading

Which files a path names and how one line is parsed are shared with every other stage (`codeparrot.data_files`:
`resolve_data_files`, `parse_record_line`); this module adds the counting reader and the shard writer.
"""

from __future__ import annotations

import gzip
import json
import os
import time
import zlib
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator, NamedTuple

from codeparrot.data_files import UTF8_BOM, BadRecord, open_data_file, parse_record_line
from codeparrot.errors import CodeParrotError

FILE_LEVEL_REASONS = {"empty file", "truncated gzip", "corrupt gzip", "unreadable file"}  # count files, not lines
SHARD_PATTERN = "file-{index:012d}.json.gz"  # CodeParrot's shard names: file-000000000001.json.gz, ...


class Location(NamedTuple):
    """Where a record came from: input file and 1-based line number."""

    path: str
    line: int

    def __str__(self) -> str:
        return f"{self.path}:{self.line}"


@dataclass
class BadRecords:
    """Counts of skipped records by reason, with the first location (and parser message) of each reason."""

    strict: bool = False
    counts: dict[str, int] = field(default_factory=dict)
    first: dict[str, str] = field(default_factory=dict)  # reason -> "file:line (detail)"

    def add(self, reason: str, where: Location, detail: str = "") -> None:
        """Count one bad record; with `strict`, raise a one-line error naming the file and line instead."""
        example = f"{where}" + (f" ({detail})" if detail else "")
        if self.strict:
            raise CodeParrotError(f"{example}: {reason} (--strict stops at the first bad record)")
        self.counts[reason] = self.counts.get(reason, 0) + 1
        self.first.setdefault(reason, example)

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def summary_lines(self) -> list[str]:
        """One line per reason: count and the first place it happened."""
        return [f"{reason}: {count} (first at {self.first[reason]})" for reason, count in sorted(self.counts.items())]


def iter_lines(paths: Iterable[Path], bad: BadRecords) -> Iterator[tuple[bytes, Location]]:
    """Non-blank lines (without the line break) of every file, in order, with their location.

    File-level problems (empty file, truncated or corrupt gzip, I/O errors) are counted in `bad`.
    """
    for path in paths:
        name = str(path)
        lineno = 0
        records = 0
        try:
            with open_data_file(path) as f:
                for lineno, line in enumerate(f, start=1):
                    # A byte order mark starts a file from a Windows tool, or a line when such files were
                    # concatenated: dropped, so the raw line copied to the output is clean.
                    line = line.rstrip(b"\r\n").removeprefix(UTF8_BOM)
                    if not line.strip():
                        continue  # blank lines (a trailing newline, padding) are not records
                    records += 1
                    yield line, Location(name, lineno)
        except EOFError as err:
            bad.add("truncated gzip", Location(name, lineno + 1), str(err))
            continue
        except (gzip.BadGzipFile, zlib.error) as err:
            bad.add("corrupt gzip", Location(name, lineno + 1), str(err))
            continue
        except OSError as err:
            bad.add("unreadable file", Location(name, lineno + 1), err.strerror or str(err))
            continue
        if records == 0:
            bad.add("empty file", Location(name, 1))


def parse_line(line: bytes, where: Location, text_column: str, bad: BadRecords) -> tuple[dict[str, Any], str] | None:
    """(record, text) of one JSON line, or None after counting it in `bad` under its reason (texts with NUL
    characters included: they are binary files)."""
    try:
        return parse_record_line(line, text_column, reject_nul_text=True)
    except BadRecord as err:
        bad.add(err.reason, where, err.detail)
        return None


def iter_raw_records(
    paths: Iterable[Path], text_column: str = "content", bad: BadRecords | None = None
) -> Iterator[tuple[bytes, dict[str, Any], str, Location]]:
    """(raw line, record, text, location) of every valid record; bad ones are counted in `bad`.

    The raw line is what the writers copy to the output, so fields pass through byte for byte.
    """
    bad = bad if bad is not None else BadRecords()
    for line, where in iter_lines(paths, bad):
        parsed = parse_line(line, where, text_column, bad)
        if parsed is not None:
            yield line, parsed[0], parsed[1], where


def iter_records(
    paths: Iterable[Path], text_column: str = "content", strict: bool = False, bad: BadRecords | None = None
) -> Iterator[tuple[dict[str, Any], Location]]:
    """(record, location) of every valid record, streamed line by line.

    Bad records are counted in `bad` (created when None); with `strict`, the first one raises a
    `CodeParrotError` naming its file and line.
    """
    bad = bad if bad is not None else BadRecords()
    bad.strict = bad.strict or strict
    for _, record, _, where in iter_raw_records(paths, text_column, bad):
        yield record, where


def iter_texts(paths: Iterable[Path], text_column: str = "content", bad: BadRecords | None = None) -> Iterator[str]:
    """The text of every valid record, streamed line by line; bad records are counted in `bad`."""
    bad = bad if bad is not None else BadRecords()
    for _, _, text, _ in iter_raw_records(paths, text_column, bad):
        yield text


class ShardWriter:
    """Writes JSON lines into `directory/file-000000000001.json.gz`, ... with `samples_per_file` rows each.

    Shards are numbered from 1 (CodeParrot's naming) and opened lazily, so no empty shard is ever written.
    The gzip header carries no file name and mtime 0: the same rows give byte-identical shards, which makes
    runs comparable with a checksum. Rows are buffered into ~1 MiB blocks that one background thread
    compresses and writes, in order (zlib releases the GIL, so compression overlaps the caller's work; at most
    `_MAX_PENDING` blocks wait, so memory stays bounded). An I/O error in the thread surfaces at the next
    write or at `close`.
    """

    _BLOCK = 1 << 20
    _MAX_PENDING = 4

    def __init__(self, directory: str | os.PathLike, samples_per_file: int = 100_000, compresslevel: int = 6):
        if samples_per_file < 1:
            raise CodeParrotError(f"samples per file must be >= 1, got {samples_per_file}")
        if not 0 <= compresslevel <= 9:
            raise CodeParrotError(f"gzip compression level must be 0..9, got {compresslevel}")
        self.directory = Path(directory)
        self.samples_per_file = samples_per_file
        self.compresslevel = compresslevel
        self.paths: list[Path] = []
        self.rows = 0
        self._rows_in_shard = 0
        self._buffer: list[bytes] = []
        self._buffered = 0
        self._executor: ThreadPoolExecutor | None = None
        self._pending: deque[Future] = deque()
        self._gz: gzip.GzipFile | None = None  # touched only by the background thread
        self.cpu_seconds = 0.0  # CPU time of the background thread (compression and writes)

    def _submit(self, fn, *args) -> None:
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="shard-writer")
        self._pending.append(self._executor.submit(fn, *args))
        while self._pending and (self._pending[0].done() or len(self._pending) > self._MAX_PENDING):
            self._pending.popleft().result()  # re-raises an error of the writer thread here

    # --- run in the writer thread, in submission order
    def _open_file(self, path: Path) -> None:
        self._close_file()
        raw = open(path, "wb")
        self._gz = gzip.GzipFile(filename="", mode="wb", fileobj=raw, compresslevel=self.compresslevel, mtime=0)

    def _write_block(self, data: bytes) -> None:
        start = time.thread_time()
        self._gz.write(data)
        self.cpu_seconds += time.thread_time() - start

    def _close_file(self) -> None:
        if self._gz is not None:
            raw = self._gz.fileobj
            self._gz.close()
            raw.close()
            self._gz = None

    # --- caller side
    def _flush(self) -> None:
        if self._buffer:
            self._submit(self._write_block, b"".join(self._buffer))
            self._buffer, self._buffered = [], 0

    def write_line(self, line: bytes) -> None:
        """Append one JSON object given as its serialized bytes (no line break)."""
        if not self.paths or self._rows_in_shard >= self.samples_per_file:
            self._flush()
            self.directory.mkdir(parents=True, exist_ok=True)
            self.paths.append(self.directory / SHARD_PATTERN.format(index=len(self.paths) + 1))
            self._submit(self._open_file, self.paths[-1])
            self._rows_in_shard = 0
        self._buffer.append(line)
        self._buffer.append(b"\n")
        self._buffered += len(line) + 1
        self._rows_in_shard += 1
        self.rows += 1
        if self._buffered >= self._BLOCK:
            self._flush()

    def write_record(self, record: dict[str, Any]) -> None:
        """Append one record (serialized as compact JSON, non-ASCII kept as UTF-8)."""
        self.write_line(json.dumps(record, ensure_ascii=False).encode("utf-8"))

    def close(self) -> list[Path]:
        """Finish the last shard and wait for the writer thread; returns every shard written."""
        if self._executor is not None:
            self._flush()
            self._submit(self._close_file)
            try:
                while self._pending:
                    self._pending.popleft().result()
            finally:
                self._executor.shutdown(wait=True)
                self._executor = None
        return self.paths

    def abort(self) -> None:
        """Stop after a failure: drop unwritten blocks and wait for the writer thread, so nothing writes into
        the (about to be removed) output folder afterwards. The shards on disk are incomplete."""
        if self._executor is not None:
            for future in self._pending:
                future.cancel()
            self._executor.submit(self._close_file)
            self._executor.shutdown(wait=True)
            self._executor, self._pending = None, deque()

    def __enter__(self) -> "ShardWriter":
        return self

    def __exit__(self, exc_type, *exc) -> None:
        self.abort() if exc_type is not None else self.close()


def ensure_replaceable(output_dir: str | os.PathLike, allowed: Iterable[str], what: str) -> None:
    """Refuse to replace an existing, non-empty `output_dir` holding anything but `allowed` entries (glob
    patterns of top-level names): the atomic rename at the end would delete it. A typo such as
    `--output-dir ~` must never cost the user their files."""
    path = Path(output_dir)
    if not path.exists():
        return
    if not path.is_dir():
        raise CodeParrotError(f"output directory {path} exists and is not a directory")
    allowed = list(allowed)
    for entry in sorted(path.iterdir()):
        if not any(entry.match(pattern) for pattern in allowed):
            raise CodeParrotError(f"refusing to replace {path}: it holds {entry.name!r}, which is not {what}; "
                                  "choose a new or empty --output-dir")

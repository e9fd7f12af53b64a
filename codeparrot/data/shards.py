"""Writing gzip JSONL shards (`file-000000000001.json.gz`, ...) and guarding the folder they replace."""

from __future__ import annotations

import gzip
import json
import os
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Iterable, NamedTuple

from codeparrot.errors import CodeParrotError

SHARD_PATTERN = "file-{index:012d}.json.gz"  # CodeParrot's shard names: file-000000000001.json.gz, ...


class ShardInfo(NamedTuple):
    """A written shard as its writer counted it: file name, JSON lines, compressed bytes."""

    name: str
    rows: int
    nbytes: int


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
        self.shard_rows: list[int] = []  # per shard, counted as lines are written
        self.shard_bytes: list[int] = []  # per shard, compressed bytes written (counted by the writer thread)
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
            self.shard_bytes.append(raw.tell())
            raw.flush()
            os.fsync(raw.fileno())  # here, in the writer thread, beside the compute: publishing then finds it on disk
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
            self.shard_rows.append(0)
        self._buffer.append(line)
        self._buffer.append(b"\n")
        self._buffered += len(line) + 1
        self._rows_in_shard += 1
        self.shard_rows[-1] += 1
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

    def shard_infos(self) -> list[ShardInfo]:
        """After `close`: every shard written, as counted while writing (what `verify_shards` checks)."""
        return [ShardInfo(p.name, r, b) for p, r, b in zip(self.paths, self.shard_rows, self.shard_bytes)]

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


def verify_shards(folder: Path, written: dict[str, list[ShardInfo]], kept: dict[str, int], samples_per_file: int) -> None:
    """Check, before an output is published, that `folder/<split>/` holds exactly the shards its writers
    reported, each on disk with the size they wrote, and that their rows add up to the kept counts
    (`samples_per_file` per shard, the last one the rest). A shard written where this process cannot see it
    (a node's local disk), truncated or left over fails here in one line, so nothing incomplete is published."""
    for split, infos in written.items():
        count = -(-kept[split] // samples_per_file)
        expected = [SHARD_PATTERN.format(index=i + 1) for i in range(count)]
        names = [info.name for info in infos]
        if names != expected:
            raise CodeParrotError(f"output check failed: {split}/ should hold {count} shard(s) for {kept[split]:,} "
                                  f"kept files, the writers reported {len(names)}")
        for i, info in enumerate(infos):
            rows = min(samples_per_file, kept[split] - i * samples_per_file)
            path = folder / split / info.name
            try:
                size = path.stat().st_size
            except FileNotFoundError:
                raise CodeParrotError(f"output check failed: {split}/{info.name} is missing here although it was "
                                      "written (on a cluster, --output-dir must be on storage every node shares)") from None
            if info.rows != rows or size != info.nbytes:
                raise CodeParrotError(f"output check failed: {split}/{info.name} has {size:,} bytes and "
                                      f"{info.rows:,} rows, expected {info.nbytes:,} bytes and {rows:,} rows")
        extra = sorted(p.name for p in (folder / split).iterdir() if p.name not in set(names))
        if extra:
            raise CodeParrotError(f"output check failed: {split}/ holds {extra[0]!r}, which no writer reported")

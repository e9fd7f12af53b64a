"""The Ray engine's read stage (`codeparrot.data.ray_engine`): read units, stable record ids, the read and parse
tasks, and the driver's side of it (`ExactDedup`: bad-line replay, license filter, exact dedup, in input order).

A read unit is one input file or one shard (data file) of a streamed Hub split (`hub_input.hub_num_shards`).
Units are numbered in input order and the records of unit u get the id `u << 40 | row` (row from 1 within the
unit), so sorting by id is input order and "first wins" is "smallest id wins". Each unit is one Ray task: the
shards of a Hub split are streamed by parallel tasks, each opening only its own data file. A split's shards in
order are its rows in order (what the local engine streams), so once the driver has counted the rows of the
earlier shards (one output row per streamed row: a record or a bad line; the driver takes blocks in input
order), each id maps back to the location the local engine reports (`dataset:split:row`, rows counted over the
whole split).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from codeparrot.data.exact_dedup import DigestSet, digest_of_stripped, strip_whitespace
from codeparrot.data.hub_input import HubInput, hub_num_shards, iter_hub_lines
from codeparrot.data.licenses import LicenseFilter
from codeparrot.data.preprocess_stats import Totals, utf8_len
from codeparrot.data.record_work import record_signals
from codeparrot.data.records import MAX_RECORD_BYTES, TOO_LARGE, BadRecords, Location, iter_lines, parse_line, too_large

LINE_BITS = 40  # id = unit << 40 | row: up to 2^40 rows per unit, 2^23 units
_BLOCK_BYTES = 16 << 20  # a read block closes at this many bytes of lines (bounded task memory)
_GROUP_BYTES = 32 << 20  # consecutive small input files share a read task up to about this many bytes of lines


def read_units(paths: list[Path | HubInput]) -> list[dict[str, Any]]:
    """The read units in input order: one per input file, one per shard of each Hub split."""
    units = []
    for i, item in enumerate(paths):
        if not isinstance(item, HubInput):
            units.append({"input": i, "path": str(item), "dataset_id": "", "split": "", "revision": "",
                          "shard": 0, "num_shards": 1})
            continue
        n = hub_num_shards(item)  # a wrong id, split or revision fails here, on the driver, in one line
        units += [{"input": i, "path": "", "dataset_id": item.dataset_id, "split": item.split,
                   "revision": item.revision or "", "shard": k, "num_shards": n} for k in range(max(n, 1))]
    return [{"unit": u, **unit} for u, unit in enumerate(units)]


def read_groups(units: list[dict[str, Any]], group_bytes: int = _GROUP_BYTES) -> list[list[dict[str, Any]]]:
    """The units split into read groups, in input order: consecutive local files together up to about
    `group_bytes` of lines (a gzip file counts 4x its size), so that many small files do not each cost a read,
    a parse and a filter task; each Hub shard is a group of its own."""
    groups: list[list[dict[str, Any]]] = []
    size = group_bytes  # of the open group of local files; group_bytes: none is open
    for unit in units:
        if not unit["path"]:
            groups.append([unit])
            size = group_bytes
            continue
        try:
            estimate = os.path.getsize(unit["path"]) * (4 if unit["path"].endswith(".gz") else 1)
        except OSError:  # unreadable: its read task reports it as the local engine does
            estimate = 0
        if size + estimate > group_bytes:
            groups.append([])
            size = 0
        groups[-1].append(unit)
        size += estimate
    return groups


def read_lines(units: list[dict[str, Any]], block_records: int,
               max_line_bytes: int = MAX_RECORD_BYTES) -> Iterator[Any]:
    """Ray streaming-generator task: the lines of a read group (`read_groups`), in order, in blocks of at most
    `block_records` lines and about `_BLOCK_BYTES` bytes (a block may span the group's files): a pyarrow table of
    (id, raw line, "", "") per line, and a row with its reason and detail per damaged or empty file and per line
    over `max_line_bytes` (read through in bounded pieces by `records.iter_lines`, as on the local engine). Only
    decompression and line splitting happen here; parsing is `parse_lines`, in parallel tasks. A unit that fails
    mid-stream (a Hub shard) first yields the lines read before the failure, as the local engine has seen them."""
    import pyarrow as pa

    rows: list[tuple] = []
    unit_id = 0

    class Recorder(BadRecords):  # the local file-level policy, with each event kept for the driver to replay
        def add(self, reason: str, where: Location, detail: str = "") -> None:
            rows.append((unit_id, int(where.line), b"", reason, detail))

    size = 0
    try:
        for unit in units:
            unit_id = int(unit["unit"])
            if unit["path"]:
                lines = iter_lines([Path(unit["path"])], Recorder(), max_line_bytes)
            else:
                hub = HubInput(unit["dataset_id"], unit["split"], unit["revision"] or None)
                n = int(unit["num_shards"])
                lines = iter_hub_lines(hub, int(unit["shard"]) if n > 1 else None, n)
            for line, where in lines:
                if len(line) > max_line_bytes:  # a Hub row (a file's long lines are events of iter_lines)
                    rows.append((unit_id, where.line, b"", TOO_LARGE, too_large(len(line), max_line_bytes)))
                    continue
                rows.append((unit_id, where.line, line, "", ""))
                size += len(line)
                if len(rows) >= block_records or size >= _BLOCK_BYTES:
                    yield _lines_table(pa, rows)
                    rows, size = [], 0
    except BaseException:
        if rows:
            yield _lines_table(pa, rows)
        raise
    if rows:
        yield _lines_table(pa, rows)


def _lines_table(pa, rows: list[tuple]):
    cols = list(zip(*rows))
    return pa.table({
        "id": pa.array((np.array(cols[0], dtype=np.int64) << LINE_BITS) + np.array(cols[1], dtype=np.int64),
                       pa.int64()),
        "raw": pa.array(cols[2], pa.large_binary()),
        "bad": pa.array(cols[3], pa.string()),  # "" for a line, else the file-level reason
        "detail": pa.array(cols[4], pa.string()),
    })


def parse_lines(table, text_column: str) -> tuple[dict[str, np.ndarray], Any]:
    """Ray task on a block of `read_lines`: each line parsed by the local parser (`records.parse_line`). Returns
    (numbers, records): the numbers are what the driver reads of every row, no text (id, bad-line reason and
    detail, UTF-8 size, digest of the whitespace-stripped text, normalized license); the records are a pyarrow
    table of the valid ones for the filter tasks (id, digest, UTF-8 size, copies, text, raw line)."""
    import pyarrow as pa

    reasons, details = table["bad"].to_pylist(), table["detail"].to_pylist()
    n = len(reasons)
    digests, sizes, texts = [0] * n, [0] * n, [""] * n
    licenses, copies = [""] * n, [-1] * n

    class Recorder(BadRecords):
        def add(self, reason: str, where: Location, detail: str = "") -> None:
            reasons[i], details[i] = reason, detail

    recorder = Recorder()
    for i, line in enumerate(table["raw"].to_pylist()):
        if reasons[i]:
            continue
        parsed = parse_line(line, Location("", 0), text_column, recorder)
        if parsed is not None:
            text = texts[i] = parsed[1]
            digests[i], sizes[i] = digest_of_stripped(strip_whitespace(text)), utf8_len(text)
            licenses[i], copies[i] = record_signals(parsed[0])
    good = np.array([not r for r in reasons], dtype=bool)
    numbers = {"id": table["id"].to_numpy(), "bad": np.array(reasons, dtype=object),
               "detail": np.array(details, dtype=object), "nbytes": np.array(sizes, dtype=np.int64),
               "digest": np.array(digests, dtype=np.uint64), "license": np.array(licenses, dtype=object)}
    records = pa.table({
        "id": table["id"], "digest": pa.array(numbers["digest"], pa.uint64()),
        "nbytes": pa.array(numbers["nbytes"], pa.int64()), "copies": pa.array(copies, pa.int64()),  # -1: none
        "text": pa.array(texts, pa.large_string()), "raw": table["raw"],
    }).filter(pa.array(good))
    return numbers, records


class Locations:
    """Record id -> the `Location` the local engine reports for it (file:line, or dataset:split:row), built as
    the units' rows arrive in input order (`add_rows`): a Hub shard's rows are counted after those of the
    earlier shards of its split."""

    def __init__(self, paths: list[Path | HubInput], units: list[dict[str, Any]]):
        self.paths = paths
        self.input = np.array([unit["input"] for unit in units], dtype=np.int64)
        self.rows = np.zeros(len(units), dtype=np.int64)  # rows (records and bad lines) seen per unit
        self.offset = np.zeros(len(units), dtype=np.int64)  # rows of the earlier shards of the same Hub split
        self._started = 0  # units before this one have their offset

    def add_rows(self, unit: int, rows: int) -> None:
        """`rows` more rows of `unit`; every unit before it is complete (rows arrive in input order)."""
        for u in range(max(self._started, 1), unit + 1):
            if self.input[u] == self.input[u - 1]:
                self.offset[u] = self.offset[u - 1] + self.rows[u - 1]
        self._started = max(self._started, unit + 1)
        self.rows[unit] += rows

    def __call__(self, rid: int) -> Location:
        u = rid >> LINE_BITS
        return Location(str(self.paths[self.input[u]]), int(self.offset[u] + (rid & ((1 << LINE_BITS) - 1))))


class ExactDedup:
    """The driver's side of the read stage, fed the `parse_lines` numbers of every block in input order: counts
    the valid records and their bytes into `totals`, replays every bad line through `bad` (the local engine's
    counts, first examples and --strict error), applies `licenses` (decisions counted in `totals.licenses`) and
    keeps the first occurrence of each digest (`DigestSet`: 8 bytes per distinct file). `winners` of a block are
    the ids its filter task works on."""

    def __init__(self, paths: list[Path | HubInput], units: list[dict[str, Any]], bad: BadRecords, totals: Totals,
                 licenses: LicenseFilter):
        self.paths, self.units, self.bad, self.totals, self.licenses = paths, units, bad, totals, licenses
        self.locate = Locations(paths, units)
        self.seen = DigestSet()
        self.winners = 0

    def winners_of(self, numbers: dict[str, np.ndarray]) -> np.ndarray:
        """The ids (sorted) of the block's records that are first occurrences among the license-kept records."""
        ids = numbers["id"]
        if not len(ids):
            return ids
        found, counts = np.unique(ids >> LINE_BITS, return_counts=True)  # a block may span a group's units
        for unit, rows in zip(found.tolist(), counts.tolist()):  # in input order: earlier units are complete
            self.locate.add_rows(unit, rows)
        is_bad = numbers["bad"] != ""
        for i in np.flatnonzero(is_bad).tolist():
            self.bad.add(numbers["bad"][i], self.locate(int(ids[i])), numbers["detail"][i])
        good = ~is_bad
        self.totals.valid_records += int(good.sum())
        self.totals.bytes_in += int(numbers["nbytes"][good].sum())
        if self.licenses.active:  # before exact dedup, as on the local engine
            good[good] = _license_allows(numbers["license"][good], self.licenses, self.totals)
        mine = ids[good][self.seen.add_batch(numbers["digest"][good])]
        self.winners += len(mine)
        return mine

    def unit_done(self, unit: int) -> None:
        """After the last block of `unit`: an empty Hub split counts as an empty file, as on the local engine."""
        self.locate.add_rows(unit, 0)
        item = self.paths[self.units[unit]["input"]]
        last = unit + 1 == len(self.units) or self.units[unit + 1]["input"] != self.units[unit]["input"]
        if isinstance(item, HubInput) and last:
            mine = np.flatnonzero(self.locate.input == self.locate.input[unit])  # the split's shards
            if not self.locate.rows[mine].sum():
                self.bad.add("empty file", self.locate((int(mine[0]) << LINE_BITS) + 1), "")


def _license_allows(values: np.ndarray, licenses: LicenseFilter, totals: Totals) -> np.ndarray:
    """bool per record: its (normalized) license value is kept by `licenses`; every decision is counted in
    `totals.licenses` per distinct value, as the local engine counts them one by one."""
    found, inverse, counts = np.unique(values, return_inverse=True, return_counts=True)
    reasons = [licenses.reason(value) for value in found.tolist()]
    for value, reason, count in zip(found.tolist(), reasons, counts.tolist()):
        totals.licenses.add(value, reason, count)
    return np.array([reason is None for reason in reasons], dtype=bool)[inverse.reshape(-1)]

"""The Ray engine's read stage (`codeparrot.data.ray_engine`): read units, stable record ids, bad-line replay.

A read unit is one input file or one shard (data file) of a streamed Hub split (`hub_input.hub_num_shards`).
Units are numbered in input order and the records of unit u get the id `u << 40 | row` (row from 1 within the
unit), so sorting by id is input order and "first wins" is "smallest id wins". Each unit is one Ray task: the
shards of a Hub split are streamed by parallel tasks, each opening only its own data file. A split's shards in
order are its rows in order (what the local engine streams), so once the driver knows every shard's row count
(one output row per streamed row: a record or a bad line), each id maps back to the location the local engine
reports (`dataset:split:row`, rows counted over the whole split).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from codeparrot.data.exact_dedup import digest_of_stripped, strip_whitespace
from codeparrot.data.hub_input import HubInput, hub_num_shards, iter_hub_lines
from codeparrot.data.licenses import LicenseFilter
from codeparrot.data.preprocess_stats import Totals, utf8_len
from codeparrot.data.record_work import record_signals
from codeparrot.data.records import BadRecords, Location, iter_lines, parse_line

LINE_BITS = 40  # id = unit << 40 | row: up to 2^40 rows per unit, 2^23 units
_ROWS_PER_READ_BATCH = 512  # lines per block emitted by a read task (bounded task memory)


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


def read_unit(batch: dict[str, np.ndarray]) -> Iterator[Any]:
    """Ray task: the lines of one read unit (a batch of one), in order: (id, raw line) per line, and a row with
    its reason per damaged or empty file. Only decompression and line splitting happen here (a unit is read by
    one task); parsing is `parse_rows`, in parallel tasks."""
    import pyarrow as pa

    class Recorder(BadRecords):  # the local file-level policy, with each event kept for the driver to replay
        def add(self, reason: str, where: Location, detail: str = "") -> None:
            rows.append((int(where.line), b"", reason, detail))

    for u in range(len(batch["unit"])):
        unit = {k: v[u] for k, v in batch.items()}
        rows: list[tuple] = []
        if unit["path"]:
            lines = iter_lines([Path(unit["path"])], Recorder())
        else:
            hub = HubInput(str(unit["dataset_id"]), str(unit["split"]), str(unit["revision"]) or None)
            n = int(unit["num_shards"])
            lines = iter_hub_lines(hub, int(unit["shard"]) if n > 1 else None, n)
        for line, where in lines:
            rows.append((where.line, line, "", ""))
            if len(rows) >= _ROWS_PER_READ_BATCH:
                yield _lines_table(pa, int(unit["unit"]), rows)
                rows = []
        if rows:
            yield _lines_table(pa, int(unit["unit"]), rows)


def _lines_table(pa, unit: int, rows: list[tuple]):
    cols = list(zip(*rows))
    return pa.table({
        "id": pa.array((unit << LINE_BITS) + np.array(cols[0], dtype=np.int64), pa.int64()),
        "raw": pa.array(cols[1], pa.large_binary()),
        "bad": pa.array(cols[2], pa.string()),  # "" for a line, else the file-level reason
        "detail": pa.array(cols[3], pa.string()),
    })


def parse_rows(table, text_column: str):
    """Ray batch function: each line parsed by the local parser (`records.parse_line`): (id, digest, UTF-8 size,
    text, raw line, license, copies) per valid record, its reason and detail per bad line; file-level rows pass
    through."""
    import pyarrow as pa

    reasons, details = table["bad"].to_pylist(), table["detail"].to_pylist()
    digests, sizes, texts = [0] * len(reasons), [0] * len(reasons), [""] * len(reasons)
    licenses, copies = [""] * len(reasons), [-1] * len(reasons)

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
    return pa.table({
        "id": table["id"],
        "digest": pa.array(np.array(digests, dtype=np.uint64), pa.uint64()),
        "nbytes": pa.array(sizes, pa.int64()),
        "text": pa.array(texts, pa.large_string()),
        "raw": table["raw"],
        "bad": pa.array(reasons, pa.string()),  # "" for a valid record, else the bad-record reason
        "detail": pa.array(details, pa.string()),
        "license": pa.array(licenses, pa.string()),  # normalized (`record_work.record_signals`)
        "copies": pa.array(copies, pa.int64()),  # -1: none
    })


def good_rows(table):
    """Ray batch function: the valid records of a block of read rows."""
    return table.filter(np.asarray(table["bad"].to_numpy(zero_copy_only=False)) == "")


class Locations:
    """Record id -> the `Location` the local engine reports for it (file:line, or dataset:split:row)."""

    def __init__(self, paths: list[Path | HubInput], units: list[dict[str, Any]], rows_per_unit: np.ndarray):
        self.paths = paths
        self.input = np.array([unit["input"] for unit in units], dtype=np.int64)
        self.offset = np.zeros(len(units), dtype=np.int64)  # rows of the earlier shards of the same Hub split
        for u in range(1, len(units)):
            if units[u]["input"] == units[u - 1]["input"]:
                self.offset[u] = self.offset[u - 1] + rows_per_unit[u - 1]

    def __call__(self, rid: int) -> Location:
        u = rid >> LINE_BITS
        return Location(str(self.paths[self.input[u]]), int(self.offset[u] + (rid & ((1 << LINE_BITS) - 1))))


def replay_bad(records, paths: list[Path | HubInput], units: list[dict[str, Any]], bad: BadRecords,
               totals: Totals, licenses: LicenseFilter) -> tuple[Locations, np.ndarray, np.ndarray]:
    """Count the valid records and their bytes into `totals` and replay every bad line through `bad` in input
    order (the local engine's counts, first examples and --strict error); returns the id -> location map and
    the ids and digests of the valid records that `licenses` keeps (16 bytes per record, for exact dedup, which
    comes after the license filter; in no particular order). License decisions go to `totals.licenses`."""
    import pandas as pd

    events, rows_per_unit = [], np.zeros(len(units), dtype=np.int64)
    ids, digests = [], []
    columns = ["id", "bad", "detail", "nbytes", "digest"] + (["license"] if licenses.active else [])
    for b in records.select_columns(columns).iter_batches(batch_format="pandas"):
        is_bad = b["bad"] != ""
        events.append(b[is_bad][["id", "bad", "detail"]])
        good = ~is_bad.to_numpy()
        totals.valid_records += int(good.sum())
        totals.bytes_in += int(b["nbytes"][good].sum())
        if licenses.active:  # before exact dedup, as on the local engine
            good[good] = _license_allows(b["license"].to_numpy(dtype=object)[good], licenses, totals)
        ids.append(b["id"].to_numpy(np.int64)[good])
        digests.append(b["digest"].to_numpy(np.uint64)[good])
        rows_per_unit += np.bincount(b["id"].to_numpy(np.int64) >> LINE_BITS, minlength=len(units))
    for i, item in enumerate(paths):  # an empty Hub split counts as an empty file, as on the local engine
        mine = [u["unit"] for u in units if u["input"] == i]
        if isinstance(item, HubInput) and not rows_per_unit[mine].sum():
            events.append(pd.DataFrame({"id": [(mine[0] << LINE_BITS) + 1], "bad": ["empty file"], "detail": [""]}))
    locate = Locations(paths, units, rows_per_unit)
    for row in pd.concat(events).sort_values("id").itertuples() if events else ():
        bad.add(row.bad, locate(row.id), row.detail)
    empty = np.zeros(0, dtype=np.int64)
    return locate, np.concatenate(ids) if ids else empty, np.concatenate(digests) if digests else empty.astype(np.uint64)


def _license_allows(values: np.ndarray, licenses: LicenseFilter, totals: Totals) -> np.ndarray:
    """bool per record: its (normalized) license value is kept by `licenses`; every decision is counted in
    `totals.licenses` per distinct value, as the local engine counts them one by one."""
    found, inverse, counts = np.unique(values, return_inverse=True, return_counts=True)
    reasons = [licenses.reason(value) for value in found.tolist()]
    for value, reason, count in zip(found.tolist(), reasons, counts.tolist()):
        totals.licenses.add(value, reason, count)
    return np.array([reason is None for reason in reasons], dtype=bool)[inverse.reshape(-1)]

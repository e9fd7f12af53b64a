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
from codeparrot.data.preprocess_stats import Totals, utf8_len
from codeparrot.data.record_work import record_signals
from codeparrot.data.records import BadRecords, Location, iter_raw_records, parse_line

LINE_BITS = 40  # id = unit << 40 | row: up to 2^40 rows per unit, 2^23 units
_ROWS_PER_READ_BATCH = 2048  # records per block emitted by a read task (bounded task memory)


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


def read_unit(batch: dict[str, np.ndarray], text_column: str) -> Iterator[Any]:
    """Ray task: the rows of one read unit (a batch of one): its valid records and its bad lines, in order."""
    import pyarrow as pa

    class Recorder(BadRecords):  # the local bad-line policy, with each event kept for the driver to replay
        def add(self, reason: str, where: Location, detail: str = "") -> None:
            rows.append((int(where.line), 0, 0, "", b"", reason, detail, "", -1))

    for u in range(len(batch["unit"])):
        unit = {k: v[u] for k, v in batch.items()}
        rows: list[tuple] = []
        recorder = Recorder()
        if unit["path"]:
            records = iter_raw_records([Path(unit["path"])], text_column, recorder)
        else:
            hub = HubInput(str(unit["dataset_id"]), str(unit["split"]), str(unit["revision"]) or None)
            n = int(unit["num_shards"])
            records = ((line, *parsed, where) for line, where in iter_hub_lines(hub, int(unit["shard"]) if n > 1
                                                                                else None, n)
                       if (parsed := parse_line(line, where, text_column, recorder)) is not None)
        for line, record, text, where in records:
            rows.append((where.line, digest_of_stripped(strip_whitespace(text)), utf8_len(text), text, line, "", "",
                         *record_signals(record)))
            if len(rows) >= _ROWS_PER_READ_BATCH:
                yield _rows_table(pa, int(unit["unit"]), rows)
                rows = []
        if rows:
            yield _rows_table(pa, int(unit["unit"]), rows)


def _rows_table(pa, unit: int, rows: list[tuple]):
    cols = list(zip(*rows))
    return pa.table({
        "id": pa.array((unit << LINE_BITS) + np.array(cols[0], dtype=np.int64), pa.int64()),
        "digest": pa.array(np.array(cols[1], dtype=np.uint64), pa.uint64()),
        "nbytes": pa.array(cols[2], pa.int64()),
        "text": pa.array(cols[3], pa.large_string()),
        "raw": pa.array(cols[4], pa.large_binary()),
        "bad": pa.array(cols[5], pa.string()),  # "" for a valid record, else the bad-record reason
        "detail": pa.array(cols[6], pa.string()),
        "license": pa.array(cols[7], pa.string()),  # normalized (`record_work.record_signals`)
        "copies": pa.array(cols[8], pa.int64()),  # -1: none
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
               totals: Totals) -> Locations:
    """Count the valid records and their bytes into `totals` and replay every bad line through `bad` in input
    order (the local engine's counts, first examples and --strict error); returns the id -> location map."""
    import pandas as pd

    events, rows_per_unit = [], np.zeros(len(units), dtype=np.int64)
    for b in records.select_columns(["id", "bad", "detail", "nbytes"]).iter_batches(batch_format="pandas"):
        is_bad = b["bad"] != ""
        events.append(b[is_bad])
        totals.valid_records += int((~is_bad).sum())
        totals.bytes_in += int(b["nbytes"][~is_bad].sum())
        rows_per_unit += np.bincount(b["id"].to_numpy(np.int64) >> LINE_BITS, minlength=len(units))
    for i, item in enumerate(paths):  # an empty Hub split counts as an empty file, as on the local engine
        mine = [u["unit"] for u in units if u["input"] == i]
        if isinstance(item, HubInput) and not rows_per_unit[mine].sum():
            events.append(pd.DataFrame({"id": [(mine[0] << LINE_BITS) + 1], "bad": ["empty file"], "detail": [""]}))
    locate = Locations(paths, units, rows_per_unit)
    for row in pd.concat(events).sort_values("id").itertuples() if events else ():
        bad.add(row.bad, locate(row.id), row.detail)
    return locate

"""Preprocessing input from a dataset repository, streamed: `--input hf://datasets/OWNER/NAME` or `--dataset-id`.

The real export (about 20M files, `codeparrot/codeparrot` or `transformersbook/codeparrot` on the Hub) is read
with `datasets.load_dataset(..., streaming=True)`: rows arrive shard by shard, nothing is downloaded whole and
memory does not grow with the dataset. Each row is serialized back to one JSON line, which then goes through
the same parser and bad-record rules as a line of a local export file (missing or non-string text column, NUL
bytes, ...), and is copied to the output shards byte for byte like any other input line. A row's location is
`hf://datasets/OWNER/NAME[@REVISION]:SPLIT:ROW` (1-based), in `stats.json` and `duplicate_clusters.json`.

`--dataset-id` also takes a local dataset repository folder (e.g. a `git clone` of a dataset repository or a
mirror of it): whatever `load_dataset` accepts. Offline (`HF_HUB_OFFLINE=1`) only local folders and the
`datasets` cache work; `HF_ENDPOINT` points the Hub client at a mirror.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from codeparrot.data.record_paths import could_be_hub_dataset, neither_path_nor_hub
from codeparrot.data.records import (
    MAX_RECORD_BYTES,
    TOO_LARGE,
    BadRecords,
    Location,
    iter_raw_records,
    parse_line,
    resolve_data_files,
    too_large,
)
from codeparrot.errors import CodeParrotError, first_line

HUB_PREFIX = "hf://datasets/"


@dataclass(frozen=True)
class HubInput:
    """One split of a dataset repository (a Hub id OWNER/NAME or a local folder), read as a stream of rows."""

    dataset_id: str
    split: str = "train"
    revision: str | None = None
    # given as --dataset-id, which may also be a folder: errors name both readings (error text only, so not compared)
    path_too: bool = field(default=False, compare=False)

    def __str__(self) -> str:
        name = self.dataset_id if os.path.isdir(self.dataset_id) else HUB_PREFIX + self.dataset_id
        return f"{name}{'@' + self.revision if self.revision else ''}:{self.split}"


def is_hub_spec(spec: str | os.PathLike) -> bool:
    return str(spec).startswith(HUB_PREFIX)


def parse_hub_spec(spec: str, split: str = "train", revision: str | None = None) -> HubInput:
    """`hf://datasets/OWNER/NAME` -> HubInput (one-line error for anything else)."""
    parts = str(spec)[len(HUB_PREFIX):].strip("/").split("/")
    if len(parts) != 2 or not all(parts):
        raise CodeParrotError(f"--input {spec}: a Hub dataset is hf://datasets/OWNER/NAME "
                              "(use --split and --revision to choose the split and the commit)")
    return HubInput("/".join(parts), split, revision)


def resolve_inputs(specs: Sequence[str], dataset_id: str | None = None, split: str = "train",
                   revision: str | None = None) -> list[Path | HubInput]:
    """The inputs in the order given: data files (`resolve_data_files` rules) and Hub datasets; `dataset_id`
    (a Hub id or a local dataset repository folder) comes last."""
    out: list[Path | HubInput] = []
    local: list[str] = []  # a run of local specs, resolved together (a file named twice is read once)
    if dataset_id and not os.path.isdir(dataset_id) and not could_be_hub_dataset(dataset_id):
        raise CodeParrotError(f"--dataset-id {dataset_id}: no such folder (and no Hub id, which is OWNER/NAME)")
    items: list[str | HubInput] = [*specs, *([HubInput(dataset_id, split, revision, path_too=True)]
                                             if dataset_id else [])]
    for item in items:
        if isinstance(item, HubInput) or is_hub_spec(item):
            if local:
                out += resolve_data_files(local)
                local = []
            out.append(item if isinstance(item, HubInput) else parse_hub_spec(item, split, revision))
        else:
            local.append(item)
    if local:
        out += resolve_data_files(local)
    if not out:
        raise CodeParrotError("no input: give --input PATH_OR_GLOB (repeatable), --input hf://datasets/OWNER/NAME "
                              "or --dataset-id")
    return out


def _json_default(value: Any) -> str:
    return value.isoformat() if hasattr(value, "isoformat") else str(value)  # dates, timestamps, bytes: as text


def _stream_error(hub: HubInput, err: Exception) -> CodeParrotError:
    """One line for whatever datasets/huggingface_hub raised (not found, offline, bad split, ...); for a
    --dataset-id that is no folder here, naming both readings."""
    if hub.path_too and not os.path.isdir(hub.dataset_id):
        return neither_path_nor_hub(f"--dataset-id {hub.dataset_id}", first_line(err))
    return CodeParrotError(f"cannot stream {hub}: {first_line(err)}")


def _stream(hub: HubInput):
    from datasets import load_dataset

    return load_dataset(hub.dataset_id, split=hub.split, revision=hub.revision, streaming=True)


def hub_num_shards(hub: HubInput) -> int:
    """Shards (data files) of the streamed split: the units that readers on several machines read in parallel
    (`--engine ray`); their rows in shard order are the split's rows in order."""
    try:
        return _stream(hub).num_shards
    except Exception as err:
        raise _stream_error(hub, err) from None


def iter_hub_lines(hub: HubInput, shard: int | None = None, num_shards: int = 1
                   ) -> Iterator[tuple[bytes, Location]]:
    """One JSON line per row of the streamed split (or of its shard `shard` of `num_shards`, contiguous), with
    its location (row numbers from 1 within what is read)."""
    try:
        rows = _stream(hub)
        if shard is not None:
            rows = rows.shard(num_shards, shard, contiguous=True)
        name = str(hub)
        for i, row in enumerate(rows, 1):
            # surrogatepass: a lone surrogate reaches the parser, which counts the row as invalid UTF-8
            yield json.dumps(row, ensure_ascii=False, default=_json_default).encode("utf-8", "surrogatepass"), \
                Location(name, i)
    except CodeParrotError:
        raise
    except Exception as err:  # datasets/huggingface_hub raise many types (not found, offline, bad split, ...)
        raise _stream_error(hub, err) from None


def iter_input_records(inputs: Iterable[Path | HubInput], text_column: str, bad: BadRecords,
                       max_line_bytes: int = MAX_RECORD_BYTES) -> Iterator[tuple[bytes, dict[str, Any], str, Location]]:
    """(raw line, record, text, location) of every valid record of every input, in order (`iter_raw_records`
    for files); bad records are counted in `bad`, an empty split as an `empty file`, a line (or row) over
    `max_line_bytes` as `record too large`."""
    for item in inputs:
        if not isinstance(item, HubInput):
            yield from iter_raw_records([item], text_column, bad, max_line_bytes)
            continue
        rows = 0
        for line, where in iter_hub_lines(item):
            rows += 1
            if len(line) > max_line_bytes:  # `datasets` holds the row already: refused as a file's line would be
                bad.add(TOO_LARGE, where, too_large(len(line), max_line_bytes))
                continue
            parsed = parse_line(line, where, text_column, bad)
            if parsed is not None:
                yield line, parsed[0], parsed[1], where
        if rows == 0:
            bad.add("empty file", Location(str(item), 1))

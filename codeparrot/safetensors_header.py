"""The header of a safetensors file, read without loading a tensor: 8 bytes of little-endian length, then that
many bytes of JSON, {tensor name: {"dtype", "shape", "data_offsets": [begin, end]}} plus an optional
`__metadata__`, the offsets counted from the end of the header. Checkpoint verification reads it to find a
truncated file; the weights fingerprint to know where each tensor's bytes are."""

from __future__ import annotations

import json
from typing import BinaryIO


def read_safetensors_header(f: BinaryIO, size: int) -> tuple[int, dict[str, dict]]:
    """(where the tensor data starts, {tensor name: its entry}, `__metadata__` left out) of the open file `f` of
    `size` bytes; a `ValueError` whose text completes "<file name> ..." when it has no readable header.
    Whether the tensors fit in the file is the caller's question (`end_of_data`)."""
    f.seek(0)
    head = f.read(8)
    if len(head) < 8:
        raise ValueError(f"is truncated ({size} bytes)")
    length = int.from_bytes(head, "little")
    if length > size - 8:
        raise ValueError(f"is truncated (header of {length} bytes, file of {size})")
    try:
        header = json.loads(f.read(length))
    except ValueError as err:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise ValueError(f"has an unreadable header ({type(err).__name__})") from None
    if not isinstance(header, dict):
        raise ValueError("has an unreadable header (not a JSON object)")
    entries = {name: entry for name, entry in header.items() if name != "__metadata__"}
    for name, entry in entries.items():
        offsets = entry.get("data_offsets") if isinstance(entry, dict) else None
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(type(x) is int for x in offsets)
                and 0 <= offsets[0] <= offsets[1]):
            raise ValueError(f"has an unreadable header (tensor {name!r} has no valid data_offsets)")
    return 8 + length, entries


def end_of_data(entries: dict[str, dict]) -> int:
    """Where the last tensor's bytes end, counted from the end of the header."""
    return max((entry["data_offsets"][1] for entry in entries.values()), default=0)

"""The narrow channel between the trusted checker and the untrusted candidate: plain data only (stdlib only).

Values cross as JSON with tags for what JSON lacks: `{"t": [...]}` a tuple, `{"s": [...]}` a set,
`{"fs": [...]}` a frozenset, `{"d": [[key, value], ...]}` a dict (any plain key), `{"b": "hex"}` bytes,
`{"c": [re, im]}` a complex. Lists, str, int, float (NaN and infinities included), bool and None are JSON's
own. Decoding builds only those types, so whatever bytes the untrusted side writes, the checker compares
plain values with plain `==`: no object of the program's (an `__eq__` that always says True) ever reaches
it. Never pickle: unpickling runs code named by the data.

Frames: 8-byte little-endian length, then UTF-8 JSON. A frame longer than `MAX_FRAME` is refused, and a
reply holding more than `MAX_VALUES` JSON values is refused before it is parsed (`loads`): what a reply
costs the trusted checker is bounded by those two numbers, not by the program (about 100 MiB at most,
measured in tests/sandbox/test_checker_bound.py; a 16 MiB reply of empty lists, unbounded, was 0.5-0.7 GiB).
"""

import json
import os
import re

MAX_FRAME = 16 << 20  # bytes: a reply larger than this fails the sample instead of filling memory
MAX_DEPTH = 200  # nesting accepted by `decode` (deeper data is refused, never a RecursionError mid-check)
# JSON values (each list, object, string, number, true/false/null) one reply may hold: 262,144, far above any
# HumanEval answer, and ~140 bytes of checker memory each at worst (parsed, then decoded).
MAX_VALUES = 1 << 18
_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"')  # a JSON string literal (escapes included)


class NotTransferable(TypeError):
    """A value that is not plain data (or is nested too deeply) cannot cross the channel."""


class TooLarge(ValueError):
    """A reply holding more JSON values than the checker decodes (`MAX_VALUES`)."""


def encode(value, exact: bool, depth: int = 0):
    """A JSON-able tagged form of `value`. `exact=True` (the trusted side, encoding arguments) accepts only
    the exact plain types; `exact=False` (the candidate's side) also accepts their subclasses (namedtuple,
    OrderedDict, Counter, IntEnum...), converted to the plain type."""
    if depth > MAX_DEPTH:
        raise NotTransferable("nested too deeply")
    kind = type(value)
    if value is None or kind is bool or kind is str or kind is int or kind is float:
        return value
    if not exact:
        for plain in (bool, int, float, str):
            if isinstance(value, plain):
                return plain(value)
    if kind is list or (not exact and isinstance(value, list)):
        return [encode(v, exact, depth + 1) for v in value]
    if kind is tuple or (not exact and isinstance(value, tuple)):
        return {"t": [encode(v, exact, depth + 1) for v in value]}
    if kind is dict or (not exact and isinstance(value, dict)):
        return {"d": [[encode(k, exact, depth + 1), encode(v, exact, depth + 1)] for k, v in value.items()]}
    if kind is set or (not exact and isinstance(value, set)):
        return {"s": [encode(v, exact, depth + 1) for v in value]}
    if kind is frozenset or (not exact and isinstance(value, frozenset)):
        return {"fs": [encode(v, exact, depth + 1) for v in value]}
    if kind is bytes or (not exact and isinstance(value, (bytes, bytearray))):
        return {"b": bytes(value).hex()}
    if kind is complex or (not exact and isinstance(value, complex)):
        return {"c": [value.real, value.imag]}
    raise NotTransferable(f"a value of type {kind.__name__} is not plain data")


def decode(data, depth: int = 0):
    """The plain value of a tagged JSON form (raises NotTransferable on anything else)."""
    if depth > MAX_DEPTH:
        raise NotTransferable("nested too deeply")
    kind = type(data)
    if data is None or kind in (bool, str, int, float):
        return data
    if kind is list:
        return [decode(v, depth + 1) for v in data]
    if kind is dict and len(data) == 1:
        (tag, body), = data.items()
        if tag == "b" and type(body) is str:
            return bytes.fromhex(body)
        if type(body) is not list:
            raise NotTransferable(f"malformed {tag!r}")
        items = [decode(v, depth + 1) for v in body] if tag != "d" else None
        if tag == "t":
            return tuple(items)
        if tag == "s":
            return set(items)
        if tag == "fs":
            return frozenset(items)
        if tag == "c" and len(items) == 2 and all(type(x) in (int, float) for x in items):
            return complex(items[0], items[1])
        if tag == "d":
            out = {}
            for pair in body:
                if type(pair) is not list or len(pair) != 2:
                    raise NotTransferable("malformed dict")
                out[decode(pair[0], depth + 1)] = decode(pair[1], depth + 1)
            return out
    raise NotTransferable("malformed data")


def dumps(obj) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def values_in(data: bytes, limit: int = MAX_VALUES) -> int:
    """How many JSON values `data` holds at most: every value but the first follows a `[`, `{`, `,` or `:`.
    Counted over the raw bytes first (C speed; characters inside strings count too, an overestimate), and
    only when that count is over the limit once more with the strings taken out (exact)."""
    quick = 1 + sum(data.count(c) for c in (b"[", b"{", b",", b":"))
    if quick <= limit:
        return quick
    bare = _STRING.sub(b'""', data)
    return 1 + sum(bare.count(c) for c in (b"[", b"{", b",", b":"))


def loads(data: bytes, max_values: int = MAX_VALUES):
    """The JSON value of a frame, refused (TooLarge) before parsing when it holds more than `max_values`
    values: parsing builds every object at once, so the bound must come first."""
    if len(data) > max_values and values_in(data, max_values) > max_values:  # fewer bytes than the limit: fewer values
        raise TooLarge(f"a reply of more than {max_values} values")
    return json.loads(data.decode("utf-8"))


def send(fd: int, payload: bytes) -> None:
    data = len(payload).to_bytes(8, "little") + payload
    while data:
        data = data[os.write(fd, data):]


def receive(fd: int, limit: int = MAX_FRAME):
    """The next frame's bytes, or None at end of input (the other side is gone). Raises ValueError when
    the announced length exceeds `limit`."""
    def exactly(n):
        chunks, got = [], 0
        while got < n:
            chunk = os.read(fd, min(n - got, 1 << 20))
            if not chunk:
                return None
            chunks.append(chunk)
            got += len(chunk)
        return b"".join(chunks)
    head = exactly(8)
    if head is None:
        return None
    size = int.from_bytes(head, "little")
    if size > limit:
        raise ValueError(f"a frame of {size} bytes (limit {limit})")
    return exactly(size)

"""JSON-lines records: one line iterator, one parser, and the bad-line policy (which files: `record_paths`).

Every stage that reads records uses these rules: preprocess (`--input`), train_tokenizer and pretokenize
(`--dataset`), and the training/validation datasets (`data.train`, `data.valid`). The BigQuery export is one
JSON object per line with `repo_name, path, copies, size, content, license`; only the text column (`content`
by default) is required, other fields pass through untouched. Files are streamed line by line (never loaded
whole), so memory does not grow with the export (180 GB for the real one).

Which files a path names (`resolve_data_files`: files, folders, globs, preprocess output roots) lives in
`codeparrot.data.record_paths`; its names are re-exported here.

Lines (`iter_record_lines`, the one line iterator): a damaged file raises `DamagedFile` (a `CodeParrotError`
with a reason) after the lines before the damage. What a line holds (`parse_record_line`): one JSON object
with a string text field; bad lines raise `BadRecord` with a reason.

The bad-line policy (`BadRecords`): the training stream stops at the first bad line or damaged file; preprocess
and the tokenizer count them by reason and go on (unless `strict=True`), remembering the first `file:line` of
each reason so the user can look at an example. The reasons:

- `malformed JSON`: the line does not parse as JSON (a truncated line, a JSON array file, ...)
- `not a JSON object`: the line parses but is a list, number or string
- `missing text column`: no `content` (or `--text-column`) key
- `non-string text`: the text column is null, a number, a list, ...
- `invalid UTF-8`: the line's bytes are not UTF-8, or the text holds an unpaired surrogate (`"\\ud800"`); when
  counting (preprocess, the tokenizer), also any other field holding one (`"path": "\\udce9"`): preprocess copies
  the line to its output, and `datasets` and every strict UTF-8 writer refuse it
- `duplicate key`: when counting, an object with a key twice (`{"content": "a", "content": "b"}`): readers
  disagree on which value counts, and `datasets` refuses the line (the training stream takes the last one)
- `NUL bytes`: a raw NUL byte in the line or `\\u0000` in the text (binary files that slipped in)
- `number out of range`: when counting, a number no 64-bit column holds (`"size": 1e400`, which Python reads as
  inf, or an integer past int64): `datasets` fails on the first and makes the second an inexact float
- `record too large`: a line over `MAX_RECORD_BYTES` (64 MiB; preprocess's `max_record_bytes`): a corrupt
  export or a file without line breaks; read through in bounded pieces, never held whole
- `empty file`: an input file without a single record
- `truncated gzip` / `corrupt gzip`: the compressed stream ends early or is damaged; the rest of the file
  is lost, the lines before it are kept
- `unreadable file`: an I/O error while reading
"""

from __future__ import annotations

import functools
import gzip
import json
import math
import os
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Iterable, Iterator, NamedTuple

from codeparrot.data.record_paths import (  # noqa: F401 - re-exported: every stage imports them from here
    DATA_SUFFIXES,
    SPLITS,
    is_data_file,
    resolve_data_files,
    split_files_for,
    split_folders,
)
from codeparrot.errors import CodeParrotError

READ_ERRORS = (OSError, EOFError, zlib.error)  # a missing/unreadable file, a truncated or corrupt gzip stream
UTF8_BOM = b"\xef\xbb\xbf"  # a UTF-8 byte order mark, written by some Windows tools


# --- reading lines --------------------------------------------------------------------------------------------
def open_data_file(path: str | os.PathLike) -> IO[bytes]:
    """Open a data file for reading bytes; `.gz` files are decompressed on the fly."""
    return gzip.open(path, "rb") if os.fspath(path).endswith(".gz") else open(path, "rb")


class DamagedFile(CodeParrotError):
    """A data file that cannot be read to its end: `reason` is `unreadable file`, `truncated gzip` or `corrupt
    gzip`; `line` is the 1-based line where reading failed; the message names the file."""

    def __init__(self, message: str, reason: str, line: int, detail: str):
        super().__init__(message)
        self.reason, self.line, self.detail = reason, line, detail


def _damage_reason(err: BaseException) -> tuple[str, str]:
    if isinstance(err, EOFError):
        return "truncated gzip", str(err)
    if isinstance(err, (gzip.BadGzipFile, zlib.error)):  # BadGzipFile is an OSError: tested first
        return "corrupt gzip", str(err)
    return "unreadable file", getattr(err, "strerror", None) or str(err)


# The longest line (record) preprocess and the tokenizer read: far above any source file (the BigQuery export
# holds files under 1 MiB, at most ~6 MiB as escaped JSON), far below what would strain a worker's memory.
MAX_RECORD_BYTES = 64 << 20
TOO_LARGE = "record too large"  # the bad-record reason of a longer line
OUT_OF_RANGE = "number out of range"  # ... of a line copied to an output with a number no 64-bit column holds


class LongLine(NamedTuple):
    """What `iter_record_lines` yields in place of a line longer than its `max_line_bytes`: the line was read
    through in bounded pieces and dropped, never held whole. `nbytes`: its length, line break excluded."""

    nbytes: int


def too_large(nbytes: int, limit: int) -> str:
    """The detail of a `record too large` line."""
    return f"{nbytes:,} bytes, over the {limit:,}-byte limit"


_SKIP_PIECE = 1 << 20  # the most bytes held at once while reading through a line over the limit


def _read_through(fh: IO[bytes], line: bytes, limit: int) -> bytes | LongLine:
    """`line`, read with `fh.readline(limit + 2)` (room for a line of exactly `limit` bytes and a CRLF), as it is,
    or a `LongLine` when it is longer than `limit` bytes, line break excluded: the rest of it is then read in
    pieces of at most `_SKIP_PIECE` bytes and dropped, so a multi-GB line (a corrupt export, a file without line
    breaks) costs bounded memory."""
    ending = 2 if line.endswith(b"\r\n") else 1 if line.endswith(b"\n") else 0
    if len(line) - ending <= limit:
        return line
    nbytes, last, piece = len(line), line, line
    while piece and not piece.endswith(b"\n"):
        last, piece = piece, fh.readline(min(limit + 1, _SKIP_PIECE))
        nbytes += len(piece)
    crlf = piece.endswith(b"\r\n") or (piece == b"\n" and last.endswith(b"\r"))
    return LongLine(nbytes - (2 if crlf else 1 if piece.endswith(b"\n") else 0))


def iter_record_lines(path: str | os.PathLike, start_line: int = 0,
                      max_line_bytes: int | None = None) -> Iterator[tuple[int, bytes | LongLine]]:
    """(1-based line number, line) of every non-blank line of `path` after its first `start_line` lines (which
    are decompressed, not parsed: a saved position resumes cheaply). A file that cannot be opened, is cut short
    or corrupt raises `DamagedFile`, and one with fewer than `start_line` lines a `CodeParrotError`; the lines
    read before the damage have been yielded by then. Lines keep their line break (`parse_record_line` ignores
    it). With `max_line_bytes`, a longer line (line break excluded) comes as a `LongLine`, read in bounded
    pieces; without it, lines are read whole whatever their length."""
    read = 0  # lines read so far
    try:
        fh = open_data_file(path)
    except READ_ERRORS as err:
        reason, detail = _damage_reason(err)
        raise DamagedFile(f"{path}: cannot read ({err})", reason, 1, detail) from None
    limit = max_line_bytes
    # One loop for both: readline called from C (iter + partial), within 5% of iterating the file itself; only a
    # line that fills the bounded read takes the Python path (`_read_through`).
    read_line = fh.readline if limit is None else functools.partial(fh.readline, limit + 2)
    with fh:
        try:
            while read < start_line:
                raw = read_line()
                if not raw:
                    raise CodeParrotError(f"{path}: has fewer than {start_line} lines; the data changed since "
                                          "the position was saved")
                if limit is not None and len(raw) > limit:
                    _read_through(fh, raw, limit)
                read += 1
            for lineno, raw in enumerate(iter(read_line, b""), start=start_line + 1):
                if limit is not None and len(raw) > limit:
                    raw = _read_through(fh, raw, limit)
                read = lineno
                if isinstance(raw, LongLine) or not raw.isspace():
                    yield read, raw
        except READ_ERRORS as err:
            reason, detail = _damage_reason(err)
            raise DamagedFile(f"{path}: truncated or corrupt after line {read} ({err})", reason, read + 1,
                              detail) from None


# --- parsing one line -----------------------------------------------------------------------------------------
class BadRecord(Exception):
    """A line that is not a usable record. `reason` is one of: NUL bytes, invalid UTF-8, malformed JSON, not a
    JSON object, missing text column, non-string text, duplicate key, number out of range; `detail` says where or
    what (may be empty)."""

    def __init__(self, reason: str, detail: str = ""):
        super().__init__(f"{reason} ({detail})" if detail else reason)
        self.reason, self.detail = reason, detail


class _DuplicateKey(ValueError):
    pass


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """`object_pairs_hook` of the checked parser: a dict, or `_DuplicateKey` naming the first key seen twice."""
    record = dict(pairs)
    if len(record) != len(pairs):
        seen: set[str] = set()
        raise _DuplicateKey(next(k for k, _ in pairs if k in seen or seen.add(k)))
    return record


class _OutOfRange(ValueError):
    """A JSON number no 64-bit column holds: `args` = (the number as written, what it does not fit)."""


def _int64(text: str) -> int:
    value = int(text)  # past 4,300 digits Python refuses first: a ValueError, "malformed JSON" as without the check
    if not -(1 << 63) <= value < 1 << 63:
        raise _OutOfRange(text, "a 64-bit integer")
    return value


def _finite_float(text: str) -> float:
    value = float(text)
    if math.isinf(value):  # 1e400: Python's json makes it inf
        raise _OutOfRange(text, "a 64-bit float")
    return value


# The parser of lines copied to an output (`check_fields`): besides duplicate keys, it refuses numbers that the
# output's readers cannot take as they are: pyarrow (`datasets.load_dataset("json")`) fails the whole shard on
# 1e400 ("Number too big to be stored in double") and reads an integer past int64 as an inexact float, turning
# that column of the shard into floats. Anywhere in the record: `size` and `copies` are the export's numbers.
_CHECKED_DECODER = json.JSONDecoder(object_pairs_hook=_unique_keys, parse_int=_int64, parse_float=_finite_float)


def _field_with_surrogate(record: dict[str, Any], skip: str) -> str | None:
    """The first key (other than `skip`) whose name or value holds an unpaired surrogate, or None. Cheap for the
    export's flat records: `str.isascii` is O(1), and only non-ASCII strings and nested values are encoded."""
    for key, value in record.items():
        if key == skip or (key.isascii() and (value is None or isinstance(value, (bool, int, float))
                                              or (isinstance(value, str) and value.isascii()))):
            continue
        try:
            json.dumps({key: value}, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            return key
    return None


def parse_record_line(line: bytes, text_column: str, reject_nul_text: bool = False,
                      check_fields: bool = False) -> tuple[dict[str, Any], str]:
    """(record, text) of one JSON line (a leading byte order mark and the line break are ignored), or `BadRecord`.

    A text must be encodable as UTF-8 (an escaped lone surrogate such as `"\\ud800"` is not: no tokenizer or
    writer takes it). `reject_nul_text`: also refuse texts holding U+0000 (binary files; preprocess drops them,
    the training stream keeps what it is given). A raw NUL byte is never valid JSON and is always refused.
    `check_fields`: the line is copied to an output that other tools read (preprocess), so every field must be
    unambiguous and writable too: a key twice in one object (`duplicate key`) or a lone surrogate in any field
    (`invalid UTF-8`) is refused; `datasets.load_dataset("json")` fails on a shard holding either. So is a number
    that does not fit 64 bits (`number out of range`: `1e400`, an integer past int64)."""
    if b"\x00" in line:
        raise BadRecord("NUL bytes")
    if line.startswith(UTF8_BOM):
        line = line[len(UTF8_BOM):]
    try:
        decoded = line.decode("utf-8")
    except UnicodeDecodeError as err:
        raise BadRecord("invalid UTF-8", f"byte {err.start}") from None
    try:
        record = _CHECKED_DECODER.decode(decoded) if check_fields else json.loads(decoded)
    except json.JSONDecodeError as err:
        raise BadRecord("malformed JSON", f"{err.msg}: column {err.colno}") from None
    except _DuplicateKey as err:
        raise BadRecord("duplicate key", f"{ascii(err.args[0])} twice in one object") from None
    except _OutOfRange as err:
        number, kind = err.args
        shown = number if len(number) <= 24 else f"{number[:12]}... ({len(number):,} characters)"
        raise BadRecord(OUT_OF_RANGE, f"{shown} does not fit {kind}") from None
    except ValueError as err:  # valid JSON Python will not parse: an integer past its 4,300-digit limit
        raise BadRecord("malformed JSON", str(err).split(";")[0]) from None
    except RecursionError:  # valid JSON nested deeper than the parser's recursion limit
        raise BadRecord("malformed JSON", "nested too deeply") from None
    if not isinstance(record, dict):
        raise BadRecord("not a JSON object", type(record).__name__)
    if text_column not in record:
        # a name with a line break, an escape sequence or a lone surrogate is shown escaped: the message stays one line
        fields = sorted(k if k.isprintable() else ascii(k) for k in record)
        shown = ", ".join(fields[:8]) + (f", ... ({len(fields)} in all)" if len(fields) > 8 else "")
        raise BadRecord("missing text column", f"no {text_column!r} key; fields: {shown or 'none'}")
    text = record[text_column]
    if not isinstance(text, str):
        raise BadRecord("non-string text", f"{text_column!r} is {type(text).__name__}")
    if reject_nul_text and "\x00" in text:
        raise BadRecord("NUL bytes")
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as err:
            raise BadRecord("invalid UTF-8", f"unpaired surrogate at character {err.start}") from None
    if check_fields and (key := _field_with_surrogate(record, text_column)) is not None:
        raise BadRecord("invalid UTF-8", f"unpaired surrogate in field {ascii(key)}")
    return record, text


# --- the bad-line policy ---------------------------------------------------------------------------------------
FILE_LEVEL_REASONS = {"empty file", "truncated gzip", "corrupt gzip", "unreadable file"}  # count files, not lines


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

    def merge(self, other: "BadRecords") -> None:
        """Add `other`'s counts to these; a reason's first location stays this one's if it has one."""
        for reason, count in other.counts.items():
            self.counts[reason] = self.counts.get(reason, 0) + count
            self.first.setdefault(reason, other.first[reason])

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def summary_lines(self) -> list[str]:
        """One line per reason: count and the first place it happened."""
        return [f"{reason}: {count} (first at {self.first[reason]})" for reason, count in sorted(self.counts.items())]


def iter_lines(paths: Iterable[Path], bad: BadRecords,
               max_line_bytes: int = MAX_RECORD_BYTES) -> Iterator[tuple[bytes, Location]]:
    """Non-blank lines (without the line break or a leading byte order mark) of every file, in order, with
    their location. File-level problems (empty file, truncated or corrupt gzip, I/O errors) are counted in
    `bad`, the lines before the damage kept; so is a line over `max_line_bytes` (`record too large`), which is
    read through in bounded pieces and skipped, never held whole."""
    for path in paths:
        name = str(path)
        records = 0
        try:
            for lineno, raw in iter_record_lines(path, max_line_bytes=max_line_bytes):
                if isinstance(raw, LongLine):
                    records += 1
                    bad.add(TOO_LARGE, Location(name, lineno), too_large(raw.nbytes, max_line_bytes))
                    continue
                # A byte order mark starts a file from a Windows tool, or a line when such files were
                # concatenated: dropped, so the raw line copied to the output is clean.
                line = raw.rstrip(b"\r\n").removeprefix(UTF8_BOM)
                if not line.strip():
                    continue  # blank lines (a trailing newline, padding) are not records
                records += 1
                yield line, Location(name, lineno)
        except DamagedFile as err:
            bad.add(err.reason, Location(name, err.line), err.detail)
            continue
        if records == 0:
            bad.add("empty file", Location(name, 1))


def parse_line(line: bytes, where: Location, text_column: str, bad: BadRecords) -> tuple[dict[str, Any], str] | None:
    """(record, text) of one JSON line, or None after counting it in `bad` under its reason (texts with NUL
    characters included: they are binary files)."""
    try:
        return parse_record_line(line, text_column, reject_nul_text=True, check_fields=True)
    except BadRecord as err:
        bad.add(err.reason, where, err.detail)
        return None


def iter_raw_records(
    paths: Iterable[Path], text_column: str = "content", bad: BadRecords | None = None,
    max_line_bytes: int = MAX_RECORD_BYTES,
) -> Iterator[tuple[bytes, dict[str, Any], str, Location]]:
    """(raw line, record, text, location) of every valid record; bad ones (and lines over `max_line_bytes`) are
    counted in `bad`.

    The raw line is what the writers copy to the output, so fields pass through byte for byte.
    """
    bad = bad if bad is not None else BadRecords()
    for line, where in iter_lines(paths, bad, max_line_bytes):
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

"""Reading the BigQuery export: every bad-record reason, --strict, and the shard writer (which files a path
names: tests/test_data_files.py)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from codeparrot.data.records import BadRecords, iter_raw_records, iter_records, iter_texts
from codeparrot.data.shards import ShardWriter
from codeparrot.errors import CodeParrotError


def _record(content, **extra) -> dict:
    return {"repo_name": "octo/repo", "path": "pkg/mod.py", "copies": "1", "size": "1234", "content": content,
            "license": "mit", **extra}


def _jsonl(path: Path, lines: list[bytes | str | dict], gz: bool = False) -> Path:
    data = b"".join((json.dumps(x).encode() if isinstance(x, dict) else x.encode() if isinstance(x, str) else x)
                    + b"\n" for x in lines)
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


def test_records_stream_with_locations_and_pass_through_fields(tmp_path):
    plain = _jsonl(tmp_path / "a.jsonl", [b"\xef\xbb\xbf" + json.dumps(_record("x = 1\n")).encode(), "",
                                          _record("y = 2\n", stars=5)])  # a byte order mark, a blank line
    packed = _jsonl(tmp_path / "b.json.gz", [_record("z = 3\r\n")], gz=True)
    bad = BadRecords()
    got = list(iter_records([plain, packed], bad=bad))
    assert [r["content"] for r, _ in got] == ["x = 1\n", "y = 2\n", "z = 3\r\n"]
    assert [str(w) for _, w in got] == [f"{plain}:1", f"{plain}:3", f"{packed}:1"]  # blank line 2 skipped
    assert got[1][0]["stars"] == 5 and bad.total == 0


def test_byte_order_marks_are_dropped_from_every_line(tmp_path):
    """Files from Windows tools start with a BOM; concatenated ones have it mid-file. The raw line that preprocess
    copies to its output is clean either way."""
    rows = [json.dumps(_record(f"v = {i}\n")).encode() for i in range(2)]
    src = _jsonl(tmp_path / "cat.jsonl", [b"\xef\xbb\xbf" + row for row in rows])
    bad = BadRecords()
    assert [line for line, *_ in iter_raw_records([src], bad=bad)] == rows and bad.total == 0


def test_every_bad_record_reason_is_counted_with_its_first_location(tmp_path):
    good = _record("print('ok')\n")
    lines = [
        good,
        '{"content": "def f(:',  # truncated JSON
        '["content", "a list"]',
        {"repo_name": "r", "path": "p"},  # no content
        _record(None), _record(42),
        b'{"content": "caf\xe9"}',  # Latin-1 byte: invalid UTF-8
        b'{"content": "a\x00b"}',  # raw NUL byte
        _record("binary\u0000blob"),  # escaped NUL in the text
        '{"content": "lone \\ud800 surrogate"}',
        _record("second malformed follows"),
        "{not json}",
        '{"content": "x", "n": ' + "1" * 5000 + "}",  # valid JSON, an integer past Python's 4,300-digit limit
        "[" * 100_000 + "]" * 100_000,  # valid JSON nested past the parser's recursion limit
    ]
    src = _jsonl(tmp_path / "mixed.jsonl", lines)
    empty = tmp_path / "empty.jsonl"
    empty.write_bytes(b"\n\n")
    bad = BadRecords()
    kept = list(iter_records([src, empty], bad=bad))
    assert len(kept) == 2
    assert bad.counts == {"malformed JSON": 4, "not a JSON object": 1, "missing text column": 1, "non-string text": 2,
                          "invalid UTF-8": 2, "NUL bytes": 2, "empty file": 1}
    assert bad.first["malformed JSON"].startswith(f"{src}:2 ")
    assert bad.first["non-string text"].startswith(f"{src}:5 ")
    assert bad.first["invalid UTF-8"].startswith(f"{src}:7 ")
    assert bad.first["empty file"].startswith(f"{empty}:")
    assert any("first at" in line and "mixed.jsonl:2" in line for line in bad.summary_lines())


def test_truncated_and_corrupt_gzip_keep_the_records_before_the_damage(tmp_path):
    data = b"".join(json.dumps(_record(f"v = {i}\n" * 50)).encode() + b"\n" for i in range(200))
    packed = gzip.compress(data)
    truncated = tmp_path / "cut.jsonl.gz"
    truncated.write_bytes(packed[: len(packed) // 2])
    corrupt = tmp_path / "corrupt.json.gz"
    corrupt.write_bytes(b"this is not gzip at all")
    bad = BadRecords()
    kept = list(iter_records([truncated, corrupt], bad=bad))
    assert 0 < len(kept) < 200
    assert [r["content"] for r, _ in kept] == [f"v = {i}\n" * 50 for i in range(len(kept))]
    assert bad.counts == {"truncated gzip": 1, "corrupt gzip": 1}


def test_strict_stops_at_the_first_bad_record_naming_file_and_line(tmp_path):
    src = _jsonl(tmp_path / "a.jsonl", [_record("ok\n"), _record("ok\n"), {"path": "no content"}])
    with pytest.raises(CodeParrotError, match=r"a\.jsonl:3.*missing text column.*--strict"):
        list(iter_records([src], strict=True))


def test_text_column_is_configurable(tmp_path):
    src = _jsonl(tmp_path / "a.jsonl", [{"text": "abc"}, {"content": "no text key"}])
    bad = BadRecords()
    assert [r["text"] for r, _ in iter_records([src], text_column="text", bad=bad)] == ["abc"]
    assert bad.counts == {"missing text column": 1}
    texts_bad = BadRecords()  # the texts alone (what the tokenizer trains on), counted alike
    assert list(iter_texts([src], text_column="text", bad=texts_bad)) == ["abc"]
    assert texts_bad.counts == {"missing text column": 1}


def test_shard_writer_splits_names_and_is_byte_deterministic(tmp_path):
    rows = [_record(f"x = {i}\n") for i in range(7)]
    outs = []
    for run in ("a", "b"):
        writer = ShardWriter(tmp_path / run, samples_per_file=3)
        for row in rows:
            writer.write_record(row)
        outs.append(writer.close())
    names = [p.name for p in outs[0]]
    assert names == ["file-000000000001.json.gz", "file-000000000002.json.gz", "file-000000000003.json.gz"]
    assert [p.read_bytes() for p in outs[0]] == [p.read_bytes() for p in outs[1]]  # no name or mtime in headers
    back = [json.loads(line) for p in outs[0] for line in gzip.open(p)]
    assert back == rows


def test_shard_writer_writes_nothing_for_no_rows(tmp_path):
    assert ShardWriter(tmp_path / "none").close() == []
    assert not (tmp_path / "none").exists()


def test_duplicate_keys_and_lone_surrogates_in_any_field_are_bad_records_where_lines_are_copied(tmp_path):
    """Preprocess copies each line to its output byte for byte: a key twice (which value is the text?) or a lone
    surrogate escape in any field (not only the text) makes `datasets.load_dataset("json")` refuse the whole shard,
    and a strict UTF-8 writer (duplicate_clusters.json) crash. Both are counted; a valid surrogate pair, an escaped
    backslash and a nested object with distinct keys stay. The training stream's parser keeps taking the last value."""
    from codeparrot.data.records import parse_record_line

    lines = [
        '{"content": "x = 1\\n", "content": "y = 2\\n"}',  # line 1: the text twice
        '{"content": "x = 3\\n", "meta": {"stars": 1, "stars": 2}}',  # line 2: a nested key twice
        '{"content": "x = 4\\n", "path": "caf\\udce9.py"}',  # line 3: a lone surrogate outside the text
        '{"content": "x = 5\\n", "\\ud800": 1}',  # line 4: ... in a key
        '{"content": "x = 6 \\ud83d\\ude00\\n", "path": "\\\\ud800.py", "meta": {"a": 1, "b": {"a": 2}}}',  # fine
    ]
    src = _jsonl(tmp_path / "a.jsonl", lines)
    bad = BadRecords()
    kept = list(iter_raw_records([src], bad=bad))
    assert [text for _, _, text, _ in kept] == ["x = 6 \U0001F600\n"]
    assert bad.counts == {"duplicate key": 2, "invalid UTF-8": 2}
    assert bad.first["duplicate key"] == f"{src}:1 ('content' twice in one object)"
    assert bad.first["invalid UTF-8"] == f"{src}:3 (unpaired surrogate in field 'path')"
    assert parse_record_line(lines[0].encode(), "content")[1] == "y = 2\n"  # the training stream: unchanged


def test_a_missing_text_column_message_stays_one_line_whatever_the_keys_hold(tmp_path):
    """The detail lists the record's keys; one holding a line break, an escape sequence or a lone surrogate is shown
    escaped, so --strict's error is still one line naming file:line (and printable on a strict UTF-8 terminal)."""
    src = _jsonl(tmp_path / "a.jsonl", ['{"a\\nb": 1, "\\u001b[2J": 2, "\\udce9": 3, "path": "p", "caf\\u00e9": 4}'])
    with pytest.raises(CodeParrotError) as err:
        list(iter_records([src], strict=True))
    message = str(err.value)
    assert message == (f"{src}:1 (no 'content' key; fields: '\\udce9', '\\x1b[2J', 'a\\nb', café, path): "
                       "missing text column (--strict stops at the first bad record)")
    message.encode("utf-8")


class _BoundedReads:
    """A data file read through `readline(size)` only, remembering the longest piece returned: what the reader held
    of a line at once (a plain `for line in file` or `readline()` would take a whole line, however long)."""

    def __init__(self, fh):
        self.fh, self.largest = fh, 0

    def readline(self, size: int = -1) -> bytes:
        assert size > 0, "a line read without a bound"
        piece = self.fh.readline(size)
        self.largest = max(self.largest, len(piece))
        return piece

    def __iter__(self):
        raise AssertionError("lines read whole")

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.fh.close()


@pytest.mark.parametrize("gz", [False, True])
def test_a_line_over_the_record_limit_is_a_bad_record_never_held_whole(tmp_path, monkeypatch, gz):
    """A multi-GB line (a corrupt export, a file without line breaks) must not be read into memory in one piece
    before it can be refused: it is read through in pieces no longer than the limit, counted as `record too large`
    at its file:line, and reading goes on at the next line. A line of exactly the limit (line break excluded) stays."""
    from codeparrot.data import records

    limit = 1000
    base = len(json.dumps(_record("")))
    at_limit = json.dumps(_record("a" * (limit - base))).encode()
    assert len(at_limit) == limit
    data = b"".join([
        json.dumps(_record("x = 1\n")).encode() + b"\n",
        b'{"content": "' + b"z" * (5 * limit) + b'"}\n',  # line 2: five times the limit
        at_limit + b"\r\n",  # line 3: exactly the limit, and a CRLF
        json.dumps(_record("b" * (limit - base + 1))).encode() + b"\n",  # line 4: one byte over
        json.dumps(_record("y = 2\n")).encode() + b"\n",
        b"q" * (3 * limit),  # line 6: the last line, over the limit, without a line break
    ])
    src = tmp_path / ("a.jsonl.gz" if gz else "a.jsonl")
    src.write_bytes(gzip.compress(data) if gz else data)
    opened: list[_BoundedReads] = []
    real_open = records.open_data_file
    monkeypatch.setattr(records, "open_data_file", lambda path: opened.append(_BoundedReads(real_open(path)))
                        or opened[-1])
    bad = BadRecords()
    kept = list(iter_raw_records([src], bad=bad, max_line_bytes=limit))
    assert [where.line for *_, where in kept] == [1, 3, 5]
    assert kept[1][0] == at_limit  # copied byte for byte, line break dropped
    assert bad.counts == {"record too large": 3}
    assert bad.first["record too large"] == f"{src}:2 ({5 * limit + 15:,} bytes, over the 1,000-byte limit)"
    assert opened[0].largest <= limit + 2  # never more of a line at once than the limit and its line break


def test_numbers_no_64_bit_column_holds_are_bad_records_where_lines_are_copied(tmp_path):
    """`"size": 1e400` parses in Python as inf, and a 20-digit `copies` as an exact int; copied to the output,
    the first makes `datasets.load_dataset("json")` fail the shard and the second comes back as an inexact float.
    Counted with file:line wherever the number sits; the int64 and float64 limits themselves are kept, and the
    training stream's parser (which copies nothing) is unchanged."""
    from codeparrot.data.records import BadRecord, parse_record_line

    lines = [
        '{"content": "x = 1\\n", "size": 1e400}',
        '{"content": "x = 2\\n", "copies": 100000000000000000000}',
        '{"content": "x = 3\\n", "meta": {"n": [-1e999]}}',
        '{"content": "x = 4\\n", "size": -9223372036854775809}',
        '{"content": "x = 5\\n", "size": 9223372036854775807, "copies": -9223372036854775808, "f": 1.7e308}',
        '{"content": "x = 6\\n", "copies": 1' + "0" * 60 + "}",
    ]
    src = _jsonl(tmp_path / "a.jsonl", lines)
    bad = BadRecords()
    assert [text for _, _, text, _ in iter_raw_records([src], bad=bad)] == ["x = 5\n"]
    assert bad.counts == {"number out of range": 5}
    assert bad.first["number out of range"] == f"{src}:1 (1e400 does not fit a 64-bit float)"
    with pytest.raises(BadRecord, match=r"^number out of range \(100000000000\.\.\. \(61 characters\) does not fit a "
                                        r"64-bit integer\)$"):  # a long number is shown cut: the message stays short
        parse_record_line(lines[-1].encode(), "content", check_fields=True)
    with pytest.raises(CodeParrotError, match=r"a\.jsonl:1 \(1e400 .*\): number out of range \(--strict"):
        list(iter_records([src], strict=True))
    assert parse_record_line(lines[0].encode(), "content")[0]["size"] == float("inf")  # the training stream

"""Which files a path names (one rule for preprocess, tokenizer, pretokenize and training) and the strict line
reader/parser the training stream uses."""

from __future__ import annotations

import gzip
import json
import os
import re
from pathlib import Path

import pytest

from codeparrot.data.records import BadRecord, iter_record_lines, parse_record_line, resolve_data_files, split_files_for
from codeparrot.errors import CodeParrotError


def _touch(root: Path, *names: str) -> None:
    for name in names:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(b"")


def test_files_dirs_globs_in_sorted_order(tmp_path):
    _touch(tmp_path, "b/z.jsonl", "b/a.json.gz", "b/nested/c.jsonl.gz", "b/notes.txt", ".hidden.tmp-1/x.jsonl",
           "b/.y.jsonl", "top.json")
    got = resolve_data_files([str(tmp_path / "b")])  # recursive; hidden files and folders skipped
    assert got == [tmp_path / "b/a.json.gz", tmp_path / "b/nested/c.jsonl.gz", tmp_path / "b/z.jsonl"]
    # a glob, a file, and the same file again through the directory: each read once, order kept
    got = resolve_data_files([str(tmp_path / "*.json"), str(tmp_path / "b/z.jsonl"), str(tmp_path / "b")])
    assert got[:2] == [tmp_path / "top.json", tmp_path / "b/z.jsonl"] and len(got) == 4
    assert tmp_path / ".hidden.tmp-1/x.jsonl" not in resolve_data_files([str(tmp_path)])
    assert tmp_path / "b/notes.txt" not in resolve_data_files([str(tmp_path / "b/*")])  # a glob takes data files only
    assert resolve_data_files(str(tmp_path / "b/notes.txt")) == [tmp_path / "b/notes.txt"]  # named: any suffix
    assert resolve_data_files(tmp_path / "b" / "nested") == [tmp_path / "b/nested/c.jsonl.gz"]  # one PathLike
    # a glob that matches folders takes their data files
    assert resolve_data_files(str(tmp_path / "b/nest*")) == [tmp_path / "b/nested/c.jsonl.gz"]


@pytest.mark.parametrize("spec, message", [("missing.jsonl", "input not found: .*missing.jsonl"),
                                           ("*.nothing", r"no input files match .*\*\.nothing"),
                                           ("emptydir", "no input files .* in .*emptydir")])
def test_errors_are_one_line_and_name_the_path(tmp_path, spec, message):
    (tmp_path / "emptydir").mkdir()
    _touch(tmp_path, "emptydir/readme.txt")
    with pytest.raises(CodeParrotError, match=message) as err:
        resolve_data_files([str(tmp_path / spec)])
    assert "\n" not in str(err.value)


def test_nothing_given_is_an_error():
    with pytest.raises(CodeParrotError, match="no input given"):
        resolve_data_files([])


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads every file")
def test_unreadable_file_is_named(tmp_path):
    _touch(tmp_path, "a.jsonl")
    (tmp_path / "a.jsonl").chmod(0)
    with pytest.raises(CodeParrotError, match="not readable: .*a.jsonl"):
        resolve_data_files(str(tmp_path))


def test_a_folder_that_cannot_be_listed_is_named_not_skipped(tmp_path, monkeypatch):
    """os.walk skips a folder it cannot list: its files would silently be missing from the run (and, not as root,
    the preprocess-output check beside it raised a PermissionError traceback). Simulated for root, who lists all."""
    _touch(tmp_path, "in/a/x.jsonl", "in/locked/y.jsonl")
    locked, scandir = tmp_path / "in" / "locked", os.scandir

    def refusing_scandir(path="."):
        if Path(path) == locked:
            raise PermissionError(13, "Permission denied", str(path))
        return scandir(path)

    monkeypatch.setattr(os, "scandir", refusing_scandir)
    with pytest.raises(CodeParrotError, match=re.escape(f"input folder is not readable: {locked} (Permission denied)")):
        resolve_data_files(tmp_path / "in")


def _refusing(monkeypatch, locked: Path) -> None:
    """As for a user without permissions on `locked`: listing it and looking up a name inside it both fail (root,
    who reads every folder, gets the errors simulated)."""
    scandir, lstat = os.scandir, os.lstat

    def refusing_scandir(path="."):
        if Path(path) == locked:
            raise PermissionError(13, "Permission denied", str(path))
        return scandir(path)

    def refusing_lstat(path, *args, **kwargs):
        if Path(path).parent == locked:
            raise PermissionError(13, "Permission denied", str(path))
        return lstat(path, *args, **kwargs)

    monkeypatch.setattr(os, "scandir", refusing_scandir)
    monkeypatch.setattr(os, "lstat", refusing_lstat)


@pytest.mark.parametrize("pattern", ["**/*.jsonl", "*/*.jsonl", "lock*/*", "*/y.jsonl"])
def test_a_folder_a_glob_cannot_read_is_named_not_skipped(tmp_path, monkeypatch, pattern):
    """glob.glob drops a folder it cannot list or search without a word: `in/**/*.jsonl` read in/a/ and silently
    lost every file of in/locked/. It is the one-line error of that folder given by name."""
    _touch(tmp_path, "in/a/x.jsonl", "in/a/y.jsonl", "in/locked/y.jsonl")
    locked = tmp_path / "in" / "locked"
    _refusing(monkeypatch, locked)
    with pytest.raises(CodeParrotError, match=re.escape(f"input folder is not readable: {locked} (Permission denied)")):
        resolve_data_files(str(tmp_path / "in" / pattern))


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads every folder")
def test_a_glob_over_a_folder_without_permissions_fails_naming_it(tmp_path):
    _touch(tmp_path, "in/a/x.jsonl", "in/locked/y.jsonl")
    locked = tmp_path / "in" / "locked"
    locked.chmod(0)
    try:
        for pattern in ("**/*.jsonl", "*/y.jsonl"):
            with pytest.raises(CodeParrotError, match=re.escape(f"input folder is not readable: {locked} (")):
                resolve_data_files(str(tmp_path / "in" / pattern))
    finally:
        locked.chmod(0o755)  # so that pytest can remove tmp_path


def test_globs_match_what_glob_matches(tmp_path, monkeypatch):
    """The glob expansion that reports unreadable folders matches exactly what glob.glob(recursive=True) matches:
    `**` at any depth, hidden names only for a pattern starting with a dot, a trailing slash for folders only,
    links to folders followed."""
    import glob

    from codeparrot.data.record_paths import glob_paths

    _touch(tmp_path, "a/x.jsonl", "a/.h.jsonl", "a/b/y.jsonl", "a/b/c/z.json.gz", ".hid/w.jsonl", "top.json")
    (tmp_path / "link").symlink_to(tmp_path / "a")
    (tmp_path / "broken.jsonl").symlink_to(tmp_path / "nowhere")
    monkeypatch.chdir(tmp_path)
    for pattern in ("**", "**/*.jsonl", "a/**", "*/", "**/", ".*/*", "*/*/?.json*", "[al]*/**/*.json*",
                    "**/.h.jsonl", "*", "nothing/*", f"{tmp_path}/**/*.gz", "a/*/c/"):
        assert glob_paths(pattern) == sorted(glob.glob(pattern, recursive=True)), pattern


def test_preprocess_root_stands_for_one_split_never_both(tmp_path):
    """A preprocess output (train/, valid/, stats.json) read whole would mix the splits and parse stats.json."""
    root = tmp_path / "clean"
    _touch(root, "train/file-000000000001.json.gz", "train/file-000000000002.json.gz",
           "valid/file-000000000001.json.gz", "stats.json", "duplicate_clusters.json")
    with pytest.raises(CodeParrotError, match=r"clean is a preprocess output with subfolders train, valid: pass one "
                                              r"of them \(e\.g\. .*clean/train\)"):
        resolve_data_files(root)
    train = [root / "train/file-000000000001.json.gz", root / "train/file-000000000002.json.gz"]
    assert resolve_data_files(root, split="train") == train
    assert resolve_data_files([str(root), str(root / "train")], split="train") == train  # de-duplicated
    assert resolve_data_files(root, split="valid") == [root / "valid/file-000000000001.json.gz"]
    with pytest.raises(CodeParrotError, match="subfolders train, valid"):  # through a glob as well
        resolve_data_files(str(tmp_path / "cl*"))
    # the split folders themselves are ordinary folders
    assert resolve_data_files(root / "train") == train


def test_split_files_for_finds_the_companion_split(tmp_path):
    root = tmp_path / "clean"
    _touch(root, "train/a.json.gz", "valid/b.json.gz", "other/c.json.gz")
    assert split_files_for(root, "valid") == [root / "valid/b.json.gz"]  # the root's valid/
    assert split_files_for(root / "train", "valid") == [root / "valid/b.json.gz"]  # train/'s sibling
    assert split_files_for(root / "other", "valid") is None  # not a split folder: no sibling taken
    assert split_files_for(root / "train" / "a.json.gz", "valid") is None
    (root / "valid" / "b.json.gz").unlink()
    assert split_files_for(root, "valid") is None  # an empty valid/ is none


def test_record_lines_skip_blanks_resume_and_name_damage(tmp_path):
    path = tmp_path / "a.jsonl.gz"
    data = b'{"content": "a"}\n\n  \n{"content": "b"}\n{"content": "c"}\n'
    path.write_bytes(gzip.compress(data))
    assert [n for n, _ in iter_record_lines(path)] == [1, 4, 5]
    assert [(n, raw) for n, raw in iter_record_lines(path, start_line=4)] == [(5, b'{"content": "c"}\n')]
    assert list(iter_record_lines(path, start_line=5)) == []
    with pytest.raises(CodeParrotError, match=r"a.jsonl.gz: has fewer than 6 lines"):
        list(iter_record_lines(path, start_line=6))
    big = b"".join(json.dumps({"content": f"x = {i}\n" * 20}).encode() + b"\n" for i in range(500))
    packed = gzip.compress(big)
    path.write_bytes(packed[: len(packed) // 2])
    got = []
    with pytest.raises(CodeParrotError, match=r"a.jsonl.gz: truncated or corrupt after line \d+") as err:
        for n, _ in iter_record_lines(path):
            got.append(n)
    assert got and f"after line {got[-1]} " in str(err.value)  # the lines before the damage were read
    with pytest.raises(CodeParrotError, match="missing.jsonl: cannot read"):
        list(iter_record_lines(tmp_path / "missing.jsonl"))


def test_parse_record_line_reasons_and_options():
    assert parse_record_line(b'\xef\xbb\xbf{"content": "x"}\n', "content") == ({"content": "x"}, "x")
    record, text = parse_record_line('{"content": "café 😀", "path": "p"}'.encode(), "content")
    assert text == "café 😀" and record["path"] == "p"
    # U+0000 in a text: kept by default (the training stream), refused when asked (preprocess)
    assert parse_record_line(b'{"content": "a\\u0000b"}', "content")[1] == "a\x00b"
    cases = [
        (b'{"content": "a\\u0000b"}', True, "NUL bytes", ""),
        (b'{"content": "a\x00b"}', False, "NUL bytes", ""),
        (b'{"content": "caf\xe9"}', False, "invalid UTF-8", "byte 16"),
        (b'{"content": "lone \\ud800"}', False, "invalid UTF-8", "unpaired surrogate at character 5"),
        (b'{"content": ', False, "malformed JSON", "Expecting value: column 13"),
        (b'[1, 2]', False, "not a JSON object", "list"),
        (b'{"text": "x", "path": "p"}', False, "missing text column", "no 'content' key; fields: path, text"),
        (b'{"content": null}', False, "non-string text", "'content' is NoneType"),
    ]
    for line, reject_nul, reason, detail in cases:
        with pytest.raises(BadRecord) as err:
            parse_record_line(line, "content", reject_nul_text=reject_nul)
        assert (err.value.reason, err.value.detail) == (reason, detail), line
    many = json.dumps({f"k{i:02d}": i for i in range(20)}).encode()
    with pytest.raises(BadRecord, match=r"fields: k00, k01, .*k07, \.\.\. \(20 in all\)"):
        parse_record_line(many, "content")


def test_a_preprocess_output_inside_an_input_folder_is_an_error_not_more_input(tmp_path):
    """`--output-dir` inside an input folder: the next run would read the output's shards back, and its stats.json
    as a bad record, mixing both splits into the new output."""
    _touch(tmp_path, "code/a.jsonl", "code/out/train/file-000001.json.gz", "code/out/valid/file-000001.json.gz",
           "code/out/stats.json", "code/more/b.jsonl")
    with pytest.raises(CodeParrotError, match=r"code holds a preprocess output, .*code/out: pass its train or valid "
                                              r"folder on its own, or move it out"):
        resolve_data_files([str(tmp_path / "code")])
    os.remove(tmp_path / "code/out/stats.json")  # a folder merely named train/ beside data is just data
    assert len(resolve_data_files([str(tmp_path / "code")])) == 4

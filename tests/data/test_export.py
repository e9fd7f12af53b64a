"""export_local: the BigQuery export format exactly, the size window, skips with counts, order, shards, atomicity."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sysconfig
from pathlib import Path

import pytest

from codeparrot.data.export import export_local
from codeparrot.errors import CodeParrotError


def _read(out: Path) -> list[dict]:
    return [json.loads(line) for shard in sorted(out.glob("file-*.json.gz")) for line in gzip.open(shard)]


def _code(n_bytes: int, seed: str = "x") -> bytes:
    line = f"{seed} = 1  # filler\n".encode()
    body = line * (n_bytes // len(line) + 1)
    return body[:n_bytes - 1] + b"\n"


@pytest.fixture
def tree(tmp_path) -> Path:
    root = tmp_path / "myrepo"
    (root / "pkg" / "sub").mkdir(parents=True)
    (root / ".git").mkdir()
    (root / "lib" / "site-packages").mkdir(parents=True)
    files = {
        "setup.py": _code(1024),  # the smallest size in the window
        "pkg/__init__.py": _code(1023),  # one byte too small
        "pkg/big.py": _code(1048575),  # the largest size in the window
        "pkg/huge.py": _code(1048576),  # one byte too large
        "pkg/sub/b.py": _code(2000, "b"),
        "pkg/sub/a.py": _code(3000, "a"),
        "pkg/notes.txt": _code(2000),  # not .py
        "pkg/latin1.py": b"# caf\xe9\n" + _code(2000),  # not UTF-8
        ".git/hook.py": _code(2000),  # hidden folder
        "lib/site-packages/third.py": _code(2000),  # installed third-party code
    }
    for name, data in files.items():
        (root / name).write_bytes(data)
    os.symlink(root / "setup.py", root / "pkg" / "link.py")  # symlinks are not followed
    return root


def test_export_writes_the_bigquery_format(tree, tmp_path):
    stats = export_local([tree], tmp_path / "raw", progress=False)
    rows = _read(tmp_path / "raw")
    assert [r["path"] for r in rows] == ["setup.py", "pkg/big.py", "pkg/sub/a.py", "pkg/sub/b.py"]  # sorted walk
    for row in rows:
        assert list(row) == ["repo_name", "path", "copies", "size", "content", "license"]
        data = (tree / row["path"]).read_bytes()
        assert row["repo_name"] == "myrepo" and row["copies"] == "1" and row["license"] == "unknown"
        assert row["size"] == str(len(data)) and row["content"] == data.decode()  # INT64 as string, like BigQuery
    assert stats.files_written == 4
    assert stats.skipped == {"outside size window": 2, "not UTF-8": 1}
    assert stats.first_skipped["not UTF-8"] == str(tree.resolve() / "pkg" / "latin1.py")  # the summary names it


def test_export_shards_and_repo_per_subfolder(tree, tmp_path):
    export_local([tree], tmp_path / "raw", samples_per_file=3, repo_per_subfolder=True, progress=False)
    assert sorted(p.name for p in (tmp_path / "raw").iterdir()) == ["file-000000000001.json.gz",
                                                                    "file-000000000002.json.gz"]
    rows = _read(tmp_path / "raw")
    assert [(r["repo_name"], r["path"]) for r in rows] == [("myrepo", "setup.py"), ("pkg", "big.py"),
                                                            ("pkg", "sub/a.py"), ("pkg", "sub/b.py")]


def test_export_skips_and_counts_a_file_name_that_is_not_utf8(tree, tmp_path):
    """Linux file names are bytes; one that is not UTF-8 reaches Python as lone surrogates, which no UTF-8 JSON
    line can hold: skipped and counted, not a traceback after the walk."""
    try:
        (tree / "pkg" / os.fsdecode(b"caf\xe9.py")).write_bytes(_code(2000))
    except (OSError, UnicodeEncodeError):
        pytest.skip("this file system does not take non-UTF-8 file names")
    stats = export_local([tree], tmp_path / "raw", progress=False)
    assert stats.files_written == 4 and stats.skipped["name not UTF-8"] == 1
    assert [r["path"] for r in _read(tmp_path / "raw")] == ["setup.py", "pkg/big.py", "pkg/sub/a.py", "pkg/sub/b.py"]


def test_export_is_deterministic(tree, tmp_path):
    export_local([tree], tmp_path / "one", progress=False)
    export_local([tree], tmp_path / "two", progress=False)
    assert (tmp_path / "one/file-000000000001.json.gz").read_bytes() == (tmp_path / "two/file-000000000001.json.gz").read_bytes()


def test_export_errors_leave_nothing_behind(tree, tmp_path):
    with pytest.raises(CodeParrotError, match="source folder not found"):
        export_local([tmp_path / "missing"], tmp_path / "out", progress=False)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(CodeParrotError, match=r"no \.py files"):
        export_local([empty], tmp_path / "out", progress=False)
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "thesis.tex").write_text("years of work")
    with pytest.raises(CodeParrotError, match="refusing to replace"):
        export_local([tree], precious, progress=False)
    assert (precious / "thesis.tex").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty", "myrepo", "precious"]  # no temp folders


def test_cli_exports_the_standard_library_by_default(tmp_path, python, scripts_env, repo_root):
    out = subprocess.run([python, str(repo_root / "scripts/export_local.py"), "--output-dir", str(tmp_path / "raw"),
                          "--no-progress"], env=scripts_env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    rows = _read(tmp_path / "raw")
    assert 1000 < len(rows) < 2500  # about 1,450 on CPython 3.11
    assert {r["repo_name"] for r in rows} == {Path(sysconfig.get_paths()["stdlib"]).name}  # e.g. "python3.11"
    assert any(r["path"] == "json/decoder.py" for r in rows)
    assert not any("site-packages" in r["path"] for r in rows)
    assert f"exported {len(rows)} files" in out.stdout


def test_cli_errors_are_one_line(tmp_path, python, scripts_env, repo_root):
    out = subprocess.run([python, str(repo_root / "scripts/export_local.py"), str(tmp_path / "nope"),
                          "--output-dir", str(tmp_path / "raw")], env=scripts_env, capture_output=True, text=True)
    assert out.returncode == 2
    assert out.stderr.strip().count("\n") == 0 and "source folder not found" in out.stderr

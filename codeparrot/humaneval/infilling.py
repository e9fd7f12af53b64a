"""HumanEval's infilling benchmarks (single-line: 1,033 tasks, multi-line: 5,815), derived from the problems'
canonical solutions, and how a completed middle is scored and compared.

The derivation (InCoder, Fried et al. 2022; the FIM paper's openai/human-eval-infilling data, Bavarian et al.
2022), per problem:
  - the canonical solution without its trailing whitespace is split into lines (blank lines included, and
    counted in the line numbers);
  - single-line: every non-blank line is a task's middle;
  - multi-line: every span of consecutive lines that starts and ends on a non-blank line is one (a single
    non-blank line included; the spans InCoder skips are exactly the all-blank ones and, as the published data
    has it, those starting or ending on a blank line);
  - the middle is its lines with their newlines; the task's prompt is the problem's prompt plus the solution
    before the middle, its suffix the rest of the solution, so prompt + middle + suffix is always exactly the
    problem's prompt + canonical solution.
Over the 164 problems of the human-eval package that gives the published 1,033 and 5,815 tasks. Task ids
follow the published data: `SingleLineInfilling/HumanEval/0/L3`, `MultiLineInfilling/HumanEval/0/L0_L7`
(line numbers of the stripped solution, first and last line of the middle).

Scoring: a middle is executed as `prompt + middle + suffix` with the problem's test, in the same sandbox and
through the same scorer as HumanEval (`scoring.score`, unchanged): the scorer is handed the problem's own
prompt, which the trusted checker runs alone for the helpers a test needs (e.g. `poly`), and as the completion
the rest: the solution before the middle, the middle, the suffix. (A task's prompt often ends inside a block
and would not run alone.) Exact match is the stripped middle equal to the stripped canonical middle (what
SantaCoder reports, as the BigCode evaluation harness computes it).
"""

from __future__ import annotations

from typing import Sequence

from codeparrot.errors import CodeParrotError
from codeparrot.humaneval.problems import temperature_label

HUMANEVAL = "humaneval"
BENCHMARKS = {"single-line": "SingleLineInfilling", "multi-line": "MultiLineInfilling"}  # name -> task id prefix
PUBLISHED_TASKS = {"single-line": 1033, "multi-line": 5815}  # on the human-eval package's 164 problems


def _line_spans(solution: str) -> list[tuple[int, int, bool]]:
    """(start, end, non-blank) character offsets of each line of the solution without its trailing whitespace;
    `end` includes the line's newline when the solution has one there."""
    lines = solution.rstrip().split("\n")
    spans, start = [], 0
    for line in lines:
        end = min(start + len(line) + 1, len(solution))
        spans.append((start, end, bool(line.strip())))
        start += len(line) + 1
    return spans


def infilling_tasks(problems: Sequence[dict], benchmark: str) -> list[dict]:
    """The tasks of `benchmark` ("single-line" or "multi-line") in problem order, then middle order: dicts with
    task_id, prompt (text before the middle), suffix, canonical_solution (the middle), test, entry_point, and
    base (the problem's task_id) and head (the solution's text before the middle, for scoring)."""
    if benchmark not in BENCHMARKS:
        raise CodeParrotError(f"unknown infilling benchmark {benchmark!r} (known: {', '.join(BENCHMARKS)})")
    name, tasks = BENCHMARKS[benchmark], []
    for p in problems:
        solution = p.get("canonical_solution")
        if not isinstance(solution, str):
            raise CodeParrotError(f"{p['task_id']} has no canonical_solution: the infilling tasks are derived from it")
        lines = _line_spans(solution)
        marked = [i for i, (_, _, nonblank) in enumerate(lines) if nonblank]
        if benchmark == "single-line":
            spans = [(i, i) for i in marked]
        else:
            spans = [(i, j) for n, i in enumerate(marked) for j in marked[n:]]
        for i, j in spans:
            start, end = lines[i][0], lines[j][1]
            label = f"L{i}" if benchmark == "single-line" else f"L{i}_L{j}"
            tasks.append({"task_id": f"{name}/{p['task_id']}/{label}", "prompt": p["prompt"] + solution[:start],
                          "suffix": solution[end:], "canonical_solution": solution[start:end], "test": p["test"],
                          "entry_point": p["entry_point"], "base": p["task_id"], "head": solution[:start]})
    return tasks


def scoring_inputs(tasks: Sequence[dict], samples: Sequence[dict], problems: Sequence[dict]
                   ) -> tuple[list[dict], list[dict]]:
    """(problems, samples) for `scoring.score`: per task its problem's own prompt, test and entry point under the
    task's id, and per sample the completion head + middle + suffix (never stripped), so the executed program
    is exactly task prompt + middle + suffix (module docstring)."""
    base = {p["task_id"]: p for p in problems}
    by_id = {t["task_id"]: t for t in tasks}
    scoring_problems = [{"task_id": t["task_id"], "prompt": base[t["base"]]["prompt"], "test": t["test"],
                         "entry_point": t["entry_point"]} for t in tasks]
    scoring_samples = []
    for s in samples:
        task = by_id[s["task_id"]]
        scoring_samples.append({**s, "completion": task["head"] + s["completion"] + task["suffix"],
                                "strip_prompt": False})
    return scoring_problems, scoring_samples


def exact_match(tasks: Sequence[dict], samples: Sequence[dict]) -> dict[str, dict]:
    """Per temperature label: the fraction of samples whose middle, stripped, equals the canonical middle,
    stripped (and how many samples that is over)."""
    middle = {t["task_id"]: t["canonical_solution"].strip() for t in tasks}
    counts: dict[str, list[int]] = {}
    for s in samples:
        hit = counts.setdefault(temperature_label(s["temperature"]), [0, 0])
        hit[0] += s["completion"].strip() == middle[s["task_id"]]
        hit[1] += 1
    return {label: {"exact_match": c / n, "matched": c, "samples": n} for label, (c, n) in counts.items()}

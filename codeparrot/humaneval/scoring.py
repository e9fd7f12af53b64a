"""HumanEval end to end: problems, samples (generated or given), sandboxed execution, pass@k, results.json.

`run(config)` (a `HumanEvalConfig`) is what `scripts/human_eval.py` calls. Three sources of completions:
- a model (`--model REPO [--revision REV]`): sampled under Accelerate, tasks dealt to the processes, each
  rank appending to `<samples>.part-<rank>`, rank 0 merging them into the samples JSONL (resumable: a rerun
  skips every (task_id, temperature, sample_index) already there, parts included);
- `--completions FILE.jsonl` (human-eval's samples format: task_id, completion; temperature optional);
- `--canonical`: the problems' own solutions (a scorer self-check: pass@1 must be 1.0).

Every requested task is accounted for: pass@k is the mean over all of them. A task without samples is an
error unless partial scoring is asked for (`--allow-missing-tasks`), and then it counts as failed and the
results say how many such tasks there are. A (task_id, temperature, sample_index) given twice in a
completions file is an error: it would count twice.

Nothing executes without `--allow-code-execution` or CODEPARROT_ALLOW_CODE_EXECUTION=1: the samples are
saved and the command that scores them is printed.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Sequence

from tqdm.auto import tqdm

from codeparrot.atomic_io import atomic_write_json, atomic_write_text, ensure_writable_file
from codeparrot.errors import CodeParrotError, first_line
from codeparrot.humaneval.config import HumanEvalConfig
from codeparrot.humaneval.pass_at_k import best_per_k, format_table, pass_at_k_table
from codeparrot.humaneval.problems import (
    answer_paths,
    default_problems_file,
    load_problems,
    read_samples,
    temperature_label,
)
from codeparrot.sandbox import ALLOW_ENV, Program, Sandbox, SandboxConfig, code_execution_allowed, describe_layers


def tasks_without_samples(samples: Sequence[dict], problems: Sequence[dict]) -> dict[str, list[str]]:
    """Per temperature label present in `samples`: the requested tasks that have none, in problem order."""
    have = defaultdict(set)
    for s in samples:
        have[_label(s["temperature"])].add(s["task_id"])
    return {label: [p["task_id"] for p in problems if p["task_id"] not in tasks] for label, tasks in have.items()}


def _missing_error(missing: dict[str, list[str]], total: int, where: str) -> CodeParrotError | None:
    label, tasks = max(missing.items(), key=lambda item: len(item[1]), default=(None, []))
    if not tasks:
        return None
    at = "" if label == "none" else f" at temperature {label}"
    return CodeParrotError(f"{where}: {len(tasks)} of {total} requested tasks have no samples{at} (first: "
                           f"{tasks[0]}); pass --allow-missing-tasks (allow_missing=True) to score them as failed, "
                           f"or request fewer tasks (--num-tasks / --problems)")


# ---------------------------------------------------------------------------------------------- scoring
def score(problems: Sequence[dict], samples: Sequence[dict], config: SandboxConfig, num_workers: int | None,
          ks: Sequence[int], log_file: Path | None = None, dedup: bool = True, progress: bool = True,
          allow_missing: bool = False) -> dict:
    """Execute every sample in the sandbox; pass@k per temperature over every task of `problems`, the
    best per k, per-task counts.

    A task of `problems` without samples at some temperature is an error, unless `allow_missing`: then it
    counts as failed (n = 0 in `per_task`, `tasks_without_samples` in each pass@k entry). With `dedup`,
    identical (task, completion) pairs run once and share the verdict (at low temperature most samples
    repeat). Each sample's verdict goes to `log_file` (JSONL) when given.

    The answer key (the problems and samples files this process read, the human_eval package's data) is
    hidden from the programs (`SandboxConfig.answer_paths`); a sandbox mode that cannot hide it refuses to
    start unless `allow_reachable_answers`, and then `answer_key.reachable` in the results says why.
    """

    missing = tasks_without_samples(samples, problems)
    if not allow_missing and (err := _missing_error(missing, len(problems), "score")):
        raise err

    by_id = {p["task_id"]: p for p in problems}
    distinct: dict[tuple[str, str], int] = {}
    programs, which = [], []
    for s in samples:
        key = (s["task_id"], bool(s.get("strip_prompt")), s["completion"]) + (() if dedup else (len(which),))
        if key not in distinct:
            p = by_id[s["task_id"]]
            distinct[key] = len(programs)
            # The completion continues the prompt the model saw: stripped (CodeParrot's protocol) when our
            # generator says so, else the problem's prompt as is (human-eval's samples format).
            prompt = p["prompt"].strip() if s.get("strip_prompt") else p["prompt"]
            programs.append(Program(prompt, s["completion"], p["test"], p["entry_point"]))
        which.append(distinct[key])
    config = dataclasses.replace(config, answer_paths=sorted({*config.answer_paths, *answer_paths()}))
    start = time.perf_counter()
    with Sandbox(config, num_workers=num_workers) as sandbox:
        layers = sandbox.start()
        num_workers = sandbox.num_workers
        bar = tqdm(total=len(programs), unit="prog", desc="execute", disable=None if progress else True,
                   dynamic_ncols=True)  # None: no bar where stderr is not a terminal (a log file)
        results = sandbox.run(programs, on_result=lambda i, r: bar.update(1))
        bar.close()
    seconds = time.perf_counter() - start
    # A harness-side failure on one program is that sample's "error" (counted as not passed, reason kept in
    # the executions log); the other samples are still scored and the results written.
    errors = [r for r in results if r.status == "error"]
    in_process = sum(1 for r in results if r.checker.startswith("in-process"))
    # Tests whose calls may still depend on the answers (see codeparrot/sandbox/rewrite.py): named, per task.
    answer_dependent = {s["task_id"]: results[i].checker.split("answer-dependent calls: ", 1)[1]
                        for s, i in zip(samples, which) if "answer-dependent calls: " in results[i].checker}
    counts: dict[str, dict[str, list[int]]] = defaultdict(lambda: defaultdict(lambda: [0, 0]))
    for label, tasks in missing.items():
        for task in tasks:
            counts[label][task] = [0, 0]  # requested, no samples: counted as failed
    statuses = Counter()
    lines = []
    for s, i in zip(samples, which):
        r = results[i]
        label = _label(s["temperature"])
        counts[label][s["task_id"]][0] += 1
        counts[label][s["task_id"]][1] += r.passed
        statuses[r.status] += 1
        lines.append(json.dumps({"task_id": s["task_id"], "temperature": s["temperature"],
                                 "sample_index": s["sample_index"], "status": r.status, "detail": r.detail,
                                 "checker": r.checker}))
    if log_file is not None:
        atomic_write_text(log_file, "\n".join(lines) + "\n")
    tables = {label: pass_at_k_table({t: tuple(nc) for t, nc in per_task.items()}, ks)
              for label, per_task in counts.items()}
    return {
        "pass_at_k": tables,
        "best": best_per_k(tables),
        "per_task": {label: {t: {"n": n, "passed": c} for t, (n, c) in per_task.items()}
                     for label, per_task in counts.items()},
        "status_counts": dict(statuses),
        # The sandbox's own failures (never a program's exit status or output); each program ran once.
        "sandbox_errors": {"programs": len(errors), "first": errors[0].detail if errors else None},
        "answer_dependent_tests": answer_dependent,
        "checked_in_process": in_process,  # verdicts decided beside the program (integrity best effort)
        # Its host paths, the layers that hide them from programs, and why nothing does ("" when hidden).
        "answer_key": {k: layers["answer_key"][k] for k in ("paths", "hidden_by", "reachable")},
        "execution": {"samples": len(samples), "programs_run": len(programs), "seconds": round(seconds, 2),
                      "programs_per_s": round(len(programs) / max(seconds, 1e-9), 1),
                      "num_workers": num_workers, "timeout_s": config.timeout,
                      "sandbox": describe_layers(layers), "sandbox_layers": layers},
    }


_label = temperature_label


# -------------------------------------------------------------------------------------------------- run
def samples_path(config: HumanEvalConfig) -> Path:
    """The samples JSONL: --samples-file, else <output>.samples.jsonl."""
    if config.samples_file:
        return Path(config.samples_file)
    out = Path(config.output)
    return out.with_name(out.stem + ".samples.jsonl")


def executions_path(config: HumanEvalConfig) -> Path:
    """The executions log: every sample's verdict, <output>.executions.jsonl."""
    out = Path(config.output)
    return out.with_name(out.stem + ".executions.jsonl")


def check_outputs(config: HumanEvalConfig) -> None:
    """Before any generation or execution (hours, for a model): the files this run writes can be written (the
    results and the executions log beside them; the samples, unless they come from --completions). One line
    otherwise, instead of a traceback after the work."""
    ensure_writable_file(config.output, what="results JSON")
    if not config.completions:
        flag = "--samples-file" if config.samples_file else "the samples file"
        ensure_writable_file(samples_path(config), flag, what="samples JSONL")


def report_sandbox_errors(scored: dict, config: HumanEvalConfig) -> None:
    """Say so when the sandbox itself failed to run samples (a killed worker, a setup error; never a program's own
    failure): they count as failed, so the score does not measure those programs. A warning on stderr when some
    did; when every sample did, a `CodeParrotError` (exit status 2): a 0% that measures nothing is no result,
    and a script or CI job must not take it for one. The results are written before either."""
    failed = scored["status_counts"].get("error", 0)
    if not failed:
        return
    total = scored["execution"]["samples"]
    first = first_line(scored["sandbox_errors"]["first"] or "", "no detail").rstrip(": ")
    advice = (f"a larger --memory-mb than {config.memory_mb} may help (every verdict: "
              f"{executions_path(config)}")
    if failed == total:
        raise CodeParrotError(f"the sandbox could not run any of the {total} samples (first: {first}), so the score "
                              f"measures nothing; {advice}; results written to {config.output} anyway)")
    print(f"warning: the sandbox could not run {failed} of {total} samples (first: {first}); they count as failed, so "
          f"the score does not measure those programs; {advice})", file=sys.stderr, flush=True)


def score_command(config: HumanEvalConfig, samples_file: Path) -> str:
    """The exact command that scores saved samples later (with this run's limits: a program's verdict depends
    on them)."""
    cmd = ["python", "scripts/human_eval.py", "--completions", str(samples_file), "--output", config.output,
           "--allow-code-execution", "--k", *map(str, config.k), "--timeout", f"{config.timeout:g}",
           "--memory-mb", str(config.memory_mb)]
    if config.problems:
        cmd += ["--problems", config.problems]
    if config.num_tasks:
        cmd += ["--num-tasks", str(config.num_tasks)]
    if config.allow_missing_tasks:
        cmd += ["--allow-missing-tasks"]
    return shlex.join(cmd)  # --allow-code-execution is the one opt-in; the variable would ask a second time


def run(config: HumanEvalConfig) -> int:
    """The whole CLI: obtain samples (model / file / canonical), execute if allowed, write results.json."""
    config.validate()
    problems = load_problems(config.problems, config.num_tasks)
    sandbox_cfg = config.sandbox()
    generation = None
    if (config.completions or config.canonical) and int(os.environ.get("RANK", "0") or 0) != 0:
        return 0  # launched with several processes but nothing to generate: rank 0 does the scoring
    allow_missing = config.allow_missing_tasks
    if config.completions:
        samples = read_samples(Path(config.completions), problems)
        if not samples:
            raise CodeParrotError(f"--completions {config.completions}: no samples")
        missing = tasks_without_samples(samples, problems)
        if not allow_missing and (err := _missing_error(missing, len(problems),
                                                        f"--completions {config.completions}")):
            raise err
        source = {"completions": str(config.completions)}
    elif config.canonical:
        missing = [p["task_id"] for p in problems if not isinstance(p.get("canonical_solution"), str)]
        if missing:
            raise CodeParrotError(f"--canonical: {len(missing)} problems have no canonical_solution "
                                  f"(e.g. {missing[0]})")
        samples = [{"task_id": p["task_id"], "completion": p["canonical_solution"], "temperature": "canonical",
                    "sample_index": 0} for p in problems]
        source = {"canonical": True}
    else:  # imported here: generation loads torch and transformers, which scoring saved samples never needs
        from codeparrot.humaneval.generation import generate_distributed

        out = generate_distributed(config, problems, samples_path(config))
        if out is None:  # not the main process: its share is written, nothing else to do
            return 0
        samples, generation = out
        source = {"model": config.model, "revision": config.revision}
    settings = {**source, "problems": str(config.problems or default_problems_file()), "num_tasks": len(problems),
                "k": list(config.k), "timeout_s": config.timeout, "memory_mb": config.memory_mb,
                "allow_missing_tasks": allow_missing}
    if generation is not None:
        settings.update(generation.pop("config"))
    if not code_execution_allowed(config.allow_code_execution):
        file = samples_path(config) if not config.completions else Path(config.completions)
        if config.canonical:
            file = samples_path(config)
            atomic_write_text(file, "".join(json.dumps(s) + "\n" for s in samples))
        print(f"{len(samples)} samples saved in {file}; nothing was executed. Model-generated code runs only "
              f"with an explicit opt-in (--allow-code-execution or {ALLOW_ENV}=1), in the sandbox. To score "
              f"them:\n  {score_command(config, file)}")
        return 0
    scored = score(problems, samples, sandbox_cfg, config.num_workers, config.k,
                   log_file=executions_path(config),
                   dedup=not config.execute_duplicates, progress=config.progress,
                   allow_missing=allow_missing)
    results = {"config": settings, **({"generation": generation} if generation else {}), **scored}
    atomic_write_json(config.output, results)
    print(format_table(scored["pass_at_k"], scored["best"]))
    ex = scored["execution"]
    print(f"executed {ex['programs_run']} programs for {ex['samples']} samples in {ex['seconds']} s "
          f"({ex['programs_per_s']} programs/s); statuses {scored['status_counts']}")
    print(f"sandbox: {ex['sandbox']}")
    if scored["answer_key"]["reachable"]:
        print(f"warning: programs could read the answer key ({scored['answer_key']['reachable']}): a pass may "
              "be copied from it")
    if scored["answer_dependent_tests"]:
        print(f"warning: {len(scored['answer_dependent_tests'])} tests call the candidate depending on earlier "
              f"answers (a program may learn from the calls it gets): {scored['answer_dependent_tests']}")
    print(f"results written to {config.output}")
    report_sandbox_errors(scored, config)
    return 0

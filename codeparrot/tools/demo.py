"""`make demo`: the whole pipeline on the embedded default corpus, stage by stage, each one a real CLI call.

Every stage runs the same command a user would type (printed before it runs), so the demo doubles as a
worked example. A stage is skipped when its completion record `<out>/.stages/<name>.json` exists, was written
for the same command, and the stage's outputs are still there; `--fresh` redoes everything. Each stage's
outputs are written atomically by the stage itself, so an interrupted demo resumes at the stage that broke.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from codeparrot.atomic_io import atomic_write_json
from codeparrot.child_signals import sigterm_passed_to_children
from codeparrot.config import doc
from codeparrot.errors import CodeParrotError, Terminated
from codeparrot.tools.demo_summary import print_summary

REPO_ROOT = Path(__file__).resolve().parents[2]
# The infilling example (the app's Infill tab has the same): the model writes the body between the docstring
# and the call after the function.
INFILL_PREFIX = 'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n'
INFILL_SUFFIX = "\n\nprint(fibonacci(10))\n"
INFILL_TASKS = 8  # single-line infilling tasks the demo model is scored on (4 samples each)


@dataclass
class Stage:
    """One demo stage: a command and the paths that must exist for it to count as done."""

    name: str
    command: list[str]
    outputs: list[Path]
    env: dict[str, str] = field(default_factory=dict)
    check: Callable[[], bool] | None = None  # extra completeness check beyond the outputs existing


def _script(name: str) -> list[str]:
    return [sys.executable, str(REPO_ROOT / "scripts" / name)]


def _accelerate(num_processes: int) -> list[str]:
    """`accelerate launch` for CPU through `scripts/launch.py` (its own launcher, with a failure as one line and a
    SIGTERM passed on to the run): one process plainly, several with the multi-GPU launcher on CPU."""
    # Every launcher default is given, so accelerate prints no "values were not passed" warning block.
    threads = str(max(1, (os.cpu_count() or 1) // num_processes))
    launch = [*_script("launch.py"), "--num_machines", "1", "--mixed_precision", "no",
              "--dynamo_backend", "no", "--num_cpu_threads_per_process", threads]
    if num_processes > 1:
        return [*launch, "--multi_gpu", "--num_processes", str(num_processes)]
    return [*launch, "--cpu", "--num_processes", "1"]


def data_stages(out: Path, export_args: list[str], model_config: Path) -> list[Stage]:
    """From source trees to a model repository and pretokenized splits: export_local (`export_args`: its source
    trees and options) -> preprocess with near dedup -> tokenizer -> initial model (`model_config`) -> the
    characters-per-token filter -> pretokenize. The demo's first stages, and all of `make gpu-data`."""
    raw, clean, tok, repo = out / "raw", out / "clean", out / "tokenizer", out / "model-repo"
    final = out / "clean-final"  # clean/ after the characters-per-token filter, which needs the tokenizer
    tokens = out / "tokens"
    return [
        Stage("export", [*_script("export_local.py"), *export_args, "--output-dir", str(raw)], [raw]),
        Stage("preprocess", [*_script("preprocess.py"), "--input", str(raw), "--output-dir", str(clean),
                             "--near-dedup", "--num-workers", "2", "--seed", "0",
                             # 5% instead of 1%: the demo corpus is small, and a validation split of a few
                             # files makes a noisy loss.
                             "--valid-fraction", "0.05"], [clean / "stats.json"]),
        Stage("tokenizer", [*_script("train_tokenizer.py"), "--dataset", str(clean / "train"), "--output-dir", str(tok),
                            "--valid-dataset", str(clean / "valid")], [tok / "tokenizer.json"]),
        Stage("initialize", [*_script("initialize_model.py"), "--model-config", str(model_config),
                             "--tokenizer", str(tok), "--repo", str(repo)], [repo]),
        # The characters-per-token filter needs a tokenizer, which the demo trains only after preprocessing: a
        # second pass over the clean splits applies it. Every other decision is a function of the content, seed
        # and threshold (the split included), so the pass keeps each file's split and removes only the files
        # under --min-chars-per-token; near dedup is not repeated.
        Stage("filter-tokens", [*_script("preprocess.py"), "--input", str(clean / "train"), "--input",
                                str(clean / "valid"), "--output-dir", str(final), "--tokenizer", str(tok),
                                "--num-workers", "2", "--seed", "0", "--valid-fraction", "0.05"],
              [final / "stats.json"]),
        Stage("pretokenize", [*_script("pretokenize.py"), "--dataset", str(final), "--tokenizer", str(tok),
                              "--output-dir", str(tokens), "--num-workers", "2"], [tokens / "train", tokens / "valid"]),
    ]


def build_stages(out: Path, train_minutes: float, humaneval_tasks: int, num_processes: int) -> list[Stage]:
    clean, repo, tokens = out / "clean", out / "model-repo", out / "tokens"
    run_dir, plots = out / "runs" / "demo-tiny", out / "plots"
    cpu_env = {"ACCELERATE_USE_CPU": "1"}
    stages = data_stages(out, [], REPO_ROOT / "configs/model/tiny.yaml")  # export: the standard library
    stages.insert(2, Stage("plot-filters", [*_script("plot.py"), "filters", str(clean / "stats.json"),
                                            "--output", str(plots / "filters.png")], [plots / "filters.png"]))
    return [
        *stages,
        Stage("train", [*_accelerate(num_processes), str(REPO_ROOT / "scripts/train.py"),
                        "--config", str(REPO_ROOT / "configs/train/tiny.yaml"),
                        "--model", str(repo), "--run_name", "demo-tiny", "--output_dir", str(run_dir),
                        "--data.train", str(tokens / "train"), "--data.valid", str(tokens / "valid"),
                        "--max_minutes", str(train_minutes)], [run_dir / "final"], env=cpu_env),
        Stage("plot-training", [*_script("plot.py"), "training", str(run_dir / "metrics.jsonl"),
                                "--output-dir", str(plots)], [plots / "loss.png"]),
        Stage("checkpoints", [*_script("checkpoints.py"), "list", str(repo)], []),
        Stage("validation", [*_script("validation_loss.py"), "--model", str(repo), "--revision", "demo-tiny",
                             "--dataset", str(tokens / "valid"), "--output", str(out / "validation.json")],
              [out / "validation.json"], env=cpu_env),
        Stage("generate", [*_script("generate.py"), "--model", str(repo), "--revision", "demo-tiny",
                           "--prompt", "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
                           "--num-return-sequences", "2", "--max-new-tokens", "64", "--seed", "0",
                           "--output", str(out / "generations.json")], [out / "generations.json"]),
        Stage("humaneval-canonical", [*_script("human_eval.py"), "--canonical", "--allow-code-execution",
                                      "--output", str(out / "humaneval_canonical.json")],
              [out / "humaneval_canonical.json"]),
        Stage("humaneval", [*_accelerate(1), str(REPO_ROOT / "scripts/human_eval.py"), "--model", str(repo),
                            "--revision", "demo-tiny", "--num-tasks", str(humaneval_tasks), "--n-samples", "10",
                            "--batch-size", "10", "--max-new-tokens", "96", "--allow-code-execution",
                            "--output", str(out / "humaneval.json")], [out / "humaneval.json"], env=cpu_env),
        *infill_stages(out, repo),
    ]


def infill_stages(out: Path, repo: Path) -> list[Stage]:
    """Fill-in-the-middle (the tiny config trains with data.fim_rate 0.5): one infilled completion, the canonical
    middles of both infilling benchmarks (all 1,033 + 5,815 tasks: the derivation and scorer check, 100%), and
    the demo model on a few single-line infilling tasks. Plain processes: nothing here needs a launcher."""
    stages = [Stage("generate-infill", [*_script("generate.py"), "--model", str(repo), "--revision", "demo-tiny",
                                        "--prompt", INFILL_PREFIX, "--suffix", INFILL_SUFFIX, "--max-new-tokens", "48",
                                        "--seed", "0", "--output", str(out / "infill.json")], [out / "infill.json"])]
    for benchmark in ("single-line", "multi-line"):
        result = out / f"humaneval_{benchmark}_canonical.json"
        stages.append(Stage(f"{benchmark}-canonical", [*_script("human_eval.py"), "--benchmark", benchmark,
                                                       "--canonical", "--allow-code-execution", "--no-progress",
                                                       "--output", str(result)], [result]))
    stages.append(Stage("single-line", [*_script("human_eval.py"), "--benchmark", "single-line", "--model", str(repo),
                                        "--revision", "demo-tiny", "--num-tasks", str(INFILL_TASKS), "--n-samples",
                                        "4", "--batch-size", "16", "--max-new-tokens", "48", "--k", "1",
                                        "--allow-code-execution", "--no-progress", "--output",
                                        str(out / "humaneval_single-line.json")],
                        [out / "humaneval_single-line.json"], env={"ACCELERATE_USE_CPU": "1"}))
    return stages


def _marker(out: Path, stage: Stage) -> Path:
    return out / ".stages" / f"{stage.name}.json"


def is_done(out: Path, stage: Stage) -> bool:
    """Done = a completion record for this exact command, and every output still present."""
    marker = _marker(out, stage)
    if not marker.is_file():
        return False
    try:
        record = json.loads(marker.read_text())
    except (OSError, json.JSONDecodeError):
        return False
    if record.get("command") != stage.command:
        return False
    if not all(p.exists() for p in stage.outputs):
        return False
    return stage.check() if stage.check else True


def run_stage(out: Path, stage: Stage) -> float:
    """Run one stage, streaming its output; raise with the stage name and exit code if it fails."""
    print(f"\n=== [{stage.name}] $ {shlex.join(stage.command)}", flush=True)
    env = dict(os.environ)
    env.update({"HF_HUB_OFFLINE": "1", "WANDB_MODE": env.get("WANDB_MODE", "offline"),
                "TOKENIZERS_PARALLELISM": "false", **stage.env})
    start = time.perf_counter()
    with sigterm_passed_to_children() as sigterm:  # the stage stops its own way (training: with a checkpoint)
        result = subprocess.run(stage.command, env=env, cwd=REPO_ROOT)
    seconds = time.perf_counter() - start
    if sigterm.received and result.returncode != 0:
        print(f"demo stage '{stage.name}' was stopped (re-run `make demo` to resume from it)", file=sys.stderr)
        raise Terminated
    if result.returncode != 0:
        raise CodeParrotError(f"demo stage '{stage.name}' failed with exit code {result.returncode} "
                              f"(re-run `make demo` to resume from this stage)")
    atomic_write_json(_marker(out, stage), {"command": stage.command, "seconds": round(seconds, 1),
                                            "finished": time.strftime("%Y-%m-%d %H:%M:%S")})
    return seconds


@dataclass
class DemoConfig:
    """scripts/demo.py: where the demo writes and how much of each stage it runs."""

    output_dir: str = doc("demo_output", "where every stage writes (default: demo_output)")
    fresh: bool = doc(False, "delete the output folder first and redo every stage")
    train_minutes: float = doc(4.0, "wall-clock budget of the training stage (default: 4)")
    humaneval_tasks: int = doc(5, "HumanEval problems the demo model is scored on (default: 5)")
    num_processes: int = doc(1, "training processes (CPU: 2 uses both cores as 2 ranks)")

    def validate(self) -> None:
        if self.train_minutes <= 0 or self.humaneval_tasks < 1 or self.num_processes < 1:
            raise CodeParrotError("--train-minutes must be > 0, --humaneval-tasks and --num-processes >= 1")


def run_demo(cfg: DemoConfig) -> dict[str, float]:
    out, fresh, train_minutes = Path(cfg.output_dir).resolve(), cfg.fresh, cfg.train_minutes
    humaneval_tasks, num_processes = cfg.humaneval_tasks, cfg.num_processes
    if fresh and out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    stages = build_stages(out, train_minutes, humaneval_tasks, num_processes)
    timings, reused = run_stages(out, stages, "make demo FRESH=1")
    print_summary(out, timings, reused)
    return timings


def run_stages(out: Path, stages: list[Stage], redo_hint: str) -> tuple[dict[str, float], set[str]]:
    """Run each stage not already done (`is_done`); (seconds per stage with "total", names of reused stages)."""
    timings: dict[str, float] = {}
    reused: set[str] = set()
    total = time.perf_counter()
    for stage in stages:
        if is_done(out, stage):
            print(f"=== [{stage.name}] already complete, reusing it ({redo_hint} to redo)")
            # the time it took when it ran (its completion record), shown as reused: not "0 s"
            timings[stage.name] = recorded_seconds(out, stage)
            reused.add(stage.name)
            continue
        timings[stage.name] = run_stage(out, stage)
    timings["total"] = time.perf_counter() - total
    return timings, reused


def recorded_seconds(out: Path, stage: Stage) -> float:
    """How long `stage` took when it ran, from its completion record (0 when the record does not say)."""
    try:
        return float(json.loads(_marker(out, stage).read_text()).get("seconds", 0.0))
    except (OSError, ValueError, TypeError):
        return 0.0

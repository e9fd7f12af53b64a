"""`make demo`: the whole pipeline on the embedded default corpus, stage by stage, each one a real CLI call.

Every stage runs the same command a user would type (printed before it runs), so the demo doubles as a
worked example. A stage is skipped when its completion record `<out>/.stages/<name>.json` exists, was written
for the same command (paths taken relative to the output folder, the repository and the interpreter, so a moved
folder or another clone still counts), and the stage's outputs are still there; `--fresh` redoes everything.
Each stage's outputs are written atomically by the stage itself, so an interrupted demo resumes at the stage that
broke: training and HumanEval continue their stopped run when started again with the same command. Once a
stage runs, every stage after it runs too (they read its new outputs); any other stage that runs starts from
scratch, having removed what its last run left (`Stage.clears`: the model repository, the run folder,
HumanEval's samples), which would otherwise refuse or mix with the new run.
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
from codeparrot.child_signals import signals_passed_to_children
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
    # removed before the stage is redone from scratch (a path, or a glob pattern in its folder)
    clears: list[Path] = field(default_factory=list)
    # it continues its own unfinished run (training: --resume auto; HumanEval: its samples) when started again
    # with the same command; any other stage starts from scratch every time it runs
    resumes: bool = False


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
                             "--tokenizer", str(tok), "--repo", str(repo)], [repo], clears=[repo]),
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
                        "--max_minutes", str(train_minutes), "--resume", "auto"], [run_dir / "final"], env=cpu_env,
              clears=[run_dir], resumes=True),
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
                            "--output", str(out / "humaneval.json")], [out / "humaneval.json"], env=cpu_env,
              clears=[out / "humaneval.*"], resumes=True),  # with its samples, which it resumes from
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
                        [out / "humaneval_single-line.json"], env={"ACCELERATE_USE_CPU": "1"},
                        clears=[out / "humaneval_single-line.*"], resumes=True))
    return stages


def _marker(out: Path, stage: Stage) -> Path:
    return out / ".stages" / f"{stage.name}.json"


def portable(command: list[str], out: Path) -> list[str]:
    """`command` as its completion record keeps it: the output folder, the repository and the interpreter as
    placeholders, so a moved output folder or another clone of the repository still matches."""
    # the longest first: the output folder and the interpreter (.venv) may sit inside the repository
    places = sorted([(str(out), "$OUT"), (str(REPO_ROOT), "$REPO"), (sys.executable, "$PYTHON")],
                    key=lambda place: -len(place[0]))
    return [next((name + arg[len(path):] for path, name in places if arg == path or arg.startswith(path + os.sep)),
                 arg) for arg in command]


def _record(out: Path, stage: Stage) -> dict:
    """The stage's record: {"command", "finished": None while it runs (a stop leaves that), then the time,
    "seconds"}; {} when there is none."""
    try:
        record = json.loads(_marker(out, stage).read_text())
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def _same_command(record: dict, out: Path, stage: Stage) -> bool:
    return record.get("command") in (portable(stage.command, out), stage.command)  # (older records: as is)


def is_done(out: Path, stage: Stage, record: dict) -> bool:
    """Done = its `record` (`_record`) is of this command and finished, and every output is still present."""
    if not (_same_command(record, out, stage) and record.get("finished")):
        return False
    if not all(p.exists() for p in stage.outputs):
        return False
    return stage.check() if stage.check else True


def clear(stage: Stage) -> None:
    """Remove what the stage's last run left (`Stage.clears`) before it is redone from scratch."""
    for path in stage.clears:
        for found in sorted(path.parent.glob(path.name)) if "*" in path.name else [path]:
            if found.is_dir() and not found.is_symlink():
                shutil.rmtree(found)
            elif found.exists() or found.is_symlink():
                found.unlink()


def run_stage(out: Path, stage: Stage, rerun: str = "make demo") -> float:
    """Run one stage, streaming its output; raise with the stage name and exit code if it fails. `rerun`: the
    make target that resumes the pipeline, named when the stage fails or is stopped."""
    print(f"\n=== [{stage.name}] $ {shlex.join(stage.command)}", flush=True)
    env = dict(os.environ)
    env.update({"HF_HUB_OFFLINE": "1", "WANDB_MODE": env.get("WANDB_MODE", "offline"),
                "TOKENIZERS_PARALLELISM": "false", **stage.env})
    command = portable(stage.command, out)
    atomic_write_json(_marker(out, stage), {"command": command, "finished": None})
    start = time.perf_counter()
    with signals_passed_to_children() as stop:  # the stage stops its own way (training: with a checkpoint)
        result = subprocess.run(stage.command, env=env, cwd=REPO_ROOT)
    seconds = time.perf_counter() - start
    if result.returncode == 0:
        atomic_write_json(_marker(out, stage), {"command": command, "seconds": round(seconds, 1),
                                                "finished": time.strftime("%Y-%m-%d %H:%M:%S")})
    pipeline = rerun.removeprefix("make ")
    if stop.received or stop.interrupted:  # also when the stage still finished: the stop is for the whole pipeline
        print(f"{pipeline} stage '{stage.name}' was stopped (re-run `{rerun}` to resume from it)", file=sys.stderr)
        raise Terminated if stop.received else KeyboardInterrupt
    if result.returncode != 0:
        raise CodeParrotError(f"{pipeline} stage '{stage.name}' failed with exit code {result.returncode} "
                              f"(re-run `{rerun}` to resume from this stage)")
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
    timings, reused = run_stages(out, stages, "make demo")
    print_summary(out, timings, reused)
    return timings


def run_stages(out: Path, stages: list[Stage], rerun: str) -> tuple[dict[str, float], set[str]]:
    """Run each stage not already done (`is_done`) and every stage after one that ran; (seconds per stage with
    "total", names of reused stages). A stage that resumes (`Stage.resumes`) and was stopped continues, if its
    command is the same and no stage before it ran; every other stage that runs starts from scratch (`clear`).
    `rerun`: the make target that resumes the pipeline (`make demo`, `make gpu-data`), named in the messages."""
    timings: dict[str, float] = {}
    reused: set[str] = set()
    total = time.perf_counter()
    earlier_ran = False
    for stage in stages:
        record = _record(out, stage)
        if not earlier_ran and is_done(out, stage, record):
            print(f"=== [{stage.name}] already complete, reusing it ({rerun} FRESH=1 to redo)")
            # the time it took when it ran (its completion record), shown as reused: not "0 s"
            timings[stage.name] = recorded_seconds(record)
            reused.add(stage.name)
            continue
        continues = (stage.resumes and not earlier_ran and _same_command(record, out, stage)
                     and not record.get("finished"))
        if not continues:  # its command, its inputs or its outputs changed since it last ran
            clear(stage)
        earlier_ran = True
        timings[stage.name] = run_stage(out, stage, rerun)
    timings["total"] = time.perf_counter() - total
    return timings, reused


def recorded_seconds(record: dict) -> float:
    """How long a stage took when it ran, from its completion record (0 when the record does not say)."""
    try:
        return float(record.get("seconds", 0.0))
    except (ValueError, TypeError):
        return 0.0

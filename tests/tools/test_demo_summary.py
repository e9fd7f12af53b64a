"""The demo summary (codeparrot/tools/demo_summary.py) says how far training got and what stopped it, and its
summary.json times add up: the stage seconds' "total" is their sum, this invocation's wall time is named apart."""

from __future__ import annotations

import json
from pathlib import Path

from codeparrot.tools.demo_summary import _fmt_training_steps, _last_training_entry, _training_steps, stage_seconds


def _run_dir(tmp_path: Path, last_step: int, max_steps: int, max_minutes: float | None) -> Path:
    """A run folder as train.py leaves it: train log lines (and an eval line) in metrics.jsonl, and the checkpoint
    of the last step with its resolved config."""
    run = tmp_path / "run"
    (run / "checkpoints" / f"step-{last_step}").mkdir(parents=True)
    lines = [{"step": s, "loss": 7.0, "tokens_per_s": 900.0} for s in range(20, last_step + 1, 20)]
    lines.append({"step": last_step, "val_loss": 6.9})
    (run / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    minutes = "null" if max_minutes is None else max_minutes
    (run / "checkpoints" / f"step-{last_step}" / "train_config.yaml").write_text(
        f"run_name: demo-tiny\nmax_steps: {max_steps}\nmax_minutes: {minutes}\n")
    return run


def _steps(run: Path) -> dict:
    return _training_steps(run, _last_training_entry(run / "metrics.jsonl").get("step"))


def test_summary_says_the_time_budget_stopped_training_early(tmp_path):
    steps = _steps(_run_dir(tmp_path, 60, 600, 4.0))
    assert steps == {"trained": 60, "max_steps": 600, "max_minutes": 4.0, "stopped_by": "max_minutes"}
    assert _fmt_training_steps(steps).startswith("60 of 600 steps, stopped by its 4-minute budget (--max_minutes")


def test_summary_of_a_run_that_reached_max_steps_names_no_stop(tmp_path):
    steps = _steps(_run_dir(tmp_path, 600, 600, 4.0))
    assert steps["stopped_by"] is None and _fmt_training_steps(steps) == "600 of 600 steps"
    assert _fmt_training_steps(_training_steps(tmp_path / "missing", None)) == "n/a of n/a steps"


def test_summary_json_total_is_the_sum_of_the_stage_seconds_also_when_all_were_reused():
    # a fully reused `make demo`: the stages' recorded seconds, and an invocation that took 0.2 s
    times = stage_seconds({"export": 2.3, "train": 331.9, "validation": 141.5, "total": 0.2})
    assert times["stage_seconds"] == {"export": 2.3, "train": 331.9, "validation": 141.5, "total": 475.7}
    assert times["this_run_seconds"] == 0.2

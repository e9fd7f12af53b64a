"""The summary `make demo` prints at the end: what each stage produced, read back from its output files.

Every figure comes from a file a stage wrote (stats.json, tokenizer_stats.json, metrics.jsonl, the
validation and HumanEval JSONs; tokens/s and MFU are the run's medians after its warm-up window,
`throughput.json`; the steps trained of `max_steps`, and whether the `--max_minutes` budget stopped the run
early, from the last log line and the checkpoint it ended on), so the summary is exactly as true as the outputs
themselves; a stage whose file is missing shows "n/a" instead of a guess. The summary is also saved as
`summary.json`.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Iterable

import yaml

from codeparrot.atomic_io import atomic_write_json

# a checkpoint's resolved TrainConfig (training/checkpointing.py: CONFIG_FILE; not imported: that module loads torch)
TRAIN_CONFIG_FILE = "train_config.yaml"


def _load(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None


def _last_training_entry(metrics: Path) -> dict:
    """The last train log line (with tokens/s and MFU) of a `metrics.jsonl`."""
    last: dict = {}
    try:
        for line in metrics.read_text(encoding="utf-8").splitlines():
            try:
                entry = json.loads(line)
            except json.JSONDecodeError:
                continue
            if "tokens_per_s" in entry:
                last = entry
    except OSError:
        pass
    return last


def _training_steps(run_dir: Path, last_step: Any) -> dict:
    """Steps trained of the run's `max_steps`, and what stopped it short: {"trained", "max_steps", "max_minutes",
    "stopped_by": "max_minutes" or None}. The run saves a checkpoint (with its resolved config) at the step it ends
    on, and stops early for `max_minutes` only at a log step, so `last_step` (the last train log line's) names it."""
    if not isinstance(last_step, int):
        return {"trained": None, "max_steps": None, "max_minutes": None, "stopped_by": None}
    try:
        config = yaml.safe_load((run_dir / "checkpoints" / f"step-{last_step}" / TRAIN_CONFIG_FILE).read_text())
    except (OSError, yaml.YAMLError):
        config = None
    config = config if isinstance(config, dict) else {}
    max_steps, max_minutes = config.get("max_steps"), config.get("max_minutes")
    short = isinstance(max_steps, int) and last_step < max_steps and max_minutes is not None
    return {"trained": last_step, "max_steps": max_steps, "max_minutes": max_minutes,
            "stopped_by": "max_minutes" if short else None}


def _fmt_training_steps(steps: dict) -> str:
    """'60 of 600 steps, stopped by its 4-minute budget (...)', or '600 of 600 steps'."""
    line = f"{_fmt(steps.get('trained'))} of {_fmt(steps.get('max_steps'))} steps"
    if steps.get("stopped_by") == "max_minutes":
        line += (f", stopped by its {steps['max_minutes']:g}-minute budget (--max_minutes; a slower or busier "
                 "machine trains fewer steps than the README's figures)")
    return line


def _model_info(repo: Path) -> dict:
    """Parameter count of the repository's `main` model, from its config (no weights loaded)."""
    try:
        from transformers import AutoConfig

        from codeparrot.repository.model import count_parameters
        from codeparrot.repository.refs import resolve_model_dir

        config = AutoConfig.from_pretrained(resolve_model_dir(str(repo), "main"))
        return {"parameters": count_parameters(config)}
    except Exception:  # a missing or broken stage shows as n/a in the summary
        return {}


def _fmt_pass_at_k(best: Any) -> str:
    """`{"pass@1": {"value": 0.0, ...}, "pass@100": {"value": None, "reason": ...}}` as one short line."""
    if not isinstance(best, dict) or not best:
        return "n/a"
    parts = []
    for k, entry in best.items():
        value = entry.get("value") if isinstance(entry, dict) else entry
        parts.append(f"{k} {100 * value:.2f}%" if isinstance(value, (int, float)) else f"{k} n/a (too few samples)")
    return ", ".join(parts)


def _infill_result(path: Path) -> dict:
    """The first sample of `generate.py --suffix --output` (the demo's infilled completion)."""
    record = _load(path) or {}
    first = (record.get("completions") or [{}])[0]
    return {"middle": first.get("completion"), "ended_by": first.get("stop_reason")}


def _infill_benchmark(path: Path) -> dict:
    """Tasks, best pass@k and exact match (the first temperature's) of a `human_eval.py --benchmark` result."""
    record = _load(path) or {}
    exact = next(iter((record.get("exact_match") or {}).values()), {})
    return {"tasks": (record.get("config") or {}).get("num_tasks"), "pass_at_k": record.get("best"),
            "exact_match": exact.get("exact_match"), "samples": exact.get("samples")}


def _fmt_infill_benchmark(b: dict) -> str:
    """'1,033 tasks, pass@1 100.00%, exact match 100.00%' (only the k that the sample count allows)."""
    em, best = b.get("exact_match"), b.get("pass_at_k")
    if isinstance(best, dict):
        best = {k: v for k, v in best.items() if not isinstance(v, dict) or v.get("value") is not None} or best
    return f"{_fmt(b.get('tasks'), ',')} tasks, {_fmt_pass_at_k(best)}, exact match " \
           f"{'n/a' if em is None else f'{100 * em:.2f}%'}"


def _fmt_middle(infill: dict) -> str:
    middle = infill.get("middle")
    if middle is None:
        return "n/a"
    shown = repr(middle) if len(middle) <= 40 else repr(middle[:37]) + "…"
    return f"{len(middle)} characters between the docstring and the call, ended by {infill.get('ended_by')}: {shown}"


def _fmt(value: Any, spec: str = "") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    return format(value, spec) if spec else str(value)


def collect_summary(out: Path, timings: dict[str, float], reused: set[str] | frozenset = frozenset()) -> dict:
    stats = _load(out / "clean" / "stats.json") or {}
    tok = _load(out / "tokenizer" / "tokenizer_stats.json") or {}
    model = _model_info(out / "model-repo")
    run_dir = out / "runs" / "demo-tiny"
    train = _last_training_entry(run_dir / "metrics.jsonl")
    speed = _load(run_dir / "throughput.json") or {}  # medians after the warm-up window (reporting.py)
    val = _load(out / "validation.json") or {}
    he = _load(out / "humaneval.json") or {}
    canon = _load(out / "humaneval_canonical.json") or {}
    return {
        "output_dir": str(out),
        **stage_seconds(timings),
        "reused_stages": sorted(reused),  # their seconds are from when they ran, not from this run
        "files": {
            "input_records": stats.get("input_records"),
            "bad_records": stats.get("bad_records", {}),
            "exact_duplicates": stats.get("exact_duplicates"),
            "near_duplicates": stats.get("near_duplicates"),
            "decontaminated": stats.get("decontaminated"),
            "filtered": stats.get("filtered", {}),
            "kept_train": stats.get("kept_train"),
            "kept_valid": stats.get("kept_valid"),
        },
        "tokenizer_bytes_per_token": tok.get("valid_bytes_per_token", tok.get("bytes_per_token")),
        "parameters": model.get("parameters"),
        "training_steps": _training_steps(run_dir, train.get("step")),
        "train_tokens_per_s": speed.get("median_tokens_per_s") or train.get("tokens_per_s"),
        "train_mfu": speed.get("median_mfu") or train.get("mfu"),
        "val_loss": val.get("loss"),
        "perplexity": val.get("perplexity"),
        "humaneval": he.get("best", he.get("pass_at_k")),
        "humaneval_canonical": canon.get("best", canon.get("pass_at_k")),
        "infill": _infill_result(out / "infill.json"),
        "single_line_infilling": _infill_benchmark(out / "humaneval_single-line.json"),
        "infilling_canonical": {b: _infill_benchmark(out / f"humaneval_{b}_canonical.json")
                                for b in ("single-line", "multi-line")},
        "tensorboard_logdir": str(run_dir),
        "plots_dir": str(out / "plots"),
    }


def stage_seconds(timings: dict[str, float]) -> dict:
    """summary.json's times: `stage_seconds` (each stage's seconds, reused ones from when they ran, and their
    "total"), and `this_run_seconds` (this invocation's wall time: about 0 when every stage was reused).
    `timings`: `run_stages`'s, whose "total" is this invocation's wall time."""
    stages = {k: round(v, 1) for k, v in timings.items() if k != "total"}
    return {"stage_seconds": {**stages, "total": round(sum(stages.values()), 1)},
            "this_run_seconds": round(timings.get("total", 0.0), 1)}


def stage_time_line(seconds: dict[str, float], reused: Iterable[str]) -> str:
    """'stage wall time (s): export 1, train 264, total 300' for a fresh run; a re-run marks the reused stages
    (their time from when they ran) and says what this run took and what building everything took."""
    reused = set(reused)
    stages = {k: v for k, v in seconds.items() if k != "total"}
    parts = [f"{k} {v:.0f}{' (reused)' if k in reused else ''}" for k, v in stages.items()]
    total = seconds.get("total", 0.0)
    if not reused:
        return "stage wall time (s): " + ", ".join(parts + [f"total {total:.0f}"])
    return ("stage wall time (s): " + ", ".join(parts) + f"; this run {total:.0f} ({len(reused)} of {len(stages)} "
            f"stages reused), all stages when they ran {sum(stages.values()):.0f}")


def print_summary(out: Path, timings: dict[str, float], reused: set[str] | frozenset = frozenset()) -> dict:
    from codeparrot.training.reporting import MFU_CONVENTION  # imports torch: only once the demo has run

    s = collect_summary(out, timings, reused)
    atomic_write_json(out / "summary.json", s)
    f = s["files"]
    removed = {**{f"bad: {k}": v for k, v in (f["bad_records"] or {}).items()},
               "exact duplicate": f["exact_duplicates"], "near duplicate": f["near_duplicates"],
               "HumanEval decontamination": f["decontaminated"],
               **{f"filter: {k}": v for k, v in (f["filtered"] or {}).items()}}
    lines = ["", "=" * 72, "CodeParrot demo summary", "=" * 72,
             f"files: {_fmt(f['input_records'])} in, kept {_fmt(f['kept_train'])} train + {_fmt(f['kept_valid'])} valid"]
    for reason, count in removed.items():
        if count:
            lines.append(f"  removed {count:>6}  {reason}")
    mfu = s["train_mfu"]
    lines += [
        f"tokenizer: {_fmt(s['tokenizer_bytes_per_token'], '.2f')} bytes/token on the valid split",
        f"model: {_fmt(s['parameters'], ',')} parameters",
        f"training: {_fmt_training_steps(s['training_steps'])}",
        f"  {_fmt(s['train_tokens_per_s'], ',.0f')} tokens/s, MFU {_fmt(None if mfu is None else 100 * mfu, '.1f')}% "
        f"({MFU_CONVENTION}; median after the warm-up window)",
        f"validation: loss {_fmt(s['val_loss'], '.3f')}, perplexity {_fmt(s['perplexity'], '.1f')}",
        f"HumanEval (demo model, a few tasks): {_fmt_pass_at_k(s['humaneval'])}",
        f"HumanEval canonical solutions (scorer check): {_fmt_pass_at_k(s['humaneval_canonical'])}",
        f"infilling (demo model, trained with FIM 0.5): {_fmt_middle(s['infill'])}",
        "HumanEval single-line infilling (demo model, a few tasks): "
        + _fmt_infill_benchmark(s["single_line_infilling"]),
        "HumanEval infilling, canonical middles (derivation and scorer check):",
        *(f"  {b}: {_fmt_infill_benchmark(v)}" for b, v in s["infilling_canonical"].items()),
        f"TensorBoard logs: {s['tensorboard_logdir']}",
        f"plots: {s['plots_dir']}",
        stage_time_line(timings, s["reused_stages"]),
        "",
        "next commands to try:",
        f"  .venv/bin/tensorboard --logdir {s['tensorboard_logdir']}",
        f"  .venv/bin/python scripts/checkpoints.py list {out / 'model-repo'}",
        f"  .venv/bin/python scripts/checkpoints.py log {out / 'model-repo'} --branch demo-tiny",
        f"  .venv/bin/python scripts/generate.py --model {out / 'model-repo'} --revision demo-tiny --prompt 'def add(a, b):'",
        f"  .venv/bin/python scripts/generate.py --model {out / 'model-repo'} --revision demo-tiny "
        "--prompt-file BEFORE.py --suffix-file AFTER.py",
        f"  .venv/bin/python scripts/highlight.py --model {out / 'model-repo'} --revision demo-tiny FILE.py --output FILE.html",
        "=" * 72,
    ]
    print("\n".join(lines))
    return s

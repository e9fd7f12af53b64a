"""gpu_check.json (every stage's results, merged across calls) and the Markdown tables made from it."""

from __future__ import annotations

import json
from pathlib import Path

from codeparrot.atomic_io import atomic_write_json, atomic_write_text


def load_results(folder: Path) -> dict:
    path = folder / "gpu_check.json"
    if not path.is_file():
        return {}
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError:
        return {}  # a truncated file from a killed run: start over (each write is atomic, so this is rare)


def save_results(folder: Path, results: dict) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    atomic_write_json(folder / "gpu_check.json", results)
    atomic_write_text(folder / "gpu_check.md", markdown(results))


def _fmt(value, digits: int = 1, percent: bool = False) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{100 * value:.{digits}f}%" if percent else f"{value:,.{digits}f}"
    return str(value)


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header), *("| " + " | ".join(r) + " |" for r in rows)]


def markdown(results: dict) -> str:
    lines = ["# gpu_check", ""]
    meta = results.get("run", {})
    if meta:
        lines += [f"`{meta.get('command', '')}` ({'smoke: tiny preset, small shapes' if meta.get('smoke') else 'full'}"
                  f"), {meta.get('date', '')}", ""]
    stage = results.get("stages", {})
    dev = stage.get("device", {}).get("result")
    if dev:
        lines += ["## Device", "", *[f"- {k}: {_fmt(v, 3) if isinstance(v, float) else v}" for k, v in dev.items()], ""]
    ceil = stage.get("ceilings", {}).get("result")
    if ceil:
        lines += ["## Ceilings", "", f"- bf16 GEMM {ceil['gemm_size']}³: {_fmt(ceil['gemm_bf16_tflops'])} TFLOP/s",
                  f"- device memory copy ({ceil['copy_mib']} MiB): {_fmt(ceil['copy_gb_s'])} GB/s (read + write)", ""]
    att = stage.get("attention", {}).get("result")
    if att:
        lines += ["## Attention (SDPA fwd+bwd at the training shape)", ""]
        lines += _table(["backend", "dropout", "masking", "ms", "TFLOP/s (causal FLOPs)"],
                        [[r["backend"], _fmt(r["dropout"]), r["masking"], _fmt(r.get("ms"), 2) if "ms" in r
                          else r.get("error", ""), _fmt(r.get("tflops"), 2)] for r in att]) + [""]
    loss = stage.get("loss", {}).get("result")
    if loss:
        lines += ["## LM head + cross-entropy (one micro-batch, fwd+bwd)", ""]
        lines += _table(["variant", "ms", "peak memory GiB", "relative error vs fp64"],
                        [[r["variant"], _fmt(r.get("ms"), 2) if "ms" in r else r.get("error", ""),
                          _fmt(r.get("peak_memory_gib"), 2), f"{r['relative_error']:.1e}" if "relative_error" in r
                          else "n/a"] for r in loss]) + [""]
    steps = stage.get("train_step", {}).get("result")
    if steps:
        lines += ["## Training step (synthetic token ids)", "", "MFU: PaLM convention (see Device).", ""]
        lines += _table(["variant", "tokens/s", "MFU", "ms/step", "peak memory GiB", "warm-up s", "graph breaks",
                         "recompiles while timed"],
                        [[r["variant"], *(([_fmt(r["tokens_per_s"], 0), _fmt(r["mfu"], 1, percent=True),
                                            _fmt(r["ms_per_step"]), _fmt(r["peak_memory_gib"], 2), _fmt(r["warmup_s"]),
                                            str(r["graph_breaks"]), str(r["recompiles_while_timed"])])
                                          if "tokens_per_s" in r else [r.get("error", r.get("skipped", ""))] + [""] * 6)]
                         for r in steps]) + [""]
    prof = stage.get("profile", {}).get("result")
    if prof:
        lines += [f"## Profile: {prof['variant']} ({prof['time_kind']} time, {_fmt(prof['ms_per_step'])} ms/step)", ""]
        lines += _table(["kernel class", "ms/step", "share"],
                        [[c["class"], _fmt(c["ms_per_step"], 2), _fmt(c["share"], 1, percent=True)]
                         for c in prof["classes"]]) + [""]
    e2e = stage.get("end_to_end", {}).get("result")
    if e2e:
        lines += ["## End to end (scripts/train.py, 30 steps, then --resume auto from step 20)", "",
                  *[f"- {k}: {_fmt(v, 4) if isinstance(v, float) else v}" for k, v in e2e.items()], ""]
    for name, entry in stage.items():
        if "error" in entry:
            lines += [f"**{name}: failed** — {entry['error']}", ""]
    return "\n".join(lines)

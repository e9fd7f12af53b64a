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
    lines += _headline(stage.get("headline", {}).get("result"))
    lines += _profile(stage.get("profile", {}).get("result"))
    lines += _large_model(stage.get("model_1_5b", {}).get("result"))
    lines += _jax(stage.get("jax", {}).get("result"))
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
    e2e = stage.get("end_to_end", {}).get("result")
    if e2e:  # 30 steps resumed from 20 (`--smoke`: 4 from 2)
        lines += [f"## End to end (scripts/train.py, {e2e.get('final_step', '?')} steps, then --resume auto from step "
                  f"{e2e.get('resume_from_step', '?')})", "",
                  *[f"- {k}: {_fmt(v, 4) if isinstance(v, float) else v}" for k, v in e2e.items()], ""]
    for name, entry in stage.items():
        if "error" in entry:
            lines += [f"**{name}: failed** — {entry['error']}", ""]
        elif "skipped" in entry:
            lines += [f"**{name}: {entry['skipped']}**", ""]
    return "\n".join(lines)


def _row_figures(r: dict, keys: list[tuple[str, int, bool]]) -> list[str]:
    """The figures of a table row, or its error / skip reason in the first cell and blanks after."""
    if "tokens_per_s" not in r:
        return [r.get("error", r.get("skipped", r.get("not_measured", "")))] + [""] * (len(keys) - 1)
    return [_fmt(r.get(key), digits, percent=pct) for key, digits, pct in keys]


def _headline(rows: list[dict] | None) -> list[str]:
    if not rows:
        return []
    first = rows[0]
    lines = [f"## Headline: the training CLI at global batch {first.get('global_batch')} × "
             f"{first.get('seq_length')} tokens, one process", "",
             f"`{first.get('command', '')}` ({first.get('steps')} steps, logged every 2; the CLI's own summary: "
             "the median of the log windows after the warm-up one; wall s includes start-up, compilation, the auto "
             "probe and the final save). MFU: PaLM convention (see Device).", ""]
    table = []
    for r in rows:
        batch = (f"{r['micro_batch']} × {r['accumulation']}" if r.get("micro_batch") else "n/a")
        table.append([r["row"], batch, *_row_figures(r, [("tokens_per_s", 0, False), ("mfu", 1, True),
                                                          ("peak_memory_gib", 2, False), ("wall_s", 0, False)])])
    lines += _table(["row", "micro-batch × accumulation", "tokens/s", "MFU", "peak memory GiB", "wall s"], table)
    for r in rows:
        if "speedup_vs_eager" in r or "loss_max_abs_diff_vs_eager" in r:
            diff = r.get("loss_max_abs_diff_vs_eager")
            lines += ["", f"{r['row']}: {_fmt(r.get('speedup_vs_eager'), 3)}× the eager row's tokens/s; largest "
                          f"logged-loss difference from it {'n/a' if diff is None else format(diff, '.3g')}"]
        if "not_compared" in r:
            lines += ["", f"{r['row']}: {r['not_compared']}"]
        if r.get("log_tail"):
            lines += ["", f"{r['row']}, the end of its log:", "", "```", *r["log_tail"], "```"]
    return lines + [""]


def _profile(prof: dict | None) -> list[str]:
    if not prof:
        return []
    lines = [f"## Profile: {prof['variant']} ({prof['time_kind']} time, {_fmt(prof['ms_per_step'])} ms/step)", "",
             f"Timed without the profiler: {_fmt(prof.get('tokens_per_s'), 0)} tokens/s, MFU "
             f"{_fmt(prof.get('mfu'), 1, percent=True)}.", ""]
    lines += _table(["kernel class", "ms/step", "share"],
                    [[c["class"], _fmt(c["ms_per_step"], 2), _fmt(c["share"], 1, percent=True)]
                     for c in prof["classes"]]) + [""]
    top = prof.get("top_kernels") or []
    if top:
        lines += [f"Top {len(top)} of {prof.get('kernels_seen', len(top))} kernels (shares of all {prof['time_kind']} "
                  "time; names shortened, in full in gpu_check.json):", ""]
        lines += _table(["kernel", "class", "calls/step", "ms/step", "share"],
                        [[f"`{k['kernel']}`", k["class"], _fmt(k["calls_per_step"], 0), _fmt(k["ms_per_step"], 3),
                          _fmt(k["share"], 1, percent=True)] for k in top]) + [""]
    return lines


def _large_model(res: dict | None) -> list[str]:
    if not res:
        return []
    lines = [f"## 1.5B preset ({res['preset']}, {res['n_layer']} layers, {res['parameters'] / 1e6:,.1f}M parameters, "
             f"sequences of {res['seq_length']})", "",
             f"Largest micro-batch that fits ({res['search']}; two eager steps each, out of memory caught):", ""]
    lines += _table(["micro-batch", "activation checkpointing", "fits", "peak memory GiB (2nd step)", "s"],
                    [[str(t["micro_batch"]), _fmt(t["activation_checkpointing"]), _fmt(t["fits"]),
                      _fmt(t.get("peak_memory_gib"), 2), _fmt(t["seconds"])] for t in res["trials"]]) + [""]
    m = res.get("measured")
    if m:
        lines += [f"- measured at micro-batch {m['micro_batch']} (compile: {m['compile']}, activation checkpointing: "
                  f"{_fmt(res['activation_checkpointing'])}): {_fmt(m['tokens_per_s'], 0)} tokens/s, MFU "
                  f"{_fmt(m['mfu'], 1, percent=True)}, {_fmt(m['ms_per_step'])} ms/step, peak memory "
                  f"{_fmt(m['peak_memory_gib'], 2)} GiB, warm-up {_fmt(m['warmup_s'])} s, graph breaks "
                  f"{m['graph_breaks']}, recompiles while timed {m['recompiles_while_timed']}"]
    for key in ("not_measured", "note"):
        if res.get(key):
            lines += [f"- {key.replace('_', ' ')}: {res[key]}"]
    lines += [f"- {e}" for e in res.get("measure_errors", [])]
    return lines + [""]


def _jax(res: dict | None) -> list[str]:
    if not res:
        return []
    ref = res.get("torch", {})
    lines = ["## JAX peer: the same model and step in plain JAX, same device and batch", "",
             f"jax {res.get('jax', '?')} on {res.get('device', '?')} ({res.get('backend', '?')}, PRNG "
             f"{res.get('prng', '?')}), {res.get('python')}. "
             f"This project: {_fmt(ref.get('tokens_per_s'), 0)} tokens/s ({ref.get('source', 'n/a')}).", ""]
    table = []
    for r in res.get("rows", []):
        figures = _row_figures(r, [("tokens_per_s", 0, False), ("mfu", 1, True), ("ms_per_step", 1, False),
                                   ("compile_s", 1, False), ("peak_memory_gib", 2, False),
                                   ("torch_over_jax", 2, False)])
        loss = f"{r['first_loss']:.3f} → {r['last_loss']:.3f}" if "last_loss" in r else ""
        table.append([r["variant"], *figures[:5], loss, figures[5]])
    lines += _table(["variant", "tokens/s", "MFU", "ms/step", "first step s (compile)", "peak memory GiB",
                     "loss first → last", "this project ÷ JAX"], table) + [""]
    for r in res.get("rows", []):
        lines += [f"- {r['variant']}: refused {why}; jax's default ran" for why in r.get("attention_refused", [])]
    if any(r.get("attention_refused") for r in res.get("rows", [])):
        lines.append("")
    if res.get("stopped"):
        lines += [f"- stopped: {res['stopped']}", ""]
    return lines

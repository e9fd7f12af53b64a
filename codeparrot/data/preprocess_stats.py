"""What a preprocessing run reports: the running totals both engines fill (`Totals`), `stats.json`
(`build_stats`), the human summary scripts/preprocess.py prints (`format_summary`) and `duplicate_clusters.json`
(`write_clusters`). Shared by the local engine (`codeparrot.data.local_engine`) and the Ray engine
(`codeparrot.data.ray_engine`), so the two write the same files from the same totals.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from codeparrot.data.filters import REASONS, SWITCHES
from codeparrot.data.hub_input import HubInput
from codeparrot.data.licenses import LicenseCounts
from codeparrot.data.preprocess_config import PreprocessConfig
from codeparrot.data.records import FILE_LEVEL_REASONS, BadRecords


@dataclass
class Totals:
    """Counts and costs of a run, filled as it goes."""

    valid_records: int = 0
    exact_duplicates: int = 0
    near_duplicates: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    filtered: Counter = field(default_factory=Counter)
    decontaminated: Counter = field(default_factory=Counter)  # source ("HumanEval/12 docstring") -> files
    kept: Counter = field(default_factory=Counter)  # split -> files
    seconds: Counter = field(default_factory=Counter)  # stage -> seconds
    files: Counter = field(default_factory=Counter)  # stage -> files that entered it
    bytes: Counter = field(default_factory=Counter)  # stage -> bytes that entered it
    licenses: LicenseCounts = field(default_factory=LicenseCounts)  # --licenses decisions, by license value
    encoded_data: Counter = field(default_factory=Counter)  # --filter-encoded-data drops, by rule
    redacted: Counter = field(default_factory=Counter)  # --redact-secrets replacements, by kind (never values)
    files_redacted: int = 0


def utf8_len(text: str) -> int:
    """UTF-8 bytes of `text` (without encoding it when it is ASCII)."""
    return len(text) if text.isascii() else len(text.encode("utf-8"))


def build_stats(cfg: PreprocessConfig, paths: list[Path | HubInput], bad: BadRecords, totals: Totals, index_bytes: int,
           clusters: dict | None, shards: dict[str, list[Path]]) -> dict[str, Any]:
    """stats.json. `seconds` per stage are CPU seconds, so they do not depend on other jobs sharing the machine:
    read, exact_dedup and clustering of the main thread, write of the main thread plus the compression thread,
    filters, decontaminate and minhash summed over the worker processes; pass1, pass2 and total are wall-clock.
    `files_per_second`/`mb_per_second` divide the files/bytes that entered a stage by its seconds (for a CPU
    stage: per core)."""
    secs = {k: v for k, v in totals.seconds.items() if v > 0}
    enabled = cfg.filters.enabled_reasons(with_tokenizer=bool(cfg.tokenizer))
    near_index = {}
    if cfg.near_dedup:  # per survivor: its signature row (on disk) and the spool's metadata arrays (in RAM)
        near_index = {"near_dedup_signature_on_disk": 4 * cfg.num_perm, "near_dedup_spool_metadata": 26}
    filters = vars(cfg.filters)
    unique = totals.valid_records - totals.exact_duplicates
    # Filters that did not run, and why: a filter that is off must say so, never look like it removed nothing.
    off = {r: "no --tokenizer" if getattr(cfg.filters, SWITCHES[r]) else f"--no-{SWITCHES[r].replace('_', '-')}"
           for r in REASONS if r not in enabled}
    return {
        "input_records": totals.valid_records + sum(c for r, c in bad.counts.items() if r not in FILE_LEVEL_REASONS),
        "valid_records": totals.valid_records,
        "bad_records": dict(sorted(bad.counts.items())),
        "bad_record_examples": dict(sorted(bad.first.items())),
        "exact_duplicates": totals.exact_duplicates,
        "filtered": {r: totals.filtered[r] for r in REASONS if r in enabled or totals.filtered[r]},
        "filters_off": off,
        "license_dropped": sum(totals.licenses.by_reason.values()),
        "licenses": {"mode": cfg.licenses, **totals.licenses.as_stats()} if cfg.licenses != "all" else {"mode": "all"},
        "encoded_data": sum(totals.encoded_data.values()),
        "encoded_data_by_rule": dict(sorted(totals.encoded_data.items())),
        "files_redacted": totals.files_redacted,
        "redacted_by_kind": dict(sorted(totals.redacted.items())),
        "decontaminated": sum(totals.decontaminated.values()),
        "decontaminated_by_source": dict(sorted(totals.decontaminated.items())),
        "near_duplicates": totals.near_duplicates,
        "near_duplicate_clusters": clusters["num_clusters"] if clusters else 0,
        "files_in_clusters": clusters["files_in_clusters"] if clusters else 0,
        "kept_train": totals.kept["train"],
        "kept_valid": totals.kept["valid"],
        "bytes_in": totals.bytes_in,
        "bytes_out": totals.bytes_out,
        "seconds": {k: round(v, 4) for k, v in secs.items()},
        "files_per_second": {k: round(totals.files[k] / v, 1) for k, v in secs.items() if k in totals.files},
        "mb_per_second": {k: round(totals.bytes[k] / 1e6 / v, 2) for k, v in secs.items() if k in totals.bytes},
        "index_bytes_per_file": {"exact_dedup": round(index_bytes / max(unique, 1), 2), **near_index},
        "warnings": _warnings(cfg, totals),
        "shards": {split: [p.name for p in files] for split, files in shards.items()},
        "inputs": [str(p) for p in paths],
        "config": {k: v for k, v in vars(cfg).items() if k not in ("filters", "progress")} | {"filters": filters},
    }


def _warnings(cfg: PreprocessConfig, totals: Totals) -> list[str]:
    """Problems the run can finish with but a user must hear about now, not at training time."""
    out = []
    if totals.kept["valid"] == 0 and cfg.valid_fraction > 0:
        kept = totals.kept["train"]
        out.append(f"the valid split is empty: {kept:,} kept file(s) x --valid-fraction {cfg.valid_fraction} "
                   f"~ {kept * cfg.valid_fraction:.2f} expected; a training run given --data.valid on it has no "
                   "validation data (raise --valid-fraction or add input)")
    return out


def format_summary(stats: dict[str, Any]) -> str:
    """The human summary: files kept and removed by reason, then seconds and throughput per stage."""
    cfg = stats["config"]
    rows = [(f"bad records: {r}", c) for r, c in stats["bad_records"].items()]
    if cfg.get("licenses", "all") != "all":
        rows += [(f"license: {r}", c) for r, c in stats["licenses"]["dropped_by_reason"].items()]
    rows.append(("exact duplicates", stats["exact_duplicates"]))
    rows += [(f"filtered: {r}", c) for r, c in stats["filtered"].items()]
    rows += [(f"filtered: {r} (OFF: {why})", None) for r, why in stats.get("filters_off", {}).items()]
    if cfg.get("filter_encoded_data"):
        rows.append(("encoded data", stats["encoded_data"]))
    rows.append(("HumanEval decontamination", stats["decontaminated"]))
    if cfg["near_dedup"]:
        rows.append((f"near duplicates ({stats['near_duplicate_clusters']} clusters)", stats["near_duplicates"]))
    rows += [("kept: train", stats["kept_train"]), ("kept: valid", stats["kept_valid"])]
    if cfg.get("redact_secrets"):
        kinds = ", ".join(f"{k} {n:,}" for k, n in stats["redacted_by_kind"].items()) or "none"
        rows.append((f"kept, with secrets redacted ({kinds})", stats["files_redacted"]))
    total, width = max(stats["input_records"], 1), max(len(name) for name, _ in rows) + 2
    lines = [f"  {'':<{width}}{'files':>9}  {'share':>6}"]
    lines += [f"  {name:<{width}}{count:>9,}  {100 * count / total:5.1f}%" if count is not None
              else f"  {name:<{width}}{'-':>9}" for name, count in rows]
    lines.append(f"  {'input records':<{width}}{stats['input_records']:>9,}  -> "
                 f"{stats['kept_train'] + stats['kept_valid']:,} kept; {stats['bytes_in'] / 1e6:.1f} MB in, "
                 f"{stats['bytes_out'] / 1e6:.1f} MB out")
    lines += [f"  first '{reason}' at {where}" for reason, where in stats["bad_record_examples"].items()]
    lines.append(f"  {'stage':<14}{'seconds':>9}{'files/s':>12}{'MB/s':>8}")
    for stage, sec in stats["seconds"].items():
        fps, mbs = stats["files_per_second"].get(stage), stats["mb_per_second"].get(stage)
        lines.append(f"  {stage:<14}{sec:>9.2f}{'' if fps is None else f'{fps:,.0f}':>12}"
                     f"{'' if mbs is None else f'{mbs:.1f}':>8}")
    lines.append("  (stages in CPU seconds, files/s per core; filters, decontaminate and minhash summed over workers; "
                 "pass1, pass2, total wall-clock)")
    return printable("\n".join(lines))


def printable(text: str) -> str:
    """`text` writable to any UTF-8 stream: a path whose name is not UTF-8 (its bytes are lone surrogates in a Python
    str, e.g. a bad record's input file or --output-dir) is shown with \\udcXX escapes instead of failing the print
    after the run."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def write_clusters(path: Path, clusters: dict) -> None:
    """duplicate_clusters.json with one cluster per line: valid JSON, greppable, no single giant string."""
    with open(path, "w", encoding="utf-8") as f:
        f.write(json.dumps({k: v for k, v in clusters.items() if k != "clusters"})[:-1] + ', "clusters": [')
        for i, cluster in enumerate(clusters["clusters"]):
            line = printable(json.dumps(cluster, ensure_ascii=False))  # a name that is not UTF-8: \udcXX escapes
            f.write(("\n  " if i == 0 else ",\n  ") + line)
        f.write("\n]}\n")

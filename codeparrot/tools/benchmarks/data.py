"""Data-pipeline benchmark: export, exact dedup + filters, decontamination, near dedup and the whole pipeline,
in files/s and MB/s, on the standard-library export and (full run) on an export of the virtualenv's
site-packages (about 12,000 files, 240 MB), plus the bytes per file the dedup indexes hold.

Each pipeline row is a real `preprocess()` run (reading gzip shards, writing shards) with 2 worker processes,
timed wall-clock. On a shared machine other jobs steal cores, so each note also gives the run's CPU seconds
(main process + workers) and the rate 2 free cores would reach at that CPU cost.
"""

from __future__ import annotations

import resource
import sysconfig
import tempfile
import time
from pathlib import Path

from codeparrot.data.export import export_local
from codeparrot.data.preprocess import PreprocessConfig, preprocess
from codeparrot.data.records import iter_texts, resolve_data_files
from codeparrot.tools.benchmarks.common import BenchRow, area_cli, measure, print_rows

TARGET_EXACT_AND_FILTERS = 380  # files/s on the site-packages export with 2 workers (issue 2)
# The original preprocessing script on this machine, 2 workers. It always counts tokens (the chars-per-token
# filter), so equal work is our run with --tokenizer; our run without it does less work.
ORIGINAL_FILES_PER_S = 126
# About 230 stdlib files for the quick run (smoke test, a few seconds); `encodings` holds the near duplicates
# (its codec tables) that near dedup finds: 17 clusters, 61 files removed.
QUICK_PACKAGES = ["asyncio", "email", "encodings", "json", "multiprocessing", "xml"]


def _cpu_seconds() -> float:
    """CPU seconds of this process and its reaped children (the pool workers, once joined)."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def _run(raw: Path, out: Path, **kwargs) -> tuple[dict, float, float]:
    """(stats, wall seconds, CPU seconds) of one pipeline run."""
    cpu, wall = _cpu_seconds(), time.perf_counter()
    stats = preprocess(PreprocessConfig([str(raw)], str(out), num_workers=2, progress=False, **kwargs))
    return stats, time.perf_counter() - wall, _cpu_seconds() - cpu


def _pipeline_rows(name: str, raw: Path, work: Path, repeats: int, target: int | None,
                   tokenizer: Path | None = None) -> list[BenchRow]:
    rows: list[BenchRow] = []
    runs: dict[str, list[tuple[dict, float, float]]] = {}
    configs = {"exact dedup + filters": {"decontaminate": False},
               "exact dedup + filters + decontamination": {},
               "full pipeline with near dedup": {"near_dedup": True}}
    if tokenizer is not None:  # the original's work: every filter, the characters-per-token one included
        configs["exact dedup + filters with --tokenizer"] = {"decontaminate": False, "tokenizer": str(tokenizer)}
    for label, kwargs in configs.items():
        runs[label] = []

        def once(label=label, kwargs=kwargs) -> float:
            stats, wall, cpu = _run(raw, work / "clean", **kwargs)
            runs[label].append((stats, wall, cpu))
            return stats["input_records"] / wall

        median, low, high = measure(once, repeats=repeats)
        stats, wall, cpu = runs[label][-1]
        files, mb = stats["input_records"], stats["bytes_in"] / 1e6
        note = (f"{files:,} files, {mb:.0f} MB: {median * mb / files:.1f} MB/s; {cpu:.1f} CPU-s = "
                f"{2 * files / cpu:,.0f} files/s on 2 free cores")
        main_cpu = stats["seconds"].get("read", 0) + stats["seconds"].get("exact_dedup", 0)
        if label == "exact dedup + filters" and main_cpu > 0:  # what bounds the run with many worker cores
            note += f"; main process (read + exact dedup) alone tops out at {files / main_cpu:,.0f} files/s"
        if target and label == "exact dedup + filters":
            note += (f"; {median / target:.2f}x the {target} files/s target; no chars-per-token filter (the "
                     "original always runs it: compare the --tokenizer row)")
        if "tokenizer" in kwargs:
            note += (f"; filters {stats['seconds'].get('filters', 0):.1f} CPU-s (token counts included); equal work "
                     f"to the original: {median / ORIGINAL_FILES_PER_S:.1f}x its {ORIGINAL_FILES_PER_S} files/s")
        if "near_dedup" in kwargs:
            sec = stats["seconds"]
            note += (f"; stage CPU-s: read {sec.get('read', 0):.1f}, exact {sec.get('exact_dedup', 0):.1f}, filters "
                     f"{sec.get('filters', 0):.1f}, decontaminate {sec.get('decontaminate', 0):.1f}, minhash "
                     f"{sec.get('minhash', 0):.1f}, clustering {sec.get('clustering', 0):.2f}, write "
                     f"{sec.get('write', 0):.1f}; pass 2 {sec.get('pass2', 0):.1f} s wall")
        rows.append(BenchRow(f"data: {label} ({name}, 2 workers)", "files/s", median, low, high, repeats, note))

    # Stage rows from the full run's stats: CPU seconds per stage, so these are files/s per core.
    stats = runs["full pipeline with near dedup"][-1][0]
    sec, fps = stats["seconds"], stats["files_per_second"]
    for stage, label in [("read", "read + parse JSON (main process)"),
                         ("exact_dedup", "exact dedup: hash + index (main process)"),
                         ("filters", "heuristic filters (per worker core)"),
                         ("decontaminate", "HumanEval decontamination (per worker core)")]:
        if stage in fps:
            mbs = stats["mb_per_second"].get(stage)
            rows.append(BenchRow(f"data: {label} ({name})", "files/s", fps[stage], fps[stage], fps[stage], 1,
                                 f"{sec[stage]:.2f} CPU-s" + (f", {mbs:.1f} MB/s" if mbs else "")))
    survivors = stats["kept_train"] + stats["kept_valid"] + stats["near_duplicates"]  # files that entered near dedup
    near_s = sec.get("minhash", 0) / 2 + sec.get("clustering", 0)  # 2 workers share the MinHash work
    if near_s > 0:
        near = survivors / near_s
        rows.append(BenchRow(f"data: near dedup in the pipeline, 2 free cores ({name})", "files/s", near, near, near,
                             1, f"{survivors:,} files: MinHash {sec.get('minhash', 0):.2f} CPU-s shared by 2 workers + "
                             f"clustering {sec.get('clustering', 0):.2f} CPU-s; {stats['near_duplicate_clusters']} "
                             f"clusters, {stats['near_duplicates']} files removed"))
    index = stats["index_bytes_per_file"]
    rows.append(BenchRow(f"data: dedup index per unique file ({name})", "bytes/file", index["exact_dedup"],
                         index["exact_dedup"], index["exact_dedup"], 1,
                         f"exact dedup in RAM; near dedup adds {index.get('near_dedup_spool_metadata', 0)} B RAM + "
                         f"{index.get('near_dedup_signature_on_disk', 0)} B of signature on disk per survivor, "
                         f"plus the LSH index while clustering (near-dedup rows)"))
    return rows


def _export_row(name: str, sources: list[Path], out: Path, repo_per_subfolder: bool = False) -> BenchRow:
    start = time.perf_counter()
    stats = export_local(sources, out, repo_per_subfolder=repo_per_subfolder, progress=False)
    wall = time.perf_counter() - start
    rate = stats.files_written / wall
    return BenchRow(f"data: export_local ({name})", "files/s", rate, rate, rate, 1,
                    f"{stats.files_written:,} files, {stats.bytes_written / 1e6:.0f} MB: "
                    f"{stats.bytes_written / 1e6 / wall:.1f} MB/s, gzip level 6")


def _stdlib_tokenizer(raw: Path, out: Path) -> Path:
    """A CodeParrot-sized (32,768) byte-level BPE trained on the stdlib export: what --tokenizer loads."""
    from codeparrot.tokenizer import train_tokenizer  # transformers and torch: not for `--help`

    tok = train_tokenizer(iter_texts(resolve_data_files([raw])), vocab_size=32768, show_progress=False)
    tok.save_pretrained(out)
    return out


def rows(quick: bool = False) -> list[BenchRow]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    out: list[BenchRow] = []
    with tempfile.TemporaryDirectory(prefix="codeparrot-bench-data-") as tmp:
        work = Path(tmp)
        if quick:
            sources = [stdlib / p for p in QUICK_PACKAGES if (stdlib / p).is_dir()]
            out.append(_export_row("stdlib subset", sources, work / "stdlib"))
            out += _pipeline_rows("stdlib subset", work / "stdlib", work, repeats=1, target=None)
            return out
        out.append(_export_row("stdlib", [stdlib], work / "stdlib"))
        tokenizer = _stdlib_tokenizer(work / "stdlib", work / "tokenizer")
        out += _pipeline_rows("stdlib", work / "stdlib", work, repeats=3, target=None, tokenizer=tokenizer)
        purelib = Path(sysconfig.get_paths()["purelib"])
        out.append(_export_row("site-packages", [purelib], work / "site", repo_per_subfolder=True))
        out += _pipeline_rows("site-packages", work / "site", work, repeats=1, target=TARGET_EXACT_AND_FILTERS,
                              tokenizer=tokenizer)
    return out


if __name__ == "__main__":
    area_cli(__doc__, lambda flags: print_rows(rows(quick=flags.quick)))

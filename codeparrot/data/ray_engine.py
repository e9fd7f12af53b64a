"""`preprocess.py --engine ray`: the same pipeline as the local engine (`codeparrot.data.local_engine`), scheduled
by Ray; both implement `codeparrot.data.engine`'s interface.

Only the scheduler differs: every per-record decision is made by the local engine's own functions (the record
reader and bad-line policy of `records`, `strip_whitespace`/`digest_of_stripped`, `record_work.ChunkWorker` for
the filters, decontamination and MinHash, `lsh.find_clusters`, `cluster_report`, `shards.ShardWriter`,
`preprocess_stats.build_stats`), so the output is byte for byte the local engine's whatever the number of
blocks, workers, nodes or task finishing order. Every record carries a stable id, `read unit << 40 | row` (see
`ray_read`), and every "first wins" rule is "smallest id wins", which is input order.

Stages (the driver only sees fixed-size per-record numbers, never file contents; no group-by shuffle):
1. read (Ray Data, one task per input file or Hub split shard, `ray_read`) streaming lines to parse tasks:
   (id, digest, UTF-8 size, text, raw line, license, copies) per valid record, one row per bad line or damaged
   file with its reason; materialized once (the object store spills to disk).
2. license filter + exact dedup (driver): the (id, digest) of every valid record, 16 bytes each, read once with
   the bad lines (and, with `--licenses`, each record's license value, counted per value and dropped before
   exact dedup as on the local engine); the smallest id of each digest wins (`exact_dedup.first_ids`); the
   winners go to the workers as one object.
3. filters + encoded-data filter + decontamination + redaction + MinHash (Ray Data map over the winners):
   `ChunkWorker`, as in the local pool. Its output blocks stay in the object store; a task per block returns
   the counts (redactions by kind: counts only) and the kept files' numbers.
4. near dedup: by default on the driver, the kept files' signatures, one block at a time, into a memory-mapped
   file in id order (the local spool's row order), clustered by `find_clusters`; with `--ray-clustering
   distributed`, by Ray tasks (`ray_clustering`: band keys hash-partitioned, buckets linked where their
   members' signatures are, connected components in large-star/small-star rounds), the same clusters with no
   index and no signature on the driver. One member kept per cluster by `--near-dedup-keep` (the kept files'
   `copies`); a cluster member's repo_name and path are read by a task on the block that holds it.
5. shards (a task per shard): the driver assigns each kept id its split and shard (`samples_per_file`
   consecutive kept ids per shard); the shard's task gets those ids and the blocks whose kept id range overlaps
   them, sorts its rows by id and writes them with `ShardWriter`, then renames the file into place (a retried
   task rewrites the same bytes) and reports its rows and size, which the caller checks on disk.

Driver memory: about 170 bytes per input file at most (measured, `codeparrot.tools.benchmarks.ray_driver`: ids
and digests for exact dedup, the kept files' numbers, the LSH index, the cluster members' entries), plus 8 bytes
per kept file for its `copies` (`--near-dedup-keep most-copies`; 176 bytes per input file measured with it, 70%
kept); signatures (4 x num_perm bytes per survivor) live in a memory-mapped file inside the output folder.

Where Ray runs (a private loopback-only Ray, or a joined cluster checked node by node before any work):
`codeparrot.data.ray_cluster`. Every path a task opens is absolute (`codeparrot.data.preprocess` resolves them),
so a node's own working directory never matters.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from codeparrot.atomic_io import atomic_write_json
from codeparrot.data.cluster_report import clusters_report, member_entry, member_fields, near_duplicates_to_drop
from codeparrot.data.engine import EngineJob, EngineOutput
from codeparrot.data.hub_input import HubInput
from codeparrot.data.lsh import banding, find_clusters
from codeparrot.data.preprocess_config import PreprocessConfig
from codeparrot.data.preprocess_stats import Totals, build_stats, utf8_len, write_clusters
from codeparrot.data.record_work import ChunkWorker, count_decisions, count_redactions, replace_text
from codeparrot.data.ray_blocks import TASK_CPUS, kept_rows, ray_task, rows_with_ids, signature_matrix
from codeparrot.data.ray_cluster import check_nodes, is_private, start_ray
from codeparrot.data.ray_clustering import distributed_clusters
from codeparrot.data.exact_dedup import first_ids
from codeparrot.data.ray_read import Locations, parse_rows, read_unit, read_units, replay_bad
from codeparrot.data.records import BadRecords
from codeparrot.data.shards import SHARD_PATTERN, ShardInfo, ShardWriter
from codeparrot.errors import CodeParrotError

SPLITS = ("train", "valid")
# The kept files' numbers the driver holds (`_block_summary`, `_concat_sorted`): 33 bytes per kept file.
_KEPT_COLUMNS = {"id": np.int64, "digest": np.uint64, "nbytes": np.int64, "has_sig": bool, "copies": np.int64}
_WORK_CPUS = TASK_CPUS  # per filter/MinHash task: its tokenizer pool gets as many threads (`ray_blocks`)
_WORK_STAGES = ("filters", "encoded_data", "decontaminate", "redact_secrets", "minhash")  # ChunkWorker's CPU seconds
_READ_TASK_MEMORY = 64 << 20  # bytes reserved per read task (Ray's logical memory resource)
_PARTITION_BYTES = 256 << 20  # band keys per clustering partition at most (--ray-clustering distributed)
FAULT_MARKER_ENV = "CODEPARROT_RAY_FAULT_MARKER"  # tests: the first work task SIGKILLs its worker once


def _ray_data(cfg: PreprocessConfig):
    import ray.data

    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = bool(cfg.progress)
    ctx.print_on_execution_start = False
    return ray.data


# --- tasks: plain functions of their arguments (a retried task computes the same rows) --------------------

_SHARED: dict[str, Any] = {}  # per worker process: shared objects already fetched, by object id


def _shared(ref_box: list):
    import ray

    key = ref_box[0].hex()
    if key not in _SHARED:
        _SHARED.clear()
        _SHARED[key] = ray.get(ref_box[0])
    return _SHARED[key]


def _work(table, worker: ChunkWorker, winners_box: list, num_perm: int, fault_marker: str | None):
    """Filters, encoded-data filter, decontamination, redaction and MinHash of the exact-dedup winners of a batch
    (the local pool's work)."""
    import pyarrow as pa

    if fault_marker and not os.path.exists(fault_marker):
        Path(fault_marker).touch()
        os.kill(os.getpid(), signal.SIGKILL)  # a worker dying mid-task: Ray must retry the task
    os.environ.setdefault("RAYON_NUM_THREADS", str(_WORK_CPUS))  # read when the tokenizer's pool starts
    winners = _shared(winners_box)
    table = rows_with_ids(table, winners)
    texts = table["text"].to_pylist()
    reasons, sigs, valid, seconds, redactions = (worker(texts, table["digest"].to_pylist()) if texts
                                                 else ([], None, None, {}, []))
    kept = np.array([r is None for r in reasons], dtype=bool)
    raw = [r if k else b"" for r, k in zip(table["raw"].to_pylist(), kept.tolist())]
    nbytes = table["nbytes"].to_numpy().copy()
    redacted = [""] * len(texts)  # per row: the redaction kinds as JSON (counts only, never the values)
    for i, redaction in enumerate(redactions):
        if redaction is not None:  # the redacted text replaces the original in the written record
            raw[i] = replace_text(raw[i], worker.text_column, redaction[0])
            nbytes[i] = utf8_len(redaction[0])
            redacted[i] = json.dumps(dict(redaction[1]))
    has_sig = np.zeros(len(texts), dtype=bool)
    offsets = np.zeros(len(texts) + 1, dtype=np.int32)  # signature list per row: num_perm values if kept
    values = np.zeros(0, dtype=np.uint32)
    if sigs is not None:
        has_sig[kept] = valid
        offsets[1:] = np.cumsum(kept * num_perm)
        values = np.ascontiguousarray(sigs, dtype=np.uint32).reshape(-1)
    cpu = np.zeros((len(_WORK_STAGES), len(texts)))  # the batch's seconds on its first row
    if len(texts):
        cpu[:, 0] = [seconds.get(k, 0.0) for k in _WORK_STAGES]
    return pa.table({
        "id": table["id"], "digest": table["digest"], "nbytes": pa.array(nbytes, pa.int64()),
        "copies": table["copies"], "redacted": pa.array(redacted, pa.string()),
        "reason": pa.array(["" if r is None else r for r in reasons], pa.string()),
        "raw": pa.array(raw, pa.large_binary()), "has_sig": pa.array(has_sig),
        "sig": pa.ListArray.from_arrays(pa.array(offsets), pa.array(values, pa.uint32())),
        **{f"cpu_{stage}": cpu[k] for k, stage in enumerate(_WORK_STAGES)},
    })


def _member_fields(block, ids: np.ndarray) -> dict[int, tuple]:
    """id -> (repo_name, path) of the near-duplicate cluster members (sorted `ids`) in one block: what the
    driver prints about them, never the files themselves."""
    found = rows_with_ids(block, ids)
    return {int(i): member_fields(raw) for i, raw in zip(found["id"].to_pylist(), found["raw"].to_pylist())}


def _block_summary(block) -> dict:
    """What the driver needs of one block of filter/MinHash results: counts by reason, CPU seconds per stage,
    redacted files and replacements by kind (counts only), and the kept files' numbers (no text, no signature)."""
    reasons = block["reason"].to_numpy(zero_copy_only=False)
    kept = reasons == ""
    found, counts = np.unique(reasons[~kept], return_counts=True)
    redacted = [kinds for kinds in block["redacted"].to_pylist() if kinds]
    return {"reasons": dict(zip(found.tolist(), counts.tolist())),
            "cpu": {stage: float(np.sum(block[f"cpu_{stage}"].to_numpy())) for stage in _WORK_STAGES},
            "files_redacted": len(redacted), "redacted": sum((Counter(json.loads(k)) for k in redacted), Counter()),
            "kept": {c: block[c].to_numpy()[kept] for c in _KEPT_COLUMNS}}


def _block_signatures(block, num_perm: int) -> tuple[np.ndarray, np.ndarray]:
    """(kept ids, their signatures uint32[kept, num_perm]) of one block."""
    block = kept_rows(block)
    return block["id"].to_numpy(), signature_matrix(block, num_perm)


def _write_shard(folder: str, number: int, ids: np.ndarray, compression_level: int, *blocks) -> ShardInfo:
    """Write shard `number` of a split: the rows with the (sorted) `ids`, gathered from the blocks that hold
    them, in id order, with ShardWriter; then rename it into place (a retried task writes the same bytes)."""
    import pyarrow as pa

    table = pa.concat_tables([rows_with_ids(block.select(["id", "raw"]), ids) for block in blocks])
    order = np.argsort(table["id"].to_numpy(), kind="stable")
    if len(order) != len(ids):
        raise CodeParrotError(f"ray engine: shard {number} of {folder} found {len(order)} of its {len(ids)} rows")
    part = Path(folder) / f".part-{number}-{uuid.uuid4().hex}"  # private to this attempt
    part.mkdir()  # not its parents: an output folder this node does not see fails here, not on a private disk
    writer = ShardWriter(part, len(ids), compression_level)
    try:
        raws = table["raw"].to_pylist()
        for i in order.tolist():
            writer.write_line(raws[i])
        writer.close()
        (info,) = writer.shard_infos()
    except BaseException:
        writer.abort()
        raise
    name = SHARD_PATTERN.format(index=number)
    os.replace(part / info.name, Path(folder) / name)
    shutil.rmtree(part, ignore_errors=True)
    return info._replace(name=name)


# --- driver ------------------------------------------------------------------------------------------------

def _one_line_errors(run):
    """`run()`; a CodeParrotError raised inside a Ray task (e.g. a Hub shard that fails mid-stream) comes out as
    itself, one line, not wrapped in Ray's task error with the worker's traceback."""
    try:
        return run()
    except Exception as err:
        cause, seen = err, set()
        while cause is not None and id(cause) not in seen:
            seen.add(id(cause))
            inner = getattr(cause, "cause", None)  # RayTaskError: the task's own exception
            if isinstance(inner, BaseException):
                cause = inner
            elif isinstance(cause, CodeParrotError):  # Ray Data appends its retry advice on further lines
                raise CodeParrotError(str(cause).splitlines()[0]) from None
            else:
                cause = cause.__cause__ or cause.__context__
        raise


def _valid_split(digests: np.ndarray, fraction: float) -> np.ndarray:
    """`digest < fraction * 2.0**64` exactly as the local engine (a Python int/float comparison is exact;
    numpy would round the uint64 digests to float64)."""
    bound = fraction * 2.0**64
    if bound >= 2.0**64:
        return np.ones(len(digests), dtype=bool)
    return digests < np.uint64(math.ceil(bound))


def run(job: EngineJob) -> EngineOutput:
    """The `engine.Engine` of Ray Data (see the module docstring): the output into `job.tmp`."""
    started = start_ray(job.cfg)
    try:
        if not is_private(job.cfg):
            check_nodes(job.paths, job.cfg.tokenizer, job.tmp)
        return _run(job.cfg, job.paths, job.worker, job.tmp, job.start)
    finally:
        if started:
            import ray

            ray.shutdown()


def _run(cfg: PreprocessConfig, paths: list[Path | HubInput], worker: ChunkWorker, tmp: Path,
         start: float) -> EngineOutput:
    import ray

    rd = _ray_data(cfg)
    totals, bad = Totals(), BadRecords(strict=cfg.strict)
    units = read_units(paths)  # input files and Hub split shards, in input order (see `ray_read`)
    # The read reserves a little memory (what one block of lines needs) so that its resources differ from the
    # parse tasks': Ray Data would otherwise fuse the two maps into one task, and one large input file would be
    # decompressed, parsed and hashed on one core. Apart, the parse tasks work on other cores as lines stream in.
    lines = rd.from_items(units, override_num_blocks=len(units)).map_batches(
        read_unit, batch_size=1, batch_format="numpy", memory=_READ_TASK_MEMORY)
    records = lines.map_batches(parse_rows, batch_size=None, batch_format="pyarrow",
                                fn_kwargs={"text_column": cfg.text_column})
    if cfg.ray_blocks:
        records = records.repartition(cfg.ray_blocks)
    records = _one_line_errors(records.materialize)
    # Bad lines: replayed through the local policy in input order (same counts, first examples, --strict error).
    t = time.perf_counter()
    locate, ids, digests = replay_bad(records, paths, units, bad, totals, worker.license_filter)
    if totals.valid_records == 0:
        problems = "; ".join(bad.summary_lines()) or "the files hold no lines"
        raise CodeParrotError(f"no valid records in {len(paths)} input file(s): {problems}")

    # Exact dedup (driver, from the 16 bytes per record it already reads): the smallest id (first in input
    # order) of each digest wins, among the records the license filter kept.
    winners = first_ids(digests, ids)
    del ids, digests
    totals.exact_duplicates = totals.valid_records - sum(totals.licenses.by_reason.values()) - len(winners)
    totals.seconds["exact_dedup"] = time.perf_counter() - t

    marker = os.environ.get(FAULT_MARKER_ENV)
    # bad lines never match a winner's id: `_work` drops them with the exact duplicates
    work = records.map_batches(_work, batch_size=4 * cfg.chunk_files, batch_format="pyarrow", num_cpus=_WORK_CPUS,
                               fn_kwargs={"worker": worker, "winners_box": [ray.put(winners)],
                                          "num_perm": cfg.num_perm, "fault_marker": marker}).materialize()

    # Decisions of the winners, block by block: counts by reason, redactions by kind, and the kept files' (id,
    # digest, size, has signature, copies). The blocks stay where they are; each block's kept id range tells the
    # shard tasks where to look.
    blocks = work.to_arrow_refs()
    kept_parts, ranges = [], []
    for summary in ray.get([ray_task(_block_summary).remote(block) for block in blocks]):
        for stage in _WORK_STAGES:
            totals.seconds[stage] += summary["cpu"][stage]
        count_decisions(totals, summary["reasons"].items())
        count_redactions(totals, summary["redacted"], summary["files_redacted"])
        kept_parts.append(summary["kept"])
        ids = summary["kept"]["id"]
        ranges.append((int(ids.min()), int(ids.max())) if len(ids) else (1, 0))
    kept = _concat_sorted(kept_parts)
    totals.files["filters"] = len(winners)
    totals.files["encoded_data"] = len(winners) - sum(totals.filtered.values())
    totals.files["decontaminate"] = totals.files["encoded_data"] - sum(totals.encoded_data.values())
    totals.files["minhash"] = totals.files["redact_secrets"] = len(kept["id"])
    for stage in ("read", "exact_dedup"):
        totals.files[stage], totals.bytes[stage] = totals.valid_records, totals.bytes_in
    totals.seconds["pass1"] = time.perf_counter() - start

    drop = np.zeros(len(kept["id"]), dtype=bool)
    clusters = None
    if cfg.near_dedup:
        t = time.perf_counter()
        clusters = _near_dedup(cfg, blocks, ranges, kept, drop, locate, tmp, totals)
        totals.seconds["pass2"] = time.perf_counter() - t
        totals.files["pass2"] = totals.files["clustering"]

    is_valid = _valid_split(kept["digest"], cfg.valid_fraction)
    final = ~drop
    by_split = [kept["id"][final & ~is_valid], kept["id"][final & is_valid]]
    totals.kept["train"], totals.kept["valid"] = len(by_split[0]), len(by_split[1])
    totals.bytes_out = int(kept["nbytes"][final].sum())
    for split in SPLITS:
        (tmp / split).mkdir(exist_ok=True)  # an empty split is an empty folder, never a missing one
    t = time.perf_counter()
    infos: dict[str, list[ShardInfo]] = {split: [] for split in SPLITS}  # as the shard tasks reported them
    pending = []  # (split, shard task), in shard order
    for split, split_ids in zip(SPLITS, by_split):
        for first in range(0, len(split_ids), cfg.samples_per_file):
            mine = split_ids[first:first + cfg.samples_per_file]  # sorted: the shard's rows in input order
            where = [b for b, (lo, hi) in zip(blocks, ranges) if lo <= mine[-1] and hi >= mine[0]]
            number = first // cfg.samples_per_file + 1
            pending.append((split, ray_task(_write_shard).remote(str(tmp / split), number, mine, cfg.compression_level,
                                                              *where)))
    for (split, _), info in zip(pending, _one_line_errors(lambda: ray.get([task for _, task in pending]))):
        infos[split].append(info)
    totals.seconds["write"] = time.perf_counter() - t
    shards = {}
    for split in SPLITS:
        for leftover in (tmp / split).glob(".part-*"):  # a killed attempt's private folder
            shutil.rmtree(leftover, ignore_errors=True)
        shards[split] = [tmp / split / info.name for info in infos[split]]
    totals.seconds["total"] = time.perf_counter() - start
    for stage in ("pass1", "total"):
        totals.files[stage], totals.bytes[stage] = totals.valid_records, totals.bytes_in
    stats = build_stats(cfg, paths, bad, totals, 8 * len(winners), clusters, shards)
    if clusters is not None:
        write_clusters(tmp / "duplicate_clusters.json", clusters)
    atomic_write_json(tmp / "stats.json", stats)
    return EngineOutput(stats, infos)


def _concat_sorted(parts: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """The kept files' columns (per block) as numpy arrays sorted by id (input order)."""
    columns = {c: np.concatenate([p[c] for p in parts]).astype(t) if parts else np.zeros(0, t)
               for c, t in _KEPT_COLUMNS.items()}
    order = np.argsort(columns["id"], kind="stable")
    return {c: v[order] for c, v in columns.items()}


def _near_dedup(cfg: PreprocessConfig, blocks: list, ranges: list[tuple[int, int]], kept: dict, drop: np.ndarray,
                locate: Locations, tmp: Path, totals: Totals) -> dict:
    """Cluster the kept files as the local engine does (same rows, same order, same `find_clusters`); marks
    `drop` and returns the content of `duplicate_clusters.json`. `ranges`: each block's kept id range."""
    import ray

    ids, n = kept["id"], len(kept["id"])
    t = time.perf_counter()
    clusters: list[np.ndarray] = []
    if n and cfg.ray_clustering == "distributed":  # Ray tasks: no index and no signature on the driver
        bands = banding(cfg.jaccard_threshold, cfg.num_perm)[0]
        partitions = max(int(ray.cluster_resources().get("CPU", 1)), math.ceil(n * bands * 12 / _PARTITION_BYTES))
        clusters = distributed_clusters(blocks, ranges, ids, cfg.jaccard_threshold, cfg.num_perm, partitions)
    elif n:
        sig_path = tmp / ".signatures.u32"
        sigs = np.lib.format.open_memmap(sig_path, mode="w+", dtype=np.uint32, shape=(n, cfg.num_perm))
        for block in blocks:  # one block's signatures on the driver at a time
            block_ids, block_sigs = ray.get(ray_task(_block_signatures).remote(block, cfg.num_perm))
            sigs[np.searchsorted(ids, block_ids)] = block_sigs
        sigs.flush()
        clusters = find_clusters(sigs, cfg.jaccard_threshold, kept["has_sig"])
        del sigs
        os.unlink(sig_path)
    totals.seconds["clustering"] = time.perf_counter() - t
    totals.files["clustering"] = n
    drop |= near_duplicates_to_drop(clusters, n, kept["copies"], cfg.near_dedup_keep)
    totals.near_duplicates = int(drop.sum())
    rows = np.sort(np.concatenate(clusters)) if clusters else np.zeros(0, dtype=np.int64)
    members: dict[int, dict] = {}
    if len(rows):
        wanted, fields = ids[rows], {}
        for block, (lo, hi) in zip(blocks, ranges):
            mine = wanted[(wanted >= lo) & (wanted <= hi)]
            if len(mine):
                fields.update(ray.get(ray_task(_member_fields).remote(block, mine)))
        for row in rows.tolist():
            rid = int(ids[row])
            members[row] = member_entry(fields[rid], str(locate(rid)), not drop[row])
    return clusters_report(cfg, clusters, drop, members)

"""`preprocess.py --engine ray`: the same pipeline as the local engine (`codeparrot.data.local_engine`), scheduled
by Ray; both implement `codeparrot.data.engine`'s interface.

Only the scheduler differs: every per-record decision is made by the local engine's own functions (the record
reader and bad-line policy of `records`, `strip_whitespace`/`digest_of_stripped`, `record_work.ChunkWorker` for
the filters, decontamination and MinHash, `lsh.find_clusters`, `cluster_report`, `shards.ShardWriter`,
`preprocess_stats.build_stats`), so the output is byte for byte the local engine's whatever the number of
blocks, workers, nodes or task finishing order. Every record carries a stable id, `read unit << 40 | row` (see
`ray_read`), and every "first wins" rule is "smallest id wins", which is input order.

Stages (the driver only sees fixed-size per-record numbers, never file contents; no group-by shuffle). Pass 1
(stages 1-3, `ray_pass1`) streams: no stage waits for the whole input, so reading, parsing and filtering overlap
on every core. Stage 4 is `ray_near_dedup`; stage 5 and the run's totals are this module.
1. read (`ray_read.read_lines`: a streaming-generator task per read group, i.e. a Hub split shard or a run of
   consecutive input files up to ~32 MiB of lines; one per 8 CPUs at once, in input order, reserving no CPU)
   yields blocks of `ray_block_records` lines; a parse task per block (`ray_read.parse_lines`) returns the
   block's numbers (id, bad-line reason, size, digest, license: no text) and its valid records (id, digest,
   size, copies, text, raw line), which wait in the object store for their filter task. At most
   `_BLOCKS_PER_CPU` blocks per CPU are parsed and not yet filtered; a reader more than `_READ_AHEAD` blocks
   ahead pauses, so the object store holds a window of the input, not all of it.
2. license filter + exact dedup (driver, `ray_read.ExactDedup`): the blocks' numbers in input order; bad lines
   replayed through the local policy as they come (same counts, first examples, --strict error), license values
   counted and dropped before exact dedup as on the local engine, and the first occurrence of each digest wins
   (`DigestSet`, 8 bytes per distinct file), which is the smallest id. Each block's winners go at once to:
3. filters + encoded-data filter + decontamination + redaction + MinHash (a task per block, `_work`):
   `ChunkWorker`, as in the local pool. It returns the counts (redactions by kind: counts only) and the kept
   files' numbers to the driver; the kept rows (id, raw line as written, signature) stay in the object store.
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

Driver memory: about 170 bytes per input file with the driver's clustering, 90 with `--ray-clustering
distributed` (measured, `codeparrot.tools.benchmarks.ray_driver`, 30% exact duplicates, the rest kept: the
digests of exact dedup, the kept files' numbers including `copies`, the LSH index, the cluster members'
entries); signatures (4 x num_perm bytes per survivor) live in a memory-mapped file inside the output folder.

Why Ray tasks and not Ray Data: with Ray Data's map stages, exact dedup needed every block materialized first
(a barrier: on 2 CPUs the filters started after 11 s of reading and parsing, then ran alone), its bundling delayed
the parse tasks until most of a file was read, and `import ray.data` plus its executor cost a second per run.
Streamed as tasks, the same work keeps every core busy from the first block (see bench/results.md).

Where Ray runs (a private loopback-only Ray, or a joined cluster checked node by node before any work):
`codeparrot.data.ray_cluster`. Every path a task opens is absolute (`codeparrot.data.preprocess` resolves them),
so a node's own working directory never matters.
"""

from __future__ import annotations

import math
import os
import shutil
import time
import uuid
from pathlib import Path

import numpy as np

from codeparrot.atomic_io import atomic_write_json
from codeparrot.data.engine import EngineJob, EngineOutput
from codeparrot.data.hub_input import HubInput
from codeparrot.data.preprocess_config import PreprocessConfig
from codeparrot.data.preprocess_stats import Totals, build_stats, write_clusters
from codeparrot.data.ray_blocks import ray_task, rows_with_ids
from codeparrot.data.ray_cluster import check_nodes, is_private, ray_shutdown, start_ray
from codeparrot.data.ray_near_dedup import near_dedup
from codeparrot.data.ray_pass1 import concat_sorted, read_and_filter
from codeparrot.data.ray_read import ExactDedup, read_units
from codeparrot.data.record_work import ChunkWorker
from codeparrot.data.records import BadRecords
from codeparrot.data.shards import SHARD_PATTERN, ShardInfo, ShardWriter
from codeparrot.errors import CodeParrotError, first_line

SPLITS = ("train", "valid")


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
            elif isinstance(cause, CodeParrotError):  # only its first line: no retry advice, no traceback
                raise CodeParrotError(first_line(cause)) from None
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
    """The `engine.Engine` of Ray (see the module docstring): the output into `job.tmp`."""
    started = start_ray(job.cfg)
    try:
        if not is_private(job.cfg):
            check_nodes(job.paths, job.cfg.tokenizer, job.tmp)
        return _run(job.cfg, job.paths, job.worker, job.tmp, job.start)
    finally:
        if started:
            ray_shutdown()


def _run(cfg: PreprocessConfig, paths: list[Path | HubInput], worker: ChunkWorker, tmp: Path,
         start: float) -> EngineOutput:
    import ray

    totals, bad = Totals(), BadRecords(strict=cfg.strict)
    units = read_units(paths)  # input files and Hub split shards, in input order (see `ray_read`)
    dedup = ExactDedup(paths, units, bad, totals, worker.license_filter)
    # pass 1: the kept rows of every block that kept a file, each block's kept id range (where the shard tasks
    # look), and the kept files' (id, digest, size, has signature, copies); the decisions are counted in totals
    blocks, ranges, kept_parts = _one_line_errors(lambda: read_and_filter(cfg, units, worker, dedup))
    if totals.valid_records == 0:
        problems = "; ".join(bad.summary_lines()) or "the files hold no lines"
        raise CodeParrotError(f"no valid records in {len(paths)} input file(s): {problems}")
    winners = dedup.winners
    totals.exact_duplicates = totals.valid_records - sum(totals.licenses.by_reason.values()) - winners
    kept = concat_sorted(kept_parts)
    totals.files["filters"] = winners
    totals.files["encoded_data"] = winners - sum(totals.filtered.values())
    totals.files["decontaminate"] = totals.files["encoded_data"] - sum(totals.encoded_data.values())
    totals.files["minhash"] = totals.files["redact_secrets"] = len(kept["id"])
    for stage in ("read", "exact_dedup"):
        totals.files[stage], totals.bytes[stage] = totals.valid_records, totals.bytes_in
    totals.seconds["pass1"] = time.perf_counter() - start

    drop = np.zeros(len(kept["id"]), dtype=bool)
    clusters = None
    if cfg.near_dedup:
        t = time.perf_counter()
        clusters = near_dedup(cfg, blocks, ranges, kept, drop, dedup.locate, tmp, totals)
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
    stats = build_stats(cfg, paths, bad, totals, dedup.seen.nbytes, clusters, shards)
    if clusters is not None:
        write_clusters(tmp / "duplicate_clusters.json", clusters)
    atomic_write_json(tmp / "stats.json", stats)
    return EngineOutput(stats, infos)

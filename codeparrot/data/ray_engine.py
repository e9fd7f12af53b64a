"""`preprocess.py --engine ray`: the same pipeline as the local engine (`codeparrot.data.local_engine`), scheduled
by Ray; both implement `codeparrot.data.engine`'s interface.

Only the scheduler differs: every per-record decision is made by the local engine's own functions (the record
reader and bad-line policy of `records`, `strip_whitespace`/`digest_of_stripped`, `record_work.ChunkWorker` for
the filters, decontamination and MinHash, `lsh.find_clusters`, `cluster_report`, `shards.ShardWriter`,
`preprocess_stats.build_stats`), so the output is byte for byte the local engine's whatever the number of
blocks, workers, nodes or task finishing order. Every record carries a stable id, `read unit << 40 | row` (see
`ray_read`), and every "first wins" rule is "smallest id wins", which is input order.

Stages (the driver only sees fixed-size per-record numbers, never file contents; no group-by shuffle). Pass 1
streams: no stage waits for the whole input, so reading, parsing and filtering overlap on every core.
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
import queue
import shutil
import signal
import threading
import time
import uuid
from collections import Counter, deque
from pathlib import Path
from typing import Any

import numpy as np

from codeparrot.atomic_io import atomic_write_json
from codeparrot.data.cluster_report import clusters_report, member_entry, member_fields, near_duplicates_to_drop
from codeparrot.data.engine import EngineJob, EngineOutput, progress_bar
from codeparrot.data.hub_input import HubInput
from codeparrot.data.lsh import banding, find_clusters
from codeparrot.data.preprocess_config import PreprocessConfig
from codeparrot.data.preprocess_stats import Totals, build_stats, utf8_len, write_clusters
from codeparrot.data.record_work import ChunkWorker, count_decisions, count_redactions, replace_text
from codeparrot.data.ray_blocks import TASK_CPUS, ray_task, rows_with_ids, signature_matrix
from codeparrot.data.ray_cluster import check_nodes, is_private, start_ray
from codeparrot.data.ray_clustering import distributed_clusters
from codeparrot.data.ray_read import ExactDedup, Locations, parse_lines, read_groups, read_lines, read_units
from codeparrot.data.records import BadRecords
from codeparrot.data.shards import SHARD_PATTERN, ShardInfo, ShardWriter
from codeparrot.errors import CodeParrotError

SPLITS = ("train", "valid")
# The kept files' numbers the driver holds (`_work`'s summary, `_concat_sorted`): 33 bytes per kept file.
_KEPT_COLUMNS = {"id": np.int64, "digest": np.uint64, "nbytes": np.int64, "has_sig": bool, "copies": np.int64}
_WORK_CPUS = TASK_CPUS  # per filter/MinHash task: its tokenizer pool gets as many threads (`ray_blocks`)
_WORK_STAGES = ("filters", "encoded_data", "decontaminate", "redact_secrets", "minhash")  # ChunkWorker's CPU seconds
_CPUS_PER_READER = 8  # read tasks at once: one per 8 CPUs (a reader feeds several parse and filter tasks)
_READ_AHEAD = 4  # blocks a read task yields ahead of the driver before it pauses
_BLOCKS_PER_CPU = 4  # blocks parsed and not yet filtered at once, per CPU (the object store's working set)
_PARTITION_BYTES = 256 << 20  # band keys per clustering partition at most (--ray-clustering distributed)
FAULT_MARKER_ENV = "CODEPARROT_RAY_FAULT_MARKER"  # tests: the first work task SIGKILLs its worker once


# --- tasks: plain functions of their arguments (a retried task computes the same rows) --------------------

_SHARED: dict[str, Any] = {}  # per worker process: shared objects already fetched, by object id


def _shared(ref_box: list):
    import ray

    key = ref_box[0].hex()
    if key not in _SHARED:
        _SHARED.clear()
        _SHARED[key] = ray.get(ref_box[0])
    return _SHARED[key]


def _work(records, worker_box: list, winners: np.ndarray, num_perm: int, fault_marker: str | None):
    """Ray task (2 returns): filters, encoded-data filter, decontamination, redaction and MinHash of the
    exact-dedup winners (sorted ids) among a block of `ray_read.parse_lines` records: the local pool's work.
    Returns (summary, kept): what the driver counts (counts by reason, CPU seconds per stage,
    redactions by kind, the kept files' numbers; never a text) and the kept files' rows (id, raw line as
    written, signature), which stay in the object store for clustering and the shard tasks."""
    import pyarrow as pa

    if fault_marker and not os.path.exists(fault_marker):
        Path(fault_marker).touch()
        os.kill(os.getpid(), signal.SIGKILL)  # a worker dying mid-task: Ray must retry the task
    os.environ.setdefault("RAYON_NUM_THREADS", str(_WORK_CPUS))  # read when the tokenizer's pool starts
    worker: ChunkWorker = _shared(worker_box)
    table = rows_with_ids(records, winners)
    texts = table["text"].to_pylist()
    reasons, sigs, valid, seconds, redactions = (worker(texts, table["digest"].to_pylist()) if texts
                                                 else ([], None, None, {}, []))
    kept = np.array([r is None for r in reasons], dtype=bool)
    summary = {"reasons": dict(sorted(Counter(r for r in reasons if r is not None).items())),
               "cpu": {stage: seconds.get(stage, 0.0) for stage in _WORK_STAGES},
               "files_redacted": 0, "redacted": Counter()}
    table = table.filter(pa.array(kept))
    raw, nbytes = table["raw"], table["nbytes"].to_numpy().copy()
    redactions = [r for r, k in zip(redactions, kept.tolist()) if k]
    if any(r is not None for r in redactions):  # the redacted text replaces the original in the written record
        lines = raw.to_pylist()
        for i, redaction in enumerate(redactions):
            if redaction is not None:
                lines[i] = replace_text(lines[i], worker.text_column, redaction[0])
                nbytes[i] = utf8_len(redaction[0])
                summary["files_redacted"] += 1
                summary["redacted"].update(redaction[1])  # counts by kind, never the values
        raw = pa.array(lines, pa.large_binary())
    has_sig = np.zeros(len(table), dtype=bool)
    values = np.zeros(0, dtype=np.uint32)
    if sigs is not None:
        has_sig[:] = valid
        values = np.ascontiguousarray(sigs, dtype=np.uint32).reshape(-1)
    # num_perm values per kept row; empty lists without near dedup
    offsets = np.arange(len(table) + 1, dtype=np.int32) * (num_perm if sigs is not None else 0)
    summary["kept"] = {"id": table["id"].to_numpy(), "digest": table["digest"].to_numpy(), "nbytes": nbytes,
                       "has_sig": has_sig, "copies": table["copies"].to_numpy()}
    return summary, pa.table({
        "id": table["id"], "raw": raw, "has_sig": pa.array(has_sig),
        "sig": pa.ListArray.from_arrays(pa.array(offsets), pa.array(values, pa.uint32())),
    })


def _member_fields(block, ids: np.ndarray) -> dict[int, tuple]:
    """id -> (repo_name, path) of the near-duplicate cluster members (sorted `ids`) in one block: what the
    driver prints about them, never the files themselves."""
    found = rows_with_ids(block, ids)
    return {int(i): member_fields(raw) for i, raw in zip(found["id"].to_pylist(), found["raw"].to_pylist())}


def _block_signatures(block, num_perm: int) -> tuple[np.ndarray, np.ndarray]:
    """(kept ids, their signatures uint32[kept, num_perm]) of one block (it holds only kept files)."""
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
            elif isinstance(cause, CodeParrotError):  # only its first line: no retry advice, no traceback
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
    """The `engine.Engine` of Ray (see the module docstring): the output into `job.tmp`."""
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

    totals, bad = Totals(), BadRecords(strict=cfg.strict)
    units = read_units(paths)  # input files and Hub split shards, in input order (see `ray_read`)
    dedup = ExactDedup(paths, units, bad, totals, worker.license_filter)
    # pass 1: the kept rows of every block that kept a file, each block's kept id range (where the shard tasks
    # look), and the kept files' (id, digest, size, has signature, copies); the decisions are counted in totals
    blocks, ranges, kept_parts = _one_line_errors(lambda: _read_and_filter(cfg, units, worker, dedup))
    if totals.valid_records == 0:
        problems = "; ".join(bad.summary_lines()) or "the files hold no lines"
        raise CodeParrotError(f"no valid records in {len(paths)} input file(s): {problems}")
    winners = dedup.winners
    totals.exact_duplicates = totals.valid_records - sum(totals.licenses.by_reason.values()) - winners
    kept = _concat_sorted(kept_parts)
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
        clusters = _near_dedup(cfg, blocks, ranges, kept, drop, dedup.locate, tmp, totals)
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


def _feed_blocks(cfg: PreprocessConfig, units: list[dict], cpus: int, out: queue.Queue,
                 in_flight: threading.Semaphore, stop: threading.Event) -> None:
    """Driver thread: a read task per read group (`ray_read.read_groups`; `read_lines`, a streaming generator;
    one per `_CPUS_PER_READER` CPUs at once, started in input order) and a parse task per block of lines as it
    is read, once `in_flight` has room (blocks parsed and not yet filtered: the driver releases one per block it
    is done with). Puts, in input order, ("block", numbers ref, records ref) per block and ("units", [u, ...])
    after each group's last block; then None. A read error reaches the driver through its parse task's numbers;
    an error of this thread itself goes on `out` as itself. On `stop`, the read tasks still running are cancelled."""
    import ray

    generators = []
    try:
        # Readers reserve no CPU (like the local engine's reading main process): a reader paused because the
        # filters are behind (`_READ_AHEAD` blocks not taken) must not hold a core the filters need.
        read = ray_task(read_lines, "streaming").options(num_cpus=0, _generator_backpressure_num_objects=_READ_AHEAD)
        parse = ray_task(parse_lines, 2)
        groups = read_groups(units)
        readers = max(1, cpus // _CPUS_PER_READER)
        generators = [read.remote(group, cfg.ray_block_records) for group in groups[:readers]]
        for g, group in enumerate(groups):
            for lines in generators[g]:
                while not in_flight.acquire(timeout=0.2):
                    if stop.is_set():
                        return
                if stop.is_set():
                    return
                out.put(("block", *parse.remote(lines, cfg.text_column)))
            out.put(("units", [int(unit["unit"]) for unit in group]))
            generators[g] = None  # finished: nothing to cancel
            if g + readers < len(groups):
                generators.append(read.remote(groups[g + readers], cfg.ray_block_records))
        out.put(None)
    except BaseException as err:  # noqa: BLE001 - handed to the driver's thread, which raises it
        out.put(err)
    finally:
        if stop.is_set():
            for generator in generators:
                if generator is not None:
                    ray.cancel(generator)


def _read_and_filter(cfg: PreprocessConfig, units: list[dict], worker: ChunkWorker,
                     dedup: ExactDedup) -> tuple[list, list[tuple[int, int]], list[dict]]:
    """Pass 1, streaming: blocks are read and parsed by Ray tasks while the driver takes their numbers in input
    order, counts bad lines and decides exact duplicates (`ExactDedup`), and sends each block's winners to a
    filter/MinHash task (`_work`) at once; reading, parsing and filtering overlap, no stage waits for the whole
    input, and at most `_BLOCKS_PER_CPU` blocks per CPU are parsed and not yet filtered (the object store holds
    a bounded window, not the input). The filter tasks' summaries are counted in input order as they finish,
    so a failing task stops the run at once. Returns the kept rows of the blocks that kept files, their kept id
    ranges and the kept files' numbers, in input order; on an error, every task still running is cancelled."""
    import ray

    work = ray_task(_work, 2)
    worker_box = [ray.put(worker)]  # fetched once per worker process (`_shared`)
    marker = os.environ.get(FAULT_MARKER_ENV)
    totals = dedup.totals
    cpus = int(ray.cluster_resources().get("CPU", 1))
    in_flight = threading.Semaphore(max(4, _BLOCKS_PER_CPU * cpus))
    feed: queue.Queue = queue.Queue()
    stop = threading.Event()
    feeder = threading.Thread(target=_feed_blocks, args=(cfg, units, cpus, feed, in_flight, stop), daemon=True,
                              name="ray-read")
    feeder.start()
    pending: deque = deque()  # (summary ref, kept rows ref) of the filter tasks not yet counted, in input order
    blocks, ranges, kept_parts = [], [], []
    seconds, filtered = 0.0, 0

    def count(summary_ref, block) -> None:  # the oldest filter task's summary, in input order
        nonlocal filtered
        summary = ray.get(summary_ref)
        in_flight.release()
        for stage in _WORK_STAGES:
            totals.seconds[stage] += summary["cpu"][stage]
        count_decisions(totals, summary["reasons"].items())
        count_redactions(totals, summary["redacted"], summary["files_redacted"])
        ids = summary["kept"]["id"]
        filtered += len(ids) + sum(summary["reasons"].values())
        if len(ids):  # a block of which nothing was kept is not needed again
            blocks.append(block)
            kept_parts.append(summary["kept"])
            ranges.append((int(ids.min()), int(ids.max())))

    try:
        with progress_bar(cfg, "read, exact dedup, filters") as progress:
            fed = False  # the feed's last block was taken
            while not fed or pending:
                if pending and ray.wait([pending[0][0]], timeout=0 if not fed else None)[0]:
                    count(*pending.popleft())  # the oldest filter task finished: counted in input order
                    progress.set_postfix(filtered=filtered, refresh=False)
                    continue
                if fed:
                    continue
                try:  # the next block; while filter tasks run, look at them again every 50 ms
                    item = feed.get(timeout=0.05 if pending else None)
                except queue.Empty:
                    continue
                if item is None:
                    fed = True
                elif isinstance(item, BaseException):
                    raise item
                elif item[0] == "units":
                    for unit in item[1]:
                        dedup.unit_done(unit)
                else:
                    numbers = ray.get(item[1])
                    t = time.perf_counter()
                    winners = dedup.winners_of(numbers)
                    if len(winners):
                        pending.append(tuple(work.remote(item[2], worker_box, winners, cfg.num_perm, marker)))
                    else:
                        in_flight.release()
                    seconds += time.perf_counter() - t
                    progress.update(len(numbers["id"]))
    except BaseException:
        stop.set()
        for summary_ref, _ in pending:  # nothing of a failed run is needed: free the cores
            ray.cancel(summary_ref)
        raise
    finally:
        stop.set()
        feeder.join(timeout=10)
    totals.seconds["exact_dedup"] = seconds
    return blocks, ranges, kept_parts


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

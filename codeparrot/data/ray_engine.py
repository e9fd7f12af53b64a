"""`preprocess.py --engine ray`: the same pipeline as `codeparrot.data.preprocess`, scheduled by Ray Data.

Only the scheduler differs (`codeparrot.data.engine` is the interface both engines implement): every per-record
decision is made by the local engine's own functions (the record reader and bad-line policy of `records`,
`strip_whitespace`/`digest_of_stripped`, `record_work.ChunkWorker` for the filters, decontamination and MinHash, `lsh.find_clusters`, `shards.ShardWriter`,
`preprocess_stats.build_stats`), so the output is byte for byte the local engine's whatever the number of
blocks, workers or task finishing order. Every record carries a stable id, `read unit << 40 | row` (see
`ray_read`), and every "first wins" rule is "smallest id wins", which is input order.

Stages (Ray Data operators; the driver only sees fixed-size per-record numbers, never texts):
1. read (map, one task per input file or Hub split shard, `ray_read`): (id, digest, UTF-8 size, text, raw line)
   per valid record, and one row per bad line or damaged file with its reason; materialized once (the object
   store spills to disk).
2. exact dedup (group-by): `groupby(digest).min(id)` over the (digest, id) columns only; the winning ids
   (8 bytes per unique file) go to the driver and back to the workers as one shared object.
3. filters + decontamination + MinHash (map over the winners): `ChunkWorker`, as in the local pool.
4. near dedup (driver): the kept files' signatures are streamed into a memory-mapped file in id order (the
   local spool's row order) and clustered by `find_clusters`, the local engine's vectorized union-find.
5. shards (group-by): the driver assigns each kept id its split and shard (`samples_per_file` consecutive
   kept ids per shard), a group-by on the shard number gathers each shard's rows in one task, which sorts them
   by id and writes them with `ShardWriter`; a retried task rewrites the same bytes and renames them into place.

Driver memory per input file: 8 bytes (winning id) + per survivor 8 (id) + 8 (digest) + 8 (size) + 8 (copies) + 1
(has a signature) bytes, plus the LSH index while clustering (about 90 bytes per survivor, see `codeparrot.data.lsh`);
signatures (4 x num_perm bytes per survivor) live in a memory-mapped file inside the output folder.

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
from codeparrot.data.lsh import find_clusters
from codeparrot.data.preprocess_config import PreprocessConfig
from codeparrot.data.licenses import LicenseFilter
from codeparrot.data.preprocess_stats import Totals, build_stats, utf8_len, write_clusters
from codeparrot.data.record_work import ChunkWorker, count_decisions, count_redactions, replace_text
from codeparrot.data.ray_cluster import check_nodes, is_private, start_ray
from codeparrot.data.ray_read import LINE_BITS, Locations, good_rows, read_unit, read_units, replay_bad
from codeparrot.data.records import BadRecords
from codeparrot.data.shards import SHARD_PATTERN, ShardInfo, ShardWriter
from codeparrot.errors import CodeParrotError

SPLITS = ("train", "valid")
# CPUs per filter/MinHash task (Ray's default, stated): the tokenizer's Rust pool in that task gets as many
# threads, so N concurrent tasks on a node never run N x all-core pools (as `preprocess._init_worker`).
_WORK_CPUS = 1
_WORK_STAGES = ("filters", "encoded_data", "decontaminate", "redact_secrets", "minhash")  # ChunkWorker's CPU seconds
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
    ids = table["id"].to_numpy()
    pos = np.minimum(np.searchsorted(winners, ids), max(len(winners) - 1, 0))
    table = table.filter(winners[pos] == ids) if len(winners) else table.slice(0, 0)
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
    cpu = np.zeros((len(_WORK_STAGES), len(texts)))
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


def _allowed_by_license(table, licenses: LicenseFilter):
    """Rows whose license the --licenses allowlist keeps (the local engine's check, before exact dedup)."""
    keep = [licenses.reason(value) is None for value in table["license"].to_pylist()]
    return table.filter(np.array(keep, dtype=bool))


def _select_ids(table, ids_box: list):
    """Rows whose id is in the shared sorted id array."""
    ids = _shared(ids_box)
    mine = table["id"].to_numpy()
    pos = np.minimum(np.searchsorted(ids, mine), max(len(ids) - 1, 0))
    return table.filter(ids[pos] == mine) if len(ids) else table.slice(0, 0)


def _tag_shards(table, splits_box: list, samples_per_file: int):
    """Kept rows with their shard key: split index << 40 | shard number (1-based), from the driver's id lists."""
    import pyarrow as pa

    kept_by_split = _shared(splits_box)
    ids = table["id"].to_numpy()
    key = np.full(len(ids), -1, dtype=np.int64)
    for s, split_ids in enumerate(kept_by_split):
        if not len(split_ids):
            continue
        pos = np.minimum(np.searchsorted(split_ids, ids), len(split_ids) - 1)
        hit = split_ids[pos] == ids
        key[hit] = (s << LINE_BITS) + pos[hit] // samples_per_file + 1
    keep = key >= 0
    return pa.table({"id": table["id"].filter(keep), "raw": table["raw"].filter(keep), "shard": key[keep]})


def _write_shard(table, out: str, samples_per_file: int, compression_level: int):
    """Write one whole shard (all its rows, sorted by id) with ShardWriter, then rename it into place."""
    import pyarrow as pa

    key = int(table["shard"][0].as_py())
    split, number = SPLITS[key >> LINE_BITS], key & ((1 << LINE_BITS) - 1)
    order = np.argsort(table["id"].to_numpy(), kind="stable")
    part = Path(out) / split / f".part-{number}-{uuid.uuid4().hex}"  # private to this attempt
    part.mkdir()  # not its parents: an output folder this node does not see fails here, not on a private disk
    writer = ShardWriter(part, samples_per_file, compression_level)
    try:
        raws = table["raw"].to_pylist()
        for i in order.tolist():
            writer.write_line(raws[i])
        writer.close()
        (info,) = writer.shard_infos()
    except BaseException:
        writer.abort()
        raise
    os.replace(part / info.name, Path(out) / split / SHARD_PATTERN.format(index=number))  # same bytes if retried
    shutil.rmtree(part, ignore_errors=True)
    return pa.table({"shard": [key], "rows": [info.rows], "nbytes": [info.nbytes]})


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
    from ray.data.aggregate import Min

    rd = _ray_data(cfg)
    totals, bad = Totals(), BadRecords(strict=cfg.strict)
    units = read_units(paths)  # input files and Hub split shards, in input order (see `ray_read`)
    records = rd.from_items(units, override_num_blocks=len(units)).map_batches(
        read_unit, batch_size=1, batch_format="numpy", fn_kwargs={"text_column": cfg.text_column})
    if cfg.ray_blocks:
        records = records.repartition(cfg.ray_blocks)
    records = _one_line_errors(records.materialize)
    # Bad lines: replayed through the local policy in input order (same counts, first examples, --strict error).
    locate = replay_bad(records, paths, units, bad, totals)
    good = records.map_batches(good_rows, batch_format="pyarrow")
    if totals.valid_records == 0:
        problems = "; ".join(bad.summary_lines()) or "the files hold no lines"
        raise CodeParrotError(f"no valid records in {len(paths)} input file(s): {problems}")

    licenses = worker.license_filter
    if licenses.active:  # before exact dedup, as on the local engine; counted per distinct license value
        per_license = good.select_columns(["license"]).groupby("license").count().to_pandas()
        for value, count in zip(per_license["license"], per_license.iloc[:, 1]):
            totals.licenses.add(value, licenses.reason(value), int(count))
        good = good.map_batches(_allowed_by_license, batch_format="pyarrow", fn_kwargs={"licenses": licenses})

    # Exact dedup: shuffle (digest, id) only; the smallest id (first in input order) of each digest wins.
    t = time.perf_counter()
    firsts = good.select_columns(["digest", "id"]).groupby("digest").aggregate(Min("id", alias_name="first"))
    winners = np.sort(firsts.to_pandas()["first"].to_numpy(dtype=np.int64))
    totals.exact_duplicates = totals.valid_records - sum(totals.licenses.by_reason.values()) - len(winners)
    totals.seconds["exact_dedup"] = time.perf_counter() - t

    marker = os.environ.get(FAULT_MARKER_ENV)
    work = good.map_batches(_work, batch_size=4 * cfg.chunk_files, batch_format="pyarrow", num_cpus=_WORK_CPUS,
                            fn_kwargs={"worker": worker, "winners_box": [ray.put(winners)], "num_perm": cfg.num_perm,
                                       "fault_marker": marker}).materialize()

    # Decisions of the winners: counts by reason, and the kept files' (id, digest, size, has signature, copies).
    kept_parts = []
    for b in work.select_columns(["id", "digest", "nbytes", "copies", "reason", "redacted", "has_sig",
                                  *(f"cpu_{stage}" for stage in _WORK_STAGES)]).iter_batches(batch_format="pandas"):
        for stage in _WORK_STAGES:
            totals.seconds[stage] += float(b[f"cpu_{stage}"].sum())
        count_decisions(totals, ((reason, int(count)) for reason, count in b["reason"].value_counts().items()))
        for kinds in b["redacted"][b["redacted"] != ""]:
            count_redactions(totals, Counter(json.loads(kinds)))
        kept_parts.append(b[b["reason"] == ""][["id", "digest", "nbytes", "has_sig", "copies"]])
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
        clusters = _near_dedup(cfg, work, kept, drop, locate, tmp, totals)
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
    if len(by_split[0]) + len(by_split[1]):
        tagged = work.map_batches(_tag_shards, batch_format="pyarrow", fn_kwargs={
            "splits_box": [ray.put(by_split)], "samples_per_file": cfg.samples_per_file})
        written = tagged.groupby("shard").map_groups(_write_shard, batch_format="pyarrow", fn_kwargs={
            "out": str(tmp), "samples_per_file": cfg.samples_per_file, "compression_level": cfg.compression_level})
        reports = _one_line_errors(written.to_pandas).sort_values("shard")
        for key, rows, nbytes in zip(*(reports[c].tolist() for c in ("shard", "rows", "nbytes"))):
            infos[SPLITS[key >> LINE_BITS]].append(ShardInfo(SHARD_PATTERN.format(index=key & ((1 << LINE_BITS) - 1)),
                                                             rows, nbytes))
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


def _concat_sorted(parts: list) -> dict[str, np.ndarray]:
    """The kept files' columns as numpy arrays sorted by id (input order)."""
    import pandas as pd

    frame = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(
        {"id": [], "digest": [], "nbytes": [], "has_sig": [], "copies": []})
    frame = frame.sort_values("id", kind="stable")
    return {"id": frame["id"].to_numpy(np.int64), "digest": frame["digest"].to_numpy(np.uint64),
            "nbytes": frame["nbytes"].to_numpy(np.int64), "has_sig": frame["has_sig"].to_numpy(bool),
            "copies": frame["copies"].to_numpy(np.int64)}


def _near_dedup(cfg: PreprocessConfig, work, kept: dict, drop: np.ndarray, locate: Locations, tmp: Path,
                totals: Totals) -> dict:
    """Cluster the kept files as the local engine does (same rows, same order, same `find_clusters`); marks
    `drop` and returns the content of `duplicate_clusters.json`."""
    import pyarrow.compute as pc
    import ray

    ids, n = kept["id"], len(kept["id"])
    t = time.perf_counter()
    clusters: list[np.ndarray] = []
    if n:
        sig_path = tmp / ".signatures.u32"
        sigs = np.lib.format.open_memmap(sig_path, mode="w+", dtype=np.uint32, shape=(n, cfg.num_perm))
        for b in work.select_columns(["id", "reason", "sig"]).iter_batches(batch_format="pyarrow"):
            b = b.filter(np.asarray(b["reason"].to_numpy(zero_copy_only=False)) == "")
            if len(b):
                rows = np.searchsorted(ids, b["id"].to_numpy())
                sigs[rows] = pc.list_flatten(b["sig"]).to_numpy().reshape(len(b), cfg.num_perm)
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
        found = work.map_batches(_select_ids, batch_format="pyarrow", fn_kwargs={"ids_box": [ray.put(ids[rows])]})
        raw_by_id = {int(i): r for i, r in zip(*(found.select_columns(["id", "raw"]).to_pandas()[c]
                                                   for c in ("id", "raw")))}
        for row in rows.tolist():
            rid = int(ids[row])
            members[row] = member_entry(member_fields(raw_by_id[rid]), str(locate(rid)), not drop[row])
    return clusters_report(cfg, clusters, drop, members)

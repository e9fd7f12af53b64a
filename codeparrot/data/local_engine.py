"""The local engine of the data pipeline (`--engine local`, see `codeparrot.data.engine`): exact dedup ->
filters -> HumanEval decontamination -> near dedup -> deterministic train/valid split -> gzip JSONL shards,
`stats.json` and `duplicate_clusters.json`, with a process pool on this machine.

Streaming and parallel: the main process reads and parses records, hashes each content (whitespace removed)
and decides exact duplicates in input order (so the first occurrence wins for any worker count); only first
occurrences go to the worker pool, which filters, decontaminates and computes MinHash signatures in chunks.
Results come back in submission order with a bounded number of chunks in flight, so memory does not grow
with the input. Survivors go straight to the shards, or, with near dedup, to a spool file inside the temporary
output folder while their signatures are appended to a uint32 file (1 KiB per file at 256 permutations,
memory-mapped for clustering). After clustering (connected components, see `near_dedup`), a second pass copies
the spool to the shards without the near duplicates (the first file of each cluster in input order is kept).
Records are written byte for byte as they were read, so every field passes through.

Per-file memory: 8 bytes for the exact-dedup digest; with near dedup also 26 bytes of spool metadata per
survivor (split and signature flags, text size, input file index and line for `duplicate_clusters.json`, the
`copies` count for --near-dedup-keep), the
signature row on disk, and the LSH index while clustering (see `codeparrot.data.near_dedup`).

Everything is written inside the temporary output folder `codeparrot.data.preprocess` gives it (renamed into
place only after the run succeeded): a failed or interrupted run leaves no output folder.
"""

from __future__ import annotations

import os
import signal
import time
from array import array
from collections import deque
from pathlib import Path
from typing import Any

import numpy as np

from codeparrot.atomic_io import atomic_write_json
from codeparrot.data.cluster_report import clusters_report, member_entry, member_fields, near_duplicates_to_drop
from codeparrot.data.engine import EngineJob, EngineOutput, progress_bar
from codeparrot.data.exact_dedup import DigestSet, digest_of_stripped, strip_whitespace
from codeparrot.data.hub_input import HubInput, iter_input_records
from codeparrot.data.licenses import LicenseFilter
from codeparrot.data.near_dedup import find_clusters
from codeparrot.data.preprocess_config import PreprocessConfig, available_cores
from codeparrot.data.preprocess_stats import Totals, build_stats, utf8_len, write_clusters
from codeparrot.data.record_work import (DECONTAMINATED, ENCODED, ChunkWorker, count_decisions, count_redactions,
                                        record_signals, replace_text)
from codeparrot.data.records import BadRecords
from codeparrot.data.shards import ShardWriter
from codeparrot.data.stall import records_watchdog
from codeparrot.errors import CodeParrotError
from codeparrot.watchdog import stops_watchdogs
from codeparrot.worker_pool import WatchedResult, start_pool, stop_pool


# --- worker side: the per-record work (`record_work.ChunkWorker`) in each pool process -------------------------

_WORKER: ChunkWorker | None = None


def _init_worker(worker: ChunkWorker, threads: int) -> None:
    global _WORKER
    # The tokenizer's Rust thread pool (batched encoding of the files the word counts do not cover) gets this
    # worker's share of the cores: N workers x all-core pools would oversubscribe the machine. Read when the pool
    # starts, i.e. at this process's first batch.
    os.environ.setdefault("RAYON_NUM_THREADS", str(threads))
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the main process's to handle
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    _WORKER = worker


def _run_chunk(task):
    return _WORKER(*task)


class _Done:
    """An already computed result with the `AsyncResult.get` interface (--num-workers 0)."""

    def __init__(self, value):
        self.value = value

    def get(self):
        return self.value


# --- main side ----------------------------------------------------------------------------------------------

class _Sink:
    """Where pass 1 puts survivors: straight into the train/valid shards, or into the near-dedup spool."""

    def __init__(self, cfg: PreprocessConfig, out: Path, totals: Totals):
        self.cfg, self.totals = cfg, totals
        self.writers = {split: ShardWriter(out / split, cfg.samples_per_file, cfg.compression_level)
                        for split in ("train", "valid")}
        self.spool = None
        if cfg.near_dedup:
            self.spool_path, self.sig_path = out / ".spool.jsonl", out / ".signatures.u32"
            self.spool, self.sig_file = open(self.spool_path, "wb"), open(self.sig_path, "wb")
            self.is_valid = bytearray()  # per spool row: 1 = valid split
            self.has_sig = bytearray()  # per spool row: 1 = has a signature (>= min_tokens tokens)
            self.file_index, self.line = array("I"), array("Q")  # per spool row: where it was read
            self.nbytes = array("I")  # per spool row: UTF-8 bytes of the text
            self.copies = array("q")  # per spool row: the record's `copies` (-1: none), for --near-dedup-keep

    def put(self, line: bytes, text: str, digest: int, file_index: int, lineno: int, copies: int) -> None:
        # Deterministic split by content: the (uniform) 64-bit digest below valid_fraction x 2^64.
        is_valid = digest < self.cfg.valid_fraction * 2.0**64
        if self.spool is None:
            self.write(line, is_valid, utf8_len(text))
            return
        self.spool.write(line + b"\n")
        self.is_valid.append(is_valid)
        self.file_index.append(file_index)
        self.line.append(lineno)
        self.nbytes.append(utf8_len(text))
        self.copies.append(copies)

    def put_signatures(self, sigs: np.ndarray, valid: np.ndarray) -> None:
        self.sig_file.write(np.ascontiguousarray(sigs, dtype=np.uint32).tobytes())
        self.has_sig.extend(valid.astype(np.uint8).tobytes())

    def abort(self) -> None:
        for writer in self.writers.values():
            writer.abort()
        if self.spool is not None:
            self.spool.close()
            self.sig_file.close()

    def write(self, line: bytes, is_valid: bool, nbytes: int) -> None:
        split = "valid" if is_valid else "train"
        self.writers[split].write_line(line)
        self.totals.kept[split] += 1
        self.totals.bytes_out += nbytes


@stops_watchdogs
def _pass1(cfg: PreprocessConfig, paths: list[Path | HubInput], bad: BadRecords, sink: _Sink, submit,
           totals: Totals, licenses: LicenseFilter) -> int:
    """Read, exact-dedup (here, in input order), then filter, decontaminate and sign (in the workers); returns
    the bytes the exact-dedup index holds."""
    seen = DigestSet()
    file_index = {str(p): i for i, p in enumerate(paths)}
    pending: deque = deque()  # (chunk, first-occurrence positions, digests, async result), in input order
    window = 2 * max(cfg.num_workers, 1) + 1  # chunks in flight: keeps every worker busy, bounds memory
    bar, start = progress_bar(cfg, "preprocess"), time.perf_counter()
    watchdog = records_watchdog(cfg.stall_minutes, Path(cfg.output_dir), pending)  # codeparrot/data/stall.py

    def finish_oldest() -> None:
        chunk, firsts, digests, result = pending[0]  # still in `pending` while waited for: the watchdog names it
        reasons, sigs, valid, worker_seconds, redactions = result.get()
        pending.popleft()
        t = time.thread_time()
        totals.seconds.update(worker_seconds)
        for pos, reason, redaction in zip(firsts, reasons, redactions):
            if reason is None:
                line, text, where, copies = chunk[pos]
                if redaction is not None:  # the redacted text replaces the original in the written record
                    text = redaction[0]
                    line = replace_text(line, cfg.text_column, text)
                    count_redactions(totals, redaction[1])
                sink.put(line, text, digests[pos], file_index[where.path], where.line, copies)
        count_decisions(totals, ((reason, 1) for reason in reasons))
        if sigs is not None:
            sink.put_signatures(sigs, valid)
        passed_filters = sum(r is None or r.startswith((DECONTAMINATED, ENCODED)) for r in reasons)
        totals.files["encoded_data"] += passed_filters
        totals.files["decontaminate"] += passed_filters - sum(r is not None and r.startswith(ENCODED) for r in reasons)
        totals.files["redact_secrets"] += reasons.count(None)
        totals.files["minhash"] += reasons.count(None)
        totals.seconds["write"] += time.thread_time() - t
        bar.update(len(chunk))
        watchdog.beat(watchdog.progress + len(chunk))  # records done
        bar.set_postfix_str(f"{totals.bytes_in / 1e6 / max(time.perf_counter() - start, 1e-9):.1f} MB/s")

    records = iter_input_records(paths, cfg.text_column, bad, cfg.max_record_bytes)
    while True:
        t = time.thread_time()
        chunk, size = [], 0  # (raw line, text, location, copies), closed at chunk_files files or chunk_bytes chars
        for line, record, text, where in records:
            license_key, copies = record_signals(record)
            if licenses.active:  # before exact dedup: a permissive copy must not lose to an earlier GPL one
                reason = licenses.reason(license_key)
                totals.licenses.add(license_key, reason)
                if reason is not None:
                    totals.valid_records += 1
                    totals.bytes_in += utf8_len(text)
                    continue
            chunk.append((line, text, where, copies))
            size += len(text)
            if len(chunk) >= cfg.chunk_files or size >= cfg.chunk_bytes:
                break
        totals.seconds["read"] += time.thread_time() - t
        if not chunk:
            break
        t = time.thread_time()
        digests = [digest_of_stripped(strip_whitespace(text)) for _, text, _, _ in chunk]
        firsts = np.flatnonzero(seen.add_batch(np.array(digests, dtype=np.uint64))).tolist()
        chunk_bytes = sum(utf8_len(text) for _, text, _, _ in chunk)
        totals.valid_records += len(chunk)
        totals.exact_duplicates += len(chunk) - len(firsts)
        totals.bytes_in += chunk_bytes
        totals.files["filters"] += len(firsts)
        totals.seconds["exact_dedup"] += time.thread_time() - t
        pending.append((chunk, firsts, digests, submit(([chunk[i][1] for i in firsts], [digests[i] for i in firsts]))))
        while len(pending) >= window:
            finish_oldest()
    while pending:
        finish_oldest()
    bar.close()
    for stage in ("read", "exact_dedup"):
        totals.files[stage], totals.bytes[stage] = totals.valid_records, totals.bytes_in
    return seen.nbytes


def _near_dedup_pass(cfg: PreprocessConfig, sink: _Sink, paths: list[Path | HubInput], totals: Totals) -> dict:
    """Cluster the spooled survivors' signatures, then copy the spool to the shards without the near duplicates.
    Returns the content of `duplicate_clusters.json`."""

    sink.spool.close()
    sink.sig_file.close()
    n = len(sink.is_valid)
    t = time.thread_time()
    clusters: list[np.ndarray] = []
    if n:
        sigs = np.memmap(sink.sig_path, dtype=np.uint32, mode="r", shape=(n, cfg.num_perm))  # [n, num_perm]
        has_sig = np.frombuffer(bytes(sink.has_sig), dtype=np.uint8).astype(bool)  # [n]
        clusters = find_clusters(sigs, cfg.jaccard_threshold, has_sig)
        del sigs
    totals.seconds["clustering"] += time.thread_time() - t
    totals.files["clustering"] = n
    copies = np.frombuffer(sink.copies, dtype=np.int64) if n else None  # [n]
    drop = near_duplicates_to_drop(clusters, n, copies, cfg.near_dedup_keep)
    members: dict[int, dict | None] = {int(r): None for c in clusters for r in c}
    t = time.thread_time()
    bar = progress_bar(cfg, "write", total=n)
    with open(sink.spool_path, "rb") as spool:
        for row, line in enumerate(spool):
            line = line[:-1]  # every spool line ends with "\n"
            if row in members:
                members[row] = member_entry(member_fields(line), f"{paths[sink.file_index[row]]}:{sink.line[row]}",
                                            not drop[row])
            if drop[row]:
                totals.near_duplicates += 1
            else:
                sink.write(line, sink.is_valid[row], sink.nbytes[row])
            if row % 1024 == 1023 or row == n - 1:
                bar.update(row + 1 - bar.n)
    bar.close()
    os.unlink(sink.spool_path)
    os.unlink(sink.sig_path)
    totals.seconds["write"] += time.thread_time() - t
    return clusters_report(cfg, clusters, drop, members)




def run(job: EngineJob) -> EngineOutput:
    """The `engine.Engine` of the local pool: both passes into `job.tmp`."""
    cfg, totals, bad = job.cfg, Totals(), BadRecords(strict=job.cfg.strict)
    sink = _Sink(cfg, job.tmp, totals)
    try:
        stats = _run(cfg, job.paths, bad, sink, job.worker, totals, job.tmp, job.start)
        return EngineOutput(stats, {split: writer.shard_infos() for split, writer in sink.writers.items()})
    except BaseException:
        sink.abort()  # no writer thread may still write into the folder atomic_dir is removing
        raise


def _start_pool(num_workers: int, worker: ChunkWorker, threads: int):
    """The worker processes (forked with SIGTERM at its default: see codeparrot/worker_pool.py); None for
    num_workers 0 (work in this process)."""
    if not num_workers:
        return None
    return start_pool(num_workers, _init_worker, (worker, threads))


def _run(cfg: PreprocessConfig, paths: list[Path | HubInput], bad: BadRecords, sink: _Sink, worker: ChunkWorker,
         totals: Totals, tmp: Path, start: float) -> dict[str, Any]:
    """Both passes into the temporary folder `tmp`; returns the stats."""
    pool = _start_pool(cfg.num_workers, worker, max(1, available_cores() // max(cfg.num_workers, 1)))
    submit = ((lambda task: WatchedResult(pool, pool.apply_async(_run_chunk, (task,)))) if pool
              else (lambda task: _Done(worker(*task))))
    try:
        index_bytes = _pass1(cfg, paths, bad, sink, submit, totals, worker.license_filter)
    finally:
        if pool is not None:
            stop_pool(pool)  # all results are in (or we are failing): nothing left to wait for
    totals.seconds["pass1"] = time.perf_counter() - start
    if totals.valid_records == 0:
        problems = "; ".join(bad.summary_lines()) or "the files hold no lines"
        raise CodeParrotError(f"no valid records in {len(paths)} input file(s): {problems}")
    clusters = None
    if cfg.near_dedup:
        t = time.perf_counter()
        clusters = _near_dedup_pass(cfg, sink, paths, totals)
        totals.seconds["pass2"] = time.perf_counter() - t
        totals.files["pass2"] = totals.files["clustering"]
    shards = {split: writer.close() for split, writer in sink.writers.items()}
    totals.seconds["write"] += sum(writer.cpu_seconds for writer in sink.writers.values())  # compression thread
    for split in shards:
        (tmp / split).mkdir(exist_ok=True)  # an empty split is an empty folder, never a missing one
    totals.seconds["total"] = time.perf_counter() - start
    for stage in ("pass1", "total"):
        totals.files[stage], totals.bytes[stage] = totals.valid_records, totals.bytes_in
    stats = build_stats(cfg, paths, bad, totals, index_bytes, clusters, shards)
    if clusters is not None:
        write_clusters(tmp / "duplicate_clusters.json", clusters)
    atomic_write_json(tmp / "stats.json", stats)
    return stats

"""The data pipeline: BigQuery export -> exact dedup -> filters -> HumanEval decontamination -> near dedup ->
deterministic train/valid split -> gzip JSONL shards, `stats.json` and `duplicate_clusters.json`.

Streaming and parallel: the main process reads and parses records, hashes each content (whitespace removed)
and decides exact duplicates in input order (so the first occurrence wins for any worker count); only the
first occurrences go to the worker pool, which filters, decontaminates and computes MinHash signatures in
chunks. Results come back in submission order with a bounded number of chunks in flight, so memory does
not grow with the input. Survivors go straight to the shards, or, with near dedup, to a spool file inside the
temporary output folder while their signatures are appended to a uint32 file (1 KiB per file at 256
permutations, memory-mapped for clustering). After clustering (connected components, see `near_dedup`),
a second pass copies the spool to the shards without the near duplicates (the first file of each cluster in
input order is kept). Records are written byte for byte as they were read, so every field passes through.

Per-file memory: 8 bytes for the exact-dedup digest; with near dedup also 18 bytes of spool metadata per
survivor (split and signature flags, text size, input file index and line for `duplicate_clusters.json`), the
signature row on disk, and the LSH index while clustering (see `codeparrot.near_dedup`).

Everything is written inside `atomic_dir(output_dir)`: a failed or interrupted run leaves no output folder.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import time
from array import array
from collections import Counter, deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from codeparrot.atomic_io import atomic_dir
from codeparrot.errors import CodeParrotError
from codeparrot.exact_dedup import DigestSet, digest_of_stripped, strip_whitespace
from codeparrot.filters import REASONS, FilterConfig, TextFilter, TokenCounter
from codeparrot.records import (BadRecords, ShardWriter, ensure_replaceable, iter_lines, parse_line,
                                resolve_inputs)

FILE_LEVEL_REASONS = {"empty file", "truncated gzip", "corrupt gzip", "unreadable file"}
OUTPUT_ENTRIES = ["train", "valid", "stats.json", "duplicate_clusters.json"]


@dataclass
class PreprocessConfig:
    inputs: list[str]
    output_dir: str
    text_column: str = "content"
    strict: bool = False
    num_workers: int = field(default_factory=lambda: os.cpu_count() or 1)
    seed: int = 0
    near_dedup: bool = False
    num_perm: int = 256
    jaccard_threshold: float = 0.85
    min_tokens: int = 10
    decontaminate: bool = True
    valid_fraction: float = 0.01
    samples_per_file: int = 100_000
    tokenizer: str | None = None
    compression_level: int = 6
    chunk_files: int = 64  # a worker task closes at this many files ...
    chunk_bytes: int = 1 << 20  # ... or this many characters of text
    progress: bool | None = None  # None: a bar when stderr is a terminal
    filters: FilterConfig = field(default_factory=FilterConfig)

    def validate(self) -> None:
        if not 0.0 <= self.valid_fraction <= 1.0:
            raise CodeParrotError(f"--valid-fraction must be between 0 and 1, got {self.valid_fraction}")
        if self.num_workers < 0:
            raise CodeParrotError(f"--num-workers must be >= 0, got {self.num_workers}")
        if not 0.0 < self.jaccard_threshold <= 1.0:
            raise CodeParrotError(f"--jaccard-threshold must be in (0, 1], got {self.jaccard_threshold}")
        self.filters.validate()


# ----------------------------------------------------------------------------------------------------------
# Worker side: filters, decontamination and MinHash for a chunk of first occurrences.

class ChunkWorker:
    """Picklable: sent once to each pool process by the initializer."""

    def __init__(self, cfg: PreprocessConfig, decontaminator, minhasher):
        counter = TokenCounter(cfg.tokenizer) if cfg.tokenizer else None
        self.text_filter = TextFilter(cfg.filters, cfg.seed, counter)
        self.decontaminator = decontaminator
        self.minhasher = minhasher

    def __call__(self, texts: list[str], digests: list[int]):
        """(reasons, signatures uint32[kept, P] | None, valid bool[kept] | None, seconds per stage).
        A reason is a filter name, "decontaminated:<source>" or None (kept)."""
        t0 = time.perf_counter()
        all_lines = [t.splitlines() for t in texts]
        reasons = self.text_filter.reasons(texts, digests, all_lines)
        t1 = time.perf_counter()
        if self.decontaminator is not None:
            for i, text in enumerate(texts):
                if reasons[i] is None:
                    source = self.decontaminator.match(text, all_lines[i])
                    if source is not None:
                        reasons[i] = f"decontaminated:{source}"
        t2 = time.perf_counter()
        sigs = valid = None
        if self.minhasher is not None:
            sigs, valid = self.minhasher.signatures([t for t, r in zip(texts, reasons) if r is None])
        t3 = time.perf_counter()
        return reasons, sigs, valid, {"filters": t1 - t0, "decontaminate": t2 - t1, "minhash": t3 - t2}


_WORKER: ChunkWorker | None = None


def _init_worker(worker: ChunkWorker) -> None:
    global _WORKER
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the main process's to handle
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    _WORKER = worker


def _run_chunk(task):
    return _WORKER(*task)


class _Ready:
    def __init__(self, value):
        self.value = value

    def get(self, timeout=None):
        return self.value


class _InProcessPool:
    """`--num-workers 0`: the same chunk function, run in the main process."""

    def __init__(self, worker: ChunkWorker):
        self.worker = worker

    def apply_async(self, fn, args) -> _Ready:
        return _Ready(self.worker(*args[0]))

    def close(self) -> None: ...
    def join(self) -> None: ...
    def terminate(self) -> None: ...


# ----------------------------------------------------------------------------------------------------------
# Main side.

@dataclass
class _Totals:
    input_records: int = 0
    valid_records: int = 0
    exact_duplicates: int = 0
    filtered: Counter = field(default_factory=Counter)
    decontaminated: Counter = field(default_factory=Counter)  # source ("HumanEval/12 docstring") -> files
    near_duplicates: int = 0
    kept: Counter = field(default_factory=Counter)  # split -> files
    bytes_in: int = 0
    bytes_out: int = 0
    seconds: Counter = field(default_factory=Counter)
    files: Counter = field(default_factory=Counter)  # files entering each stage
    bytes: Counter = field(default_factory=Counter)  # characters entering each stage


def _chunks(records: Iterator, cfg: PreprocessConfig, totals: _Totals):
    """Lists of (raw line, text, location), closed at `chunk_files` files or `chunk_bytes` characters."""
    chunk, size = [], 0
    t = time.perf_counter()
    for line, where in records:
        parsed = parse_line(line, where, cfg.text_column, records.bad)
        if parsed is None:
            continue
        chunk.append((line, parsed[1], where))
        size += len(parsed[1])
        if len(chunk) >= cfg.chunk_files or size >= cfg.chunk_bytes:
            totals.seconds["read"] += time.perf_counter() - t
            yield chunk
            chunk, size = [], 0
            t = time.perf_counter()
    totals.seconds["read"] += time.perf_counter() - t
    if chunk:
        yield chunk


class _Lines:
    """`iter_lines` with its `BadRecords` attached (so `_chunks` can count parse failures)."""

    def __init__(self, paths, bad: BadRecords):
        self.bad = bad
        self._it = iter_lines(paths, bad)

    def __iter__(self):
        return self._it


def _is_valid_split(digest: int, valid_fraction: float) -> bool:
    """Deterministic split by content: the (uniform) 64-bit digest below valid_fraction x 2^64."""
    return digest < valid_fraction * 2.0**64


class _Sink:
    """Where pass 1 puts survivors: straight into train/valid shards, or into the near-dedup spool."""

    def __init__(self, cfg: PreprocessConfig, out: Path, totals: _Totals):
        self.cfg, self.totals = cfg, totals
        self.writers = {s: ShardWriter(out / s, cfg.samples_per_file, cfg.compression_level) for s in ("train", "valid")}
        self.spool = None
        if cfg.near_dedup:
            self.spool_path, self.sig_path = out / ".spool.jsonl", out / ".signatures.u32"
            self.spool, self.sig_file = open(self.spool_path, "wb"), open(self.sig_path, "wb")
            self.split = bytearray()  # per spool row: 1 = valid split
            self.valid_sig = bytearray()  # per spool row: 1 = has a signature
            self.where_file, self.where_line = array("I"), array("Q")  # per spool row: input file index, line
            self.nbytes = array("I")  # per spool row: UTF-8 bytes of the text

    def put(self, line: bytes, text: str, digest: int, where, file_index: int) -> None:
        is_valid = _is_valid_split(digest, self.cfg.valid_fraction)
        if self.spool is None:
            self.writers["valid" if is_valid else "train"].write_line(line)
            self.totals.kept["valid" if is_valid else "train"] += 1
            self.totals.bytes_out += _utf8_len(text)
            return
        self.spool.write(line + b"\n")
        self.split.append(is_valid)
        self.where_file.append(file_index)
        self.where_line.append(where.line)
        self.nbytes.append(_utf8_len(text))

    def put_signatures(self, sigs: np.ndarray, valid: np.ndarray) -> None:
        self.sig_file.write(np.ascontiguousarray(sigs, dtype=np.uint32).tobytes())
        self.valid_sig.extend(valid.astype(np.uint8).tobytes())


def _utf8_len(text: str) -> int:
    return len(text) if text.isascii() else len(text.encode("utf-8"))


def _bar(cfg: PreprocessConfig, desc: str, total: int | None = None):
    from tqdm import tqdm

    return tqdm(total=total, unit=" files", desc=desc, disable=None if cfg.progress is None else not cfg.progress)


def _pass1(cfg: PreprocessConfig, paths: list[Path], bad: BadRecords, sink: _Sink, pool, totals: _Totals) -> int:
    """Read, exact-dedup, filter, decontaminate (and sign); returns the bytes the exact-dedup index holds."""
    seen = DigestSet()
    file_index = {str(p): i for i, p in enumerate(paths)}
    pending: deque = deque()
    window = 2 * max(cfg.num_workers, 1) + 1
    bar = _bar(cfg, "preprocess")
    start = time.perf_counter()

    def finish_one() -> None:
        chunk, firsts, digests, result = pending.popleft()
        reasons, sigs, valid, worker_seconds = result.get()
        totals.seconds.update(worker_seconds)
        t = time.perf_counter()
        kept = 0
        for pos, reason in zip(firsts, reasons):
            line, text, where = chunk[pos]
            if reason is None:
                sink.put(line, text, digests[pos], where, file_index[where.path])
                kept += 1
            elif reason.startswith("decontaminated:"):
                totals.decontaminated[reason.split(":", 1)[1]] += 1
            else:
                totals.filtered[reason] += 1
        if sigs is not None:
            sink.put_signatures(sigs, valid)
        totals.files["decontaminate"] += sum(1 for r in reasons if r is None or r.startswith("decontaminated:"))
        totals.files["minhash"] += kept
        totals.seconds["write"] += time.perf_counter() - t
        bar.update(len(chunk))
        elapsed = max(time.perf_counter() - start, 1e-9)
        bar.set_postfix_str(f"{totals.bytes_in / 1e6 / elapsed:.1f} MB/s")

    for chunk in _chunks(_Lines(paths, bad), cfg, totals):
        t = time.perf_counter()
        digests = [digest_of_stripped(strip_whitespace(text)) for _, text, _ in chunk]
        first = seen.add_batch(np.array(digests, dtype=np.uint64))
        firsts = np.flatnonzero(first).tolist()
        totals.valid_records += len(chunk)
        totals.exact_duplicates += len(chunk) - len(firsts)
        chunk_bytes = sum(_utf8_len(text) for _, text, _ in chunk)
        totals.bytes_in += chunk_bytes
        totals.files["exact_dedup"] += len(chunk)
        totals.bytes["exact_dedup"] += chunk_bytes
        totals.files["filters"] += len(firsts)
        totals.seconds["exact_dedup"] += time.perf_counter() - t
        task = ([chunk[i][1] for i in firsts], [digests[i] for i in firsts])
        pending.append((chunk, firsts, digests, pool.apply_async(_run_chunk, (task,))))
        while len(pending) >= window:
            finish_one()
    while pending:
        finish_one()
    bar.close()
    totals.files["read"] = totals.valid_records
    totals.bytes["read"] = totals.bytes_in
    return seen.nbytes


def _near_dedup_pass(cfg: PreprocessConfig, sink: _Sink, out: Path, paths: list[Path], totals: _Totals) -> dict:
    """Cluster the spooled survivors' signatures, then copy the spool to the shards without near duplicates.
    Returns the `duplicate_clusters.json` content."""
    from codeparrot.near_dedup import find_clusters

    sink.spool.close()
    sink.sig_file.close()
    n = len(sink.split)
    t = time.perf_counter()
    clusters: list[np.ndarray] = []
    if n:
        sigs = np.memmap(sink.sig_path, dtype=np.uint32, mode="r", shape=(n, cfg.num_perm))  # [n, num_perm]
        valid = np.frombuffer(bytes(sink.valid_sig), dtype=np.uint8).astype(bool)  # [n]
        clusters = find_clusters(sigs, cfg.jaccard_threshold, valid)
        del sigs
    totals.seconds["clustering"] += time.perf_counter() - t
    totals.files["clustering"] = n
    drop = np.zeros(n, dtype=bool)
    for cluster in clusters:
        drop[cluster[1:]] = True  # the first (earliest in input order) member of each cluster is kept
    members = {int(r) for c in clusters for r in c}
    info: dict[int, dict] = {}
    t = time.perf_counter()
    bar = _bar(cfg, "write", total=n)
    with open(sink.spool_path, "rb") as spool:
        for row, line in enumerate(spool):
            line = line.rstrip(b"\n")
            if row in members:
                record = json.loads(line)
                info[row] = {"repo_name": record.get("repo_name"), "path": record.get("path"),
                             "input": f"{paths[sink.where_file[row]]}:{sink.where_line[row]}", "kept": not drop[row]}
            if drop[row]:
                totals.near_duplicates += 1
            else:
                split = "valid" if sink.split[row] else "train"
                sink.writers[split].write_line(line)
                totals.kept[split] += 1
                totals.bytes_out += sink.nbytes[row]
            if row % 1024 == 1023:
                bar.update(1024)
    bar.close()
    os.unlink(sink.spool_path)
    os.unlink(sink.sig_path)
    totals.seconds["write"] += time.perf_counter() - t
    return {"num_clusters": len(clusters), "files_in_clusters": len(members),
            "near_duplicates": int(drop.sum()), "jaccard_threshold": cfg.jaccard_threshold, "num_perm": cfg.num_perm,
            "clusters": [[info[int(r)] for r in c] for c in clusters]}


def _stats(cfg: PreprocessConfig, paths: list[Path], bad: BadRecords, totals: _Totals, index_bytes: int,
           clusters: dict | None, shards: dict[str, list[Path]]) -> dict[str, Any]:
    record_level_bad = sum(c for r, c in bad.counts.items() if r not in FILE_LEVEL_REASONS)
    unique = totals.valid_records - totals.exact_duplicates
    seconds = {k: round(v, 4) for k, v in totals.seconds.items()}
    files_per_second = {k: round(totals.files[k] / v, 1) for k, v in totals.seconds.items() if v > 0 and k in totals.files}
    mb_per_second = {k: round(totals.bytes[k] / 1e6 / v, 2) for k, v in totals.seconds.items() if v > 0 and k in totals.bytes}
    enabled = cfg.filters.enabled_reasons(with_tokenizer=bool(cfg.tokenizer))
    return {
        "input_records": totals.valid_records + record_level_bad,
        "valid_records": totals.valid_records,
        "bad_records": dict(sorted(bad.counts.items())),
        "bad_record_examples": dict(sorted(bad.first.items())),
        "exact_duplicates": totals.exact_duplicates,
        "filtered": {r: totals.filtered.get(r, 0) for r in REASONS if r in enabled or totals.filtered.get(r)},
        "decontaminated": sum(totals.decontaminated.values()),
        "decontaminated_by_source": dict(sorted(totals.decontaminated.items())),
        "near_duplicates": totals.near_duplicates,
        "near_duplicate_clusters": clusters["num_clusters"] if clusters else 0,
        "files_in_clusters": clusters["files_in_clusters"] if clusters else 0,
        "kept_train": totals.kept["train"],
        "kept_valid": totals.kept["valid"],
        "bytes_in": totals.bytes_in,
        "bytes_out": totals.bytes_out,
        "seconds": seconds,
        "files_per_second": files_per_second,
        "mb_per_second": mb_per_second,
        "index_bytes_per_file": {
            "exact_dedup": round(index_bytes / max(unique, 1), 2),
            **({"near_dedup_signature_on_disk": 4 * cfg.num_perm, "near_dedup_spool_metadata": 18} if cfg.near_dedup else {}),
        },
        "shards": {split: [p.name for p in files] for split, files in shards.items()},
        "inputs": [str(p) for p in paths],
        "config": {k: v for k, v in vars(cfg).items() if k not in ("filters", "progress")} | {"filters": vars(cfg.filters)},
    }


def preprocess(cfg: PreprocessConfig) -> dict[str, Any]:
    """Run the whole pipeline into `cfg.output_dir` (atomically); returns the stats also saved as stats.json."""
    from codeparrot.atomic_io import atomic_write_json

    cfg.validate()
    start = time.perf_counter()
    paths = resolve_inputs(cfg.inputs)
    out = Path(cfg.output_dir)
    ensure_replaceable(out, OUTPUT_ENTRIES, "a preprocess output")
    if cfg.tokenizer:
        TokenCounter(cfg.tokenizer).load()  # a wrong path fails now, not in every worker
    decontaminator = minhasher = None
    if cfg.decontaminate:
        from codeparrot.decontaminate import Decontaminator

        decontaminator = Decontaminator()
    if cfg.near_dedup:
        from codeparrot.near_dedup import MinHasher

        minhasher = MinHasher(cfg.num_perm, cfg.seed, cfg.min_tokens)
    totals, bad = _Totals(), BadRecords(strict=cfg.strict)
    worker = ChunkWorker(cfg, decontaminator, minhasher)
    with atomic_dir(out) as tmp:
        os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp makes 0700; the output is an ordinary folder
        sink = _Sink(cfg, tmp, totals)
        pool = (_InProcessPool(worker) if cfg.num_workers == 0
                else multiprocessing.get_context().Pool(cfg.num_workers, _init_worker, (worker,)))
        try:
            index_bytes = _pass1(cfg, paths, bad, sink, pool, totals)
            pool.close()
            pool.join()
        except BaseException:
            pool.terminate()
            raise
        totals.seconds["pass1"] = time.perf_counter() - start
        totals.files["pass1"] = totals.valid_records
        totals.bytes["pass1"] = totals.bytes_in
        if totals.valid_records == 0:
            problems = "; ".join(bad.summary_lines()) or "the files hold no lines"
            raise CodeParrotError(f"no valid records in {len(paths)} input file(s) ({problems})")
        clusters = None
        if cfg.near_dedup:
            t = time.perf_counter()
            clusters = _near_dedup_pass(cfg, sink, tmp, paths, totals)
            totals.seconds["pass2"] = time.perf_counter() - t
            totals.files["pass2"] = totals.files["clustering"]
        shards = {split: writer.close() for split, writer in sink.writers.items()}
        for split in shards:
            (tmp / split).mkdir(exist_ok=True)  # an empty split is an empty folder, never a missing one
        totals.seconds["total"] = time.perf_counter() - start
        totals.files["total"] = totals.valid_records
        totals.bytes["total"] = totals.bytes_in
        stats = _stats(cfg, paths, bad, totals, index_bytes, clusters, shards)
        if clusters is not None:
            _write_clusters(tmp / "duplicate_clusters.json", clusters)
        atomic_write_json(tmp / "stats.json", stats)
    return stats


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _write_clusters(path: Path, clusters: dict) -> None:
    """duplicate_clusters.json, one cluster per line (valid JSON, greppable, written without one big string)."""
    with open(path, "w", encoding="utf-8") as f:
        head = {k: v for k, v in clusters.items() if k != "clusters"}
        f.write(json.dumps(head)[:-1] + ', "clusters": [')
        for i, cluster in enumerate(clusters["clusters"]):
            f.write(("\n  " if i == 0 else ",\n  ") + json.dumps(cluster, ensure_ascii=False))
        f.write("\n]}\n")


def format_summary(stats: dict[str, Any]) -> str:
    """The human summary: kept and removed files by reason, then throughput per stage."""
    total = max(stats["input_records"], 1)
    rows: list[tuple[str, int]] = [("bad records: " + r, c) for r, c in stats["bad_records"].items()]
    rows.append(("exact duplicates", stats["exact_duplicates"]))
    rows += [("filtered: " + r, c) for r, c in stats["filtered"].items()]
    rows.append(("HumanEval decontamination", stats["decontaminated"]))
    if stats["config"]["near_dedup"]:
        rows.append((f"near duplicates ({stats['near_duplicate_clusters']} clusters)", stats["near_duplicates"]))
    rows += [("kept: train", stats["kept_train"]), ("kept: valid", stats["kept_valid"])]
    width = max(len(name) for name, _ in rows) + 2
    lines = [f"{'files':>{width + 10}}  {'share':>6}"]
    for name, count in rows:
        lines.append(f"  {name:<{width}}{count:>8,}  {100 * count / total:5.1f}%")
    kept = stats["kept_train"] + stats["kept_valid"]
    lines.append(f"  {'input records':<{width}}{stats['input_records']:>8,}  -> {kept:,} kept, "
                 f"{stats['bytes_in'] / 1e6:.1f} MB -> {stats['bytes_out'] / 1e6:.1f} MB")
    for reason, where in stats["bad_record_examples"].items():
        lines.append(f"  first '{reason}' at {where}")
    lines.append(f"{'stage':<16}{'seconds':>9}{'files/s':>11}{'MB/s':>9}")
    for stage, sec in stats["seconds"].items():
        fps = stats["files_per_second"].get(stage)
        mbs = stats["mb_per_second"].get(stage)
        lines.append(f"  {stage:<14}{sec:>9.2f}{'' if fps is None else f'{fps:,.0f}':>11}"
                     f"{'' if mbs is None else f'{mbs:.1f}':>9}")
    lines.append("  (worker stages are summed over worker processes; pass1/pass2/total are wall-clock)")
    return "\n".join(lines)

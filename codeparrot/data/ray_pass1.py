"""Pass 1 of the Ray engine (`codeparrot.data.ray_engine`), streaming: read, parse, license filter and exact
dedup, then filters, encoded-data filter, decontamination, redaction and MinHash (stages 1-3 of its docstring).

`read_and_filter` runs it on the driver: a feeder thread (`_feed_blocks`) starts the read tasks and a parse task
per block, the driver decides exact duplicates in input order (`ray_read.ExactDedup`) and sends each block's
winners to a filter/MinHash task (`_work`) at once; reading, parsing and filtering overlap, and at most
`_BLOCKS_PER_CPU` blocks per CPU are parsed and not yet filtered. It returns the kept rows (left in the object
store), each block's kept id range and the kept files' numbers, which `concat_sorted` puts in id order.
"""

from __future__ import annotations

import os
import queue
import signal
import threading
import time
from collections import Counter, deque
from pathlib import Path
from typing import Any

import numpy as np

from codeparrot.data.engine import progress_bar
from codeparrot.data.preprocess_config import PreprocessConfig
from codeparrot.data.preprocess_stats import utf8_len
from codeparrot.data.ray_blocks import TASK_CPUS, ray_task, rows_with_ids
from codeparrot.data.ray_read import ExactDedup, parse_lines, read_groups, read_lines
from codeparrot.data.record_work import ChunkWorker, count_decisions, count_redactions, replace_text

# The kept files' numbers the driver holds (`_work`'s summary, `concat_sorted`): 33 bytes per kept file.
_KEPT_COLUMNS = {"id": np.int64, "digest": np.uint64, "nbytes": np.int64, "has_sig": bool, "copies": np.int64}
_WORK_CPUS = TASK_CPUS  # per filter/MinHash task: its tokenizer pool gets as many threads (`ray_blocks`)
_WORK_STAGES = ("filters", "encoded_data", "decontaminate", "redact_secrets", "minhash")  # ChunkWorker's CPU seconds
_CPUS_PER_READER = 8  # read tasks at once: one per 8 CPUs (a reader feeds several parse and filter tasks)
_READ_AHEAD = 4  # blocks a read task yields ahead of the driver before it pauses
_BLOCKS_PER_CPU = 4  # blocks parsed and not yet filtered at once, per CPU (the object store's working set)
FAULT_MARKER_ENV = "CODEPARROT_RAY_FAULT_MARKER"  # tests: the first work task SIGKILLs its worker once
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
        generators = [read.remote(group, cfg.ray_block_records, cfg.max_record_bytes) for group in groups[:readers]]
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
                generators.append(read.remote(groups[g + readers], cfg.ray_block_records, cfg.max_record_bytes))
        out.put(None)
    except BaseException as err:  # noqa: BLE001 - handed to the driver's thread, which raises it
        out.put(err)
    finally:
        if stop.is_set():
            for generator in generators:
                if generator is not None:
                    ray.cancel(generator)


def read_and_filter(cfg: PreprocessConfig, units: list[dict], worker: ChunkWorker,
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


def concat_sorted(parts: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """The kept files' columns (per block) as numpy arrays sorted by id (input order)."""
    columns = {c: np.concatenate([p[c] for p in parts]).astype(t) if parts else np.zeros(0, t)
               for c, t in _KEPT_COLUMNS.items()}
    order = np.argsort(columns["id"], kind="stable")
    return {c: v[order] for c, v in columns.items()}

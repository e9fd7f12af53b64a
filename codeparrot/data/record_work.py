"""The per-record work both engines run on the exact-dedup winners: heuristic filters, HumanEval
decontamination and MinHash signatures (`ChunkWorker`), and how its decisions are counted (`count_decisions`).

The local pool (`codeparrot.data.local_engine`) calls a `ChunkWorker` in each worker process on chunks of
first occurrences; the Ray engine (`codeparrot.data.ray_engine`) calls the same object inside its map tasks.
Whatever either engine does around it, every per-file decision is made here, so the two write the same bytes.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

from codeparrot.data.filters import TextFilter, TokenCounter
from codeparrot.data.preprocess_config import PreprocessConfig
from codeparrot.data.preprocess_stats import Totals

DECONTAMINATED = "decontaminated:"  # prefix of a worker's reason for a contaminated file


class ChunkWorker:
    """The per-chunk work; picklable, sent once to each worker process (pool initializer, Ray task argument)."""

    def __init__(self, cfg: PreprocessConfig, decontaminator, minhasher):
        counter = TokenCounter(cfg.tokenizer) if cfg.tokenizer else None  # loads lazily, in the worker
        self.text_filter = TextFilter(cfg.filters, cfg.seed, counter)
        self.decontaminator = decontaminator
        self.minhasher = minhasher

    def __call__(self, texts: list[str], digests: list[int]):
        """(reasons, signatures uint32[kept, num_perm] | None, valid bool[kept] | None, seconds per stage).
        A reason is a filter name, DECONTAMINATED + the pattern's source, or None (kept)."""
        t0 = time.process_time()  # CPU seconds: stage costs do not depend on other jobs sharing the machine
        all_lines = [t.splitlines() for t in texts]  # shared by the filters and the decontamination
        reasons = self.text_filter.reasons(texts, digests, all_lines)
        t1 = time.process_time()
        if self.decontaminator is not None:
            for i, text in enumerate(texts):
                if reasons[i] is None and (source := self.decontaminator.match(text, all_lines[i])) is not None:
                    reasons[i] = DECONTAMINATED + source
        t2 = time.process_time()
        sigs = valid = None
        if self.minhasher is not None:
            sigs, valid = self.minhasher.signatures([t for t, r in zip(texts, reasons) if r is None])
        t3 = time.process_time()
        return reasons, sigs, valid, {"filters": t1 - t0, "decontaminate": t2 - t1, "minhash": t3 - t2}


def build_chunk_worker(cfg: PreprocessConfig) -> ChunkWorker:
    """The `ChunkWorker` of a run (the decontamination patterns and MinHash functions are built once, here)."""
    decontaminator = minhasher = None
    if cfg.decontaminate:
        from codeparrot.data.decontaminate import Decontaminator

        decontaminator = Decontaminator()
    if cfg.near_dedup:
        from codeparrot.data.near_dedup import MinHasher

        minhasher = MinHasher(cfg.num_perm, cfg.seed, cfg.min_tokens)
    return ChunkWorker(cfg, decontaminator, minhasher)


def count_decisions(totals: Totals, counts: Iterable[tuple[str, int]]) -> None:
    """Add (reason, files) pairs of removed files to `totals` (a filter name, or DECONTAMINATED + source);
    "" / None (kept) is not counted."""
    for reason, count in counts:
        if not reason:
            continue
        if reason.startswith(DECONTAMINATED):
            totals.decontaminated[reason[len(DECONTAMINATED):]] += count
        else:
            totals.filtered[reason] += count

"""The per-record work both engines run on the exact-dedup winners: heuristic filters, the encoded-data filter,
HumanEval decontamination, secret redaction and MinHash signatures (`ChunkWorker`), and how its decisions are
counted (`count_decisions`, `count_redactions`). Before exact dedup, both engines take each record's license
and copies with `record_signals` and apply `ChunkWorker.license_filter` (a file kept under a permissive license
in one repository must not lose to an earlier copy from a GPL one).

The local pool (`codeparrot.data.local_engine`) calls a `ChunkWorker` in each worker process on chunks of
first occurrences; the Ray engine (`codeparrot.data.ray_engine`) calls the same object inside its map tasks.
Whatever either engine does around it, every per-file decision is made here, so the two write the same bytes.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Iterable
from typing import Any

from codeparrot.data.encoded_data import REASON as ENCODED_DATA
from codeparrot.data.encoded_data import encoded_data_reason
from codeparrot.data.filters import TextFilter, TokenCounter
from codeparrot.data.licenses import LicenseFilter, normalize
from codeparrot.data.near_dedup import copies_of
from codeparrot.data.preprocess_config import PreprocessConfig
from codeparrot.data.preprocess_stats import Totals
from codeparrot.data.secret_redaction import redact

DECONTAMINATED = "decontaminated:"  # prefix of a worker's reason for a contaminated file
ENCODED = ENCODED_DATA + ":"  # prefix of a worker's reason for an encoded-data file ("encoded_data:base64")


def record_signals(record: dict[str, Any]) -> tuple[str, int]:
    """(normalized `license`, `copies` or -1): the fields the license filter and the most-copies keep policy read."""
    return normalize(record.get("license")), copies_of(record)


def replace_text(line: bytes, text_column: str, text: str) -> bytes:
    """The record's JSON line with its text replaced (a redacted file): the other fields keep their values and
    order; non-ASCII stays as UTF-8 unless the record holds lone surrogates (then everything is \\u-escaped)."""
    record = json.loads(line)
    record[text_column] = text
    try:
        return json.dumps(record, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return json.dumps(record).encode("ascii")


class ChunkWorker:
    """The per-chunk work; picklable, sent once to each worker process (pool initializer, Ray task argument)."""

    def __init__(self, cfg: PreprocessConfig, decontaminator, minhasher):
        counter = TokenCounter(cfg.tokenizer) if cfg.tokenizer else None  # loads lazily, in the worker
        self.text_filter = TextFilter(cfg.filters, cfg.seed, counter)
        self.decontaminator = decontaminator
        self.minhasher = minhasher
        self.license_filter = LicenseFilter(cfg.licenses)  # applied by the engines before exact dedup
        self.filter_encoded_data = cfg.filter_encoded_data
        self.redact_secrets = cfg.redact_secrets
        self.text_column = cfg.text_column  # where a redacted text goes back into its record (`replace_text`)

    def __call__(self, texts: list[str], digests: list[int]):
        """(reasons, signatures uint32[kept, num_perm] | None, valid bool[kept] | None, seconds per stage,
        redactions). A reason is a filter name, ENCODED + the rule, DECONTAMINATED + the pattern's source, or None
        (kept). `redactions[i]` is None or (redacted text, Counter of kinds) for a kept file with secrets; the
        signatures are of the redacted texts (what is written)."""
        t0 = time.process_time()  # CPU seconds: stage costs do not depend on other jobs sharing the machine
        all_lines = [t.splitlines() for t in texts]  # shared by the filters and the decontamination
        reasons = self.text_filter.reasons(texts, digests, all_lines)
        t1 = time.process_time()
        if self.filter_encoded_data:
            for i, text in enumerate(texts):
                if reasons[i] is None:
                    reasons[i] = encoded_data_reason(text)
        t2 = time.process_time()
        if self.decontaminator is not None:
            for i, text in enumerate(texts):
                if reasons[i] is None and (source := self.decontaminator.match(text, all_lines[i])) is not None:
                    reasons[i] = DECONTAMINATED + source
        t3 = time.process_time()
        redactions: list[tuple[str, Counter] | None] = [None] * len(texts)
        if self.redact_secrets:
            for i, text in enumerate(texts):
                if reasons[i] is None:
                    redacted, kinds = redact(text)
                    redactions[i] = (redacted, kinds) if kinds else None
        t4 = time.process_time()
        sigs = valid = None
        if self.minhasher is not None:
            sigs, valid = self.minhasher.signatures([t if red is None else red[0]
                                                     for t, r, red in zip(texts, reasons, redactions) if r is None])
        t5 = time.process_time()
        # only the stages that ran: one that is off would show a rate of its files over ~0 seconds
        seconds = {"filters": t1 - t0}
        if self.filter_encoded_data:
            seconds["encoded_data"] = t2 - t1
        if self.decontaminator is not None:
            seconds["decontaminate"] = t3 - t2
        if self.redact_secrets:
            seconds["redact_secrets"] = t4 - t3
        if self.minhasher is not None:
            seconds["minhash"] = t5 - t4
        return reasons, sigs, valid, seconds, redactions


def build_chunk_worker(cfg: PreprocessConfig) -> ChunkWorker:
    """The `ChunkWorker` of a run (the decontamination patterns and MinHash functions are built once, here)."""
    decontaminator = minhasher = None
    if cfg.decontaminate:
        from codeparrot.data.decontaminate import Decontaminator

        decontaminator = Decontaminator()
    if cfg.near_dedup:
        from codeparrot.data.near_dedup import MinHasher

        minhasher = MinHasher(cfg.num_perm, cfg.seed, cfg.min_tokens, cfg.shingle_size)
    return ChunkWorker(cfg, decontaminator, minhasher)


def count_decisions(totals: Totals, counts: Iterable[tuple[str, int]]) -> None:
    """Add (reason, files) pairs of removed files to `totals` (a filter name, ENCODED + rule, or DECONTAMINATED +
    source);
    "" / None (kept) is not counted."""
    for reason, count in counts:
        if not reason:
            continue
        if reason.startswith(DECONTAMINATED):
            totals.decontaminated[reason[len(DECONTAMINATED):]] += count
        elif reason.startswith(ENCODED):
            totals.encoded_data[reason[len(ENCODED):]] += count
        else:
            totals.filtered[reason] += count


def count_redactions(totals: Totals, kinds: Counter, files: int = 1) -> None:
    """Add the replacements (kind -> count; the values themselves are never kept) of `files` redacted files (one
    on the local engine, a block's on the Ray engine) to `totals`."""
    totals.files_redacted += files
    totals.redacted.update(kinds)

"""Tokenizer training throughput and compression on the standard library (the demo corpus).

Corpus: the running interpreter's stdlib .py files of 1 KiB to 1 MiB without test suites, in sorted path
order; every 50th file is held out for bytes/token, the rest trains a 32,768-entry byte-level BPE
(CodeParrot's size; 4,096 on 100 files in quick mode). One process; `tokenizers` uses the cores it is allowed
(TOKENIZERS_PARALLELISM).
"""

from __future__ import annotations

import time

from codeparrot.tokenizer import bytes_per_token, train_tokenizer
from codeparrot.tools.benchmarks.common import BenchRow
from codeparrot.tools.benchmarks.loader import stdlib_texts


def rows(quick: bool = False) -> list[BenchRow]:

    texts = stdlib_texts(100 if quick else 100_000)
    held_out = texts[::50]
    train = [t for i, t in enumerate(texts) if i % 50]
    vocab = 4096 if quick else 32768
    start = time.perf_counter()
    tokenizer = train_tokenizer(train, vocab_size=vocab, show_progress=False)
    seconds = time.perf_counter() - start
    stats = tokenizer.train_stats
    mb = stats["train_bytes"] / 1e6
    corpus = f"{len(train)} stdlib files ({mb:.1f} MB), vocab {vocab}"
    bpt = bytes_per_token(tokenizer, held_out)
    return [
        BenchRow("tokenizer: BPE training (stdlib)", "MB/s", mb / seconds, mb / seconds, mb / seconds, 1,
                 f"{corpus}, {seconds:.1f} s"),
        BenchRow("tokenizer: bytes per token (held-out stdlib)", "bytes/token", bpt, bpt, bpt, 1,
                 f"{len(held_out)} held-out files (every 50th), vocab {vocab}"),
    ]

"""Data-loading throughput: ConstantLengthDataset, pretokenization and the memory-mapped loader.

Corpus: the running interpreter's standard library (.py files of 1 KiB to 1 MiB, tests excluded), written as
gzip JSONL shards like the preprocess output; tokenizer: a byte-level BPE trained here on part of it (32,768
entries as CodeParrot's; 4,096 in quick mode). All figures are one process unless a row says otherwise.
"""

from __future__ import annotations

import gzip
import io
import json
import sysconfig
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from codeparrot.tokenizer import train_tokenizer
from codeparrot.tools.benchmarks.common import BenchRow, measure, rate
from codeparrot.training.datasets.constant_length import ConstantLengthDataset, encode_with_eos
from codeparrot.training.datasets.loader import build_dataloader
from codeparrot.training.datasets.pretokenize import pretokenize
from codeparrot.training.datasets.pretokenized import PretokenizedDataset

SEQ_LENGTH = 1024


SKIPPED_FOLDERS = {"test", "tests", "idle_test", "site-packages", "dist-packages"}  # test suites: not typical code


def _python_files_sorted(folder: Path):
    """The .py files under `folder` in `sorted(folder.rglob("*.py"))` order (part by part), walked lazily: a caller
    that needs 10 files reads a few folders instead of sorting the whole tree (~13k files). Symlinked folders are
    not entered; `SKIPPED_FOLDERS` are not entered."""
    try:
        entries = sorted(folder.iterdir(), key=lambda p: p.name)
    except OSError:
        return
    for path in entries:
        if path.is_dir() and not path.is_symlink():
            if path.name not in SKIPPED_FOLDERS:
                yield from _python_files_sorted(path)
        elif path.name.endswith(".py"):
            yield path


def stdlib_texts(limit: int) -> list[str]:
    """Up to `limit` stdlib sources of 1 KiB to 1 MiB, in sorted path order, test suites left out."""
    texts = []
    for path in _python_files_sorted(Path(sysconfig.get_paths()["stdlib"])):
        try:
            size = path.stat().st_size
            if 1024 <= size < 1 << 20:
                texts.append(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError):
            continue
        if len(texts) >= limit:
            break
    return texts


def write_shards(folder: Path, texts: list[str], per_shard: int = 500) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for start in range(0, len(texts), per_shard):
        with gzip.open(folder / f"file-{start // per_shard + 1:012d}.json.gz", "wt", encoding="utf-8") as f:
            for text in texts[start : start + per_shard]:
                f.write(json.dumps({"content": text}) + "\n")
    return folder


def _count(iterable) -> int:
    return sum(t.numel() for t in iterable)


def original_style_tokens(tokenizer, texts: list[str], seq_length: int, buffer_chars: int) -> int:
    """Baseline written from the description of the original loop (not its code): texts from memory (which
    flatters it), the buffer tokenized through the tokenizer's full `__call__`, ids gathered in a Python list
    with EOS after each file, one `torch.tensor` per full chunk, the buffer's tail dropped. Returns tokens."""
    produced, it = 0, iter(texts)
    while True:
        buffer, chars = [], 0
        for text in it:
            buffer.append(text)
            chars += len(text)
            if chars >= buffer_chars:
                break
        if not buffer:
            return produced
        all_ids: list[int] = []
        for ids in tokenizer(buffer, truncation=False)["input_ids"]:
            all_ids.extend(ids + [tokenizer.eos_token_id])
        for start in range(0, len(all_ids) - seq_length + 1, seq_length):
            produced += torch.tensor(all_ids[start : start + seq_length]).numel()


def rows(quick: bool = False) -> list[BenchRow]:

    texts = stdlib_texts(40 if quick else 400)
    tokenizer = train_tokenizer(texts[: 30 if quick else 400], vocab_size=2048 if quick else 32768,
                                show_progress=False)
    repeats, warmup = (1, 0) if quick else (3, 1)  # tokenizer rows: one untimed pass first (BPE word cache)
    corpus = f"{len(texts)} stdlib files, {sum(map(len, texts)) / 1e6:.1f} M chars, vocab {len(tokenizer)}"
    out: list[BenchRow] = []
    with tempfile.TemporaryDirectory(prefix="bench-loader-") as tmp:
        shards = write_shards(Path(tmp) / "clean", texts)
        n_tokens = len(encode_with_eos(tokenizer, texts, tokenizer.eos_token_id, np.uint16))

        # the ceiling: the tokenizer's own batch call over the same texts, nothing else
        med, lo, hi = measure(lambda: rate(n_tokens, lambda: tokenizer.backend_tokenizer.encode_batch_fast(
            texts, add_special_tokens=False)), repeats=repeats, warmup=warmup)
        out.append(BenchRow("data: tokenizer batch call alone (ceiling)", "tokens/s", med, lo, hi, repeats, corpus))
        ceiling = med

        buffer_chars = int(SEQ_LENGTH * 3.6 * 1024)
        med_orig, lo, hi = measure(lambda: rate(n_tokens, lambda: original_style_tokens(
            tokenizer, texts, SEQ_LENGTH, buffer_chars)), repeats=repeats, warmup=warmup)
        out.append(BenchRow("data: original-style loop (same tokenizer, baseline)", "tokens/s", med_orig, lo, hi,
                            repeats, "full tokenizer __call__, Python lists, torch.tensor per chunk, tails dropped"))

        med, lo, hi = measure(lambda: rate(n_tokens, lambda: _count(ConstantLengthDataset(
            tokenizer, shards, seq_length=SEQ_LENGTH))), repeats=repeats, warmup=warmup)
        out.append(BenchRow("data: ConstantLengthDataset, 1 process", "tokens/s", med, lo, hi, repeats,
                            f"seq {SEQ_LENGTH}, buffer 1024 seqs × 3.6 chars/token, reading gzip shards; "
                            f"{med / ceiling:.0%} of the tokenizer call alone, {med / med_orig:.2f}× the baseline"))
        plain = med
        med, lo, hi = measure(lambda: rate(n_tokens, lambda: _count(ConstantLengthDataset(
            tokenizer, shards, seq_length=SEQ_LENGTH, fim_rate=0.5))), repeats=repeats, warmup=warmup)
        out.append(BenchRow("data: ConstantLengthDataset with FIM 0.5, 1 process", "tokens/s", med, lo, hi, repeats,
                            f"each sequence rearranged (docs/fim.md); {med / plain:.2f}× the row above"))

        outputs: list[Path] = []
        for workers in (1,) if quick else (1, 2):
            def run(workers=workers) -> float:
                outputs.append(Path(tmp) / f"pretok-{len(outputs)}")
                index = pretokenize(shards, tokenizer, outputs[-1], num_workers=workers, batch_size=200,
                                    progress=False)
                return index["tokens_per_second"]

            med, lo, hi = measure(run, repeats=repeats)
            out.append(BenchRow(f"data: pretokenize, {workers} worker process(es)", "tokens/s", med, lo, hi,
                                repeats, "read + parse + tokenize + write tokens.bin (uint16), output independent "
                                         "of the worker count"))

        pretok = outputs[0]
        batch = 8
        n_batches = 200 if quick else 2000

        def loader_rate(fim_rate: float = 0.0, n_batches: int = n_batches) -> float:
            ds = PretokenizedDataset(pretok, SEQ_LENGTH, infinite=True, seed=0, tokenizer=tokenizer,
                                     fim_rate=fim_rate)
            loader = build_dataloader(ds, batch_size=batch, num_workers=0)
            it = iter(loader)
            next(it)  # opens the map; the first batch is not what a long run sees
            start = time.perf_counter()
            for _ in range(n_batches):
                next(it)
            return n_batches * batch * SEQ_LENGTH / (time.perf_counter() - start)

        med, lo, hi = measure(loader_rate, repeats=repeats)
        out.append(BenchRow("data: pretokenized loader (memmap, StatefulDataLoader)", "tokens/s", med, lo, hi,
                            repeats, f"batch {batch}×{SEQ_LENGTH}, shuffled, 0 workers, state snapshot every "
                                     f"batch; target ≥ 10M tokens/s: {med / 1e7:.1f}× target"))
        plain = med
        med, lo, hi = measure(lambda: loader_rate(0.5, n_batches // 20), repeats=repeats)
        out.append(BenchRow("data: pretokenized loader with FIM 0.5", "tokens/s", med, lo, hi, repeats,
                            f"the row above, each sequence rearranged as it is read (docs/fim.md): "
                            f"{med / plain:.3f}× it; one reader, so a GPU run gives it DataLoader workers"))

        # state size of the streaming dataset at CodeParrot's buffer, mid-buffer (the largest it gets)
        ds = ConstantLengthDataset(tokenizer, shards, seq_length=SEQ_LENGTH, num_of_sequences=1024)
        it = iter(ds)
        next(it)
        buf = io.BytesIO()
        torch.save(ds.state_dict(), buf)
        kib = len(buf.getvalue()) / 1024
        out.append(BenchRow("data: ConstantLengthDataset state size", "KiB", kib, kib, kib, 1,
                            "torch.save of state_dict() one sequence into a 1024×1024 buffer, no shuffle buffers "
                            "(each sequence-shuffle slot adds 2 KiB, each file-shuffle slot its text)"))
    return out

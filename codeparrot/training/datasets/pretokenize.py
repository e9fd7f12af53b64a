"""Write a pretokenized folder (`scripts/pretokenize.py`): tokenize the clean shards once, for training to read
through a memory map (`pretokenized.py`: the format, the checks and the reader).

the parent reads and parses records and hands batches of texts to `num_workers`
processes (one batched tokenizer call each), and appends the returned arrays in order, so the output does not
depend on the worker count. Work goes to a stable sibling `.NAME.partial/` with a progress file (file, line,
tokens written, seconds spent) saved every few seconds, each time after the token file is on disk (fsync): a
killed run resumes there (the token file is cut back to the last recorded length; one shorter than that, which
only a failing disk leaves, is started over, with a note). The finished token file gets a second name in the new
folder (a hard link) that then takes the output's place (`atomic_dir`); the partial folder goes only after that,
so a run stopped at any moment of the commit is resumed by the next one with nothing left to tokenize. A folder
that already holds the same data tokenized by the same tokenizer is left as it is. A lock on `.NAME.lock` keeps
a second run (the same command started on every node) from writing the same output: it waits, then reuses it.
"""

from __future__ import annotations

import errno
import multiprocessing
import os
import shutil
import socket
import sys
import time
from collections import deque
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from codeparrot.atomic_io import atomic_dir, atomic_write_json, ensure_writable_dir
from codeparrot.data.records import resolve_data_files
from codeparrot.errors import CodeParrotError
from codeparrot.file_lock import exclusive_lock
from codeparrot.repository.datasets import open_dataset_repository, publish_pretokenized
from codeparrot.tokenizer import load_tokenizer
from codeparrot.training.config import PretokenizeConfig
from codeparrot.training.datasets.constant_length import encode_with_eos, eos_token_id, token_dtype, vocab_size_of
from codeparrot.training.datasets.pretokenized import (
    FORMAT,
    INDEX_NAME,
    PROGRESS_NAME,
    SPECIALS_AS_TEXT,
    TOKENS_NAME,
    VERSION,
    is_pretokenized,
    read_index,
    read_json_object,
    tokenizer_fingerprint,
)
from codeparrot.training.datasets.record_streams import check_has_records, parse_record, record_lines
from codeparrot.worker_pool import WatchedResult, start_pool, stop_pool

_WORKER: dict = {}


def _init_worker(tokenizer, eos_id: int, dtype: str) -> None:
    _WORKER.update(tokenizer=tokenizer, eos_id=eos_id, dtype=np.dtype(dtype))


def _encode_batch(texts: list[str]) -> np.ndarray:
    return encode_with_eos(_WORKER["tokenizer"], texts, _WORKER["eos_id"], _WORKER["dtype"])


def _batches(files: list[str], text_column: str, batch_size: int, start_file: int, start_line: int):
    """(file index, line after the batch, texts) for batches of up to `batch_size` records of one file each,
    starting at line `start_line` of file `start_file` (earlier lines are skipped, not parsed)."""
    for file_idx in range(start_file, len(files)):
        path, texts = files[file_idx], []
        try:
            for line, raw in record_lines(path, start_line if file_idx == start_file else 0):
                texts.append(parse_record(raw, text_column, path, line))
                if len(texts) >= batch_size:
                    yield file_idx, line, texts
                    texts = []
        except CodeParrotError as err:  # a damaged shard or a bad record
            # The saved position holds only while every shard stays as it is (size and time are in the job's
            # signature): the user should know that mending this one costs the work done so far.
            raise CodeParrotError(f"{err}; replacing, fixing or removing this shard restarts the pretokenize job "
                                  "from the beginning") from None
        yield file_idx, -1, texts  # -1: the file is done (possibly with an empty last batch)


def _job_signature(files: list[str], fingerprint: str, dtype: np.dtype, text_column: str) -> dict:
    stats = [os.stat(p) for p in files]
    return {"fingerprint": fingerprint, "dtype": dtype.name, "text_column": text_column,
            "literal_special_tokens": SPECIALS_AS_TEXT,  # a folder encoded the old way is redone
            "files": [[os.path.abspath(p), s.st_size, s.st_mtime_ns] for p, s in zip(files, stats)]}


def pretokenize(data_files, tokenizer, output_dir, text_column: str = "content", num_workers: int = 1,
                batch_size: int = 1000, progress: bool = True) -> dict:
    """Tokenize every record once into `output_dir/tokens.bin` + `index.json` (module docstring); returns the
    index. Resumes an interrupted run of the same job; returns at once if `output_dir` already holds it."""

    if num_workers < 1 or batch_size < 1:
        raise CodeParrotError(f"num_workers and batch_size must be >= 1, got {num_workers} and {batch_size}")
    files = [os.fspath(p) for p in resolve_data_files(data_files)]
    check_has_records(files, text_column, str(data_files))
    output_dir = Path(output_dir)
    ensure_writable_dir(output_dir.parent if str(output_dir.parent) else Path("."))
    dtype = token_dtype(vocab_size_of(tokenizer))
    signature = _job_signature(files, tokenizer_fingerprint(tokenizer), dtype, text_column)
    partial = output_dir.parent / f".{output_dir.name}.partial"
    with _exclusive(output_dir):
        if is_pretokenized(output_dir):
            try:
                existing = read_json_object(output_dir / INDEX_NAME)
            except (OSError, ValueError) as err:
                raise CodeParrotError(f"{output_dir / INDEX_NAME}: unreadable ({err}): {output_dir} is not a "
                                      "complete pretokenized output; remove it and re-run") from None
            if existing.get("job") == signature:
                index = read_index(output_dir)
                shutil.rmtree(partial, ignore_errors=True)  # left by a run stopped just after its commit
                return {**index, "reused": True}
        elif output_dir.exists() and (not output_dir.is_dir() or any(output_dir.iterdir())):
            raise CodeParrotError(f"{output_dir} exists and is not a pretokenized folder; refusing to replace it")
        return _write(files, tokenizer, output_dir, partial, signature, text_column, num_workers, batch_size,
                      progress)


_NO_SPACE = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
# What `link` answers on filesystems without hard links (FAT, some FUSE and SMB mounts).
_NO_HARD_LINKS = (errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.ENOSYS)


def _exclusive(output_dir: Path):
    """Hold `.NAME.lock` beside `output_dir` for the block (`exclusive_lock`, removed at the end): two runs writing one
    output would interleave in its partial folder, and the same command started on every node should end with every
    node using the one output the first one wrote. Without locks (some NFS mounts) the run goes on, with a note."""
    lock_path = output_dir.parent / f".{output_dir.name}.lock"
    return exclusive_lock(
        lock_path, f"host {socket.gethostname()}, pid {os.getpid()}", remove=True,
        waiting=lambda holder: (f"waiting for the pretokenize run writing {output_dir} ({holder or 'a process'}, "
                                f"holding {lock_path}): what it finishes is reused"),
        unsupported=lambda err: print(f"note: cannot lock {lock_path} ({err.strerror}): make sure only one run "
                                      f"writes {output_dir}", file=sys.stderr))


def _cannot_write(err: OSError, path: Path, partial: Path) -> CodeParrotError:
    """The one line for an OSError while writing `path` (the partial folder's token file, or the output being
    committed): disk full, file too large, quota. What `partial` holds is still a valid resume point (tokens
    fsynced before the progress that counts them; the commit removes nothing from it)."""
    path = err.filename or path  # a file object's write names no file
    advice = "free space (or raise the file-size limit)" if err.errno in _NO_SPACE else "fix that"
    return CodeParrotError(f"{path}: cannot write ({err.strerror or err}): {advice} and re-run the same command, "
                           f"it resumes from {partial}")


def _write(files: list[str], tokenizer, output_dir: Path, partial: Path, signature: dict, text_column: str,
           num_workers: int, batch_size: int, progress: bool) -> dict:
    """`pretokenize`'s work, under its lock: tokenize into `partial` (resuming there), then commit."""
    eos_id, vocab_size, dtype = eos_token_id(tokenizer), vocab_size_of(tokenizer), np.dtype(signature["dtype"])
    progress_path, tokens_path = partial / PROGRESS_NAME, partial / TOKENS_NAME
    state = {"job": signature, "file": 0, "line": 0, "n_tokens": 0, "seconds": 0.0, "files": []}
    if progress_path.is_file():
        try:
            saved = read_json_object(progress_path)
        except (OSError, ValueError):
            saved = {}  # unreadable (it is written atomically: a failing disk): start over
        if saved.get("job") == signature and tokens_path.is_file():
            have, need = tokens_path.stat().st_size, saved["n_tokens"] * dtype.itemsize
            if have >= need:
                state = saved  # resume the interrupted run
            else:  # never lengthen it: the missing tail would read as zeros, valid token ids
                print(f"{tokens_path}: {have:,} bytes, fewer than the {need:,} its progress file records (lost in a "
                      f"crash): pretokenizing {output_dir} from the beginning", file=sys.stderr)
    if state["n_tokens"] == 0 and state["file"] == 0:
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
    per_file = state["files"] or [{"path": p, "n_records": 0, "n_tokens": 0} for p in files]
    # tokens/s counts every token over the time every run spent on it (saved with the progress); a progress file
    # written before that was recorded: this run's tokens only.
    earlier_seconds = float(state.get("seconds", 0.0))
    untimed_tokens = 0 if "seconds" in state else state["n_tokens"]

    start = time.perf_counter()
    bar = tqdm(total=None, unit="tok", unit_scale=True, disable=None if progress else True,
               desc=f"pretokenize {output_dir.name}", initial=state["n_tokens"])
    pool = None
    if num_workers > 1:
        pool = start_pool(num_workers, _init_worker, (tokenizer, eos_id, dtype.name),
                          "fork" if "fork" in multiprocessing.get_all_start_methods() else None)
    else:
        _init_worker(tokenizer, eos_id, dtype.name)
    last_save = time.monotonic()
    try:
        with open(tokens_path, "r+b" if tokens_path.exists() else "wb") as out:
            out.truncate(state["n_tokens"] * dtype.itemsize)  # drop anything written after the last save
            out.seek(0, os.SEEK_END)
            in_flight: deque = deque()  # ordered results; at most 2 × workers batches held (backpressure)

            def write(file_idx: int, line: int, texts: list[str], tokens: np.ndarray) -> None:
                nonlocal last_save
                out.write(tokens.tobytes())
                per_file[file_idx]["n_records"] += len(texts)
                per_file[file_idx]["n_tokens"] += len(tokens)
                state["n_tokens"] += len(tokens)
                state["file"], state["line"] = (file_idx + 1, 0) if line < 0 else (file_idx, line)
                bar.update(len(tokens))
                if line < 0 or time.monotonic() - last_save > 5:
                    out.flush()
                    os.fsync(out.fileno())  # the tokens reach the disk before the progress that counts them
                    state["files"], state["seconds"] = per_file, earlier_seconds + time.perf_counter() - start
                    atomic_write_json(progress_path, state)
                    last_save = time.monotonic()

            for file_idx, line, texts in _batches(files, text_column, batch_size, state["file"], state["line"]):
                if pool is None:
                    write(file_idx, line, texts, _encode_batch(texts))
                    continue
                result = WatchedResult(pool, pool.apply_async(_encode_batch, (texts,)))
                in_flight.append((file_idx, line, texts, result))
                while len(in_flight) > 2 * num_workers or (in_flight and in_flight[0][3].ready()):
                    f_idx, f_line, f_texts, result = in_flight.popleft()
                    write(f_idx, f_line, f_texts, result.get())
            while in_flight:
                f_idx, f_line, f_texts, result = in_flight.popleft()
                write(f_idx, f_line, f_texts, result.get())
    except OSError as err:  # reading errors are DamagedFile (a CodeParrotError): this one is a write's
        raise _cannot_write(err, tokens_path, partial) from None
    finally:
        bar.close()
        if pool is not None:
            stop_pool(pool)

    seconds = earlier_seconds + time.perf_counter() - start
    index = {"format": FORMAT, "version": VERSION, "tokens_file": TOKENS_NAME, "dtype": dtype.name,
             "n_tokens": state["n_tokens"], "n_records": sum(f["n_records"] for f in per_file),
             "eos_token_id": eos_id, "vocab_size": vocab_size, "tokenizer_fingerprint": signature["fingerprint"],
             "text_column": text_column, "literal_special_tokens": SPECIALS_AS_TEXT, "files": per_file,
             "seconds": round(seconds, 3),
             "tokens_per_second": round((state["n_tokens"] - untimed_tokens) / max(seconds, 1e-9)), "job": signature}
    try:
        with atomic_dir(output_dir) as tmp:
            atomic_write_json(tmp / INDEX_NAME, index)
            # A second name, not a move: until the new folder is in place (the fsync of tens of GB, the exchange)
            # the partial folder keeps the finished file, and a run stopped meanwhile resumes with nothing to do.
            try:
                os.link(tokens_path, tmp / TOKENS_NAME)
            except OSError as err:
                if err.errno not in _NO_HARD_LINKS:
                    raise
                os.rename(tokens_path, tmp / TOKENS_NAME)  # no hard links here: already on disk, a short window
    except OSError as err:
        raise _cannot_write(err, output_dir, partial) from None
    shutil.rmtree(partial, ignore_errors=True)
    return index



def run_pretokenize(cfg: PretokenizeConfig) -> list[dict]:
    """scripts/pretokenize.py: pretokenize every split `cfg` names, one summary line each; returns the indexes.
    With `cfg.push`, the output folder is then published (`codeparrot.repository.datasets`)."""
    repo = open_dataset_repository(cfg.push, cfg.output_dir) if cfg.push else None  # a bad --push fails before the work
    tokenizer = load_tokenizer(cfg.tokenizer)
    indexes = []
    for shards, out in cfg.jobs():
        print(f"pretokenizing {shards} -> {out} with {cfg.num_workers} worker(s)", file=sys.stderr)
        index = pretokenize(shards, tokenizer, out, text_column=cfg.text_column, num_workers=cfg.num_workers,
                            batch_size=cfg.batch_size, progress=cfg.progress)
        indexes.append(index)
        if index.get("reused"):
            print(f"{out}: already holds this data tokenized by this tokenizer ({index['n_tokens']:,} tokens); "
                  "nothing to do")
            continue
        print(f"{out}: {index['n_tokens']:,} tokens ({index['dtype']}) from {index['n_records']:,} files in "
              f"{len(index['files'])} shard(s); {index['seconds']:.1f} s, {index['tokens_per_second']:,} tokens/s")
    if repo is not None:
        root = Path(cfg.output_dir)
        publish_pretokenized(repo, root, {os.path.relpath(out, root): index
                                          for (_, out), index in zip(cfg.jobs(), indexes)})
    return indexes

"""Dataset factory and a DataLoader whose position is what the training loop consumed.

    dataset = build_dataset(cfg.data.train, tokenizer, seq_length, rank=accelerator.process_index,
                            world_size=accelerator.num_processes, infinite=True, seed=cfg.seed, ...)
    loader = build_dataloader(dataset, batch_size=micro_batch_size, num_workers=cfg.data.num_workers)
    batch = next(it)                      # LongTensor [micro_batch_size, seq_length]
    state = loader.state_dict()           # save with the checkpoint (torch.save; loads with weights_only=True)
    loader.load_state_dict(state)         # on resume, before iter(loader): the next batch is the next unseen one

Do NOT pass the loader through `accelerator.prepare`: the datasets already give every rank (and every worker) its
own part of the data, and Accelerate would split or dispatch the batches again. Move batches to the device
yourself (`batch.to(device, non_blocking=True)`; `pin_memory=True` on GPU).

The loader is torchdata's `StatefulDataLoader` (torchdata 0.11, checked with torch 2.13): each worker snapshots its
dataset's `state_dict()` right after producing a batch and sends it with the batch, and the main process keeps the
snapshot of the last batch it handed out, so prefetched-but-unused batches are produced again after a resume
rather than skipped. A state must be restored with the same number of processes and workers (checked).
"""

from __future__ import annotations

import glob
import os
import warnings

import torch
from torchdata.stateful_dataloader import StatefulDataLoader

from codeparrot.data.record_paths import could_be_hub_dataset, neither_path_nor_hub
from codeparrot.errors import CodeParrotError
from codeparrot.repository.datasets import resolve_dataset
from codeparrot.training.datasets.constant_length import ConstantLengthDataset
from codeparrot.training.datasets.pretokenized import PretokenizedDataset, is_pretokenized, validate_against_tokenizer
from codeparrot.training.datasets.record_streams import HubRecordStream
from codeparrot.training.stop_signal import ignore_sigterm, kill_workers_at_exit


def build_dataset(data, tokenizer, seq_length: int, *, rank: int = 0, world_size: int = 1, infinite: bool = False,
                  seed: int = 0, shuffle: bool = True, num_of_sequences: int = 1024, chars_per_token: float = 3.6,
                  text_column: str = "content", shuffle_buffer: int = 0, sequence_shuffle_buffer: int = 0,
                  hub_dataset: str | None = None, split: str = "train", fim_rate: float = 0.0,
                  fim_spm_rate: float = 0.5, name: str = "dataset") -> torch.utils.data.IterableDataset:
    """The training/validation dataset for `data`:
    - a pretokenized folder (`scripts/pretokenize.py`) -> `PretokenizedDataset`, after checking it was made with
      `tokenizer` (one-line error otherwise); `shuffle` = a seeded permutation of sequences per epoch;
    - JSON/JSONL(.gz) shards (file, folder, glob or list) -> `ConstantLengthDataset`; `shuffle` enables its
      file-level (`shuffle_buffer` records) and sequence-level (`sequence_shuffle_buffer`) shuffle buffers;
    - a Hub dataset id (`user/name`, not a local path; or `hub_dataset=`) -> `ConstantLengthDataset` streaming it;
    - a dataset repository (`--push` of preprocess/pretokenize: a local git repository, a clone of one or
      `hf://datasets/OWNER/NAME`, optionally `@REVISION`) -> its `split` folder, read as one of the above.
    Use `infinite=True, shuffle=True` for training and `infinite=False, shuffle=False` for validation (a finite
    stream where every sequence belongs to exactly one rank; ranks may differ by a few sequences).
    `fim_rate` > 0 turns on fill-in-the-middle in either dataset (codeparrot/fim/transform.py; `fim_spm_rate` of
    those in SPM order); it needs a tokenizer with the FIM tokens (a one-line error otherwise). `name`: how errors
    about a path that does not exist name `data` (the flag the user typed it in, e.g. "--data.train")."""
    if seq_length <= 0:
        raise CodeParrotError(f"seq_length must be > 0, got {seq_length}")
    if hub_dataset is None and isinstance(data, (str, os.PathLike)):
        data = resolve_dataset(data, split)
        if is_pretokenized(data):
            validate_against_tokenizer(data, tokenizer)
            return PretokenizedDataset(data, seq_length, infinite=infinite, seed=seed, shuffle=shuffle, rank=rank,
                                       world_size=world_size, tokenizer=tokenizer, fim_rate=fim_rate,
                                       fim_spm_rate=fim_spm_rate)
        text = os.fspath(data)
        if not os.path.exists(text) and not glob.has_magic(text):
            if not could_be_hub_dataset(text):
                raise CodeParrotError(f"{name} {text} does not exist (no such file or folder)")
            check_hub_dataset(text, split, text_column, name)
            hub_dataset, data = text, None  # "user/name": stream it from the Hub
    if not shuffle:
        shuffle_buffer = sequence_shuffle_buffer = 0
    return ConstantLengthDataset(
        tokenizer, data, seq_length=seq_length, num_of_sequences=num_of_sequences, chars_per_token=chars_per_token,
        text_column=text_column, infinite=infinite, seed=seed, shuffle_buffer=shuffle_buffer,
        sequence_shuffle_buffer=sequence_shuffle_buffer, rank=rank, world_size=world_size, hub_dataset=hub_dataset,
        split=split, fim_rate=fim_rate, fim_spm_rate=fim_spm_rate)


def check_hub_dataset(dataset: str, split: str, text_column: str, name: str = "dataset") -> None:
    """A one-line error naming both readings of `dataset` (given as `name`), a missing path that may be a Hub
    dataset id, when the Hub cannot stream it either: a mistyped folder must not read as a Hub failure only.
    Opening the stream costs a few Hub requests (none offline), paid again when the dataset opens its own."""
    try:
        HubRecordStream(dataset, split, None, text_column, 0, 1)
    except CodeParrotError as err:
        raise neither_path_nor_hub(f"{name} {dataset}", str(err)) from None


def build_dataloader(dataset: torch.utils.data.IterableDataset, batch_size: int, num_workers: int = 0,
                     pin_memory: bool = False, drop_last: bool = False, prefetch_factor: int | None = None,
                     snapshot_every_n_steps: int | None = None):
    """A `torchdata.stateful_dataloader.StatefulDataLoader` over `dataset`: batches are LongTensor
    [batch_size, seq_length]; `state_dict()`/`load_state_dict()` give/restore the position after the last batch
    the caller received (module docstring). `drop_last` drops a final short batch of a finite dataset.

    `snapshot_every_n_steps`: how often workers send their dataset position; a resume replays the batches since
    the last snapshot, so it stays exact either way. Default: every batch for pretokenized data (a few integers),
    every 32 for the streaming dataset with a sequence (or file) shuffle buffer (its state carries the buffers,
    MBs)."""
    if batch_size <= 0 or num_workers < 0:
        raise CodeParrotError(f"batch_size must be > 0 and num_workers >= 0, got {batch_size} and {num_workers}")
    if snapshot_every_n_steps is None:
        buffered = isinstance(dataset, ConstantLengthDataset) and (dataset.shuffle_buffer > 0
                                                                   or dataset.sequence_shuffle_buffer > 0)
        snapshot_every_n_steps = 32 if buffered else 1
    extra = {"prefetch_factor": prefetch_factor} if num_workers > 0 and prefetch_factor else {}
    if num_workers > 0:
        kill_workers_at_exit()  # they ignore SIGTERM (training/stop_signal.py)
    with warnings.catch_warnings():  # torchdata 0.11 calls torch.set_vital, deprecated (harmless) in torch 2.13
        warnings.filterwarnings("ignore", message=".*set_vital.*")
        return CheckedStatefulDataLoader(dataset, batch_size=batch_size, num_workers=num_workers,
                                         pin_memory=pin_memory, drop_last=drop_last, persistent_workers=False,
                                         snapshot_every_n_steps=snapshot_every_n_steps,
                                         worker_init_fn=ignore_sigterm, **extra)  # training/stop_signal.py


class CheckedStatefulDataLoader(StatefulDataLoader):
    """StatefulDataLoader whose `load_state_dict` first checks that the saved position fits this run."""

    def load_state_dict(self, state_dict: dict) -> None:
        check_loader_state(state_dict, self.dataset, self.num_workers)
        super().load_state_dict(state_dict)


def dataset_states(loader_state: dict) -> list[dict]:
    """The per-reader dataset positions inside a StatefulDataLoader state (one per worker, or one)."""
    if "dataset_state" in loader_state:  # num_workers == 0
        return [loader_state["dataset_state"]]
    workers = loader_state.get("_snapshot", {}).get("_worker_snapshots", {})
    return [workers[key]["dataset_state"] for key in sorted(workers, key=lambda k: int(k.rsplit("_", 1)[-1]))]


def check_loader_state(loader_state: dict, dataset, num_workers: int) -> None:
    """One-line CodeParrotError when a saved loader position cannot continue in this run: another dataset
    kind, or another number of readers (processes × workers), which would re-split the data differently."""
    if not isinstance(loader_state, dict):
        raise CodeParrotError(f"data loader state is a {type(loader_state).__name__}, not a dict")
    states = dataset_states(loader_state)
    if not states:  # saved before the first batch: nothing to continue from
        return
    kind = dataset.STATE_KIND
    readers_now = dataset.world_size * max(num_workers, 1)
    saved_workers = 0 if "dataset_state" in loader_state else len(states)
    if saved_workers != num_workers:
        raise CodeParrotError(f"data position was saved with num_workers={saved_workers}; this run has "
                              f"num_workers={num_workers}: resume with the same number of dataloader workers")
    for state in states:
        if state is None or state.get("kind") != kind:
            raise CodeParrotError(f"data position is for a {None if state is None else state.get('kind')} "
                                  f"dataset; this run reads a {kind} one")
        if state.get("started") and state.get("n_readers") != readers_now:
            raise CodeParrotError(f"data position was saved with {state.get('n_readers')} readers (processes × "
                                  f"workers); this run has {readers_now}: resume with the same number of processes "
                                  "and dataloader workers")

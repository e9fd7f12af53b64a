"""What the two training datasets (`ConstantLengthDataset`, `PretokenizedDataset`) share: how processes and
DataLoader workers split the data into readers, and a position that is saved, checked and resumed.

A *reader* is one rank's one DataLoader worker: rank r's worker w is reader r × workers + w of
world_size × workers, so rank r's workers together cover exactly what rank r would read alone.

The position protocol (what `torchdata`'s `StatefulDataLoader` calls in each worker): `state_dict()` is the live
iterator's position (or a loaded one not yet used, or a "not started" stub); `load_state_dict(state)` checks the
state's kind and version and keeps it for the next `iter()`, which continues with the very next item.
"""

from __future__ import annotations

from typing import Any, Iterator, NamedTuple

import torch

from codeparrot.errors import CodeParrotError
from codeparrot.fim.transform import LEVEL


class Reader(NamedTuple):
    """This process's place in the split: reader `id` of `count`, DataLoader worker `worker` of `workers`."""

    id: int
    count: int
    worker: int
    workers: int


def check_state_matches(state: dict, expected: dict[str, Any], same: str) -> None:
    """One-line `CodeParrotError` naming the first key whose saved value differs from this run's (`same`: what the
    user must keep, e.g. "data, seq_length")."""
    for key, value in expected.items():
        if state.get(key) != value:
            raise CodeParrotError(f"data state does not match this run: {key} was {state.get(key)!r}, now {value!r} "
                                  f"(resume with the same {same}, number of processes and dataloader workers)")


def check_fim_matches(state: dict, fim) -> None:
    """One-line `CodeParrotError` when a saved position was taken with other FIM rates than this run's `fim` (a
    `FimTransform`, or None for off; a position saved with FIM off has no rates): the rest of the stream would
    be a different one."""
    saved = (state.get("fim_rate") or 0.0, state.get("fim_spm_rate") if state.get("fim_rate") else None)
    now = (fim.rate, fim.spm_rate) if fim is not None else (0.0, None)
    if saved[0] and state.get("fim_level") != LEVEL:  # its buffers hold whole files rearranged before packing
        raise CodeParrotError("data state was saved with document-level FIM (CodeParrot before context-level FIM): "
                              "resume it with the version that saved it, or start over without --resume")
    if saved != now:
        def show(rates):
            return f"fim_rate {rates[0]:g}" + (f", fim_spm_rate {rates[1]:g}" if rates[1] is not None else "")
        raise CodeParrotError(f"data state was saved with data.{show(saved)}; this run has data.{show(now)}: "
                              "resume with the same data.fim_rate and data.fim_spm_rate")


class ResumableIterableDataset(torch.utils.data.IterableDataset):
    """Base of the training datasets: subclasses set `STATE_KIND`, `STATE_VERSION`, call `_set_ranks`, and
    implement `_start(reader, state)` returning their iterator (with `epoch` and `state_dict()`)."""

    STATE_KIND: str
    STATE_VERSION: int
    rank: int = 0
    world_size: int = 1
    _resume: dict | None = None  # a loaded position, used by the next __iter__
    _iter: Any = None  # the live iterator in this process

    def _set_ranks(self, rank: int, world_size: int) -> None:
        if not world_size > 0:
            raise CodeParrotError(f"world_size must be > 0, got {world_size}")
        if not 0 <= rank < world_size:
            raise CodeParrotError(f"rank {rank} is outside 0..{world_size - 1} (world_size {world_size})")
        self.rank, self.world_size = int(rank), int(world_size)

    def __getstate__(self) -> dict:
        # A copy sent to a DataLoader worker (spawn) starts where this object would: drop the live iterator
        # (open files / memory map), keep a loaded-but-unused position.
        return {**self.__dict__, "_iter": None}

    def reader(self) -> Reader:
        """This process's reader (inside a DataLoader worker, that worker's)."""
        info = torch.utils.data.get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        return Reader(self.rank * workers + worker, self.world_size * workers, worker, workers)

    def _start(self, reader: Reader, state: dict | None) -> Iterator[torch.Tensor]:
        raise NotImplementedError

    def __iter__(self) -> Iterator[torch.Tensor]:
        state, self._resume = self._resume, None
        self._iter = self._start(self.reader(), state)
        return self._iter

    @property
    def epoch(self) -> int:
        """Restarts so far of this process's reader (with DataLoader workers, the loader's state holds theirs)."""
        if self._iter is not None:
            return self._iter.epoch
        return int(self._resume["epoch"]) if self._resume and self._resume.get("started") else 0

    def state_dict(self) -> dict:
        """The position after the last yielded item (plain ints/strings/lists and torch tensors, so it
        `torch.save`s and loads with `weights_only=True`)."""
        if self._iter is not None:
            return self._iter.state_dict()
        if self._resume is not None:
            return self._resume
        return {"kind": self.STATE_KIND, "version": self.STATE_VERSION, "started": False}

    def load_state_dict(self, state: dict) -> None:
        """Continue from `state` at the next `iter()`: exactly the item after the last one consumed."""
        if state.get("kind") == self.STATE_KIND and state.get("version") != self.STATE_VERSION:
            raise CodeParrotError(f"{type(self).__name__} position of format version {state.get('version')!r}; this "
                                  f"code reads version {self.STATE_VERSION} (the data is dealt differently): "
                                  "start a new run, or finish this one with the code that wrote it")
        if state.get("kind") != self.STATE_KIND:
            raise CodeParrotError(f"not a {type(self).__name__} state (kind {state.get('kind')!r}, "
                                  f"version {state.get('version')!r})")
        self._resume, self._iter = state, None

"""The interface between `codeparrot.data.preprocess` (which prepares a run and publishes its output) and the
engines that do the work: `codeparrot.data.local_engine` (a process pool on this machine) and
`codeparrot.data.ray_engine` (Ray tasks, one machine or a cluster).

An engine is a function `run(job) -> EngineOutput` that writes the whole output (`train/`, `valid/`,
`stats.json`, with near dedup `duplicate_clusters.json`) into `job.tmp` and returns the stats it saved with
the shards its writers reported. Both make every per-file decision with `codeparrot.data.record_work` and
report with `codeparrot.data.preprocess_stats`, so their outputs are byte-identical; the caller checks the
shards on disk against the report (`shards.verify_shards`) and only then renames `job.tmp` into place.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from tqdm import tqdm

from codeparrot.data.hub_input import HubInput
from codeparrot.data.preprocess_config import PreprocessConfig
from codeparrot.data.record_work import ChunkWorker
from codeparrot.data.shards import ShardInfo


@dataclass
class EngineJob:
    """One run as an engine receives it: everything already checked and resolved to absolute paths."""

    cfg: PreprocessConfig
    paths: list[Path | HubInput]  # input files (absolute) and Hub splits, in input order
    worker: ChunkWorker  # the per-record work
    tmp: Path  # absolute temporary output folder: becomes --output-dir once the output is verified
    start: float  # time.perf_counter() at the start of the run (stats' wall-clock seconds)


@dataclass
class EngineOutput:
    """What an engine wrote: the stats (saved as stats.json) and, per split, the shards as their writers counted
    them (in shard order)."""

    stats: dict[str, Any]
    shards: dict[str, list[ShardInfo]]


class Engine(Protocol):
    def __call__(self, job: EngineJob) -> EngineOutput: ...


ENGINES = {"local": "codeparrot.data.local_engine", "ray": "codeparrot.data.ray_engine"}  # --engine -> module


def progress_bar(cfg: PreprocessConfig, desc: str, total: int | None = None) -> tqdm:
    """A bar over files with its rate; shown when stderr is a terminal, unless `--no-progress` (or forced on)."""
    return tqdm(total=total, unit=" files", desc=desc, disable=None if cfg.progress is None else not cfg.progress)


def engine_for(name: str) -> Engine:
    """The `run` function of the engine `name` (imported only when chosen: Ray is an optional dependency)."""
    return importlib.import_module(ENGINES[name]).run

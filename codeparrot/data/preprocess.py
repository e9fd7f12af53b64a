"""The data pipeline: BigQuery export -> exact dedup -> filters -> HumanEval decontamination -> near dedup ->
deterministic train/valid split -> gzip JSONL shards, `stats.json` and `duplicate_clusters.json`.

This module prepares a run and publishes it; the work is done by one of two engines behind one interface
(`codeparrot.data.engine`): `--engine local`, a process pool on this machine (`codeparrot.data.local_engine`),
or `--engine ray`, Ray tasks on one machine or a cluster (`codeparrot.data.ray_engine`). Both make every per-file
decision with `codeparrot.data.record_work`, so their outputs are byte-identical.

Before anything is scheduled, the inputs, `--tokenizer` and `--output-dir` are resolved to absolute paths, so
no worker (a pool process, or a Ray task on a node with another working directory) resolves them on its own.
Everything is written inside `atomic_dir(output_dir)`, and renamed into place only after every shard the
engine reported was found on disk with its size and the kept rows (`shards.verify_shards`): a failed,
interrupted or unverifiable run leaves no output folder.
"""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path
from typing import Any

from codeparrot.atomic_io import atomic_dir
from codeparrot.data.engine import EngineJob, engine_for
from codeparrot.data.filters import TokenCounter
from codeparrot.data.hub_input import HubInput, resolve_inputs
from codeparrot.data.preprocess_config import PreprocessConfig, available_cores
from codeparrot.data.record_work import build_chunk_worker
from codeparrot.data.shards import ensure_replaceable, verify_shards
from codeparrot.repository.datasets import open_dataset_repository, publish_clean

__all__ = ["OUTPUT_ENTRIES", "PreprocessConfig", "available_cores", "preprocess"]

OUTPUT_ENTRIES = ["train", "valid", "stats.json", "duplicate_clusters.json"]


def _absolute(path: str | None) -> str | None:
    """`path` made absolute when it names something local (a Hub id such as OWNER/NAME is left as it is)."""
    return os.path.abspath(os.path.expanduser(path)) if path and os.path.exists(os.path.expanduser(path)) else path


def _absolute_inputs(paths: list[Path | HubInput]) -> list[Path | HubInput]:
    return [dataclasses.replace(p, dataset_id=_absolute(p.dataset_id)) if isinstance(p, HubInput)
            else Path(os.path.abspath(p)) for p in paths]


def preprocess(cfg: PreprocessConfig) -> dict[str, Any]:
    """Run the whole pipeline into `cfg.output_dir` (atomically); returns the stats also saved as stats.json."""
    cfg = cfg.with_recipe()  # --recipe stack-v2 switches its stages on; the engines and stats.json see the result
    cfg.validate()
    start = time.perf_counter()
    cfg = dataclasses.replace(cfg, output_dir=os.path.abspath(os.path.expanduser(cfg.output_dir)),
                              tokenizer=_absolute(cfg.tokenizer))
    # files and Hub datasets, in order, absolute
    paths = _absolute_inputs(resolve_inputs(cfg.inputs, cfg.dataset_id, cfg.split, cfg.revision))
    out = Path(cfg.output_dir)
    ensure_replaceable(out, OUTPUT_ENTRIES, "a preprocess output")
    repo = open_dataset_repository(cfg.push, out) if cfg.push else None  # a bad --push fails now, not after the run
    if cfg.tokenizer:
        TokenCounter(cfg.tokenizer).load()  # a wrong path fails now, not in every worker
    engine = engine_for(cfg.engine)
    worker = build_chunk_worker(cfg)
    with atomic_dir(out) as tmp:
        result = engine(EngineJob(cfg, paths, worker, tmp.absolute(), start))
        stats = result.stats
        verify_shards(tmp, result.shards, {"train": stats["kept_train"], "valid": stats["kept_valid"]},
                      cfg.samples_per_file)
    return publish_clean(repo, out, stats)  # --push: after the output is complete and in place

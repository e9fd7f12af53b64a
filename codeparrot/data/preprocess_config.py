"""The data pipeline's settings: `PreprocessConfig`, from which scripts/preprocess.py's flags are generated.

Kept apart from `codeparrot.data.preprocess` (the pipeline itself) so that `--help` and config checks do not
load the pipeline's workers; `codeparrot.data.preprocess` re-exports both names.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Literal

from codeparrot.config import MAX_WAIT_SECONDS, doc
from codeparrot.config_flags import given_fields, parse_config
from codeparrot.data.filters import FilterConfig
from codeparrot.data.records import MAX_RECORD_BYTES
from codeparrot.errors import CodeParrotError


def available_cores() -> int:
    """Cores this process may run on (its CPU affinity, e.g. a container's share), else the machine's count."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


_CORES = available_cores()  # the default of --num-workers

NEAR = "near deduplication (with --near-dedup)"
STAGES = "data you may train on (The Stack v2 / StarCoder2 stages; off in the codeparrot recipe)"
# --recipe stack-v2: each field still at its CodeParrot default takes this value (a flag given explicitly wins).
STACK_V2 = {"licenses": "permissive", "redact_secrets": True, "filter_encoded_data": True, "near_dedup": True,
            "near_dedup_keep": "most-copies", "shingle_size": 5, "jaccard_threshold": 0.7}
FILTERS = "heuristic filters (CodeParrot's defaults; FIXED marks a corrected definition)"


@dataclass
class PreprocessConfig:
    """Everything `preprocess` needs; scripts/preprocess.py's flags are generated from these fields."""

    inputs: list[str] = doc([], "export files (.json/.jsonl, optionally .gz), directories (searched recursively), "
                            "globs, or a Hub dataset hf://datasets/OWNER/NAME (streamed); repeatable, read in order",
                            flag="--input", extend=True, metavar="PATH_OR_GLOB")
    # A default only so that `inputs` (optional with --dataset-id) may come first; the flag stays required.
    output_dir: str = doc("", "output folder (replaced atomically at the end)", required=True)
    push: str | None = doc(None, "then publish the output (and a dataset card with these stats and this command) as "
                           "one commit on main of this dataset repository, created if missing: a Hub dataset "
                           "(OWNER/NAME or hf://datasets/OWNER/NAME) or a local git repository path; training "
                           "reads it with --data.train REPO", metavar="REPO")
    dataset_id: str | None = doc(None, "a dataset repository to stream (with `datasets`, nothing downloaded whole) "
                                 "after the --input files: a Hub id such as codeparrot/codeparrot, or a local dataset "
                                 "repository folder", metavar="ID")
    split: str = doc("train", "split of the Hub datasets (--dataset-id, hf://datasets/...) to read")
    revision: str | None = doc(None, "branch, tag or commit of the Hub datasets (default: the main branch)")
    near_dedup: bool = doc(False, "also remove near duplicates (MinHash LSH)", negatable=True)
    num_workers: int = doc(_CORES, "worker processes for filtering, decontamination and MinHash; 0 runs everything "
                           f"in this process; the output is identical for every value (default: {_CORES}, the core count)")
    seed: int = doc(0, "seed of the random filters and MinHash: same seed, same output")
    text_column: str = doc("content", "JSON key holding the file text")
    strict: bool = doc(False, "stop with an error naming file:line at the first bad record instead of counting it")
    valid_fraction: float = doc(0.01, "share of files in the valid split, chosen by content hash")
    samples_per_file: int = doc(100_000, "records per shard")
    tokenizer: str | None = doc(None, "tokenizer folder (AutoTokenizer.from_pretrained) for the characters-per-token "
                                "filter; without it that filter is off")
    decontaminate: bool = doc(True, "drop files containing a HumanEval problem's docstring or canonical solution "
                              "(whitespace-insensitive; solutions under 40 non-space characters are skipped as not "
                              "distinctive)")
    recipe: Literal["codeparrot", "stack-v2"] = doc(
        "codeparrot", "codeparrot: the original recipe (every stage below off); stack-v2: also --licenses permissive "
        "--redact-secrets --filter-encoded-data --near-dedup --near-dedup-keep most-copies --shingle-size 5 "
        "--jaccard-threshold 0.7, each unless that flag is given another value", group=STAGES)
    licenses: str = doc("all", "all (keep every file), permissive (keep the MIT/Apache/BSD/... allowlist and files with "
                        "no license; drop copyleft and unrecognized license strings, counted by value) or FILE (your "
                        "allowlist, one license key per line)", metavar="all|permissive|FILE", group=STAGES)
    redact_secrets: bool = doc(False, "replace API keys, tokens, private keys, passwords, emails and public IP "
                               "addresses by <KEY>, <PASSWORD>, <EMAIL>, <IP_ADDRESS> (counted by kind)", group=STAGES,
                               negatable=True)
    filter_encoded_data: bool = doc(False, "drop files with a base64/hex/\\uXXXX run over 1,024 characters or such "
                                    "runs covering over half the file (StarCoder2)", group=STAGES,
                                    negatable=True)
    near_dedup_keep: Literal["first", "most-copies"] = doc(
        "first", "which file of a near-duplicate cluster stays: first (in input order, CodeParrot) or most-copies "
        "(highest `copies` field, ties to the first)", group=STAGES)
    num_perm: int = doc(256, "MinHash permutations", group=NEAR)
    shingle_size: int = doc(1, "MinHash over runs of this many consecutive identifier tokens (1: the token set, "
                            "CodeParrot; 5: StarCoder2)", group=NEAR)
    jaccard_threshold: float = doc(0.85, "estimated Jaccard similarity of identifier-token sets that links two files",
                                   group=NEAR)
    min_tokens: int = doc(10, "files with fewer identifier tokens are never clustered", group=NEAR)
    ray_clustering: Literal["driver", "distributed"] = doc(
        "driver", "with --engine ray: where the LSH clustering runs: driver (signatures memory-mapped on the driver's "
        "disk, about 95 B/file of index in its RAM) or distributed (Ray tasks: band keys hash-partitioned, connected "
        "components in large-star/small-star rounds; the driver receives only the clustered files' ids); the "
        "clusters are identical", group=NEAR)
    compression_level: int = doc(6, "gzip level 0-9 of the shards")
    progress: bool | None = doc(None, "no progress bars (without it: bars when stderr is a terminal)",
                                flag="--no-progress", inverted=True)
    engine: Literal["local", "ray"] = doc("local", "where the work runs: local (a process pool on this machine) or ray "
                                          "(Ray, pip install codeparrot[distributed]); the output is identical")
    ray_address: str | None = doc(None, "with --engine ray: join this Ray cluster (e.g. 10.0.0.1:6379 or auto) instead "
                                  "of starting a private loopback-only Ray with --num-workers CPUs (`local` also "
                                  "starts one); the inputs, --tokenizer and --output-dir must then be on storage "
                                  "every node mounts at the same path (checked on every node before any work)",
                                  metavar="ADDR")
    ray_block_records: int = doc(512, "with --engine ray: lines per read block, and so per parse and filter task (a "
                                 "block also closes at 16 MiB of lines); the output is identical for every value",
                                 cli=False)
    max_record_bytes: int = doc(MAX_RECORD_BYTES, "longest input line (JSON record) read, in bytes; a longer one (a "
                                "corrupt export, a file without line breaks) is read through in bounded pieces and "
                                "counted as a bad record, `record too large`", cli=False)
    stall_minutes: float = doc(30.0, "stall watchdog: when no batch of records completes for this many minutes (an "
                               "input that stopped answering, a hung worker), the stacks of every thread go to "
                               "OUTPUT_DIR.stall.log and the run stops with one line, exit status 75; 0 = off. The local engine's reading "
                               "and filtering pass only: --engine ray relies on Ray's task retries for dead workers "
                               "and does not detect a task that hangs")
    given: tuple[str, ...] = doc((), "the fields set on the command line (scripts/preprocess.py fills it): "
                                 "--recipe never overrides them, even when given their default value", cli=False)
    chunk_files: int = doc(64, "a worker task closes at this many files ...", cli=False)
    chunk_bytes: int = doc(1 << 20, "... or this many characters of text", cli=False)
    filters: FilterConfig = doc(FilterConfig, "the heuristic filters", group=FILTERS)

    def validate(self) -> None:
        if not self.output_dir:
            raise CodeParrotError("--output-dir is required")
        if not self.inputs and not self.dataset_id:
            raise CodeParrotError("no input: give --input PATH_OR_GLOB (repeatable), --input hf://datasets/OWNER/NAME "
                                  "or --dataset-id ID")
        if not 0.0 <= self.valid_fraction <= 1.0:
            raise CodeParrotError(f"--valid-fraction must be between 0 and 1, got {self.valid_fraction}")
        if self.num_workers < 0:
            raise CodeParrotError(f"--num-workers must be >= 0, got {self.num_workers}")
        if not 0 <= self.stall_minutes <= MAX_WAIT_SECONDS / 60:
            raise CodeParrotError(f"--stall-minutes must be in [0, {MAX_WAIT_SECONDS // 60}] (0 = off), "
                                  f"got {self.stall_minutes}")
        if not 0.0 < self.jaccard_threshold <= 1.0:
            raise CodeParrotError(f"--jaccard-threshold must be in (0, 1], got {self.jaccard_threshold}")
        if self.num_perm < 2 or self.min_tokens < 1:
            raise CodeParrotError("--num-perm must be >= 2 and --min-tokens >= 1")
        if not 1 <= self.shingle_size <= self.min_tokens:
            raise CodeParrotError(f"--shingle-size must be between 1 and --min-tokens ({self.min_tokens}), "
                                  f"got {self.shingle_size}")
        if self.recipe not in ("codeparrot", "stack-v2"):
            raise CodeParrotError(f"--recipe must be codeparrot or stack-v2, got {self.recipe!r}")
        if self.ray_address is not None and self.engine != "ray":
            raise CodeParrotError("--ray-address needs --engine ray")
        if self.ray_clustering not in ("driver", "distributed"):
            raise CodeParrotError(f"--ray-clustering must be driver or distributed, got {self.ray_clustering!r}")
        if self.ray_clustering == "distributed" and self.engine != "ray":
            raise CodeParrotError("--ray-clustering distributed needs --engine ray")
        if not 1 <= self.max_record_bytes <= MAX_RECORD_BYTES:  # training and pretokenize refuse longer lines
            raise CodeParrotError(f"max_record_bytes must be from 1 to {MAX_RECORD_BYTES:,} (what training reads), "
                                  f"got {self.max_record_bytes}")
        if self.ray_block_records < 1:
            raise CodeParrotError(f"ray_block_records must be >= 1, got {self.ray_block_records}")
        self.filters.validate()

    def with_recipe(self) -> "PreprocessConfig":
        """A copy with `recipe`'s settings applied: for stack-v2, every STACK_V2 field takes the recipe's value
        unless it was given on the command line (`given`, e.g. `--licenses all` or `--no-redact-secrets`) or set
        to another value than its default (a config built in Python)."""
        if self.recipe != "stack-v2":
            return self
        defaults = PreprocessConfig()
        changes = {k: v for k, v in STACK_V2.items()
                   if k not in self.given and getattr(self, k) == getattr(defaults, k)}
        return dataclasses.replace(self, **changes)


def parse_preprocess_config(argv: list[str] | None = None, description: str | None = None) -> PreprocessConfig:
    """scripts/preprocess.py's command line as a PreprocessConfig, with `given` naming the flags it holds."""
    cfg = parse_config(PreprocessConfig, argv, description)
    return dataclasses.replace(cfg, given=tuple(sorted(given_fields(PreprocessConfig, argv))))

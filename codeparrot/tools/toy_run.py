"""A complete miniature training setup built in seconds, through the project's own APIs.

    toy = build_toy_run(root, texts, vocab_size=512, n_layer=2, n_embd=64, n_head=4, n_positions=128)
    cfg = toy.config(max_steps=20, **{"data.seq_length": 64})

It trains a byte-level BPE on `texts`, initializes a GPT-2 into a local checkpoint repository ("initial model"
on `main`, exactly what scripts/initialize_model.py commits), and writes the texts as the data pipeline's
gzip JSONL shards (train/ and valid/). The training tests, the training benchmark and anyone who wants to try
the loop before running the data pipeline use it.
"""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from codeparrot.config import from_dict, merge
from codeparrot.repository.initialize import initialize_model
from codeparrot.repository.model import ModelConfig
from codeparrot.tokenizer import save_tokenizer, train_tokenizer
from codeparrot.training.config import TrainConfig


@dataclass
class ToyRun:
    root: Path
    tokenizer_dir: Path
    repo: Path  # local git checkpoint repository; main = the initial model
    train_data: Path  # folder of train shards
    valid_data: Path  # folder of valid shards
    vocab_size: int

    def config(self, **overrides: Any) -> TrainConfig:
        """A TrainConfig for this setup: small, CPU-friendly defaults; `overrides` use dotted keys
        (`**{"optim.lr": 1e-3}`) or plain top-level ones (`max_steps=20`)."""
        base: dict[str, Any] = {
            "model": str(self.repo), "run_name": "toy", "output_dir": str(self.root / "runs" / "toy"), "max_steps": 20,
            "data": {"train": str(self.train_data), "valid": str(self.valid_data), "seq_length": 64,
                     "num_of_sequences": 16, "shuffle_buffer": 8, "sequence_shuffle_buffer": 8, "num_workers": 0},
            "batch": {"micro_batch_size": 4},
            "optim": {"lr": 1e-3},
            "schedule": {"warmup_steps": 2},
            "eval": {"eval_steps": 0, "max_eval_steps": 4},
            "checkpoint": {"save_steps": 0, "keep_last": 2},
            "logging": {"log_steps": 5, "trackers": [], "progress_bar": False},
        }
        for key, value in overrides.items():
            node: dict[str, Any] = {}
            cursor = node
            parts = key.split(".")
            for part in parts[:-1]:
                cursor = cursor.setdefault(part, {})
            cursor[parts[-1]] = value
            base = merge(base, node)
        return from_dict(TrainConfig, base)


def write_shards(texts: list[str], folder: Path, per_file: int = 50) -> Path:
    """`texts` as the data pipeline writes them: folder/file-000000000001.json.gz ... with {"content": text}."""
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(0, len(texts), per_file):
        with gzip.open(folder / f"file-{i // per_file + 1:012d}.json.gz", "wt", encoding="utf-8") as f:
            for text in texts[i : i + per_file]:
                f.write(json.dumps({"content": text, "repo_name": "toy/repo", "path": f"f{i}.py"}) + "\n")
    return folder


def build_toy_run(root: str | Path, texts: list[str], vocab_size: int = 512, valid_fraction: float = 0.1,
                  seed: int = 0, **model_fields: Any) -> ToyRun:
    """Tokenizer, initial model (GPT-2 of `model_fields`, e.g. n_layer/n_embd/n_head/n_positions and the
    dropouts) committed to a local repository, and train/valid shards of `texts`, all under `root`."""

    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    tokenizer = train_tokenizer(texts, vocab_size=vocab_size, show_progress=False)
    tokenizer_dir = save_tokenizer(tokenizer, root / "tokenizer")
    fields = {"n_layer": 2, "n_embd": 64, "n_head": 4, "n_positions": 128, "resid_pdrop": 0.0,
              "embd_pdrop": 0.0, "attn_pdrop": 0.0, **model_fields}
    model_cfg = from_dict(ModelConfig, fields)
    repo = root / "repo"
    initialize_model(model_cfg, tokenizer, str(repo), seed=seed)
    n_valid = max(1, int(len(texts) * valid_fraction))
    train_data = write_shards(texts[n_valid:], root / "data" / "train")
    valid_data = write_shards(texts[:n_valid], root / "data" / "valid")
    return ToyRun(root, tokenizer_dir, repo, train_data, valid_data, len(tokenizer))

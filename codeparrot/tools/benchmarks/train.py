"""Training throughput on CPU: the real loop (`scripts/train.py`) on the tiny preset, fp32 / bf16 / compile.

Setup (built here, a few tens of seconds): a 32,768-entry byte-level BPE trained on 400 stdlib files, the
configs/model/tiny.yaml model (5 layers, 128 wide: 5.3M parameters, the shape of reference.md's "original
loop" anchor) committed to a local repository, and the stdlib shards pretokenized. Each variant is one
`scripts/train.py` run at batch 8 × 256 (configs/train/tiny.yaml's shape) with logging every few steps; the
first logging interval (warm-up, compilation) is dropped and the median / spread is over the later ones.
Variants: fp32 (the default fused LM-head + cross-entropy), fp32 with the Hugging Face loss (the original
loop's loss path), bf16 autocast, torch.compile. About 2.5 minutes on 2 cores.

MFU follows the PaLM convention (mfu.py): 6N + 12·L·H·Q·T FLOPs per token with N = all parameters but the
position embeddings (the tied LM head counts), against this machine's measured matmul peak in the compute
dtype. The loader rows divide each data path's own tokens/s by the fp32 training tokens/s: how far the
loader is from being the bottleneck.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from statistics import median

import torch
import yaml

from codeparrot.repository.initialize import initialize_model
from codeparrot.repository.model import count_parameters, load_model_config, to_gpt2_config
from codeparrot.tokenizer import train_tokenizer
from codeparrot.tools.benchmarks.common import BenchRow
from codeparrot.tools.benchmarks.loader import stdlib_texts
from codeparrot.tools.toy_run import write_shards
from codeparrot.training.datasets.constant_length import ConstantLengthDataset
from codeparrot.training.datasets.loader import build_dataloader
from codeparrot.training.datasets.pretokenize import pretokenize
from codeparrot.training.datasets.pretokenized import PretokenizedDataset
from codeparrot.training.mfu import cpu_matmul_peak

REPO_ROOT = Path(__file__).resolve().parents[3]
ORIGINAL_TOKENS_PER_S = 2400.0  # reference.md: the original loop, 5.3M GPT-2, 8×256, fp32, this CPU class
MICRO_BATCH, SEQ_LENGTH = 8, 256


def _stdlib_texts(limit: int) -> list[str]:

    return stdlib_texts(limit)


def build_setup(root: Path, quick: bool) -> dict:
    """Tokenizer, tiny initial model in a local repository, pretokenized train data; returns paths and sizes."""

    texts = _stdlib_texts(40 if quick else 400)
    tokenizer = train_tokenizer(texts, vocab_size=2048 if quick else 32768, show_progress=False)
    model_cfg = load_model_config(str(REPO_ROOT / "configs" / "model" / "tiny.yaml"))
    config = to_gpt2_config(model_cfg, tokenizer)
    initialize_model(model_cfg, tokenizer, str(root / "repo"), seed=0)
    shards = write_shards(texts, root / "shards", per_file=100)
    pretokenize(str(shards), tokenizer, root / "tokens", progress=False)
    return {"repo": root / "repo", "shards": shards, "tokens": root / "tokens", "tokenizer": tokenizer,
            "params": count_parameters(config), "vocab": len(tokenizer)}


def _config(setup: dict, run_dir: Path, steps: int, log_steps: int, **extra) -> dict:
    cfg = {
        "model": str(setup["repo"]), "run_name": run_dir.name, "output_dir": str(run_dir), "max_steps": steps,
        "data": {"train": str(setup["tokens"]), "valid": "", "seq_length": SEQ_LENGTH, "num_workers": 0},
        "batch": {"micro_batch_size": MICRO_BATCH, "gradient_accumulation_steps": 1},
        "schedule": {"warmup_steps": 2},
        "checkpoint": {"save_steps": 0, "push": False},
        "logging": {"log_steps": log_steps, "trackers": [], "progress_bar": False},
    }
    for key, value in extra.items():
        cfg[key] = value
    return cfg


def run_variant(setup: dict, root: Path, name: str, steps: int, log_steps: int, in_process: bool = False,
                **extra) -> list[dict]:
    """One scripts/train.py process (or `train()` in this process, for the quick smoke run); the logged training
    entries after the warm-up window (marked by the training loop)."""
    run_dir = root / "runs" / name
    cfg = _config(setup, run_dir, steps, log_steps, **extra)
    if in_process:
        from accelerate.state import AcceleratorState, GradientState

        from codeparrot.config import from_dict
        from codeparrot.training.config import TrainConfig
        from codeparrot.training.train import train

        try:
            train(from_dict(TrainConfig, cfg))
        finally:
            AcceleratorState._reset_state(True)
            GradientState._reset_state()
        entries = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        return [e for e in entries if "loss" in e and not e.get("warmup")]
    path = root / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "offline", "TOKENIZERS_PARALLELISM": "false",
           "PYTHONPATH": str(REPO_ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run([sys.executable, str(REPO_ROOT / "scripts" / "train.py"), "--config", str(path)],
                          env=env, capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        raise RuntimeError(f"{name}: scripts/train.py failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    entries = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [e for e in entries if "loss" in e and not e.get("warmup")]


def loader_tokens_per_s(dataset, n_batches: int) -> float:

    it = iter(build_dataloader(dataset, batch_size=MICRO_BATCH, num_workers=0))
    next(it)  # opening / the first buffer is not what a long run sees
    start = time.perf_counter()
    for _ in range(n_batches):
        next(it)
    return n_batches * MICRO_BATCH * SEQ_LENGTH / (time.perf_counter() - start)


def rows(quick: bool = False) -> list[BenchRow]:

    fp32_peak = cpu_matmul_peak("float32", refresh=not quick)  # refresh keeps the best figure ever measured
    # A CPU without native bf16 (no AVX512-BF16/AMX) emulates bf16 matmuls, here at 1.3 GFLOP/s against 54 fp32:
    # 30 bf16 steps took 14 minutes and measured the emulation, not the recipe. Such a CPU gets no bf16 row.
    bf16_peak = None if quick else cpu_matmul_peak("bfloat16", refresh=True)
    out: list[BenchRow] = []
    with tempfile.TemporaryDirectory(prefix="bench-train-") as tmp:
        root = Path(tmp)
        setup = build_setup(root, quick)
        shape = f"{setup['params'] / 1e6:.1f}M params, vocab {setup['vocab']:,}, batch {MICRO_BATCH}×{SEQ_LENGTH}"
        variants = [("fp32", {"mixed_precision": "no"})] if quick else [
            ("fp32", {"mixed_precision": "no"}),
            ("fp32 with the Hugging Face loss", {"mixed_precision": "no", "fused_loss": False}),
            ("bf16 autocast", {"mixed_precision": "bf16"}),
            ("torch.compile fp32", {"mixed_precision": "no", "compile": True}),
        ]
        steps, log_steps = (4, 2) if quick else (30, 5)
        fp32_rate = None
        for name, extra in variants:
            if extra.get("mixed_precision") == "bf16" and bf16_peak is not None and bf16_peak < fp32_peak / 2:
                out.append(BenchRow(f"train: tiny GPT-2 on CPU, {name}", "tokens/s", float("nan"), float("nan"),
                                    float("nan"), 0, f"not measured: this CPU emulates bf16 matmuls "
                                    f"({bf16_peak / 1e9:.1f} GFLOP/s against {fp32_peak / 1e9:.0f} fp32)"))
                continue
            slug = "-".join(name.replace(".", "_").split()[:3])
            entries = run_variant(setup, root, slug, steps, log_steps, in_process=quick, **extra)
            rates = [e["tokens_per_s"] for e in entries]
            mfus = [100 * e["mfu"] for e in entries]
            if fp32_rate is None:
                fp32_rate = median(rates)
            vs = (f"{median(rates) / ORIGINAL_TOKENS_PER_S:.2f}× the original loop's ~2,400 tokens/s" if not quick
                  else "quick smoke run (small vocab): not comparable to the original loop")
            if name != "fp32":
                vs += f", {median(rates) / fp32_rate:.2f}× fp32"
            out.append(BenchRow(f"train: tiny GPT-2 on CPU, {name}", "tokens/s", median(rates), min(rates), max(rates),
                                len(rates), f"{shape}; {vs}; scripts/train.py, {torch_threads()} threads"))
            peak = "the larger of the measured bf16/fp32" if "bf16" in name else "the measured fp32"
            out.append(BenchRow(f"train: tiny GPT-2 on CPU, {name}", "MFU %", median(mfus), min(mfus), max(mfus),
                                len(mfus), f"PaLM 6N+12LHQT (tied LM head counted) vs {peak} matmul peak of this "
                                           "CPU (mfu.py)"))

        n_batches = 50 if quick else 400
        pretok = loader_tokens_per_s(PretokenizedDataset(setup["tokens"], SEQ_LENGTH, infinite=True, seed=0), n_batches)
        # small tokenization buffers (64 sequences = 8 batches) so the timed window spans many refills
        streaming = loader_tokens_per_s(ConstantLengthDataset(
            setup["tokenizer"], str(setup["shards"]), seq_length=SEQ_LENGTH, num_of_sequences=64, infinite=True,
            shuffle_buffer=100, sequence_shuffle_buffer=256), n_batches // 2)
        for label, value in (("pretokenized loader", pretok), ("ConstantLengthDataset (tokenizing)", streaming)):
            ratio = value / fp32_rate
            out.append(BenchRow(f"train: {label} ÷ fp32 training speed", "×", ratio, ratio, ratio, 1,
                                f"{value:,.0f} tokens/s on one core, batch {MICRO_BATCH}×{SEQ_LENGTH}, 0 workers; "
                                f"> 1 means the loader is not the bottleneck"))
    return out


def torch_threads() -> int:

    return torch.get_num_threads()

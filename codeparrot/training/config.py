"""The training run's typed config: one dataclass per section, a doc per field, and the token budget arithmetic.

Loaded with `codeparrot.config.load_config(TrainConfig, yaml_path, cli_overrides)` (CLI > file > defaults).
`validate()` runs on load, so a config that cannot work fails as one line before any compute starts.

The token budget of one optimizer step:

    sequences/step = micro_batch_size × gradient_accumulation_steps × processes   (= global_batch_size)
    tokens/step    = sequences/step × data.seq_length
    tokens (run)   = tokens/step × max_steps

`global_batch_size` is the recipe's invariant: when it is set, the accumulation is derived from the number of
processes actually launched (`accumulation_steps(world_size)`), so the same config gives the same optimization
on 16 GPUs or on 8 (with twice the accumulation); a count that does not divide is an error, never a rounded batch.

`micro_batch_size: auto` keeps that invariant and lets the run choose how the per-process batch
P = global_batch_size / processes is split: the largest of `auto_candidates(world_size)` that fits in the
device's memory, measured at start (`codeparrot/training/micro_batch.py`). Until then the accumulation is unknown:
`accumulation_steps` checks what can be checked before the run and returns None.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Optional

from codeparrot.config import MAX_WAIT_SECONDS, REQUIRED, doc
from codeparrot.data.records import resolve_data_files, split_folders
from codeparrot.errors import CodeParrotError

TRACKERS = ("tensorboard", "wandb")
AUTO = "auto"  # batch.micro_batch_size: measured at the start of the run (training/micro_batch.py)


@dataclass
class DataConfig:
    """Where the tokens come from and how they are cut into training sequences."""

    train: str = doc("", "Training data: a pretokenized folder (scripts/pretokenize.py, the fast path), clean "
                         "JSON/JSONL(.gz) shards (a file, folder or glob), or a Hub dataset id.")
    valid: str = doc("", "Validation data in the same forms as `train`; empty = no evaluation.")
    tokenizer: Optional[str] = doc(None, "Tokenizer folder or repository; default: the tokenizer stored with the model.")
    seq_length: int = doc(1024, "Tokens per training sequence (at most the model's context, n_positions).")
    text_column: str = doc("content", "Record field holding the source text (text data only).")
    chars_per_token: float = doc(3.6, "Characters per token used to size the tokenization buffer (text data only).")
    num_of_sequences: int = doc(1024, "Sequences per tokenization buffer: buffer = seq_length × chars_per_token × "
                                      "num_of_sequences characters (text data only).")
    shuffle_buffer: int = doc(1000, "File-level shuffle buffer (files); 0 = stream order (text data only).")
    sequence_shuffle_buffer: int = doc(1024, "Sequence-level shuffle buffer (sequences); 0 = no shuffling (text "
                                             "data only: pretokenized sequences are read in a seeded permutation).")
    num_workers: int = doc(1, "DataLoader worker processes per training process (0 = load in the training process).")
    fim_rate: float = doc(0.0, "Fill-in-the-middle: fraction of the files (the EOS-separated pieces of each training "
                               "sequence) split at two random characters and rearranged with the FIM sentinels "
                               "(docs/fim.md); 0 = off (CodeParrot's recipe), 0.5 = BigCode's. Needs a tokenizer "
                               "with the FIM tokens; validation stays left-to-right.")
    fim_spm_rate: float = doc(0.5, "Of the FIM pieces, the fraction in SPM order (suffix first, StarCoder's "
                                   "variant); the rest in PSM order (default 0.5, BigCode's).")


@dataclass
class BatchConfig:
    """How many sequences one optimizer step sees (the token budget; see the module docstring)."""

    micro_batch_size: int | Literal["auto"] = doc(
        8, "Sequences per process per forward/backward pass. auto = the largest that fits in the device's memory, "
           "measured at start with real training steps on CUDA (on CPU: a measured per-sequence activation size "
           "against half the available RAM); it needs global_batch_size (the invariant it splits, accumulation "
           "null = derived), only splits each process's batch into a multiple of data.num_workers micro-steps (so "
           "every optimizer step trains on the same sequences whatever it picks), is the same on every process, "
           "is printed and written to <run>/micro_batch.json, and a resumed run reuses its checkpoint's value.")
    gradient_accumulation_steps: Optional[int] = doc(None, "Micro-batches per optimizer step; null = derived from "
                                                           "global_batch_size and the number of processes launched.")
    global_batch_size: Optional[int] = doc(None, "Sequences per optimizer step over all processes; null = "
                                                 "micro_batch_size × gradient_accumulation_steps × processes.")
    num_processes: int = doc(1, "Processes (GPUs) the budget is written for; checked here. At launch the real "
                                "number is used and the accumulation re-derived when global_batch_size is set.")


@dataclass
class OptimConfig:
    """AdamW; weight decay on every weight except biases and LayerNorm weights."""

    lr: float = doc(5e-4, "Peak learning rate, reached at the end of warmup.")
    weight_decay: float = doc(0.1, "Decoupled weight decay on matmul/embedding weights (not biases, not LayerNorm).")
    betas: list[float] = doc([0.9, 0.999], "AdamW (beta1, beta2).")
    eps: float = doc(1e-8, "AdamW epsilon.")
    max_grad_norm: float = doc(1.0, "Clip the global gradient norm to this before each optimizer step; 0 = no clipping.")
    fused: Optional[bool] = doc(None, "Fused AdamW kernel; null = on where supported (CUDA), off elsewhere.")


@dataclass
class ScheduleConfig:
    """Learning rate: linear warmup from lr/warmup_steps to lr, then decay to min_lr_ratio × lr at max_steps."""

    name: Literal["cosine", "linear", "constant"] = doc("cosine", "Decay after warmup.")
    warmup_steps: int = doc(2000, "Optimizer steps of linear warmup.")
    min_lr_ratio: float = doc(0.0, "Final learning rate as a fraction of lr.")


@dataclass
class EvalConfig:
    """Validation loss and perplexity every `eval_steps` and at the end of the run."""

    eval_steps: int = doc(5000, "Evaluate every this many optimizer steps (and always at the end); 0 = only at the end.")
    max_eval_steps: int = doc(-1, "Validation batches per process per evaluation; -1 = the whole validation split.")
    micro_batch_size: Optional[int] = doc(None, "Sequences per process per validation batch; null = the training one.")


@dataclass
class CheckpointConfig:
    """`step-N/` folders under <run dir>/checkpoints, and pushes to the model repository's run branch."""

    save_steps: int = doc(5000, "Save a checkpoint every this many optimizer steps (and always at the end); 0 = only at the end.")
    keep_last: int = doc(3, "Keep this many most recent step-N folders locally; older ones are deleted.")
    push: bool = doc(True, "Push each checkpoint's weights, config and tokenizer to branch `run_name` of the model "
                           "repository (in the background; a failed push never stops training).")
    push_training_state: bool = doc(False, "Also push optimizer/scheduler/RNG/data state (large: ~2× the weights).")


@dataclass
class LoggingConfig:
    """Console line, progress bar, trackers and metrics.jsonl."""

    log_steps: int = doc(10, "Print/log training metrics every this many optimizer steps.")
    trackers: list[str] = doc(["tensorboard", "wandb"], "Accelerate trackers: any of tensorboard, wandb (W&B runs "
                                                        "offline when WANDB_API_KEY is not set).")
    project: str = doc("codeparrot", "Tracker project name.")
    progress_bar: bool = doc(True, "Show a tqdm progress bar on the main process (only where stderr is a "
                                   "terminal: a log file gets the log lines, not the bar's redraws).")


@dataclass
class TrainConfig:
    """One training run: `accelerate launch scripts/train.py --config configs/train/NAME.yaml [--key value ...]`."""

    model: str = doc("", "Model repository (local git repository path or Hub id) whose `revision` holds the "
                         "initial model (scripts/initialize_model.py).")
    revision: Optional[str] = doc("main", "Revision (branch, tag or commit) of `model` to start from; null for a "
                                          "plain model folder (not a repository).")
    run_name: str = doc("run", "Name of the run: its branch in the model repository (and its folder by default).")
    output_dir: Optional[str] = doc(None, "The run's folder (checkpoints/, final/, metrics.jsonl, tensorboard/, "
                                          "wandb/); null = runs/<run_name>.")
    seed: int = doc(1, "Seed for data order, dropout and everything else random.")
    max_steps: int = doc(150_000, "Optimizer steps of the run (the learning-rate schedule spans them).")
    max_minutes: Optional[float] = doc(None, "Stop earlier, after this many minutes of training (checked at each "
                                             "log step; the final evaluation, checkpoint and push still happen).")
    stall_minutes: float = doc(30.0, "Stall watchdog: when no optimizer step (nor evaluation or checkpoint) "
                                     "completes for this long, every process writes the stacks of all its threads "
                                     "to <run>/logs/rank-N.log and the run stops with one line (exit status 75); the "
                                     "last checkpoint stays the resume point. Longer than the slowest step, the "
                                     "first (compiling) step, an evaluation and a checkpoint save; 0 = off.")
    max_bad_steps: int = doc(5, "Steps whose loss or gradient norm is not finite are skipped (no update, counted "
                                "in the log); this many in a row stop the run, naming the first one and its data.")
    mixed_precision: Optional[Literal["no", "fp16", "bf16"]] = doc(
        None, "Mixed precision; null = from the Accelerate config / launcher (accelerate_config.yaml: bf16).")
    attn_implementation: Literal["causal_sdpa", "sdpa", "eager", "flash_attention_2"] = doc(
        "causal_sdpa", "Attention kernel. causal_sdpa: PyTorch's SDPA with is_causal=True and no mask built "
                       "(flash/cuDNN causal kernels on a GPU, compiled or not; no per-forward host sync); sdpa: "
                       "transformers' SDPA path with its mask; eager: the original numerics (slow).")
    gradient_checkpointing: bool = doc(False, "Recompute activations in the backward pass (less memory, ~30% slower).")
    compile: Optional[bool] = doc(None, "torch.compile (inductor); null = on for CUDA, off on CPU (where the "
                                        "first steps' compile costs more than it saves in short runs).")
    compile_regions: bool = doc(True, "Compile each transformer block in place (one compile reused by every "
                                      "block; mask creation and the loss stay eager); false = the whole model "
                                      "as one graph (Accelerate's dynamo plugin).")
    compile_loss: Optional[bool] = doc(None, "Compile the fused loss's per-chunk softmax into fused kernels "
                                             "(one read of each logits chunk instead of several fp32 passes); "
                                             "null = on for CUDA, off on CPU.")
    cuda_graphs: Optional[bool] = doc(None, "Replay each micro-step (forward, fused loss, backward) from one CUDA "
                                            "graph captured after a few eager micro-steps: one launch instead of "
                                            "hundreds (training/micro_step.py). One CUDA process, bf16 or fp32, no "
                                            "gradient checkpointing: true elsewhere is a one-line error. null = off "
                                            "(not yet measured on a GPU: scripts/gpu_check.py's headline stage "
                                            "compares it with eager).")
    fused_loss: bool = doc(True, "Compute the LM head and cross-entropy together in chunks, never materializing the "
                                 "[batch, seq, vocab] logits (same loss, less memory, faster); false = the Hugging "
                                 "Face loss. Not used under FSDP/DeepSpeed (sharded head weight).")
    data: DataConfig = doc(DataConfig, "Data.")
    batch: BatchConfig = doc(BatchConfig, "Batch size and the token budget.")
    optim: OptimConfig = doc(OptimConfig, "Optimizer.")
    schedule: ScheduleConfig = doc(ScheduleConfig, "Learning-rate schedule.")
    eval: EvalConfig = doc(EvalConfig, "Evaluation.")
    checkpoint: CheckpointConfig = doc(CheckpointConfig, "Checkpoints.")
    logging: LoggingConfig = doc(LoggingConfig, "Logging.")

    # ---- checks that need nothing but the config (model/data checks happen in train() before compute) ----
    def validate(self) -> None:
        def positive(name: str, value: float, allow_zero: bool = False, at_most: float | None = None) -> None:
            if value < 0 or (value == 0 and not allow_zero):
                raise CodeParrotError(f"{name} must be {'>= 0' if allow_zero else '> 0'}, got {value!r}")
            if at_most is not None and value > at_most:
                raise CodeParrotError(f"{name} must be at most {at_most:g}, got {value!r}")

        b, o, s = self.batch, self.optim, self.schedule
        positive("max_steps", self.max_steps)
        if self.max_minutes is not None:
            positive("max_minutes", self.max_minutes)
        positive("stall_minutes", self.stall_minutes, allow_zero=True, at_most=MAX_WAIT_SECONDS / 60)
        positive("max_bad_steps", self.max_bad_steps)
        positive("data.seq_length", self.data.seq_length)
        positive("data.chars_per_token", self.data.chars_per_token)
        positive("data.num_of_sequences", self.data.num_of_sequences)
        positive("data.shuffle_buffer", self.data.shuffle_buffer, allow_zero=True)
        positive("data.sequence_shuffle_buffer", self.data.sequence_shuffle_buffer, allow_zero=True)
        positive("data.num_workers", self.data.num_workers, allow_zero=True)
        for name in ("fim_rate", "fim_spm_rate"):
            if not 0.0 <= getattr(self.data, name) <= 1.0:
                raise CodeParrotError(f"data.{name} must be in [0, 1], got {getattr(self.data, name)!r}")
        if b.micro_batch_size != AUTO:
            positive("batch.micro_batch_size", b.micro_batch_size)
        positive("batch.num_processes", b.num_processes)
        if b.gradient_accumulation_steps is not None:
            positive("batch.gradient_accumulation_steps", b.gradient_accumulation_steps)
        if b.global_batch_size is not None:
            positive("batch.global_batch_size", b.global_batch_size)
        self.accumulation_steps(b.num_processes)  # the budget must divide for the processes it is written for
        positive("optim.lr", o.lr)
        positive("optim.weight_decay", o.weight_decay, allow_zero=True)
        positive("optim.eps", o.eps)
        positive("optim.max_grad_norm", o.max_grad_norm, allow_zero=True)
        if len(o.betas) != 2 or not all(0.0 <= beta < 1.0 for beta in o.betas):
            raise CodeParrotError(f"optim.betas must be two numbers in [0, 1), got {o.betas!r}")
        positive("schedule.warmup_steps", s.warmup_steps, allow_zero=True)
        if s.warmup_steps > self.max_steps:
            raise CodeParrotError(f"schedule.warmup_steps ({s.warmup_steps}) is larger than max_steps ({self.max_steps})")
        if not 0.0 <= s.min_lr_ratio <= 1.0:
            raise CodeParrotError(f"schedule.min_lr_ratio must be in [0, 1], got {s.min_lr_ratio!r}")
        positive("eval.eval_steps", self.eval.eval_steps, allow_zero=True)
        if self.eval.max_eval_steps == 0 or self.eval.max_eval_steps < -1:
            raise CodeParrotError(f"eval.max_eval_steps must be -1 (whole split) or > 0, got {self.eval.max_eval_steps}")
        if self.eval.micro_batch_size is not None:
            positive("eval.micro_batch_size", self.eval.micro_batch_size)
        positive("checkpoint.save_steps", self.checkpoint.save_steps, allow_zero=True)
        positive("checkpoint.keep_last", self.checkpoint.keep_last)
        positive("logging.log_steps", self.logging.log_steps)
        unknown = [t for t in self.logging.trackers if t not in TRACKERS]
        if unknown:
            raise CodeParrotError(f"logging.trackers: unknown tracker {unknown[0]!r} (known: {', '.join(TRACKERS)})")
        if not self.run_name or any(c in self.run_name for c in " /\\:~^?*[") or self.run_name.startswith(("-", ".")):
            raise CodeParrotError(f"run_name {self.run_name!r} must be a non-empty folder/branch name without "
                                  "spaces or any of / \\ : ~ ^ ? * [")

    def run_dir(self) -> Path:
        return Path(self.output_dir) if self.output_dir else Path("runs") / self.run_name

    # ---- the token budget ----
    def auto_candidates(self, world_size: int) -> list[int]:
        """The micro-batches `auto` may choose on `world_size` processes, smallest first: those that split the
        per-process batch P = global_batch_size / world_size into a multiple of W = max(data.num_workers, 1)
        micro-steps, i.e. the divisors of P / W.

        Why the multiple of W: a DataLoader with W workers hands out whole batches from its workers in turn, and
        worker w reads every W-th sequence of this process's share. With W | accumulation every optimizer step
        takes exactly P / W consecutive sequences from each worker, whatever the micro-batch: the step trains
        on the same sequences for every candidate (only float summation order differs), every worker (reader)
        stands at the same place after every step and so at every checkpoint, and auto picking 96 on one card
        and 24 on another is the same optimization. A split such as 192 × 1 with 2 workers would instead train
        step 1 on worker 0's sequences only and step 2 on worker 1's. (Epoch coverage and exact resume hold for
        any split, explicit ones included: the readers are consumed in turn and the loader's position records
        the next worker.)"""
        b = self.batch
        if b.global_batch_size is None:
            raise CodeParrotError("batch.micro_batch_size auto needs batch.global_batch_size: auto keeps the global "
                                  "batch and chooses how each process splits it (or give an integer micro_batch_size)")
        if b.gradient_accumulation_steps is not None:
            raise CodeParrotError(f"batch.micro_batch_size auto derives the accumulation: set "
                                  f"batch.gradient_accumulation_steps to null, not {b.gradient_accumulation_steps}")
        if b.global_batch_size % world_size:
            raise CodeParrotError(f"batch.global_batch_size {b.global_batch_size} does not divide among {world_size} "
                                  f"processes (remainder {b.global_batch_size % world_size})")
        procs = f"{world_size} process{'es' if world_size != 1 else ''}"
        per_process, workers = b.global_batch_size // world_size, max(self.data.num_workers, 1)
        if per_process % workers:
            raise CodeParrotError(f"batch.micro_batch_size auto: the per-process batch {per_process} "
                                  f"(global_batch_size {b.global_batch_size} / {procs}) is not a multiple of "
                                  f"data.num_workers {workers}: every optimizer step must take the same number of "
                                  "sequences from each DataLoader worker")
        share = per_process // workers
        return [n for n in range(1, share + 1) if share % n == 0]

    def accumulation_steps(self, world_size: int) -> int | None:
        """Micro-batches per optimizer step on `world_size` processes; `CodeParrotError` if the budget does not divide.
        None for micro_batch_size auto (its candidates checked instead): the run derives it once it has measured
        the micro-batch (`micro_batch.resolve_micro_batch` returns the resolved config)."""
        b = self.batch
        if b.micro_batch_size == AUTO:
            self.auto_candidates(world_size)
            return None
        per_pass = b.micro_batch_size * world_size  # sequences in one micro-step over all processes
        if b.global_batch_size is None:
            return b.gradient_accumulation_steps or 1
        if b.global_batch_size % per_pass:
            raise CodeParrotError(
                f"batch.global_batch_size {b.global_batch_size} does not divide into micro_batch_size "
                f"{b.micro_batch_size} × {world_size} processes = {per_pass} sequences per micro-step "
                f"(remainder {b.global_batch_size % per_pass})")
        derived = b.global_batch_size // per_pass
        if b.gradient_accumulation_steps is not None and b.gradient_accumulation_steps != derived:
            raise CodeParrotError(
                f"batch.global_batch_size {b.global_batch_size} != micro_batch_size {b.micro_batch_size} × "
                f"gradient_accumulation_steps {b.gradient_accumulation_steps} × {world_size} processes = "
                f"{b.micro_batch_size * b.gradient_accumulation_steps * world_size}; set one of them to null "
                f"(with {world_size} processes the accumulation would be {derived})")
        return derived

    def sequences_per_step(self, world_size: int) -> int:
        if self.accumulation_steps(world_size) is None:  # auto: needs global_batch_size, and keeps it
            return self.batch.global_batch_size
        return self.batch.micro_batch_size * self.accumulation_steps(world_size) * world_size

    def tokens_per_step(self, world_size: int) -> int:
        return self.sequences_per_step(world_size) * self.data.seq_length

    def budget_summary(self, world_size: int) -> str:
        """One line of arithmetic, e.g. '192 seq/step = 12 × 1 accum × 16 proc; 196,608 tok/step; 29.49B tokens'."""
        total = self.tokens_per_step(world_size) * self.max_steps
        accum = self.accumulation_steps(world_size) or "derived"  # auto: derived once measured
        return (f"{self.sequences_per_step(world_size)} sequences/step = {self.batch.micro_batch_size}/process × "
                f"{accum} accumulation × {world_size} process{'es' if world_size != 1 else ''}; {self.tokens_per_step(world_size):,} tokens/step × "
                f"{self.max_steps:,} steps = {_human(total)} tokens")


def _human(n: float) -> str:
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            return f"{n / scale:.2f}{unit}"
    return f"{n:.0f}"


@dataclass
class ValidationLossConfig:
    """scripts/validation_loss.py: the loss of any checkpoint on a dataset, on one or many processes."""

    model: str = doc(REQUIRED, "model repository (local path or Hub id) or a model folder (e.g. a run's "
                               "checkpoints/step-N or final/)")
    dataset: str = doc(REQUIRED, "pretokenized folder, JSON/JSONL(.gz) shards (file, folder, glob) or a Hub "
                                 "dataset id")
    revision: Optional[str] = doc(None, "branch, tag or commit of --model (default: main; none for a folder)")
    tokenizer: Optional[str] = doc(None, "tokenizer folder/repository (default: the model's)")
    seq_length: Optional[int] = doc(None, "tokens per sequence (default: the model's context)")
    batch_size: int = doc(8, "sequences per process per batch (default: 8)")
    max_eval_steps: int = doc(-1, "batches per process; -1 = the whole dataset (default)")
    text_column: str = doc("content", "record field with the text (default: content)")
    num_workers: int = doc(0, "DataLoader workers per process (default: 0)")
    mixed_precision: Optional[Literal["no", "fp16", "bf16"]] = doc(None, "default: from the Accelerate "
                                                                         "config/launcher")
    output: Optional[str] = doc(None, "also write the result as JSON here (atomically)")
    progress: bool = doc(True, "no progress (without it: a bar where stderr is a terminal, else periodic lines "
                               "with the rates)", flag="--no-progress", inverted=True)


@dataclass
class PretokenizeConfig:
    """scripts/pretokenize.py: which clean shards are tokenized once into memory-mapped token files, and how."""

    dataset: list[str] = doc(REQUIRED, "clean gzip/plain JSONL shards: a preprocess output root with train/ and "
                                       "valid/ (each split is pretokenized), a folder of shards, a glob, or files",
                             metavar="PATH_OR_GLOB")
    tokenizer: str = doc(REQUIRED, "tokenizer folder (scripts/train_tokenizer.py), checkpoint repository or Hub id",
                         metavar="DIR")
    output_dir: str = doc(REQUIRED, "where the token files go (OUTPUT_DIR/train and OUTPUT_DIR/valid for a "
                                    "preprocess root)")
    num_workers: int = doc(max(1, os.cpu_count() or 1), "tokenizer processes (default: the number of CPU cores); "
                                                        "output does not depend on it")
    text_column: str = doc("content", "JSON field holding the file's text (default: content)")
    batch_size: int = doc(1000, "records per batched tokenizer call and per task handed to a worker (default: 1000)")
    progress: bool = doc(True, "no progress bar", flag="--quiet", inverted=True)
    push: Optional[str] = doc(None, "then publish OUTPUT_DIR (and a dataset card with the token counts and this "
                                    "command) as one commit on main of this dataset repository, created if missing: "
                                    "a Hub dataset (OWNER/NAME or hf://datasets/OWNER/NAME) or a local git "
                                    "repository path; training reads it with --data.train REPO", metavar="REPO")

    def validate(self) -> None:
        if self.num_workers < 1 or self.batch_size < 1:
            raise CodeParrotError("--num-workers and --batch-size must be >= 1")
        for shards, _ in self.jobs():  # a wrong path fails now, before the tokenizer (and torch) are loaded
            resolve_data_files(shards)

    def jobs(self) -> list[tuple[str | list[str], Path]]:
        """(shards, output folder) pairs: one per split of a preprocess root, else the dataset as given."""
        output_dir = Path(self.output_dir)
        splits = split_folders(Path(self.dataset[0]).expanduser()) if len(self.dataset) == 1 else {}
        if splits:
            return [(str(folder), output_dir / name) for name, folder in splits.items()]
        return [(self.dataset[0] if len(self.dataset) == 1 else self.dataset, output_dir)]

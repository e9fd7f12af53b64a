"""Validation loss and perplexity, token-weighted, that never hang a multi-process run.

Every process iterates its own shard of the validation split. Shards of a finite split rarely hold the same
number of batches, and a process that stops early would leave the others blocked in a collective (DDP's
forward, the final all-reduce). So at every eval step all processes all-reduce a "has data" flag and keep
stepping while any of them has data; a process that has run out forwards a fully masked dummy batch (labels
all -100: no loss, no tokens). Each sequence of the split is therefore counted exactly once, and the loss is
sum of token losses / number of predicted tokens over all processes, not a mean of per-batch means.

Every forward has the same shape: the split's last, shorter batch is padded to the full batch with masked rows
(rows are independent under causal attention, and masked ones add no loss and no tokens). A compiled model then
runs one graph for the whole pass instead of compiling another (a dynamic-shape one, under dynamo's automatic
dynamic shapes) for the last batch.

A split that gives no sequence at all would give a NaN loss, of 0 tokens: training (`run_data.build_datasets`) and
scripts/validation_loss.py refuse it at start instead (`check_has_a_sequence`).

Progress is the caller's opt-in (`on_step`): the CLIs (scripts/validation_loss.py, `checkpoints.py plot --dataset`)
report it (`EvalProgress`); training's periodic evaluation (its own bar and log lines) and the app do not.
"""

from __future__ import annotations

import copy
import json
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator

import torch
from accelerate import Accelerator, PartialState
from tqdm.auto import tqdm

from codeparrot.atomic_io import atomic_write_json, ensure_writable_dir
from codeparrot.errors import CodeParrotError
from codeparrot.repository.metrics import describe_eval
from codeparrot.repository.model import check_model_tokenizer, load_pretrained_model, read_model_config
from codeparrot.repository.refs import resolve_model_dir
from codeparrot.tokenizer import PROGRESS_EVERY_S, load_tokenizer
from codeparrot.training.config import ValidationLossConfig
from codeparrot.training.datasets.constant_length import ConstantLengthDataset
from codeparrot.training.datasets.loader import build_dataloader, build_dataset
from codeparrot.training.datasets.pretokenized import PretokenizedDataset
from codeparrot.training.datasets.resumable import Reader
from codeparrot.training.loss import IGNORE_INDEX, FusedHead, fused_head_weight, token_loss_sum


@dataclass
class EvalResult:
    loss: float  # mean cross-entropy per predicted token (nats)
    perplexity: float
    tokens: int  # predicted tokens counted, over all processes
    batches: int  # eval steps taken (each process ran this many forwards, real or dummy)
    sequences: int = 0  # real (not dummy) sequences scored, over all processes
    seq_length: int | None = None  # tokens per sequence (None when there was no real batch)

    def describe(self) -> str:
        """What the loss was measured on: '40 sequences x 1,024 tokens (40,920 predicted tokens)'. Losses on
        other sequence lengths or other sequences are not comparable: every printed figure carries this."""
        return describe_eval({"val_sequences": self.sequences, "val_seq_length": self.seq_length,
                              "val_tokens": self.tokens})

    def metrics(self) -> dict:
        """The metrics.jsonl keys of this evaluation (what a pushed checkpoint's metrics.json carries)."""
        return {"val_loss": self.loss, "perplexity": self.perplexity, "val_tokens": self.tokens,
                "val_sequences": self.sequences, "val_seq_length": self.seq_length}


class EvaluationStopped(CodeParrotError):
    """`evaluate` was asked to stop (`should_stop`) before the end: there is no loss to report."""


@torch.no_grad()
def evaluate(model, batches: Iterable[torch.Tensor], accelerator, max_steps: int = -1,
             dummy_shape: tuple[int, int] | None = None,
             head_weight: FusedHead | torch.Tensor | None = None,
             should_stop: Callable[[], bool] | None = None,
             on_step: Callable[[int], None] | None = None) -> EvalResult:
    """Validation loss of `model` over this process's `batches` (LongTensor [B, T], labels = inputs) and the
    other processes' ones: `max_steps` eval steps (each process one batch per step), or -1 for all of them.

    `dummy_shape` [B, T] is the shape of every forward: a shorter batch is padded to it, and a process whose data
    ran out forwards a fully masked one (default: the largest batch seen; required only when a process may have
    no data at all). `head_weight`: see `token_loss_sum`.

    `should_stop`, asked on the host before every eval step (the app's losses plot: its client cancelled or
    left), ends the evaluation there with `EvaluationStopped`; with several processes, on all of them at the same
    step as soon as one is asked to (carried by the step's "has data" all-reduce: no extra collective).

    `on_step`, called on the host after every eval step with the tokens this process predicted in it (rows ×
    (T - 1) of its batch, 0 for a dummy one), reads the batch's shape only: no device value, no sync per batch.
    The CLIs' progress (`EvalProgress`); None (training, the app): no progress."""
    device = accelerator.device
    was_training = model.training
    model.eval()
    loss_sum = torch.zeros((), dtype=torch.float64, device=device)
    count = torch.zeros((), dtype=torch.int64, device=device)
    sequences = 0
    seq_length = None
    iterator: Iterator[torch.Tensor] = iter(batches)
    steps = 0
    shape = dummy_shape
    stopped = False
    while max_steps < 0 or steps < max_steps:
        stopped = should_stop is not None and bool(should_stop())
        batch = None if stopped else next(iterator, None)
        if accelerator.num_processes > 1:  # one host read per step: every process must agree to go on
            flags = torch.tensor([0 if batch is None else 1, int(stopped)], device=device)
            has_data, stops = accelerator.reduce(flags, reduction="sum").tolist()
            stopped = stops > 0
            if stopped or has_data == 0:  # one process was asked to stop, or every process has run out
                break
        elif stopped or batch is None:  # one process: known on the host, no device round trip (a GPU sync per batch)
            break
        if batch is not None:
            sequences += batch.shape[0]
            seq_length = batch.shape[1]
            if shape is None or batch.shape[1] != shape[1] or batch.shape[0] > shape[0]:
                shape = tuple(batch.shape)
            input_ids = batch.to(device, non_blocking=True)
            labels = input_ids
            if batch.shape[0] < shape[0]:  # the split's last, short batch: padded with masked rows (see above)
                input_ids, labels = pad_rows(input_ids, shape[0])
        else:
            if shape is None:
                raise ValueError("evaluate: a process had no validation data and no dummy_shape was given")
            input_ids, labels = pad_rows(torch.zeros((0, shape[1]), dtype=torch.long, device=device), shape[0])
        batch_loss, batch_count = token_loss_sum(model, input_ids, labels, head_weight)
        loss_sum += batch_loss.double()
        count += batch_count
        steps += 1
        if on_step is not None:
            on_step(0 if batch is None else batch.shape[0] * (batch.shape[1] - 1))  # labels = inputs: no -100
    totals = torch.stack([loss_sum, count.double(), torch.tensor(float(sequences), dtype=torch.float64,
                                                                 device=device)])
    if accelerator.num_processes > 1:
        totals = accelerator.reduce(totals, reduction="sum")
    total_loss, total_count, total_sequences = totals.tolist()
    if was_training:
        model.train()
    if stopped:
        raise EvaluationStopped(f"the evaluation was stopped after {steps} of its batches: its caller asked it to "
                                f"(should_stop)")
    loss = total_loss / total_count if total_count else float("nan")
    return EvalResult(loss=loss, perplexity=perplexity(loss), tokens=int(total_count), batches=steps,
                      sequences=int(total_sequences), seq_length=seq_length or (shape[1] if shape else None))


class EvalProgress:
    """`on_step` of a CLI's evaluation, on the main process: eval steps (batches) and tokens/s, counted on the host.
    Where stderr is a terminal, a tqdm bar (as the other long CLIs); elsewhere (a log file: the demo's stages, a
    cluster job) a bar's redraws would be one long line of carriage returns, so a line every `PROGRESS_EVERY_S`
    seconds and one at the end instead, as tokenizer training prints. On a GPU the forwards are queued
    asynchronously: the host runs ahead of the device by at most its launch queue, so the rates are the device's
    over any stretch longer than a few batches. `total`: the eval steps when known (`eval_steps_total`)."""

    def __init__(self, label: str, total: int | None = None, terminal: bool | None = None):
        self.label, self.total = label, total
        self.steps = self.tokens = 0
        self.start = self.last_line = time.monotonic()
        terminal = sys.stderr.isatty() if terminal is None else terminal
        self.bar = tqdm(total=total, unit="batch", desc=label, dynamic_ncols=True) if terminal else None

    def __call__(self, tokens: int) -> None:
        self.steps += 1
        self.tokens += tokens
        now = time.monotonic()
        if self.bar is not None:
            self.bar.set_postfix_str(f"{self.tokens / max(now - self.start, 1e-9):,.0f} tok/s", refresh=False)
            self.bar.update(1)
        elif now - self.last_line >= PROGRESS_EVERY_S:
            self.last_line = now
            self._line(now - self.start, done=False)

    def close(self, finished: bool = True) -> None:
        """The bar closed, or (a log file) the last line with the whole pass's rates: only for a pass that
        `finished` (a stopped or failed one says so in its own error)."""
        if self.bar is not None:
            self.bar.close()
        elif finished and self.steps:
            self._line(time.monotonic() - self.start, done=True)

    def _line(self, seconds: float, done: bool) -> None:
        seconds = max(seconds, 1e-9)
        total = "" if done or self.total is None else f"/{self.total:,}"
        print(f"{self.label}: {'done, ' if done else ''}{self.steps:,}{total} batches, {self.tokens:,} tokens in "
              f"{seconds:,.0f} s ({self.steps / seconds:.2f} batches/s, {self.tokens / seconds:,.0f} tokens/s)",
              file=sys.stderr, flush=True)


def eval_steps_total(dataset, batch_size: int, num_workers: int, max_steps: int) -> int | None:
    """The eval steps of `validation_loss` where cheap to know, for this process's progress: `max_steps`, or fewer
    for pretokenized data, whose shard is known without reading it: this rank's positions r::world_size (rank 0,
    the main process, has the most, so its batches are the eval steps), of which each DataLoader worker batches
    its own w::workers (as `PretokenizedDataset.order` deals them). Text data: None (its sequences are known only
    once tokenized) unless `max_steps` bounds them."""
    limit = None if max_steps < 0 else max_steps
    if not isinstance(dataset, PretokenizedDataset):
        return limit
    workers = max(num_workers, 1)
    shard = range(dataset.n_sequences)[dataset.rank::dataset.world_size]
    batches = sum(math.ceil(len(shard[worker::workers]) / batch_size) for worker in range(workers))
    return batches if limit is None else min(batches, limit)


def check_has_a_sequence(dataset, readers: int, split: str, seq_key: str, workers_key: str) -> None:
    """One-line `CodeParrotError` unless the finite `dataset` (a validation split from `build_dataset`) gives at
    least one sequence to one of its `readers` (processes × DataLoader workers); else its loss would be NaN, of 0
    tokens. `split`, `seq_key`, `workers_key`: how the user names the split, seq_length and num_workers.

    Pretokenized data refuses fewer tokens than one sequence itself (`PretokenizedDataset`) and deals whole
    sequences. Text data (`ConstantLengthDataset`) deals files: each reader packs its own into sequences and
    drops its last, short one, so a split can hold more than seq_length tokens and no sequence. It is read here
    reader by reader until one gives a sequence: all of a small split, the first files of a large one (with a
    buffer of seq_length characters: files are tokenized one by one, so the sequences are the same)."""
    if not isinstance(dataset, ConstantLengthDataset):
        return
    probe = copy.copy(dataset)  # the dataset itself keeps no iterator from this
    probe.max_buffer_chars = dataset.seq_length
    workers = readers // dataset.world_size
    tails = []
    for reader in range(readers):
        iterator = probe._start(Reader(reader, readers, reader % workers, workers), None)
        if next(iterator, None) is not None:
            return
        tails.append(len(iterator.tail))  # no sequence: every token it read is in its tail
    length = f"one sequence of {dataset.seq_length:,} tokens ({seq_key})"
    if readers == 1:
        raise CodeParrotError(f"{split} {dataset.label} holds {tails[0]:,} tokens, not {length}: its validation loss "
                              f"would be NaN; give at least {dataset.seq_length:,} tokens of validation data, a "
                              f"shorter {seq_key}, or no {split}")
    raise CodeParrotError(f"{split} {dataset.label} holds {sum(tails):,} tokens, dealt by file to {readers} readers "
                          f"(processes × dataloader workers) that pack their own files into sequences, at most "
                          f"{max(tails):,} tokens each: not {length} for any of them, its validation loss would be "
                          f"NaN; give more validation data, fewer processes or {workers_key}, a shorter {seq_key}, "
                          f"or no {split}")


def pad_rows(input_ids: torch.Tensor, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(input ids, labels) of `input_ids` [b, T] padded to [rows, T]: token 0 and label IGNORE_INDEX below."""
    pad = rows - input_ids.shape[0]
    padded = torch.cat([input_ids, input_ids.new_zeros((pad, input_ids.shape[1]))])  # [rows, T]
    labels = torch.cat([input_ids, input_ids.new_full((pad, input_ids.shape[1]), IGNORE_INDEX)])  # [rows, T]
    return padded, labels


def perplexity(loss: float) -> float:
    """exp(loss), inf instead of an overflow."""
    try:
        return math.exp(loss)
    except OverflowError:
        return float("inf")


def validation_loss(model_ref: str, dataset: str, revision: str | None = None, tokenizer_ref: str | None = None,
                    seq_length: int | None = None, batch_size: int = 8, max_eval_steps: int = -1,
                    text_column: str = "content", num_workers: int = 0, mixed_precision: str | None = None,
                    should_stop: Callable[[], bool] | None = None, progress: str | None = None) -> dict:
    """Loss and perplexity of a checkpoint (`model_ref` at `revision`) on `dataset`, on every process Accelerate
    launched (each takes its own shard). Returns the same summary dict on every process. `should_stop`: see
    `evaluate` (raises `EvaluationStopped`). `progress`: the label of the evaluation's progress on the main
    process (`EvalProgress`: the CLIs); None for none (the app)."""
    if batch_size <= 0 or (max_eval_steps == 0 or max_eval_steps < -1):
        raise CodeParrotError(f"batch size must be > 0 and max eval steps -1 or > 0, got {batch_size}, {max_eval_steps}")
    if seq_length is not None and seq_length <= 0:  # 0 would silently mean the model's context
        raise CodeParrotError(f"seq length must be > 0 (or left out: the model's context), got {seq_length}")
    accelerator = Accelerator(mixed_precision=mixed_precision)
    with accelerator.local_main_process_first():  # materialize a repository revision once per node
        model_dir = resolve_model_dir(model_ref, revision)
        tokenizer = load_tokenizer(tokenizer_ref or str(model_dir))
    model_config = read_model_config(model_dir)  # the config only: the data is checked before the weights load
    seq_length = seq_length or model_config.get("n_positions") or model_config.get("max_position_embeddings", 1024)
    check_model_tokenizer(model_config, tokenizer, str(tokenizer_ref or model_dir), seq_length=seq_length)
    data = build_dataset(dataset, tokenizer, seq_length, rank=accelerator.process_index,
                         world_size=accelerator.num_processes, infinite=False, shuffle=False, text_column=text_column,
                         name="--dataset")
    check_has_a_sequence(data, accelerator.num_processes * max(num_workers, 1), "--dataset", "--seq-length",
                         "--num-workers")
    model = load_pretrained_model(str(model_dir), dtype=torch.float32)
    loader = build_dataloader(data, batch_size=batch_size, num_workers=num_workers,
                              pin_memory=accelerator.device.type == "cuda")
    model = accelerator.prepare(model)
    head = fused_head_weight(accelerator, model)
    bar = None
    if progress is not None and accelerator.is_main_process:
        if accelerator.num_processes > 1:  # its shard's tokens: the others' are not read (no sync per batch)
            progress = f"{progress} (rank 0/{accelerator.num_processes})"
        bar = EvalProgress(progress, eval_steps_total(data, batch_size, num_workers, max_eval_steps))
    finished = False
    try:
        result = evaluate(model, loader, accelerator, max_steps=max_eval_steps, dummy_shape=(batch_size, seq_length),
                          head_weight=head, should_stop=should_stop, on_step=bar)
        finished = True
    except EvaluationStopped:
        accelerator.end_training()  # as after a whole evaluation: every process stopped at the same step
        raise
    finally:
        if bar is not None:
            bar.close(finished)
    accelerator.end_training()
    if not result.tokens:  # every process has the totals: each raises the same line
        raise CodeParrotError(f"nothing to evaluate: {dataset} holds no complete sequence of {seq_length} tokens "
                              f"(the loss of 0 tokens is undefined; give more data or a shorter --seq-length)")
    return {"model": model_ref, "revision": revision, "dataset": str(dataset), "seq_length": seq_length,
            "loss": result.loss, "perplexity": result.perplexity, "tokens": result.tokens,
            "sequences": result.sequences, "eval_steps": result.batches, "processes": accelerator.num_processes,
            "measured_on": result.describe()}


def run_validation_loss(cfg: ValidationLossConfig) -> dict:
    """scripts/validation_loss.py: `validation_loss` for `cfg`; the main process prints one line and writes the
    result to `cfg.output` (or prints it as JSON)."""
    if cfg.output:  # checked before the evaluation, which can take hours, not when writing its result
        output = Path(cfg.output)
        if output.is_dir():
            raise CodeParrotError(f"--output {cfg.output} is a folder; give the JSON file to write "
                                  f"(e.g. {output / 'validation_loss.json'})")
        ensure_writable_dir(output.parent)
    result = validation_loss(cfg.model, cfg.dataset, revision=cfg.revision, tokenizer_ref=cfg.tokenizer,
                             seq_length=cfg.seq_length, batch_size=cfg.batch_size,
                             max_eval_steps=cfg.max_eval_steps, text_column=cfg.text_column,
                             num_workers=cfg.num_workers, mixed_precision=cfg.mixed_precision,
                             progress="validation" if cfg.progress else None)
    if PartialState().is_main_process:
        print(f"validation loss {result['loss']:.4f} | perplexity {result['perplexity']:.2f} | "
              f"{result['measured_on']} | {result['processes']} process(es) | {cfg.model}"
              f"{'@' + cfg.revision if cfg.revision else ''} on {cfg.dataset}")
        if cfg.output:
            atomic_write_json(cfg.output, result)
        else:
            print(json.dumps(result))
    return result

"""This process's data in a training run: its shards of the training and validation sets, their loaders, the
evaluation pass over its validation shard, and `--inspect-batches` (the first batches decoded back to text)."""

from __future__ import annotations

import torch

from codeparrot.errors import CodeParrotError
from codeparrot.training.config import TrainConfig
from codeparrot.training.datasets.loader import build_dataloader, build_dataset
from codeparrot.training.validation import EvalResult, check_has_a_sequence, evaluate


def build_datasets(cfg: TrainConfig, tokenizer, rank: int, world: int):
    """(train dataset, validation dataset or None) for this process: its own shard of each."""

    d = cfg.data
    if not d.train:
        raise CodeParrotError("data.train is not set: give the training data (pretokenized folder or JSONL shards)")
    common = dict(rank=rank, world_size=world, seed=cfg.seed, num_of_sequences=d.num_of_sequences,
                  chars_per_token=d.chars_per_token, text_column=d.text_column)
    # FIM rearranges training documents only: the validation loss stays the left-to-right loss, comparable
    # between runs with and without FIM.
    train_ds = build_dataset(d.train, tokenizer, d.seq_length, infinite=True, shuffle=True, split="train",
                             shuffle_buffer=d.shuffle_buffer, sequence_shuffle_buffer=d.sequence_shuffle_buffer,
                             fim_rate=d.fim_rate, fim_spm_rate=d.fim_spm_rate, name="--data.train", **common)
    valid_ds = None
    if d.valid:
        valid_ds = build_dataset(d.valid, tokenizer, d.seq_length, infinite=False, shuffle=False, split="validation",
                                 name="--data.valid", **common)
        # now, not as a NaN validation loss at every evaluation: a split too small for one sequence of its readers
        check_has_a_sequence(valid_ds, world * max(d.num_workers, 1), "data.valid", "data.seq_length",
                             "data.num_workers")
    return train_ds, valid_ds


def make_loader(cfg: TrainConfig, dataset, batch_size: int, device: torch.device):

    return build_dataloader(dataset, batch_size=batch_size, num_workers=cfg.data.num_workers,
                            pin_memory=device.type == "cuda")


def run_eval(cfg: TrainConfig, model, head, valid_ds, accelerator, device) -> EvalResult:
    """A fresh pass over this process's validation shard. Run inside a forked RNG so that evaluating (its
    loader workers draw a seed) never changes the training run's random stream: same weights with or without
    evaluation, and exact resumes whatever eval_steps is."""
    batch_size = cfg.eval.micro_batch_size or cfg.batch.micro_batch_size
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        loader = make_loader(cfg, valid_ds, batch_size, device)
        return evaluate(model, loader, accelerator, max_steps=cfg.eval.max_eval_steps,
                        dummy_shape=(batch_size, cfg.data.seq_length), head_weight=head)


def print_batches(dataset, tokenizer, n: int, batch_size: int) -> None:
    """`--inspect-batches N`: the first N batches decoded back to text, file boundaries (EOS) marked."""

    eos_text = tokenizer.convert_ids_to_tokens(tokenizer.eos_token_id)
    marker = f"\n{'─' * 20} {eos_text} {'─' * 20}\n"
    loader = build_dataloader(dataset, batch_size=batch_size, num_workers=0)
    for b, batch in enumerate(loader):
        if b >= n:
            break
        for r, row in enumerate(batch.tolist()):
            n_eos = sum(1 for t in row if t == tokenizer.eos_token_id)
            print(f"\n{'=' * 30} batch {b} row {r}: {len(row)} tokens, {n_eos} EOS {'=' * 30}")
            pieces = [tokenizer.decode(part) for part in _split_on(row, tokenizer.eos_token_id)]
            print(marker.join(pieces))


def _split_on(ids: list[int], sep: int) -> list[list[int]]:
    parts, current = [], []
    for t in ids:
        if t == sep:
            parts.append(current)
            current = []
        else:
            current.append(t)
    parts.append(current)
    return parts

"""HumanEval sampling: batched, left-padded generation with per-sequence stopping, resumable, one rank's share.

Work is a fixed plan: for each temperature, each of this rank's tasks (tasks are dealt round-robin to the
Accelerate processes), sample indices 0..n_samples-1, cut into batches of `batch_size` rows. A batch may
mix prompts (e.g. n_samples=1): rows are left-padded to a common length with an attention mask, so every
row's completion starts at the same column and `StopStringsCriteria` sees only generated tokens.

Each batch is seeded from (seed, temperature, its first sample): a resumed run regenerates a half-written
batch identically and skips finished ones. Samples are appended to this rank's part file and flushed as
each batch finishes, so a killed run loses at most one batch.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import torch

from codeparrot.errors import CodeParrotError
from codeparrot.stopping import STOP_STRINGS, StopStringsCriteria, finished_completion

SampleKey = tuple[str, float, int]  # (task_id, temperature, sample_index)


@dataclass
class SamplingConfig:
    n_samples: int = 200
    batch_size: int = 10
    temperatures: list[float] = field(default_factory=lambda: [0.2])
    top_p: float = 0.95
    max_new_tokens: int = 256
    seed: int = 0
    strip_prompt: bool = True  # CodeParrot's protocol: EOS + prompt.strip()

    def validate(self) -> None:
        for name in ("n_samples", "batch_size", "max_new_tokens"):
            if getattr(self, name) < 1:
                raise CodeParrotError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(self, name)}")
        if not self.temperatures or any(t < 0 for t in self.temperatures):
            raise CodeParrotError(f"--temperature needs values >= 0 (0 = greedy), got {self.temperatures}")
        if len(set(self.temperatures)) != len(self.temperatures):
            raise CodeParrotError(f"--temperature lists a value twice: {self.temperatures}")
        if not 0 < self.top_p <= 1:
            raise CodeParrotError(f"--top-p must be in (0, 1], got {self.top_p}")


@dataclass
class Batch:
    temperature: float
    rows: list[tuple[int, int]]  # (task position in `problems`, sample index)
    seed: int


def prompt_text(prompt: str, strip: bool) -> str:
    return prompt.strip() if strip else prompt


def prompt_ids(tokenizer, problems: Sequence[dict], strip: bool) -> list[list[int]]:
    """EOS + the (stripped) prompt per problem, tokenized without other special tokens."""
    texts = [prompt_text(p["prompt"], strip) for p in problems]
    encoded = tokenizer(texts, add_special_tokens=False)["input_ids"]
    return [[tokenizer.eos_token_id] + ids for ids in encoded]


def check_context(ids: Sequence[list[int]], problems: Sequence[dict], max_new_tokens: int, context: int) -> None:
    """Every prompt plus `max_new_tokens` must fit the model's context; one error listing how many do not."""
    too_long = [(len(x), p["task_id"]) for x, p in zip(ids, problems) if len(x) + max_new_tokens > context]
    if too_long:
        longest, task = max(too_long)
        raise CodeParrotError(f"{len(too_long)} of {len(problems)} prompts plus --max-new-tokens {max_new_tokens} "
                              f"exceed the model's context of {context} tokens (longest: {task}, {longest} "
                              f"prompt tokens); lower --max-new-tokens")


def batch_seed(seed: int, temperature: float, task_id: str, index: int) -> int:
    digest = hashlib.sha256(f"{seed}|{temperature!r}|{task_id}|{index}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def plan_batches(problems: Sequence[dict], cfg: SamplingConfig, rank: int, world: int) -> list[Batch]:
    """This rank's batches: tasks rank, rank + world, ...; every sample index of a task; per temperature."""
    mine = range(rank, len(problems), world)
    batches = []
    for temperature in cfg.temperatures:
        rows = [(t, i) for t in mine for i in range(cfg.n_samples)]
        for start in range(0, len(rows), cfg.batch_size):
            chunk = rows[start:start + cfg.batch_size]
            first_task, first_index = chunk[0]
            batches.append(Batch(temperature, chunk, batch_seed(cfg.seed, temperature,
                                                                problems[first_task]["task_id"], first_index)))
    return batches


def left_pad(rows: Sequence[list[int]], pad_id: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """(input_ids, attention_mask), both (batch, longest): padding on the left, mask 0 there."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, width - len(r):] = torch.tensor(r, dtype=torch.long)
        mask[i, width - len(r):] = 1
    return ids.to(device), mask.to(device)


def generate_batch(model, tokenizer, prompts: Sequence[list[int]], temperature: float, cfg: SamplingConfig,
                   seed: int, stop_strings: Sequence[str] = STOP_STRINGS) -> list[tuple[str, str, int]]:
    """Sample one completion per prompt row: [(completion, finish reason, generated tokens)]."""
    from transformers import StoppingCriteriaList

    eos = tokenizer.eos_token_id
    device = next(model.parameters()).device
    input_ids, attention_mask = left_pad(prompts, eos, device)
    width = input_ids.shape[1]
    criteria = StopStringsCriteria(tokenizer, width, stop_strings, eos_token_id=eos)
    # top_k=0: the protocol is nucleus sampling only (transformers would otherwise add its default top-k 50).
    sampling = ({"do_sample": True, "temperature": temperature, "top_p": cfg.top_p, "top_k": 0}
                if temperature > 0 else {"do_sample": False})
    torch.manual_seed(seed)  # seeds CPU and every CUDA device
    with torch.inference_mode():
        out = model.generate(input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=cfg.max_new_tokens,
                             pad_token_id=eos, eos_token_id=eos, stopping_criteria=StoppingCriteriaList([criteria]),
                             **sampling)
    generated = out[:, width:].tolist()  # (batch, <= max_new_tokens); finished rows padded with EOS
    results = []
    for row, ids in enumerate(generated):
        text, reason = finished_completion(tokenizer, ids, stop_strings, eos_token_id=eos)
        finished = criteria.finished_at[row] if row < len(criteria.finished_at) else None
        results.append((text, reason, finished if finished is not None else len(ids)))
    return results


def sample_key(record: dict) -> SampleKey:
    return record["task_id"], float(record["temperature"]), int(record["sample_index"])


def append_records(path: Path, records: Sequence[dict]) -> None:
    """Append JSON lines in one write, flushed to disk: a kill leaves at most a partial last line."""
    data = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records).encode("utf-8")
    with open(path, "ab") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def generate_samples(model, tokenizer, problems: Sequence[dict], cfg: SamplingConfig, part_file: Path,
                     done: set[SampleKey], rank: int = 0, world: int = 1,
                     on_progress: Callable[[int, int], None] | None = None) -> dict:
    """Generate this rank's missing samples into `part_file`. `on_progress(samples, tokens)` after each batch.

    Returns {"samples", "tokens", "seconds"} for what this call generated.
    """
    from codeparrot.generation import model_context

    ids = prompt_ids(tokenizer, problems, cfg.strip_prompt)
    check_context(ids, problems, cfg.max_new_tokens, model_context(model))
    made = tokens = 0
    start = time.perf_counter()
    for batch in plan_batches(problems, cfg, rank, world):
        keys = [(problems[t]["task_id"], float(batch.temperature), i) for t, i in batch.rows]
        if all(k in done for k in keys):
            continue
        outputs = generate_batch(model, tokenizer, [ids[t] for t, _ in batch.rows], batch.temperature, cfg,
                                 batch.seed)
        records = []
        for key, (text, reason, n_tokens) in zip(keys, outputs):
            if key in done:  # a half-written batch: same seed, same rows -> keep what was already saved
                continue
            records.append({"task_id": key[0], "completion": text, "temperature": batch.temperature,
                            "sample_index": key[2], "seed": batch.seed, "finish": reason, "num_tokens": n_tokens})
            tokens += n_tokens
        append_records(part_file, records)
        done.update(sample_key(r) for r in records)
        made += len(records)
        if on_progress is not None:
            on_progress(len(records), sum(r["num_tokens"] for r in records))
    return {"samples": made, "tokens": tokens, "seconds": time.perf_counter() - start}

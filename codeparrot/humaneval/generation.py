"""HumanEval sampling: batched, left-padded generation with per-sequence stopping, resumable, one rank's share.

Work is a fixed plan: for each temperature, each of this rank's tasks (tasks are dealt round-robin to the
Accelerate processes), sample indices 0..n_samples-1, cut into batches of `batch_size` rows. A batch may
mix prompts (e.g. n_samples=1): rows are left-padded to a common length with an attention mask, so every
row's completion starts at the same column and `StopStringsCriteria` sees only generated tokens.

Infilling tasks (`codeparrot.humaneval.infilling`: a prompt and a suffix) are sampled the same way from the PSM
prompt `EOS <fim_prefix> prompt <fim_suffix> suffix <fim_middle>` (nothing stripped); a middle ends at EOS or a
FIM sentinel (codeparrot/fim), never at HumanEval's stop strings.

Each batch is seeded from (seed, temperature, its first sample): a resumed run regenerates a half-written
batch identically and skips finished ones. Samples are appended to this rank's part file and flushed as
each batch finishes, so a killed run loses at most one batch.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import torch
from accelerate import Accelerator
from accelerate.utils import gather_object
from tqdm.auto import tqdm
from transformers import StoppingCriteriaList

from codeparrot.atomic_io import atomic_write_json
from codeparrot.errors import CodeParrotError
from codeparrot.fim.encoding import plain_text_encoder
from codeparrot.fim.prompt import fim_prompt_ids
from codeparrot.fim.tokens import FIM_TOKENS, fim_token_ids
from codeparrot.humaneval.config import HumanEvalConfig, SamplingConfig
from codeparrot.humaneval.problems import check_complete, merge_samples, part_files, read_samples
from codeparrot.humaneval.stopping import STOP_STRINGS, StopStringsCriteria, finished_completion
from codeparrot.inference.decoding import checkpoint_note, flags_only
from codeparrot.repository.model import load_model_and_tokenizer, model_context
from codeparrot.repository.provenance import load_revision, pinned_commit, weights_dtype, weights_fingerprint

SampleKey = tuple[str, float, int]  # (task_id, temperature, sample_index)


@dataclass
class Batch:
    temperature: float
    rows: list[tuple[int, int]]  # (task position in `problems`, sample index)
    seed: int


def prompt_text(prompt: str, strip: bool) -> str:
    return prompt.strip() if strip else prompt


def prompt_ids(tokenizer, problems: Sequence[dict], strip: bool, infilling: bool = False) -> list[list[int]]:
    """EOS + the (stripped) prompt per problem, tokenized as plain text like training documents (a special-token
    string in a prompt stays text); for infilling tasks the PSM prompt of (prompt, suffix), unstripped."""
    if infilling:
        return [fim_prompt_ids(tokenizer, p["prompt"], p["suffix"], "the infilling benchmarks") for p in problems]
    texts = [prompt_text(p["prompt"], strip) for p in problems]
    encoded = plain_text_encoder(tokenizer).batch(texts)
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


def stops(tokenizer, infilling: bool) -> tuple[tuple[str, ...], tuple[int, ...]]:
    """(stop strings, stop ids besides EOS): HumanEval's strings, or for a middle the FIM sentinels (as ids, and as
    text should the model spell one out)."""
    if infilling:
        return FIM_TOKENS, fim_token_ids(tokenizer, "the infilling benchmarks").all()
    return STOP_STRINGS, ()


def generate_batch(model, tokenizer, prompts: Sequence[list[int]], temperature: float, cfg: SamplingConfig,
                   seed: int, stop_strings: Sequence[str] = STOP_STRINGS,
                   stop_ids: Sequence[int] = ()) -> list[tuple[str, str, int]]:
    """Sample one completion per prompt row: [(completion, finish reason, generated tokens)]."""

    eos = tokenizer.eos_token_id
    device = next(model.parameters()).device
    input_ids, attention_mask = left_pad(prompts, eos, device)
    width = input_ids.shape[1]
    criteria = StopStringsCriteria(tokenizer, width, stop_strings, eos_token_id=eos, stop_ids=stop_ids)
    # top_k=0: the protocol is nucleus sampling only (transformers would otherwise add its default top-k 50).
    sampling = ({"do_sample": True, "temperature": temperature, "top_p": cfg.top_p, "top_k": 0}
                if temperature > 0 else {"do_sample": False})
    torch.manual_seed(seed)  # seeds CPU and every CUDA device
    # The protocol alone decides how tokens are drawn: never the checkpoint's generation_config.json (a repetition
    # penalty, no_repeat_ngram_size, min_new_tokens, beams...), which `generate` would silently fill in.
    with torch.inference_mode(), flags_only(model):
        out = model.generate(input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=cfg.max_new_tokens,
                             pad_token_id=eos, eos_token_id=[eos, *stop_ids] if stop_ids else eos,
                             stopping_criteria=StoppingCriteriaList([criteria]), **sampling)
    generated = out[:, width:].tolist()  # (batch, <= max_new_tokens); finished rows padded with EOS
    results = []
    for row, ids in enumerate(generated):
        text, reason = finished_completion(tokenizer, ids, stop_strings, eos_token_id=eos, stop_ids=stop_ids)
        finished = criteria.finished_at[row] if row < len(criteria.finished_at) else None
        results.append((text, reason, finished if finished is not None else len(ids)))
    return results


def sample_key(record: dict) -> SampleKey:
    return record["task_id"], float(record["temperature"]), int(record["sample_index"])


def append_records(path: Path, records: Sequence[dict]) -> None:
    """Append JSON lines in one write, flushed to disk: a kill leaves at most a partial last line, which the
    next append (a resumed run) cuts away first, so the new lines never run on from it."""
    data = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records).encode("utf-8")
    with open(path, "a+b") as f:
        size = f.seek(0, os.SEEK_END)
        if size:
            f.seek(size - 1)
            if f.read(1) != b"\n":  # a killed writer's partial line (read_samples skipped it): drop it
                f.seek(0)
                f.truncate(f.read().rfind(b"\n") + 1)
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def generate_samples(model, tokenizer, problems: Sequence[dict], cfg: SamplingConfig, part_file: Path,
                     done: set[SampleKey], rank: int = 0, world: int = 1,
                     on_progress: Callable[[int, int], None] | None = None, infilling: bool = False) -> dict:
    """Generate this rank's missing samples into `part_file`. `on_progress(samples, tokens)` after each batch.
    `infilling`: the problems are infilling tasks (prompt and suffix; module docstring).

    Returns {"samples", "tokens", "seconds"} for what this call generated.
    """

    ids = prompt_ids(tokenizer, problems, cfg.strip_prompt, infilling)
    stop_strings, stop_ids = stops(tokenizer, infilling)
    strip = cfg.strip_prompt and not infilling
    check_context(ids, problems, cfg.max_new_tokens, model_context(model))
    made = tokens = 0
    start = time.perf_counter()
    for batch in plan_batches(problems, cfg, rank, world):
        keys = [(problems[t]["task_id"], float(batch.temperature), i) for t, i in batch.rows]
        if all(k in done for k in keys):
            continue
        outputs = generate_batch(model, tokenizer, [ids[t] for t, _ in batch.rows], batch.temperature, cfg,
                                 batch.seed, stop_strings, stop_ids)
        records = []
        for key, (text, reason, n_tokens) in zip(keys, outputs):
            if key in done:  # a half-written batch: same seed, same rows -> keep what was already saved
                continue
            records.append({"task_id": key[0], "completion": text, "temperature": batch.temperature,
                            "sample_index": key[2], "seed": batch.seed, "finish": reason, "num_tokens": n_tokens,
                            "strip_prompt": strip})
            tokens += n_tokens
        append_records(part_file, records)
        done.update(sample_key(r) for r in records)
        made += len(records)
        if on_progress is not None:
            on_progress(len(records), sum(r["num_tokens"] for r in records))
    return {"samples": made, "tokens": tokens, "seconds": time.perf_counter() - start}


# --------------------------------------------------------------------------------------- distributed run
def _meta(config: HumanEvalConfig, problems: Sequence[dict], world: int, commit: str | None = None,
          weights: dict[str, str] | None = None) -> dict:
    """What the samples depend on: the distribution (model and the commit its revision named, or where none does
    the fingerprint of its files, `weights_fingerprint`; top-p, max new tokens, prompt format, stop strings,
    prompts) and the exact draws (seed; n_samples, batch size and process
    count shape the batches, and each batch is seeded from its first row). A resumed run must match all of it,
    so the finished file is the one an uninterrupted run would have written. Temperatures may be added on
    resume: each has its own batches."""
    cfg = config.sampling
    infilling = is_infilling(config)
    prompts = hashlib.sha256("\0".join(p["task_id"] + "\0" + p["prompt"] + ("\0" + p["suffix"] if infilling else "")
                                       for p in problems).encode()).hexdigest()
    # A pinned commit stands for the revision (any name of that commit resumes: e.g. --revision COMMIT once the
    # branch has moved on); without one, the revision as given.
    pinned = {"commit": commit} if commit else {"revision": config.revision}
    meta = {"model": config.model, **pinned, "seed": cfg.seed, "n_samples": cfg.n_samples,
            "batch_size": cfg.batch_size, "num_processes": world, "top_p": cfg.top_p,
            "max_new_tokens": cfg.max_new_tokens, "strip_prompt": cfg.strip_prompt and not infilling,
            "stop_strings": list(FIM_TOKENS if infilling else STOP_STRINGS), "prompts_sha256": prompts[:16]}
    if weights is not None:  # a plain folder: no commit names its files, so their fingerprint is recorded
        meta["weights"] = weights
    if infilling:  # only then: HumanEval samples files made before the infilling benchmarks still resume
        meta["benchmark"] = config.benchmark
    return meta


def is_infilling(config: HumanEvalConfig) -> bool:
    return config.benchmark != "humaneval"


def _check_meta(meta_file: Path, meta: dict, samples_file: Path, revision: str | None) -> dict | None:
    """A one-line error when the samples there were made with other settings (or with unknown ones); else the
    recorded meta (None when there is none yet). `revision`: the one asked for, which a meta written before Hub
    and clone commits were pinned recorded instead of a commit. A meta written before the files of a plain folder
    were fingerprinted has no "weights": it resumes on trust, as before (`generate_distributed` warns)."""
    if not meta_file.exists():
        existing = ([samples_file] if samples_file.exists() else []) + part_files(samples_file)
        if any(path.read_bytes().strip() for path in existing):
            raise CodeParrotError(f"{samples_file} holds samples but no {meta_file.name}, so the settings they "
                                  f"were made with are unknown; use another --samples-file or remove it")
        return None
    try:
        old = json.loads(meta_file.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as err:
        raise CodeParrotError(f"{meta_file}: unreadable ({err}); remove it to start the samples afresh") from None
    if not isinstance(old, dict):
        raise CodeParrotError(f"{meta_file}: not a JSON object; remove it to start the samples afresh")
    expected = meta
    # that run pinned nothing (a meta from before commits were pinned; not a fingerprinted folder): as it compared
    if "commit" in meta and "commit" not in old and "revision" in old and "weights" not in old:
        expected = {**{k: v for k, v in meta.items() if k != "commit"}, "revision": revision}
    diff = [f"{k}: {old.get(k)!r} there, {v!r} now" for k, v in expected.items()
            if k != "weights" and old.get(k) != v]
    if diff:
        raise CodeParrotError(f"{samples_file} holds samples made with other settings ({'; '.join(diff)}); "
                              f"they are recorded in {meta_file}; use the same settings to resume, another "
                              f"--samples-file, or remove both files")
    if "weights" in meta and "weights" in old:
        _check_weights(old["weights"], meta["weights"], meta["model"], meta_file, samples_file)
    return old


def _check_weights(old: object, now: dict[str, str], model: str, meta_file: Path, samples_file: Path) -> None:
    """A one-line error naming the files of the folder `model` whose fingerprint (`weights_fingerprint`) differs
    from the one `meta_file` recorded: the samples there were made with other weights."""
    recorded = old if isinstance(old, dict) else {}
    changed = sorted(name for name in recorded.keys() | now.keys() if recorded.get(name) != now.get(name))
    if changed:
        raise CodeParrotError(f"{samples_file} holds samples made with other files in {model}: "
                              f"{', '.join(changed)} changed since (their fingerprints are recorded in {meta_file}); "
                              f"put those files back to resume, or start over with another --samples-file or after "
                              f"removing both files")


def _check_dtype(old: dict | None, dtypes: Sequence[str], what: str, samples_file: Path) -> str:
    """The one dtype every process loaded the weights in, or a one-line error: the processes differ, or the
    samples there were made in another (meta written before dtypes were recorded has none: it resumes)."""
    if len(set(dtypes)) > 1:
        raise CodeParrotError(f"the processes loaded {what} in different dtypes ({', '.join(sorted(set(dtypes)))}); "
                              f"run them all on one kind of device")
    dtype = dtypes[0]
    if old is not None and old.get("dtype", dtype) != dtype:
        raise CodeParrotError(f"{samples_file} holds samples made with the weights in {old['dtype']}, now {dtype} "
                              f"(they load in float32 on a CPU, in their saved dtype on a GPU); resume on the same "
                              f"kind of device, use another --samples-file, or remove both files")
    return dtype


def generate_distributed(config: HumanEvalConfig, problems: Sequence[dict], samples_file: Path):
    """Sample under Accelerate: each process generates its tasks into its part file, rank 0 merges.

    Returns (samples of this run's tasks/temperatures/indices, generation info) on the main process and
    None on the others. Every process ends with `accelerator.end_training()`.
    """
    cfg = config.sampling
    cfg.validate()
    samples_file.parent.mkdir(parents=True, exist_ok=True)
    meta_file = samples_file.with_name(samples_file.name + ".meta.json")
    # WORLD_SIZE is what `accelerate launch` sets; checked against the Accelerator below. Every rank checks the
    # same files before any collective: all fail together, none hangs.
    commit = pinned_commit(config.model, config.revision)  # local repository or Hub: resolved before anything loads
    weights = weights_fingerprint(config.model, commit)  # a plain folder's files, where no commit names them
    meta = _meta(config, problems, int(os.environ.get("WORLD_SIZE", "1") or 1), commit, weights)
    old = _check_meta(meta_file, meta, samples_file, config.revision)
    accelerator = Accelerator()
    rank, world = accelerator.process_index, accelerator.num_processes
    if world != meta["num_processes"]:  # launched some other way than through WORLD_SIZE: record the truth
        meta["num_processes"] = world
        _check_meta(meta_file, meta, samples_file, config.revision)
    commits = sorted(set(gather_object([commit])), key=str)  # every process must sample the same checkpoint
    if len(commits) > 1:
        raise CodeParrotError(f"{config.model}: revision {config.revision or 'main'} moved while the processes "
                              f"started (they found {', '.join(str(c)[:12] for c in commits)}); run again")
    if len({json.dumps(w, sort_keys=True) for w in gather_object([weights])}) > 1:
        raise CodeParrotError(f"{config.model}: the processes found different files there (changed while they "
                              "started, or a different copy on each machine); give them all the same weights")
    if old is not None and weights is not None and "weights" not in old and accelerator.is_main_process:
        print(f"warning: {meta_file} records no fingerprint of the files in {config.model} (an older version wrote "
              f"it): resuming on trust that they are the weights its samples were made with", file=sys.stderr)
    if 0 in cfg.temperatures and cfg.n_samples > 1 and accelerator.is_main_process:
        print(f"warning: temperature 0 is greedy decoding: its {cfg.n_samples} samples per task are identical",
              file=sys.stderr)
    done: set[SampleKey] = set()
    for path in ([samples_file] if samples_file.exists() else []) + part_files(samples_file):
        done.update(sample_key(r) for r in read_samples(path, duplicates="first") if r.get("temperature") is not None)
    with accelerator.main_process_first():  # rank 0 materializes a repository revision once, then all load it
        model, tokenizer = load_model_and_tokenizer(config.model, load_revision(config.model, config.revision, commit),
                                                    device=str(accelerator.device))
    # Every process checks the same values (the old meta was read before rank 0 could rewrite it): all fail together.
    meta["dtype"] = dtype = _check_dtype(old, gather_object([weights_dtype(model)]), config.model, samples_file)
    if accelerator.is_main_process:
        atomic_write_json(meta_file, meta)
        if note := checkpoint_note(model, tokenizer.eos_token_id, "HumanEval's sampling flags"):
            print(note, file=sys.stderr)
    todo = sum(1 for b in plan_batches(problems, cfg, rank, world) for t, i in b.rows
               if (problems[t]["task_id"], float(b.temperature), i) not in done)
    bar = tqdm(total=todo, unit="sample", desc=f"generate (rank {rank}/{world})", dynamic_ncols=True,
               disable=True if not config.progress or not accelerator.is_local_main_process else None)
    counted = {"tokens": 0, "start": time.perf_counter()}

    def progress(samples: int, tokens: int) -> None:
        counted["tokens"] += tokens
        bar.update(samples)
        elapsed = max(time.perf_counter() - counted["start"], 1e-9)
        bar.set_postfix_str(f"{counted['tokens'] / elapsed:.0f} tok/s, {bar.n / elapsed:.2f} samples/s")

    part = samples_file.with_name(f"{samples_file.name}.part-{rank}")
    stats = generate_samples(model, tokenizer, problems, cfg, part, done, rank, world, on_progress=progress,
                             infilling=is_infilling(config))
    bar.close()
    all_stats = gather_object([stats])
    accelerator.wait_for_everyone()
    result = None
    if accelerator.is_main_process:
        merged = merge_samples(samples_file)
        wanted = {p["task_id"] for p in problems}
        temps = {float(t) for t in cfg.temperatures}
        samples = [s for s in merged if s["task_id"] in wanted and float(s["temperature"]) in temps
                   and int(s["sample_index"]) < cfg.n_samples]
        check_complete(samples, problems, cfg.temperatures, cfg.n_samples)
        seconds = max(s["seconds"] for s in all_stats)
        made, tokens = sum(s["samples"] for s in all_stats), sum(s["tokens"] for s in all_stats)
        info = {"config": {"n_samples": cfg.n_samples, "batch_size": cfg.batch_size, "temperatures": cfg.temperatures,
                           "top_p": cfg.top_p, "max_new_tokens": cfg.max_new_tokens, "seed": cfg.seed,
                           "commit": commit, "dtype": dtype, "strip_prompt": meta["strip_prompt"],
                           "num_processes": world, "stop_strings": meta["stop_strings"],
                           **({"weights": weights} if weights is not None else {})},
                "samples_file": str(samples_file), "samples_generated": made, "samples_reused": len(samples) - made,
                "tokens_generated": tokens, "seconds": round(seconds, 2),
                "tokens_per_s": round(tokens / max(seconds, 1e-9), 1),
                "samples_per_s": round(made / max(seconds, 1e-9), 3)}
        result = (samples, info)
    accelerator.end_training()
    return result

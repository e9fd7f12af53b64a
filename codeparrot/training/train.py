"""The training loop: `train(cfg)` reads top to bottom as the recipe; helpers that set things up sit below it.

    accelerate launch scripts/train.py --config configs/train/codeparrot-small.yaml [--key value ...]

Distribution and mixed precision come from Accelerate (its config file / launcher flags, or `mixed_precision`).
Every process reads its own part of the data (the datasets shard by rank and DataLoader worker), so the loader
is deliberately NOT passed through `accelerator.prepare`. Gradients are synchronized only on the last
micro-step of each optimizer step (`accelerator.accumulate`), and nothing leaves the device between logging
steps: the loss is summed on device and reduced once per `log_steps`.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import torch
from accelerate import Accelerator, PartialState
from accelerate.utils import ProjectConfiguration, TorchDynamoPlugin, parse_flag_from_env, set_seed
from tqdm.auto import tqdm

from codeparrot.atomic_io import atomic_dir, ensure_writable_dir
from codeparrot.config import to_dict
from codeparrot.errors import CodeParrotError
from codeparrot.repository.model import check_model_tokenizer, load_pretrained_model, save_model_folder
from codeparrot.repository.pusher import CheckpointPusher
from codeparrot.repository.refs import open_repository, resolve_model_dir
from codeparrot.tokenizer import load_tokenizer
from codeparrot.training.causal_attention import CAUSAL_SDPA, register_causal_attention
from codeparrot.training.checkpointing import (
    TrainerState,
    full_state_dict,
    list_checkpoints,
    read_data_position,
    read_state,
    resolve_resume,
    restore_training_state,
    save_checkpoint,
)
from codeparrot.training.config import TrainConfig
from codeparrot.training.datasets.loader import build_dataloader, build_dataset
from codeparrot.training.launch_checks import check_gpu_visible, check_one_job, check_sharding
from codeparrot.training.loss import forward_loss, fused_head_weight
from codeparrot.training.mfu import mfu, model_flops_per_token, peak_flops
from codeparrot.training.nonfinite import NonFiniteGuard, check_finite_weights
from codeparrot.training.optim import build_optimizer, build_scheduler
from codeparrot.training.regional_compile import compile_blocks
from codeparrot.training.rank_logs import open_rank_log
from codeparrot.training.reporting import (
    MFU_CONVENTION,
    MetricsFile,
    ThroughputWindows,
    configure_wandb_env,
    console_line,
    memory_gib,
    redact,
    start_trackers,
)
from codeparrot.training.sharding import enable_fsdp_on_cpu, reduce_gradients_in_fp32, report_sharding
from codeparrot.training.validation import EvalResult, evaluate
from codeparrot.training.watchdog import stops_watchdogs, training_watchdog


@dataclass
class TrainResult:
    run_dir: Path
    step: int
    tokens_seen: int
    final_eval: EvalResult | None = None
    last_checkpoint: Path | None = None
    push_errors: list[str] = field(default_factory=list)


@stops_watchdogs  # a stall watchdog never outlives its run
def train(cfg: TrainConfig, resume: str | None = None, inspect_batches: int = 0,
          profile_steps: tuple[int, int] | None = None) -> TrainResult | None:
    """Run (or resume) the training described by `cfg`. `resume`: None, "auto" or a step-N folder.

    Everything that can be wrong with the inputs is checked before the first forward pass."""

    # ---- 1. inputs, checked before any compute ----
    state = PartialState(cpu=parse_flag_from_env("ACCELERATE_USE_CPU"))  # as Accelerator() would read it
    check_one_job(state.num_processes, state.distributed_type)  # never N independent trainings in one folder
    check_gpu_visible(cfg.mixed_precision)  # bf16/fp16 asked for, a GPU here that torch cannot use: not on the CPU
    world, rank, main = state.num_processes, state.process_index, state.is_main_process
    accum = cfg.accumulation_steps(world)  # one-line error when the budget does not divide
    run_dir = cfg.run_dir()
    checkpoint = resolve_resume(resume, run_dir, report=lambda text: print(text, file=sys.stderr) if main else None)
    if checkpoint is not None and read_state(checkpoint).world_size != world:
        raise CodeParrotError(f"{checkpoint} was written by {read_state(checkpoint).world_size} processes; resume it "
                              f"with that many, not {world} (each process has its own data position)")
    if checkpoint is not None and read_state(checkpoint).step >= cfg.max_steps and (run_dir / "final").is_dir():
        if main:
            print(f"run {cfg.run_name} is already finished: {checkpoint.name} reached max_steps {cfg.max_steps}; "
                  f"its final model is in {run_dir / 'final'} (raise --max_steps to train further)")
        done = read_state(checkpoint)
        return TrainResult(run_dir, done.step, done.tokens_seen, last_checkpoint=checkpoint)
    watchdog = training_watchdog(cfg.stall_minutes, run_dir, rank, accum, cfg.data.train)  # training/watchdog.py
    with state.local_main_process_first():  # materialize a repository revision once per node
        tokenizer, model_dir = load_tokenizer_checked(cfg)
    if main and checkpoint is None and not inspect_batches:
        for line in model_source_lines(cfg):
            print(line, file=sys.stderr if line.startswith("warning") else sys.stdout)
    train_ds, valid_ds = build_datasets(cfg, tokenizer, rank, world)
    if inspect_batches:
        if main:
            print_batches(train_ds, tokenizer, inspect_batches, cfg.batch.micro_batch_size)
        return None

    if main:
        ensure_writable_dir(run_dir)

    # ---- 2. accelerator, model, optimizer, schedule ----
    configure_wandb_env()
    fast = FastPath.resolve(cfg, state.device)  # compile / compiled loss: on for CUDA unless the config says
    if fast.cuda:
        configure_cuda_allocator()  # before the first CUDA allocation
    accelerator = Accelerator(
        gradient_accumulation_steps=accum, mixed_precision=cfg.mixed_precision,
        project_config=ProjectConfiguration(project_dir=str(run_dir), logging_dir=str(run_dir / "tensorboard")),
        step_scheduler_with_optimizer=False,  # we step it once per optimizer step, whatever the process count
        dynamo_plugin=fast.dynamo_plugin())
    enable_fsdp_on_cpu(accelerator)  # CPU processes: Accelerate's FSDP2 over gloo (training/sharding.py)
    reduce_gradients_in_fp32(accelerator)  # FSDP + bf16: reduce-scatter in fp32, as DDP does
    check_sharding(accelerator.distributed_type)  # FSDP/DeepSpeed asked for by the launcher and not running
    open_rank_log(run_dir, rank)  # <run>/logs/rank-N.log: every process's warnings and errors
    device = accelerator.device
    set_seed(cfg.seed + rank)  # dropout differs per process; data order is seeded inside the datasets
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    model = load_model(cfg, model_dir)
    if fast.compile_model and fast.compile_regions:
        compile_blocks(model)  # in place, before DDP/FSDP wrap it (they then wrap a plain GPT2LMHeadModel)
    optimizer = build_optimizer(model, cfg.optim, device)
    scheduler = build_scheduler(optimizer, cfg.max_steps, cfg.schedule)
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    report_sharding(accelerator, model)  # FSDP asked for: the parameters really are sharded
    train_loader = make_loader(cfg, train_ds, cfg.batch.micro_batch_size, device)
    head = fused_head_weight(accelerator, model, compiled=fast.compile_loss) if cfg.fused_loss else None

    step, tokens_seen = 0, 0
    tokens_per_step = cfg.tokens_per_step(world)
    metrics = MetricsFile(run_dir, enabled=main)
    throughput = ThroughputWindows()  # the first log window is warm-up (compile, loader start): not in the summary
    if checkpoint is not None:  # the next batch is the first one the checkpointed run had not consumed
        train_loader.load_state_dict(read_data_position(checkpoint, rank))
    train_iter = iter(train_loader)  # before restoring the RNG: starting loader workers draws a seed from it
    if checkpoint is not None:
        trainer_state = restore_training_state(accelerator, checkpoint)
        step, tokens_seen = trainer_state.step, trainer_state.tokens_seen
        metrics.truncate_after(step)
        accelerator.print(f"resumed from {checkpoint}: step {step}, {tokens_seen:,} tokens seen, "
                          f"lr {scheduler.get_last_lr()[0]:.3e}")
    elif resume == "auto":
        accelerator.print(f"--resume auto: no checkpoint in {run_dir / 'checkpoints'} yet, starting from step 0")
    config_dict = redact(to_dict(cfg))
    start_trackers(accelerator, cfg.logging.trackers, cfg.logging.project, config_dict, run_dir, cfg.run_name)
    pusher = make_pusher(cfg) if main else None
    guard = NonFiniteGuard(accelerator, cfg.max_bad_steps, rank, accum, cfg.data.train, train_loader, metrics,
                           optimizer)

    flops_per_token = model_flops_per_token(accelerator.unwrap_model(model), cfg.data.seq_length)
    compute_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(accelerator.mixed_precision, torch.float32)
    peak, peak_source = peak_flops(device, compute_dtype)
    loss_kind = (f"fused LM head + cross-entropy ({'compiled' if head.compiled else 'eager'} softmax)"
                 if head is not None else "the model's own (Hugging Face)")
    accelerator.print(f"{cfg.budget_summary(world)}\nloss: {loss_kind}\n{fast.describe(cfg)}\n"
                      f"MFU: {flops_per_token / 1e6:.1f} MFLOP/token ({MFU_CONVENTION}), "
                      f"peak {'unknown' if peak is None else f'{peak / 1e12:.3f} TFLOP/s'} per device ({peak_source})")

    # ---- 3. the loop ----
    result = TrainResult(run_dir, step, tokens_seen)
    watchdog.beat(step)  # the set-up was progress too; the line names the step it waits for (a resumed one)
    model.train()
    loss_sum = torch.zeros((), device=device)  # sum of micro-batch mean losses since the last log line
    micro_steps, grad_norm = 0, None
    clock, clock_steps = time.perf_counter(), 0
    deadline = None if cfg.max_minutes is None else time.perf_counter() + 60 * cfg.max_minutes
    stop = False  # set at a log step when max_minutes has run out (agreed on by all processes)
    profiler = None
    # The bar only on a terminal: in a log file its redraws would share lines with the log lines, which
    # already say the step, loss and speed every `log_every` steps.
    bar = tqdm(total=cfg.max_steps, initial=step, unit="step", dynamic_ncols=True,
               disable=not (main and cfg.logging.progress_bar and sys.stderr.isatty()))
    while step < cfg.max_steps:
        if profile_steps and step + 1 == profile_steps[0]:
            profiler = start_profiler(run_dir, device)
        step_loss = torch.zeros((), device=device)  # this step's micro-batch mean losses, summed
        for _ in range(accum):
            batch = next(train_iter).to(device, non_blocking=True)  # [micro_batch, seq_length]
            with accelerator.accumulate(model):  # no gradient all-reduce except on the last micro-step
                loss = forward_loss(model, head, batch)  # mean over the B·(T-1) predicted tokens
                accelerator.backward(loss)  # divides by `accum`: the step's gradient is the token mean
            step_loss += loss.detach()
        assert accelerator.sync_gradients, "the last micro-step of an optimizer step must synchronize gradients"
        grad_norm = accelerator.clip_grad_norm_(model.parameters(), cfg.optim.max_grad_norm or math.inf)
        lr = scheduler.get_last_lr()[0]  # the rate this step uses (a Python float: no device sync)
        keep = guard.check(step + 1, grad_norm, step_loss)  # a non-finite step is skipped (training/nonfinite.py)
        if keep is not False:  # True, or (fused AdamW) a device flag the kernel itself skips on: no host sync
            optimizer.step()
            loss_sum += step_loss if keep is True else torch.where(keep, step_loss, torch.zeros_like(step_loss))
            micro_steps += accum  # device mode: the skipped ones are taken off at the log step (guard.flush)
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        step, tokens_seen, clock_steps = step + 1, tokens_seen + tokens_per_step, clock_steps + 1
        watchdog.beat(step)
        bar.update(1)
        if profiler is not None and step == profile_steps[1]:
            profiler.stop()
            profiler = None

        if step % cfg.logging.log_steps == 0 or step == cfg.max_steps:
            micro_steps -= accum * guard.flush()  # device mode: the window's skipped steps, read now
            loss_mean = accelerator.reduce(loss_sum / micro_steps, reduction="mean").item()  # one sync per log
            elapsed = time.perf_counter() - clock
            tokens_per_s = clock_steps * tokens_per_step / elapsed
            entry = throughput.add({
                "step": step, "tokens_seen": tokens_seen, "loss": loss_mean, "lr": lr, "grad_norm": float(grad_norm),
                "ms_per_step": 1000 * elapsed / clock_steps, "tokens_per_s": tokens_per_s,
                "mfu": mfu(tokens_per_s, flops_per_token, peak, world), "memory_gib": memory_gib(device),
                "skipped_steps": guard.skipped})
            log(accelerator, metrics, entry)
            if main:
                bar.write(console_line(entry, cfg.max_steps))
                bar.set_postfix(loss=f"{loss_mean:.3f}", tok_s=f"{tokens_per_s:,.0f}")
            loss_sum.zero_()
            micro_steps = 0
            clock, clock_steps = time.perf_counter(), 0
            if deadline is not None:  # every process must stop at the same step: reduce the decision
                late = torch.tensor([float(time.perf_counter() > deadline)], device=device)
                stop = bool(accelerator.reduce(late, reduction="sum").item() > 0)
                if stop and main:
                    bar.write(f"max_minutes {cfg.max_minutes} reached: stopping at step {step}")

        is_last = step == cfg.max_steps or stop
        if valid_ds is not None and (is_last or (cfg.eval.eval_steps and step % cfg.eval.eval_steps == 0)):
            result.final_eval = run_eval(cfg, model, head, valid_ds, accelerator, device)
            ev = result.final_eval
            log(accelerator, metrics, {"step": step, "tokens_seen": tokens_seen, **ev.metrics()})
            if main:
                bar.write(f"eval step {step}: val_loss {ev.loss:.4f} | perplexity {ev.perplexity:.2f} | "
                          f"{ev.describe()}")
            clock, clock_steps = time.perf_counter(), 0
            watchdog.beat(step)
        if is_last or (cfg.checkpoint.save_steps and step % cfg.checkpoint.save_steps == 0):
            guard.flush()  # device mode: a run of bad steps stops here at the latest
            check_finite_weights(accelerator, model, step)  # never a checkpoint, push or final model with NaN/inf
            result.last_checkpoint = save_checkpoint(
                accelerator, model, tokenizer, run_dir, TrainerState(step, tokens_seen, world, cfg.run_name),
                train_loader.state_dict(), config_dict, cfg.checkpoint.keep_last)
            if pusher is not None:
                pusher.push(result.last_checkpoint, f"step {step}", include=None if
                            cfg.checkpoint.push_training_state else model_files(result.last_checkpoint))
            clock, clock_steps = time.perf_counter(), 0
            watchdog.beat(step)
        if stop:
            break
    bar.close()

    # ---- 4. wrap up ----
    if profiler is not None:
        profiler.stop()
    if result.last_checkpoint is None and list_checkpoints(run_dir):
        result.last_checkpoint = list_checkpoints(run_dir)[-1][1]  # resumed a finished run: nothing to do
    if result.last_checkpoint is not None and result.last_checkpoint.name == f"step-{step}":
        save_final_model(accelerator, model, tokenizer, run_dir / "final")
    watchdog.stop()  # waiting for a push (its own timeouts) is not a stall
    if pusher is not None:
        result.push_errors = pusher.wait()
        for error in result.push_errors:
            warnings.warn(error)
    accelerator.wait_for_everyone()
    accelerator.end_training()
    result.step, result.tokens_seen = step, tokens_seen
    if main and throughput.windows:
        print(throughput.write(run_dir, peak, peak_source))  # median tokens/s and MFU after the warm-up window
    if main and (run_dir / "final").is_dir():
        pushed = f"; pushed to {cfg.model} branch {cfg.run_name}, commit {pusher.commits[-1][:12]}" if (
            pusher is not None and pusher.commits) else ""
        print(f"final model (step {step}): {run_dir / 'final'}{pushed}")
    return result


# ---------------------------------------------------------------------------------------------------------
# Set-up helpers
# ---------------------------------------------------------------------------------------------------------
def load_tokenizer_checked(cfg: TrainConfig):
    """(tokenizer, model folder) with the model/tokenizer/sequence-length consistency checked from config.json,
    before any weights are loaded."""
    if not cfg.model:
        raise CodeParrotError("model is not set: give the model repository (--model PATH_OR_HUB_ID)")
    model_dir = resolve_model_dir(cfg.model, cfg.revision)
    config_file = model_dir / "config.json"
    if not config_file.is_file():
        raise CodeParrotError(f"{cfg.model}@{cfg.revision} holds no model (no config.json)")
    model_cfg = json.loads(config_file.read_text(encoding="utf-8"))
    tokenizer = load_tokenizer(cfg.data.tokenizer or str(model_dir))
    check_model_tokenizer(model_cfg, tokenizer, str(cfg.data.tokenizer or model_dir), seq_length=cfg.data.seq_length)
    return tokenizer, model_dir


def model_source_lines(cfg: TrainConfig) -> list[str]:
    """Where the starting weights come from: the repository, revision and commit (for a repository), plus a
    warning when the revision's newest commit is a promotion, i.e. already-trained weights, not an initial
    model. Best effort: a repository that cannot be listed (offline Hub) only gets the first line."""
    line = f"starting weights: {cfg.model}" + (f" @ {cfg.revision}" if cfg.revision else " (a model folder)")
    if not cfg.revision:
        return [line]
    try:
        repo = open_repository(cfg.model)
        commit = repo.resolve_revision(cfg.revision)
        tip = next((c for c in repo.list_commits(cfg.revision)), None) if cfg.revision != commit else None
    except Exception:  # noqa: BLE001 - a plain folder, an offline Hub: nothing more to say
        return [line]
    lines = [f"{line} (commit {commit[:12]}{f', {tip.message!r}' if tip is not None else ''})"]
    if tip is not None and tip.message.startswith("promote "):
        lines.append(f"warning: {cfg.model}@{cfg.revision} holds a promoted, already-trained model ({tip.message}); "
                     "this run continues from those weights. For a fresh run start from the initial model "
                     "(--revision <commit of 'initial model'>, see `scripts/checkpoints.py log`)")
    return lines


def build_datasets(cfg: TrainConfig, tokenizer, rank: int, world: int):
    """(train dataset, validation dataset or None) for this process: its own shard of each."""

    d = cfg.data
    if not d.train:
        raise CodeParrotError("data.train is not set: give the training data (pretokenized folder or JSONL shards)")
    common = dict(rank=rank, world_size=world, seed=cfg.seed, num_of_sequences=d.num_of_sequences,
                  chars_per_token=d.chars_per_token, text_column=d.text_column)
    train_ds = build_dataset(d.train, tokenizer, d.seq_length, infinite=True, shuffle=True, split="train",
                             shuffle_buffer=d.shuffle_buffer, sequence_shuffle_buffer=d.sequence_shuffle_buffer,
                             **common)
    valid_ds = None
    if d.valid:
        valid_ds = build_dataset(d.valid, tokenizer, d.seq_length, infinite=False, shuffle=False, split="validation",
                                 **common)
    return train_ds, valid_ds


def make_loader(cfg: TrainConfig, dataset, batch_size: int, device: torch.device):

    return build_dataloader(dataset, batch_size=batch_size, num_workers=cfg.data.num_workers,
                            pin_memory=device.type == "cuda")


@dataclass
class FastPath:
    """What this run compiles, resolved from the config's nulls (null = on for CUDA, off elsewhere)."""

    cuda: bool
    compile_model: bool
    compile_regions: bool
    compile_loss: bool

    @classmethod
    def resolve(cls, cfg: TrainConfig, device: torch.device) -> "FastPath":
        cuda = device.type == "cuda"
        compile_model = cuda if cfg.compile is None else cfg.compile
        return cls(cuda, compile_model, cfg.compile_regions, cuda if cfg.compile_loss is None else cfg.compile_loss)

    def dynamo_plugin(self) -> TorchDynamoPlugin | None:
        """Accelerate's compile settings for whole-model compilation; None leaves the decision to the launcher
        (`--dynamo_backend`). Per-block compilation is done in place by `train()` before `accelerator.prepare`
        (regional_compile.py)."""
        if not self.compile_model or self.compile_regions:
            return None
        return TorchDynamoPlugin(backend="inductor")

    def describe(self, cfg: TrainConfig) -> str:
        compiled = ("per transformer block" if self.compile_regions else "whole model") if self.compile_model else "off"
        return f"attention: {cfg.attn_implementation}; torch.compile: {compiled}"


def configure_cuda_allocator() -> None:
    """Expandable segments: large, changing allocations (the fused loss's chunks, the last shorter chunk,
    evaluation batches) reuse memory instead of fragmenting it into OOMs on a nearly full card. The user's own
    setting wins; torch >= 2.9 reads PYTORCH_ALLOC_CONF (the CUDA-named variable still works there)."""
    if "PYTORCH_ALLOC_CONF" not in os.environ and "PYTORCH_CUDA_ALLOC_CONF" not in os.environ:
        os.environ["PYTORCH_CUDA_ALLOC_CONF" if torch.__version__ < "2.9" else "PYTORCH_ALLOC_CONF"] = (
            "expandable_segments:True")


def load_model(cfg: TrainConfig, model_dir: Path):
    """The fp32 master model with the configured attention kernel, loss type and gradient checkpointing."""

    if cfg.attn_implementation == CAUSAL_SDPA:
        register_causal_attention()  # whole unpadded sequences, no cache: SDPA is_causal=True, no mask built
    model = load_pretrained_model(str(model_dir), attn_implementation=cfg.attn_implementation, dtype=torch.float32)
    # A fixed loss type: otherwise transformers resolves it on every forward (a graph break under torch.compile).
    model.loss_type = model.config.loss_type = "ForCausalLM"
    if cfg.gradient_checkpointing:
        kwargs = {"use_reentrant": False}  # the non-reentrant variant works with DDP and torch.compile
        if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.x name
            model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    return model


def run_eval(cfg: TrainConfig, model, head, valid_ds, accelerator, device) -> EvalResult:
    """A fresh pass over this process's validation shard. Run inside a forked RNG so that evaluating (its
    loader workers draw a seed) never changes the training run's random stream: same weights with or without
    evaluation, and exact resumes whatever eval_steps is."""
    batch_size = cfg.eval.micro_batch_size or cfg.batch.micro_batch_size
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        loader = make_loader(cfg, valid_ds, batch_size, device)
        return evaluate(model, loader, accelerator, max_steps=cfg.eval.max_eval_steps,
                        dummy_shape=(batch_size, cfg.data.seq_length), head_weight=head)


def log(accelerator, metrics: MetricsFile, entry: dict) -> None:
    """One logged dict: metrics.jsonl (main process) and every started tracker."""
    metrics.append(entry)
    tracked = {k: v for k, v in entry.items() if k not in ("step", "warmup") and v is not None}
    accelerator.log(tracked, step=entry["step"])


def make_pusher(cfg: TrainConfig):
    if not cfg.checkpoint.push:
        return None

    return CheckpointPusher(cfg.model, cfg.run_name, from_revision=cfg.revision)  # the branch follows its parent


def save_final_model(accelerator, model, tokenizer, folder: Path) -> None:
    """<run dir>/final: the last weights, config and tokenizer, a stable path that pruning never removes."""

    weights = full_state_dict(accelerator, model)  # collective under FSDP/DeepSpeed
    if accelerator.is_main_process:
        with atomic_dir(folder) as tmp:
            save_model_folder(accelerator.unwrap_model(model), tmp, tokenizer, state_dict=weights)
    accelerator.wait_for_everyone()


def model_files(folder: Path) -> list[str]:
    """What a checkpoint push sends without the training state: the top-level files (weights, config,
    tokenizer, train_config.yaml, trainer_state.json), not training_state/."""
    return sorted(p.name for p in folder.iterdir() if p.is_file())


def start_profiler(run_dir: Path, device: torch.device):
    """A torch.profiler trace into the run's TensorBoard folder (open with the PyTorch profiler plugin)."""
    from torch.profiler import ProfilerActivity, profile, tensorboard_trace_handler

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    profiler = profile(activities=activities, record_shapes=True, profile_memory=True,
                       on_trace_ready=tensorboard_trace_handler(str(run_dir / "tensorboard" / "profile")))
    profiler.start()
    return profiler


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

"""The training loop: `train(cfg)` reads top to bottom as the recipe; its helpers sit beside it (`model_io.py`: the
model in and out; `run_data.py`: this process's data and the evaluation pass; `fast_path.py`: what is compiled;
`reporting.py`: logs, metrics, trackers, the profiler).

    accelerate launch scripts/train.py --config configs/train/codeparrot-small.yaml [--key value ...]

Distribution and mixed precision come from Accelerate (its config file / launcher flags, or `mixed_precision`).
Every process reads its own part of the data (the datasets shard by rank and DataLoader worker), so the loader
is deliberately NOT passed through `accelerator.prepare`. Gradients are synchronized only on the last
micro-step of each optimizer step (`accelerator.accumulate`), and nothing leaves the device between logging
steps: the loss is summed on device and reduced once per `log_steps`.
"""

from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from accelerate import Accelerator
from accelerate.utils import ProjectConfiguration, set_seed
from tqdm.auto import tqdm

from codeparrot.atomic_io import ensure_writable_dir
from codeparrot.config import to_dict
from codeparrot.training.checkpointing import (
    TrainerState,
    list_checkpoints,
    read_data_position,
    restore_training_state,
    run_setup,
    save_checkpoint,
)
from codeparrot.training.config import AUTO, TrainConfig
from codeparrot.training.fast_path import FastPath, configure_cuda_allocator
from codeparrot.training.launch_checks import check_launch, check_sharding
from codeparrot.training.loss import fused_head_weight
from codeparrot.training.mfu import mfu, model_flops_per_token, peak_flops
from codeparrot.training.micro_batch import (
    inspect_batch_size,
    provisional_accumulation,
    resolve_micro_batch,
    reuse_on_resume,
)
from codeparrot.training.micro_step import MicroStep, resolve_cuda_graphs
from codeparrot.training.model_io import (
    check_push_target_of,
    finishes_pushes,
    load_model,
    load_tokenizer_checked,
    make_pusher,
    model_files,
    model_source_lines,
    push_outcome,
    report_push_errors,
    save_final_model,
)
from codeparrot.training.nonfinite import NonFiniteGuard, check_finite_weights
from codeparrot.training.optim import apply_on_resume, build_optimizer, build_scheduler
from codeparrot.training.rank_logs import open_rank_log
from codeparrot.training.regional_compile import compile_blocks
from codeparrot.training.reporting import (
    MFU_CONVENTION,
    MetricsFile,
    ThroughputWindows,
    configure_wandb_env,
    console_line,
    log,
    memory_gib,
    redact,
    start_profiler,
    start_trackers,
)
from codeparrot.training.resume_checks import check_resume_setup, choose_resume, saved_setup
from codeparrot.training.run_data import build_datasets, make_loader, print_batches, run_eval
from codeparrot.training.sharding import enable_fsdp_on_cpu, reduce_gradients_in_fp32, report_sharding
from codeparrot.training.stop_signal import StopSignal, restores_sigterm
from codeparrot.training.validation import EvalResult
from codeparrot.training.watchdog import stops_watchdogs, training_watchdog


@dataclass
class TrainResult:
    run_dir: Path
    step: int
    tokens_seen: int
    final_eval: EvalResult | None = None
    last_checkpoint: Path | None = None
    push_errors: list[str] = field(default_factory=list)
    stopped_by_signal: bool = False  # SIGTERM stopped it after `step`, checkpoint saved, not finished


@finishes_pushes  # a failed run still pushes what it had queued (after the two below: not a stall, SIGTERM ends it)
@stops_watchdogs  # a stall watchdog never outlives its run
@restores_sigterm  # nor its SIGTERM handler
def train(cfg: TrainConfig, resume: str | None = None, inspect_batches: int = 0,
          profile_steps: tuple[int, int] | None = None) -> TrainResult | None:
    """Run (or resume) the training described by `cfg`. `resume`: None, "auto" or a step-N folder.

    Everything that can be wrong with the inputs is checked before the first forward pass."""

    # ---- 1. inputs, checked before any compute ----
    state = check_launch(cfg.mixed_precision)  # one job, not N in one folder; bf16 on a GPU torch cannot see
    world, rank, main = state.num_processes, state.process_index, state.is_main_process
    cfg.accumulation_steps(world)  # one-line error when the budget does not divide (None for auto: measured below)
    run_dir = cfg.run_dir()
    # the main process picks the checkpoint, every process checks it can use it (training/resume_checks.py)
    start = choose_resume(resume, run_dir, world=world, main=main, max_steps=cfg.max_steps,
                          report=lambda text: print(text, file=sys.stderr))
    checkpoint = start.checkpoint
    if start.finished:
        if main:
            print(f"run {cfg.run_name} is already finished: {checkpoint.name} reached max_steps {cfg.max_steps}; "
                  f"its final model is in {run_dir / 'final'} (raise --max_steps to train further)")
        return TrainResult(run_dir, start.state.step, start.state.tokens_seen, last_checkpoint=checkpoint)
    cfg, reused = reuse_on_resume(cfg, checkpoint, world)  # micro_batch_size auto: the checkpoint's, never re-measured
    accum = provisional_accumulation(cfg, world)  # the real one, except for auto before it is measured (below)
    watchdog = training_watchdog(cfg.stall_minutes, run_dir, rank, accum, cfg.data.train)  # training/watchdog.py
    with state.local_main_process_first():  # materialize a repository revision once per node
        tokenizer, model_dir = load_tokenizer_checked(cfg)
    if main and checkpoint is None and not inspect_batches:
        for line in model_source_lines(cfg):
            print(line, file=sys.stderr if line.startswith("warning") else sys.stdout)
    train_ds, valid_ds = build_datasets(cfg, tokenizer, rank, world)
    if inspect_batches:
        if main:
            print_batches(train_ds, tokenizer, inspect_batches, inspect_batch_size(cfg, world))
        return None

    if main:
        check_push_target_of(cfg)  # a repository the pushes cannot write: now, not after the first checkpoint
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
    if checkpoint is not None:  # saved under another sharding, or fp16 from a checkpoint without a loss scaler
        for change in check_resume_setup(checkpoint, saved_setup(checkpoint, start.state), run_setup(accelerator)):
            accelerator.print(f"resume: {change}")
    cuda_graphs = resolve_cuda_graphs(cfg, accelerator)  # `cuda_graphs: true` where it cannot run: one line, now
    open_rank_log(run_dir, rank)  # <run>/logs/rank-N.log: every process's warnings and errors
    device = accelerator.device
    if cfg.batch.micro_batch_size == AUTO:  # measured now, before set_seed: the probe's dropout draws random numbers
        cfg, line = resolve_micro_batch(cfg, accelerator, model_dir, run_dir)  # training/micro_batch.py
        accum = accelerator.gradient_accumulation_steps = cfg.accumulation_steps(world)
        watchdog.stop()  # started with a provisional accumulation: a stall line names the real micro-batches
        watchdog = training_watchdog(cfg.stall_minutes, run_dir, rank, accum, cfg.data.train)
        accelerator.print(line)
    elif reused:
        accelerator.print(reused)
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
    run_micro_step = MicroStep(accelerator, model, head, graphs=cuda_graphs)  # eager, or a CUDA graph's replays

    step, tokens_seen = 0, 0
    tokens_per_step = cfg.tokens_per_step(world)
    metrics = MetricsFile(run_dir, enabled=main)
    throughput = ThroughputWindows()  # the first log window is warm-up (compile, loader start): not in the summary
    if checkpoint is not None:  # the next batch is the first one the checkpointed run had not consumed
        train_loader.load_state_dict(read_data_position(checkpoint, rank, cfg.batch.micro_batch_size))
    train_iter = iter(train_loader)  # before restoring the RNG: starting loader workers draws a seed from it
    if checkpoint is not None:
        trainer_state = restore_training_state(accelerator, checkpoint)
        step, tokens_seen = trainer_state.step, trainer_state.tokens_seen
        for change in apply_on_resume(optimizer, scheduler, cfg.optim):  # the config's, not the checkpoint's
            accelerator.print(f"resume: {change}")
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
    if checkpoint is not None:
        guard.load_state_dict(trainer_state.nonfinite)  # a run of bad steps goes on counting across the resume

    flops_per_token = model_flops_per_token(accelerator.unwrap_model(model), cfg.data.seq_length)
    compute_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(accelerator.mixed_precision, torch.float32)
    peak, peak_source = peak_flops(device, compute_dtype)
    loss_kind = (f"fused LM head + cross-entropy ({'compiled' if head.compiled else 'eager'} softmax)"
                 if head is not None else "the model's own (Hugging Face)")
    accelerator.print(f"{cfg.budget_summary(world)}\nloss: {loss_kind}\n{fast.describe(cfg)}; "
                      f"{run_micro_step.describe()}\nMFU: {flops_per_token / 1e6:.1f} MFLOP/token ({MFU_CONVENTION}), "
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
    # SIGTERM (a cluster's preemption or time limit): stop after an agreed step with a checkpoint; stop_signal.py
    stop_signal = StopSignal(device, distributed=world > 1).install()
    preempted = False
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
                step_loss += run_micro_step(batch)  # forward, loss, backward (÷ accum); training/micro_step.py
        assert accelerator.sync_gradients, "the last micro-step of an optimizer step must synchronize gradients"
        grad_norm = accelerator.clip_grad_norm_(model.parameters(), cfg.optim.max_grad_norm or math.inf)
        lr = scheduler.get_last_lr()[0]  # the rate this step uses (a Python float: no device sync)
        keep = guard.check(step + 1, grad_norm, step_loss)  # a non-finite step is skipped (training/nonfinite.py)
        if keep is not False:  # True, or (fused AdamW) a device flag the kernel itself skips on: no host sync
            optimizer.step()
            loss_sum += step_loss if keep is True else torch.where(keep, step_loss, torch.zeros_like(step_loss))
            micro_steps += accum  # device mode: the skipped ones are taken off at the log step (guard.flush)
        scheduler.step()
        optimizer.zero_grad(set_to_none=not run_micro_step.keeps_gradients)  # a CUDA graph adds into the same memory
        step, tokens_seen, clock_steps = step + 1, tokens_seen + tokens_per_step, clock_steps + 1
        watchdog.beat(step)
        preempted = stop_signal.agreed()  # the same answer on every process (one step late: no device wait)
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

        is_last = step == cfg.max_steps or stop or preempted
        evaluate_now = is_last or (cfg.eval.eval_steps and step % cfg.eval.eval_steps == 0)
        if valid_ds is not None and evaluate_now and not preempted:  # preempted: the grace period is for saving
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
                accelerator, model, tokenizer, run_dir,
                TrainerState(step, tokens_seen, world, cfg.run_name, nonfinite=guard.state_dict()),
                train_loader.state_dict(), config_dict, cfg.checkpoint.keep_last)
            if pusher is not None and not preempted:
                pusher.push(result.last_checkpoint, f"step {step}", include=None if
                            cfg.checkpoint.push_training_state else model_files(result.last_checkpoint))
            if preempted and main:  # now: the cluster's SIGKILL may come before the end of this function
                print(f"stopped by SIGTERM after step {step}: saved {result.last_checkpoint}; `--resume auto` "
                      f"continues from it", file=sys.stderr, flush=True)
            clock, clock_steps = time.perf_counter(), 0
            watchdog.beat(step)
        if stop or preempted:
            break
    bar.close()

    # ---- 4. wrap up ----
    if profiler is not None:
        profiler.stop()
    if result.last_checkpoint is None and list_checkpoints(run_dir):
        result.last_checkpoint = list_checkpoints(run_dir)[-1][1]  # resumed a finished run: nothing to do
    if not preempted and result.last_checkpoint is not None and result.last_checkpoint.name == f"step-{step}":
        save_final_model(accelerator, model, tokenizer, run_dir / "final")
    watchdog.stop()  # waiting for a push (its own timeouts) is not a stall
    if pusher is not None:
        if preempted and pusher.pending():
            print(f"finishing the pushes queued before the stop ({', '.join(pusher.pending())}); a SIGKILL cuts them, "
                  "their checkpoints stay on disk", file=sys.stderr, flush=True)
        result.push_errors = pusher.wait()
        report_push_errors(result.push_errors)
        if pusher.superseded:  # each was logged when dropped; the run's end says it once more, where users look
            print(f"not pushed, newer checkpoints went first (the repository was slower than the saves): "
                  f"{', '.join(pusher.superseded)}; their checkpoints stay local while keep_last keeps them",
                  file=sys.stderr)
    accelerator.wait_for_everyone()
    accelerator.end_training()
    result.step, result.tokens_seen, result.stopped_by_signal = step, tokens_seen, preempted
    if main and throughput.windows:
        print(throughput.write(run_dir, peak, peak_source))  # median tokens/s and MFU after the warm-up window
    if main and not preempted and (run_dir / "final").is_dir():
        print(f"final model (step {step}): {run_dir / 'final'}{push_outcome(pusher, result.push_errors)}")
    return result

"""`batch.micro_batch_size: auto`: the largest micro-batch that fits, measured once at the start of a run, the same
on every process, printed, recorded in the run folder, and reused (never measured again) on resume.

What auto may choose: `TrainConfig.auto_candidates` (config.py), the micro-batches that split each process's batch
P = global_batch_size / processes into a multiple of data.num_workers micro-steps, so that every optimizer step
trains on the same sequences whichever candidate wins (its docstring says why).

How "fits" is decided (`memory_test_for`):
- CUDA (`cuda_memory_test`): real training steps (forward, backward, AdamW step) of a throwaway copy of the real
  model at the real sequence length, mixed precision, loss path and gradient checkpointing, with the AdamW
  moments allocated before the first measured step (the steady state of step 2 onwards) and, under DDP, one more
  fp32 parameter-sized buffer for its gradient buckets. A candidate fits when its step raises no out-of-memory
  error and its peak reserved memory stays within CUDA_MEMORY_FRACTION of the device (the rest: the compiled
  kernels' workspaces, NCCL buffers, the allocator's fragmentation over a long run; CUDA_GRAPH_MEMORY_FRACTION
  with `cuda_graphs: true`, whose graph keeps a micro-step's memory apart). Eager, not compiled (a
  compile per candidate would cost minutes; inductor usually saves fewer activations than eager mode), and under
  FSDP the copy is unsharded: the measure errs on the safe side. An OOM is caught, the step's memory freed, and
  a smaller candidate tried.
- anything else, i.e. CPU (`ram_memory_test`): there is no out-of-memory error to catch (the kernel's OOM killer
  ends the process), so no large step is tried. One forward pass at 1 and one at 2 sequences measure the bytes
  the model saves for its backward pass (the activations, which grow with the micro-batch); a candidate fits
  when 16 bytes per parameter (fp32 weights, gradients, AdamW's two moments) + the fixed part + 2 × B × the
  per-sequence activations stay within half the RAM available now (MemAvailable, or the cgroup's room when
  lower), shared by this node's processes. Cost: three sequences' forward passes.

Search (`largest_that_fits`): binary search over the candidates, so at most ceil(log2(n + 1)) trials (4 for the 12
candidates of one GPU at 192 sequences with 2 workers); after PROBE_SECONDS no further upward trial starts (the
largest candidate proven to fit wins). The processes agree on the minimum of their choices (every one of them fits
there). Recorded: `<run>/micro_batch.json` (candidates, trials, rule, per-process choices) and, as the resolved
integer, `train_config.yaml` of every checkpoint, which is what a resumed `auto` run takes: the same micro-batch,
so the same data position replay and identical losses.
"""

from __future__ import annotations

import dataclasses
import gc
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch
import yaml
from accelerate.utils import DistributedType

from codeparrot.atomic_io import atomic_write_json
from codeparrot.errors import CodeParrotError
from codeparrot.training.checkpointing import CONFIG_FILE
from codeparrot.training.config import AUTO, TrainConfig
from codeparrot.training.loss import MIXED_PRECISION_DTYPES, FinalNormOutput, FusedHead, forward_loss
from codeparrot.training.model_io import load_model
from codeparrot.training.optim import build_optimizer

PROBE_SECONDS = 120.0  # no upward trial starts after this; the largest candidate proven to fit wins
CUDA_MEMORY_FRACTION = 0.90  # of the device's memory, for the measured peak (reserved) of one training step
# With cuda_graphs the graph's private pool holds one micro-step's activations for the whole run, without the
# expandable segments the rest of the run allocates from, and evaluation cannot reuse that memory: a wider margin.
CUDA_GRAPH_MEMORY_FRACTION = 0.80
RAM_FRACTION = 0.5  # of the available RAM, shared by this node's processes (CPU rule)
BACKWARD_FACTOR = 2  # CPU rule: activations × this covers the backward pass's transient buffers
RECORD_FILE = "micro_batch.json"


@dataclass
class Trial:
    """One candidate tried: did it fit, and what was seen (e.g. '9.12 GiB peak', 'out of memory')."""

    micro_batch_size: int
    fits: bool
    detail: str
    seconds: float = 0.0

    def describe(self) -> str:
        return f"{self.micro_batch_size} {'fits' if self.fits else 'does not fit'} ({self.detail})"


@dataclass
class Search:
    """`largest_that_fits`' result: `chosen` = 0 when not even the smallest candidate fits."""

    chosen: int
    trials: list[Trial] = field(default_factory=list)
    out_of_time: bool = False


@dataclass
class MemoryTest:
    """`fits(b)` for one device, what it measures (`rule`, for the printed line) and `close()` to free it."""

    fits: Callable[[int], Trial]
    rule: str
    close: Callable[[], None] = lambda: None


def largest_that_fits(candidates: list[int], fits: Callable[[int], Trial], max_seconds: float = PROBE_SECONDS,
                      clock: Callable[[], float] = time.monotonic) -> Search:
    """The largest of `candidates` (ascending) for which `fits` says yes, by binary search (fitting is assumed
    monotone: a candidate that fits means every smaller one does). At most ceil(log2(n + 1)) calls; once
    `max_seconds` have passed and something is known to fit, no further (larger) trial starts."""
    lo, hi = -1, len(candidates)  # candidates[lo] fits (-1: none known yet); candidates[hi] does not (n: none known)
    search, start = Search(0), clock()
    while hi - lo > 1:
        if lo >= 0 and clock() - start > max_seconds:
            search.out_of_time = True
            break
        mid = (lo + hi + 1) // 2  # the upper middle: the usual answer is a large candidate
        began = clock()
        trial = fits(candidates[mid])
        trial.seconds = round(clock() - began, 3)
        search.trials.append(trial)
        lo, hi = (mid, hi) if trial.fits else (lo, mid)
    search.chosen = candidates[lo] if lo >= 0 else 0
    return search


# ---- measuring on a device ----
def _size(n: float) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def is_out_of_memory(err: BaseException) -> bool:
    """An allocation failure: torch's OutOfMemoryError, or cuBLAS failing to allocate its workspace."""
    return isinstance(err, torch.OutOfMemoryError) or (
        isinstance(err, RuntimeError) and ("out of memory" in str(err) or "ALLOC_FAILED" in str(err)))


def free_step(optimizer, head: FusedHead | None, device: torch.device, collect: bool) -> None:
    """Give back what a training step left (its gradients, the final norm's [b, T, D] output the fused loss's hook
    keeps, with `collect` whatever a reference cycle still holds: after an out-of-memory error), so that the next
    try starts from the model and the optimizer's state alone."""
    optimizer.zero_grad(set_to_none=True)
    if head is not None and head.final_norm is not None:
        head.final_norm.value = None
    if collect:  # gc.collect costs ~0.5 s in a big process
        gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


class StepProbe:
    """`fits(b)`: one real training step of `model` on a random batch [b, seq_length]: forward under the
    run's autocast, the run's loss, backward, optimizer step. `memory` = (reset peak, read peak) in bytes; a
    step raising out-of-memory does not fit, nor one whose peak exceeds `limit_bytes`. `held`: tensors the run
    will hold besides the model and optimizer (DDP's gradient buckets), kept alive until `release()`. Works on
    any device (the tests drive it on CPU with a simulated memory reading and a fake OOM); the run uses it on CUDA."""

    def __init__(self, model, optimizer, head, seq_length: int, autocast: Callable, limit_bytes: float,
                 memory: tuple[Callable[[], None], Callable[[], int]], held: tuple[torch.Tensor, ...] = ()):
        self.model, self.optimizer, self.head, self.seq_length = model, optimizer, head, seq_length
        self.autocast, self.limit, (self.reset_peak, self.read_peak) = autocast, limit_bytes, memory
        self.held = held
        self.device = next(model.parameters()).device
        self.vocab_size = model.get_input_embeddings().weight.shape[0]
        self.model.train()  # gradient checkpointing and dropout as in training
        with torch.no_grad():  # the AdamW moments exist from the first measured step on, as from step 2 of a run
            for param in model.parameters():
                param.grad = torch.zeros_like(param)
            optimizer.step()
        self.free()

    def step(self, b: int) -> None:
        generator = torch.Generator(device=self.device).manual_seed(b)  # not the run's random stream
        batch = torch.randint(0, self.vocab_size, (b, self.seq_length), device=self.device, generator=generator)
        with self.autocast():
            loss = forward_loss(self.model, self.head, batch)  # [] mean over b·(seq_length - 1) tokens
        loss.backward()
        self.optimizer.step()

    def free(self, collect: bool = False) -> None:
        free_step(self.optimizer, self.head, self.device, collect)

    def release(self) -> None:
        """Drop the model, optimizer and held tensors (the caller's references are its own business)."""
        self.model = self.optimizer = self.head = None
        self.held = ()
        gc.collect()  # once per run: whatever a cycle holds must not stay on the device next to the real model
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def __call__(self, b: int) -> Trial:
        self.reset_peak()
        try:
            self.step(b)
            error = None
        except (torch.OutOfMemoryError, RuntimeError) as err:
            if not is_out_of_memory(err):
                raise
            error = "out of memory"
        self.free(collect=error is not None)  # outside the except block: the traceback's frames (and their
        # activations) are gone
        if error is not None:
            return Trial(b, False, error)
        peak = self.read_peak()
        return Trial(b, peak <= self.limit, f"{_size(peak)} peak")


def _probe_model(cfg: TrainConfig, accelerator, model_dir: Path):
    """A throwaway copy of the run's model on its device, and the head its loss uses (the fused LM head with the
    run's matmul dtype, or None for the Hugging Face loss where the run uses it: fused_loss false, FSDP1,
    DeepSpeed)."""
    model = load_model(cfg, model_dir).to(accelerator.device)
    head = None
    fsdp1 = accelerator.distributed_type == DistributedType.FSDP and not getattr(accelerator, "is_fsdp2", False)
    if cfg.fused_loss and not fsdp1 and accelerator.distributed_type != DistributedType.DEEPSPEED:
        dtype = MIXED_PRECISION_DTYPES.get(accelerator.mixed_precision, torch.float32)
        head = FusedHead(model.get_output_embeddings().weight, dtype, final_norm=FinalNormOutput(model))
    return model, head


def cuda_memory_test(cfg: TrainConfig, accelerator, model_dir: Path) -> MemoryTest:
    """Real steps on this process's GPU (module docstring)."""
    device = accelerator.device
    model, head = _probe_model(cfg, accelerator, model_dir)
    optimizer = build_optimizer(model, cfg.optim, device)
    held = ()
    if accelerator.distributed_type == DistributedType.MULTI_GPU:  # DDP keeps a second fp32 copy of the gradients
        held = (torch.empty(sum(p.numel() for p in model.parameters()), dtype=torch.float32, device=device),)
    total = torch.cuda.get_device_properties(device).total_memory
    fraction = CUDA_GRAPH_MEMORY_FRACTION if cfg.cuda_graphs else CUDA_MEMORY_FRACTION
    memory = (lambda: torch.cuda.reset_peak_memory_stats(device), lambda: torch.cuda.max_memory_reserved(device))
    probe = StepProbe(model, optimizer, head, cfg.data.seq_length, accelerator.autocast, fraction * total, memory,
                      held)
    rule = (f"real training steps on {device} ({torch.cuda.get_device_name(device)}, eager, "
            f"{accelerator.mixed_precision} autocast{', DDP buckets' if held else ''}), peak within "
            f"{fraction:.0%} of {_size(total)}{' (CUDA graphs: a wider margin)' if cfg.cuda_graphs else ''}")
    return MemoryTest(probe, rule, probe.release)


def available_ram() -> int:
    """Bytes of RAM available now: MemAvailable, or the cgroup's room (limit − usage) when that is lower."""
    available = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            available = next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))
    except (OSError, StopIteration, ValueError):
        pass
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit != "max":
            available = min(available, int(limit) - int(Path("/sys/fs/cgroup/memory.current").read_text()))
    except (OSError, ValueError):
        pass
    return available


def saved_for_backward(model, head, batch: torch.Tensor, autocast: Callable) -> int:
    """Bytes of the tensors one forward pass of `batch` saves for its backward pass, parameters excluded."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    storages: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in params:
            storages[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor), autocast():
        loss = forward_loss(model, head, batch)
    del loss  # the graph, and with it the saved tensors
    return sum(storages.values())


def ram_memory_test(cfg: TrainConfig, accelerator, model_dir: Path) -> MemoryTest:
    """The CPU rule (module docstring): activations measured at 1 and 2 sequences, weights and optimizer state
    counted, against RAM_FRACTION of the available RAM per process on this node."""
    model, head = _probe_model(cfg, accelerator, model_dir)
    model.train()
    vocab = model.get_input_embeddings().weight.shape[0]
    generator = torch.Generator().manual_seed(0)
    one, two = (saved_for_backward(model, head, torch.randint(0, vocab, (b, cfg.data.seq_length), generator=generator)
                                   .to(accelerator.device), accelerator.autocast) for b in (1, 2))
    per_sequence, fixed = max(two - one, 0), max(2 * one - two, 0)
    static = 16 * sum(p.numel() for p in model.parameters())  # fp32 weights, gradients, AdamW exp_avg, exp_avg_sq
    del model, head  # freed by reference counting (no gc.collect: ~0.5 s in a process holding torch)
    processes = int(os.environ.get("LOCAL_WORLD_SIZE") or 1)
    budget = RAM_FRACTION * available_ram() / processes

    def fits(b: int) -> Trial:
        need = static + fixed + BACKWARD_FACTOR * b * per_sequence
        return Trial(b, need <= budget, f"needs ~{_size(need)}")

    rule = (f"estimated on {accelerator.device}: {_size(static)} of weights, gradients and AdamW moments + "
            f"{BACKWARD_FACTOR} × {_size(per_sequence)} of activations per sequence (saved for backward, measured "
            f"at 1 and 2 sequences) within {RAM_FRACTION:.0%} of the available RAM ({_size(budget)}"
            f"{f' for each of {processes} processes on this node' if processes > 1 else ''})")
    return MemoryTest(fits, rule)


def memory_test_for(cfg: TrainConfig, accelerator, model_dir: Path) -> MemoryTest:
    """Real steps on CUDA, the RAM rule elsewhere (tests replace this to simulate a memory budget)."""
    test = cuda_memory_test if accelerator.device.type == "cuda" else ram_memory_test
    return test(cfg, accelerator, model_dir)


# ---- resolving, agreeing, recording, resuming ----
def with_micro_batch(cfg: TrainConfig, micro_batch_size: int, world_size: int) -> TrainConfig:
    """`cfg` resolved for this launch: batch.micro_batch_size set and batch.num_processes the processes launched
    (the value was chosen for them, and is what the checkpoints' train_config.yaml then says); re-validated."""
    batch = dataclasses.replace(cfg.batch, micro_batch_size=micro_batch_size, num_processes=world_size)
    resolved = dataclasses.replace(cfg, batch=batch)
    resolved.validate()
    return resolved


def agree_on_minimum(accelerator, value: int) -> list[int]:
    """Every process's value (a collective: all processes call it); the run uses their minimum."""
    if accelerator.num_processes == 1:
        return [value]
    return [int(v) for v in accelerator.gather(torch.tensor([value], device=accelerator.device)).tolist()]


def resolve_micro_batch(cfg: TrainConfig, accelerator, model_dir: Path, run_dir: Path,
                        max_seconds: float = PROBE_SECONDS) -> tuple[TrainConfig, str]:
    """`cfg` with micro_batch_size auto measured (every process calls this, before set_seed: the probe's dropout
    draws random numbers) and the one line that says what was tried and why; writes `<run>/micro_batch.json`."""
    world = accelerator.num_processes
    candidates = cfg.auto_candidates(world)
    per_process, workers = cfg.batch.global_batch_size // world, max(cfg.data.num_workers, 1)
    test = memory_test_for(cfg, accelerator, model_dir)
    try:
        search = largest_that_fits(candidates, test.fits, max_seconds)
    finally:
        test.close()
    per_rank = agree_on_minimum(accelerator, search.chosen)
    chosen = min(per_rank)
    where = (f"the divisors of the per-process batch {per_process}" if workers == 1 else
             f"the divisors of the per-process batch {per_process} / data.num_workers {workers}")
    tried = ", ".join(t.describe() for t in search.trials)
    if chosen == 0:
        raise CodeParrotError(f"batch.micro_batch_size auto: not even {candidates[0]} sequence(s) of "
                              f"{cfg.data.seq_length} tokens fit ({tried}; {test.rule}): use gradient_checkpointing, "
                              "a shorter data.seq_length or more processes")
    accum = per_process // chosen
    stopped = f"; no larger trial after {max_seconds:g} s" if search.out_of_time else ""
    agreed = f"; processes chose {', '.join(map(str, per_rank))}, all take the minimum" if world > 1 else ""
    line = (f"micro-batch auto: {chosen} (accumulation {accum}), the largest of {', '.join(map(str, candidates))} "
            f"({where}) that fits; tried {tried}{stopped}; {test.rule}{agreed}")
    if accelerator.is_main_process:
        atomic_write_json(Path(run_dir) / RECORD_FILE, {
            "micro_batch_size": chosen, "accumulation_steps": accum, "requested": AUTO, "how": "measured",
            "candidates": candidates, "trials": [dataclasses.asdict(t) for t in search.trials],
            "out_of_time": search.out_of_time, "rule": test.rule, "per_process": per_rank, "processes": world,
            "per_process_batch": per_process, "data_num_workers": cfg.data.num_workers, "line": line,
            "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S")})
    return with_micro_batch(cfg, chosen, world), line


def recorded_micro_batch(checkpoint: Path) -> int:
    """The micro-batch a checkpoint was trained with (its train_config.yaml: the resolved config)."""
    path = Path(checkpoint) / CONFIG_FILE
    try:
        value = yaml.safe_load(path.read_text(encoding="utf-8"))["batch"]["micro_batch_size"]
    except (OSError, yaml.YAMLError, KeyError, TypeError) as err:
        raise CodeParrotError(f"{path}: no batch.micro_batch_size to resume micro_batch_size auto with "
                              f"({type(err).__name__}: {err}); give the integer the run used") from None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise CodeParrotError(f"{path}: batch.micro_batch_size is {value!r}, not a positive integer; give the "
                              "integer the run used")
    return value


def reuse_on_resume(cfg: TrainConfig, checkpoint: Path | None, world_size: int) -> tuple[TrainConfig, str | None]:
    """Resuming with micro_batch_size auto: the checkpoint's micro-batch, not measured again (a new measure could
    pick another value: the loader's replay of the batches since its last snapshot, and the float sums, would
    differ). Returns (cfg, the line to print, or None when there was nothing to reuse)."""
    if cfg.batch.micro_batch_size != AUTO or checkpoint is None:
        return cfg, None
    value = recorded_micro_batch(checkpoint)
    resolved = with_micro_batch(cfg, value, world_size)
    accum = resolved.accumulation_steps(world_size)
    return resolved, (f"micro-batch auto: {value} (accumulation {accum}), as recorded in "
                      f"{Path(checkpoint) / CONFIG_FILE}; not measured again on resume (same micro-batch, same "
                      "data order)")


def provisional_accumulation(cfg: TrainConfig, world_size: int) -> int:
    """Before auto is measured: the accumulation of its largest candidate (the fewest micro-steps it can take),
    for what the stall watchdog reports until the measure is done."""
    if cfg.batch.micro_batch_size != AUTO:
        return cfg.accumulation_steps(world_size)
    return cfg.batch.global_batch_size // world_size // cfg.auto_candidates(world_size)[-1]


def inspect_batch_size(cfg: TrainConfig, world_size: int) -> int:
    """`--inspect-batches` with auto (which measures memory, not needed to look at data): the largest candidate
    up to 8 sequences per batch. The sequences are the same whatever the grouping."""
    if cfg.batch.micro_batch_size != AUTO:
        return cfg.batch.micro_batch_size
    return max(n for n in cfg.auto_candidates(world_size) if n <= 8)


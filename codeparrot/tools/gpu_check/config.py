"""The flags of `scripts/gpu_check.py`, and the shapes each mode measures."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from codeparrot.config import doc
from codeparrot.errors import CodeParrotError

# The default order is the order of importance: a lease that ends early has measured what matters most (the
# training CLI at the recipe's batch, where its time goes, the 1.5B preset, a JAX peer), then the ceilings and
# micro-benchmarks that explain those figures. `device` is first only because it takes no time.
STAGES = ("device", "headline", "profile", "model_1_5b", "jax", "ceilings", "attention", "loss", "train_step",
          "end_to_end")
REPO_ROOT = Path(__file__).resolve().parents[3]

# The least time (seconds) a stage needs to give any figure on one H100, from the timings of 2026-11-27 (start-up,
# compilation and the first timed steps): with less left the stage is skipped rather than cut off part-way. Not an
# estimate of anything reported. A smoke run has no floors (it checks the tool, on whatever machine).
STAGE_FLOOR_S = {"device": 0, "headline": 120, "profile": 45, "model_1_5b": 90, "jax": 60, "ceilings": 5,
                 "attention": 10, "loss": 15, "train_step": 45, "end_to_end": 150}


@dataclass
class GpuCheckConfig:
    """scripts/gpu_check.py: measure the recipe on this device; results in OUTPUT_DIR/gpu_check.{json,md}."""

    output_dir: str = doc("gpu_check", "folder for gpu_check.json and gpu_check.md (results of earlier calls in it "
                                       "are kept, and a stage skipped now keeps its earlier figures)")
    stages: list[str] = doc(list(STAGES), f"stages to run, in order (default: all, most important first): "
                                          f"{', '.join(STAGES)}", nargs="+", metavar="STAGE")
    minutes: float = doc(8.0, "time budget of the whole call, from its start (a lent GPU call is limited to about "
                              "9 minutes): a stage that does not fit in what is left is recorded as 'skipped: time "
                              "budget spent', never estimated; a stage still running at the end is stopped a few "
                              "seconds later and recorded so, and its training runs are killed")
    smoke: bool = doc(False, "every stage on the tiny preset with small shapes and few steps (CPU-sized, under a "
                             "minute of CPU); checks the tool, measures nothing meaningful")
    micro_batches: list[int] = doc([12, 24, 48], "micro-batch sizes of the compiled training-step variant "
                                                 "(codeparrot-small; 12 is the recipe's)", nargs="+")
    steps: int = doc(20, "timed training steps per variant (after the warm-up steps)")
    warmup_steps: int = doc(5, "untimed steps per variant first (compilation, allocator, cuDNN autotuning)")
    stage_minutes: float = doc(8.0, "time budget of one stage, within --minutes: variants still to run when it is "
                                    "spent are recorded as skipped, never estimated; training runs are killed")
    variants: list[str] = doc([], "run only the training-step variants whose name contains one of these words "
                                  "(default: all)", nargs="*", metavar="WORD")
    jax_python: str = doc("", "Python interpreter that runs the jax stage's JAX training step (one where jax "
                              "imports; default: this one). JAX is never a dependency of this project: without "
                              "it the stage is skipped with a note")

    def __post_init__(self) -> None:
        if self.smoke:  # a check of the tool: as few steps as show that every stage works
            self.steps, self.warmup_steps = min(self.steps, 3), min(self.warmup_steps, 1)

    def validate(self) -> None:
        unknown = [s for s in self.stages if s not in STAGES]
        if unknown:
            raise CodeParrotError(f"--stages: unknown stage {unknown[0]!r} (known: {', '.join(STAGES)})")
        if (self.steps < 1 or self.warmup_steps < 0 or self.stage_minutes <= 0 or self.minutes <= 0
                or any(b < 1 for b in self.micro_batches)):
            raise CodeParrotError("--steps, --micro-batches must be >= 1, --warmup-steps >= 0, --minutes and "
                                  "--stage-minutes > 0")

    def floor_seconds(self, stage: str) -> float:
        return 0.0 if self.smoke else float(STAGE_FLOOR_S[stage])


class EndToEndSteps(NamedTuple):
    """The end_to_end stage's schedule: the first run trains `steps` optimizer steps, saving every `save_every` and
    logging every `log_every`; the resume starts from the checkpoint before the last (`resume_from`)."""

    steps: int
    save_every: int
    log_every: int
    warmup: int  # --schedule.warmup_steps (at most `steps`: the CLI refuses a longer warmup)

    @property
    def resume_from(self) -> int:
        return self.steps - self.save_every


@dataclass(frozen=True)
class Shapes:
    """What a mode measures: the model presets and every tensor size."""

    model_preset: Path
    train_preset: Path
    vocab_size: int
    seq_length: int
    micro_batches: tuple[int, ...]
    gemm_size: int  # square bf16 GEMM side
    copy_mib: int  # device-memory copy size
    attention_batch: int
    loss_rows: int  # rows of the loss micro-benchmark (one micro-batch of tokens)
    end_to_end_files: int  # stdlib files the end-to-end run's tokenizer and data come from
    # end_to_end: 30 steps saved at 10, 20, 30, resumed from 20. Smoke: 4 steps saved at 2 and 4, resumed from 2,
    # losses compared at 3 and 4 (the same code path: a run, a resume from a saved checkpoint, a comparison)
    end_to_end_steps: EndToEndSteps
    global_batch: int  # headline: sequences per optimizer step (the recipe's 192)
    # headline: the micro-batches of its rows, in the order they run: auto, auto with CUDA graphs ("auto+graphs",
    # compared with auto), then the recipe's former 12 (16 accumulation steps), whose figure from before issue 28
    # is already published: if the budget runs short, the row it drops is the one that says least.
    # Smoke: auto alone, since each CLI run costs ~13 s of CPU in imports and the rows share every line of code
    headline_micro_batches: tuple[str, ...]
    headline_steps: int  # headline: optimizer steps per CLI run (logged every 2; the first window is warm-up)
    large_preset: Path  # model_1_5b: the preset whose memory and MFU it measures
    large_override: tuple[tuple[str, int], ...]  # model_1_5b: preset fields replaced (smoke: 48 tiny layers)
    large_seq_length: int  # model_1_5b: tokens per sequence
    large_start: int  # model_1_5b: the first micro-batch tried (then doubled while it fits, halved while not)
    large_max: int  # model_1_5b: no larger micro-batch is tried
    profiled_steps: int  # profile: steps under torch.profiler (smoke: 1, the same tables from fewer events)
    # torch threads of this process and of the CLI runs on a CPU (None: torch's default). Smoke: 1, because on the
    # 2-core CI machine, where the suite runs two workers side by side, two threads per process spin-wait on
    # each other: a tiny training step measured 1,100 ms of CPU with 2 threads against 70 ms with 1.
    cpu_threads: int | None


def shapes_for(cfg: GpuCheckConfig) -> Shapes:
    configs = REPO_ROOT / "configs"
    if cfg.smoke:
        return Shapes(configs / "model" / "tiny.yaml", configs / "train" / "tiny.yaml", vocab_size=2048,
                      seq_length=128, micro_batches=(2, 4), gemm_size=128, copy_mib=8, attention_batch=2,
                      loss_rows=2 * 127, end_to_end_files=10, end_to_end_steps=EndToEndSteps(4, 2, 1, 2),
                      global_batch=8, headline_micro_batches=("auto",), headline_steps=4,
                      large_preset=configs / "model" / "tiny.yaml",
                      large_override=(("n_layer", 48), ("n_embd", 32), ("n_head", 2)), large_seq_length=32,
                      large_start=1, large_max=2, profiled_steps=1, cpu_threads=1)
    return Shapes(configs / "model" / "codeparrot-small.yaml", configs / "train" / "codeparrot-small.yaml",
                  vocab_size=32768, seq_length=1024, micro_batches=tuple(cfg.micro_batches), gemm_size=8192,
                  copy_mib=1024, attention_batch=12, loss_rows=12 * 1023, end_to_end_files=400,
                  end_to_end_steps=EndToEndSteps(30, 10, 5, 5), global_batch=192,
                  headline_micro_batches=("auto", "auto+graphs", "12"), headline_steps=10,
                  large_preset=configs / "model" / "codeparrot.yaml", large_override=(), large_seq_length=1024,
                  large_start=8, large_max=64, profiled_steps=3, cpu_threads=None)

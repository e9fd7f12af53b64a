"""The flags of `scripts/gpu_check.py`, and the shapes each mode measures."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from codeparrot.config import doc
from codeparrot.errors import CodeParrotError

STAGES = ("device", "ceilings", "attention", "loss", "train_step", "profile", "end_to_end")
REPO_ROOT = Path(__file__).resolve().parents[3]


@dataclass
class GpuCheckConfig:
    """scripts/gpu_check.py: measure the recipe on this device; results in OUTPUT_DIR/gpu_check.{json,md}."""

    output_dir: str = doc("gpu_check", "folder for gpu_check.json and gpu_check.md (results of earlier runs in it "
                                       "are kept: run the stages one call at a time)")
    stages: list[str] = doc(list(STAGES), f"stages to run, in order (default: all): {', '.join(STAGES)}",
                            nargs="+", metavar="STAGE")
    smoke: bool = doc(False, "every stage on the tiny preset with small shapes (CPU-sized, under 2 minutes); "
                             "checks the tool, measures nothing meaningful")
    micro_batches: list[int] = doc([12, 24, 48], "micro-batch sizes of the compiled training-step variant "
                                                 "(codeparrot-small; 12 is the recipe's)", nargs="+")
    steps: int = doc(20, "timed training steps per variant (after the warm-up steps)")
    warmup_steps: int = doc(5, "untimed steps per variant first (compilation, allocator, cuDNN autotuning)")
    stage_minutes: float = doc(8.0, "time budget of one stage: variants still to run when it is spent are "
                                    "recorded as skipped, never estimated; the end-to-end runs are killed when it is spent")
    variants: list[str] = doc([], "run only the training-step variants whose name contains one of these words "
                                  "(default: all)", nargs="*", metavar="WORD")

    def __post_init__(self) -> None:
        if self.smoke:  # a check of the tool: as few steps as show that every stage works
            self.steps, self.warmup_steps = min(self.steps, 3), min(self.warmup_steps, 1)

    def validate(self) -> None:
        unknown = [s for s in self.stages if s not in STAGES]
        if unknown:
            raise CodeParrotError(f"--stages: unknown stage {unknown[0]!r} (known: {', '.join(STAGES)})")
        if self.steps < 1 or self.warmup_steps < 0 or self.stage_minutes <= 0 or any(b < 1 for b in self.micro_batches):
            raise CodeParrotError("--steps, --micro-batches must be >= 1, --warmup-steps >= 0, --stage-minutes > 0")


@dataclass(frozen=True)
class Shapes:
    """What a mode measures: the model preset and every tensor size."""

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


def shapes_for(cfg: GpuCheckConfig) -> Shapes:
    configs = REPO_ROOT / "configs"
    if cfg.smoke:
        return Shapes(configs / "model" / "tiny.yaml", configs / "train" / "tiny.yaml", vocab_size=2048,
                      seq_length=128, micro_batches=(2, 4), gemm_size=256, copy_mib=8, attention_batch=2,
                      loss_rows=2 * 127, end_to_end_files=40)
    return Shapes(configs / "model" / "codeparrot-small.yaml", configs / "train" / "codeparrot-small.yaml",
                  vocab_size=32768, seq_length=1024, micro_batches=tuple(cfg.micro_batches), gemm_size=8192,
                  copy_mib=1024, attention_batch=12, loss_rows=12 * 1023, end_to_end_files=400)

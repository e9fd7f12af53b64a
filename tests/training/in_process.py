"""`train()` run in the test process: the one-process references and resumes the launched-run tests compare with
(a launch re-imports torch and transformers, ~8 s of CPU on the 2-core test machine)."""

from __future__ import annotations


def train_here(cfg, resume: str | None = None):
    """`train(cfg, resume=resume)` in this process, then Accelerate's process-wide state reset (its singletons
    would hand the next run in this process this run's Accelerator settings)."""
    from accelerate.state import AcceleratorState, GradientState

    from codeparrot.training.train import train

    try:
        return train(cfg, resume=resume)
    finally:
        AcceleratorState._reset_state(True)
        GradientState._reset_state()

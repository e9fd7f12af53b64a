"""`train()` run in the test process: the one-process references and resumes the launched-run tests compare with
(a launch re-imports torch and transformers, ~8 s of CPU on the 2-core test machine), and the reset of
Accelerate's process-wide state that every in-process run needs after it."""

from __future__ import annotations


def reset_accelerate() -> None:
    """Forget Accelerate's process-wide singletons: without this, the next Accelerator made in this process would
    get this one's settings (mixed precision, gradient accumulation, CPU)."""
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(True)
    GradientState._reset_state()


def train_here(cfg, resume: str | None = None, **kwargs):
    """`train(cfg, resume=resume, **kwargs)` in this process, then `reset_accelerate()`, whether it ended or
    raised."""
    from codeparrot.training.train import train

    try:
        return train(cfg, resume=resume, **kwargs)
    finally:
        reset_accelerate()

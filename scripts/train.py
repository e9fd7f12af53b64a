"""Train (or resume) a CodeParrot model:

    python scripts/launch.py [accelerate launch flags] scripts/train.py --config configs/train/NAME.yaml

scripts/launch.py takes `accelerate launch`'s flags (--num_processes, --mixed_precision, ...) and starts the same
processes; a failure then ends with the run's own one-line `error:`, not the launcher's traceback.

Any config key can be overridden on the command line with dots for sections (`--optim.lr 2e-4`,
`--batch.micro_batch_size=4`); see the list below. CLI > YAML file > defaults.
"""

from __future__ import annotations

import argparse
import sys

from codeparrot.config import describe, load_config
from codeparrot.errors import PREEMPTED_EXIT, CodeParrotError, run_cli
from codeparrot.training.config import TrainConfig


def parse_profile_steps(text: str | None) -> tuple[int, int] | None:
    """'A:B' -> (A, B): profile optimizer steps A..B inclusive (1-based)."""
    if not text:
        return None
    try:
        first, last = (int(x) for x in text.split(":"))
    except ValueError:
        raise CodeParrotError(f"--profile-steps expects A:B (e.g. 5:8), got {text!r}") from None
    if not 1 <= first <= last:
        raise CodeParrotError(f"--profile-steps A:B needs 1 <= A <= B, got {text!r}")
    return first, last


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__, allow_abbrev=False, formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="config keys (YAML or --key value):\n" + describe(TrainConfig))
    parser.add_argument("--config", help="YAML training config (configs/train/*.yaml); without it, defaults + overrides")
    parser.add_argument("--resume", metavar="auto|PATH",
                        help="continue a run exactly (same step, lr, next unseen sequence): 'auto' = the latest "
                             "checkpoint of this run (fresh start when there is none), or a step-N folder")
    parser.add_argument("--inspect-batches", type=int, default=0, metavar="N",
                        help="print the first N training batches decoded to text (file boundaries marked) and exit")
    parser.add_argument("--profile-steps", metavar="A:B",
                        help="record a torch.profiler trace of optimizer steps A..B into <run>/tensorboard/profile")
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        raise CodeParrotError("nothing to train: give a config, e.g. `scripts/train.py --config configs/train/tiny.yaml "
                              "--model REPO --data.train DATA` (every key: --help)")
    args, overrides = build_parser().parse_known_args(argv)
    if args.inspect_batches < 0:
        raise CodeParrotError(f"--inspect-batches must be >= 0, got {args.inspect_batches}")
    profile = parse_profile_steps(args.profile_steps)
    cfg = load_config(TrainConfig, args.config, overrides)
    from codeparrot.training.launch_checks import check_launch

    check_launch(cfg.mixed_precision)  # a launch that is not one job, refused before the model code is imported
    from codeparrot.training.train import train  # heavy imports only after the arguments are known to be valid

    result = train(cfg, resume=args.resume, inspect_batches=args.inspect_batches, profile_steps=profile)
    if result is not None and result.stopped_by_signal:
        return PREEMPTED_EXIT  # resumable: its line is printed
    if result is not None and result.push_errors:
        return 1
    return 0


if __name__ == "__main__":
    run_cli(main)

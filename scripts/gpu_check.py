"""What the recipe gets on this device, in one call bounded by --minutes (default 8): the training CLI at the
recipe's global batch (micro-batch 12 and auto), a per-kernel profile, the 1.5B preset's largest micro-batch and
MFU, a plain-JAX peer of the same step, then versions and peak, GEMM/copy ceilings, attention backends, loss
variants, training-step variants and an end-to-end CLI run with resume. A stage that does not fit in what is left
is recorded as skipped, never estimated. Results go to OUTPUT_DIR/gpu_check.json and gpu_check.md after every
stage. `--smoke`: the tiny preset on any device (CI runs it). See codeparrot/tools/gpu_check/__init__.py."""

from __future__ import annotations

import sys
import time

from codeparrot.atomic_io import ensure_writable_dir
from codeparrot.config_flags import parse_config
from codeparrot.errors import run_cli
from codeparrot.tools.gpu_check.config import GpuCheckConfig


def main(argv: list[str] | None = None) -> int:
    started = time.monotonic()  # --minutes counts from here: importing torch below is part of the call's time
    cfg = parse_config(GpuCheckConfig, argv, __doc__)
    ensure_writable_dir(cfg.output_dir)  # before the first stage (minutes), not when saving its result
    from codeparrot.tools.gpu_check.run import run_gpu_check  # torch only after the flags parsed

    results = run_gpu_check(cfg, started=started)
    failed = [name for name, entry in results["stages"].items() if "error" in entry and name in cfg.stages]
    for name in failed:
        print(f"error: gpu_check stage {name} failed: {results['stages'][name]['error']}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    run_cli(main)

"""Build what the GPU commands train on: the codeparrot-small model repository and pretokenized train/valid
splits, from this interpreter's site-packages (export -> preprocess -> tokenizer -> initial model ->
pretokenize; finished stages are reused unless --fresh). `make gpu-data` runs it into gpu_data/."""

from __future__ import annotations

from codeparrot.config_flags import parse_config
from codeparrot.errors import run_cli
from codeparrot.tools.gpu_data import GpuDataConfig, run_gpu_data


def main(argv: list[str] | None = None) -> int:
    run_gpu_data(parse_config(GpuDataConfig, argv, __doc__))
    return 0


if __name__ == "__main__":
    run_cli(main)

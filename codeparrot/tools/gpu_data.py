"""`make gpu-data`: what the GPU commands train on, built from this machine's own Python code.

The codeparrot-small model repository (`configs/model/codeparrot-small.yaml`, 111M parameters) and pretokenized
train/valid splits from a site-packages export: the demo's data stages (`demo.data_stages`: export_local ->
preprocess with near dedup -> tokenizer -> initial model -> characters-per-token filter -> pretokenize), each a
CLI call printed before it runs, each reused when it already finished. About 12,000 files (240 MB) from a
virtualenv's site-packages: enough to measure tokens/s and MFU, not to train a useful model.
"""

from __future__ import annotations

import shutil
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from codeparrot.config import doc
from codeparrot.errors import CodeParrotError
from codeparrot.tools.demo import REPO_ROOT, Stage, data_stages, run_stages


@dataclass
class GpuDataConfig:
    """scripts/gpu_data.py: the source trees, the model preset and where the repository and tokens go."""

    output_dir: str = doc("gpu_data", "folder of model-repo/, tokens/train, tokens/valid and the stages between")
    sources: list[str] = doc([], "source trees to export, each top-level package one repository (default: this "
                                 "interpreter's site-packages)")
    model_config: str = doc("configs/model/codeparrot-small.yaml", "model preset (YAML; a relative path not found "
                                                                   "here is read from the repository root)")
    fresh: bool = doc(False, "delete the output folder first and redo every stage")

    def validate(self) -> None:
        missing = [s for s in self.sources if not Path(s).is_dir()]
        if missing:
            raise CodeParrotError(f"--sources: not a folder: {', '.join(missing)}")
        if not self.model_file().is_file():
            raise CodeParrotError(f"--model-config: no such file: {self.model_config}")

    def model_file(self) -> Path:
        path = Path(self.model_config)
        return path.resolve() if path.is_absolute() or path.is_file() else REPO_ROOT / path


def gpu_data_stages(cfg: GpuDataConfig, out: Path) -> list[Stage]:
    """The demo's data stages on `cfg.sources` (default: site-packages, one repository per package)."""
    sources = [str(Path(s).resolve()) for s in cfg.sources] or [sysconfig.get_paths()["purelib"]]
    return data_stages(out, [*sources, "--repo-per-subfolder"], cfg.model_file())


def run_gpu_data(cfg: GpuDataConfig) -> Path:
    """Build (or finish building) the repository and tokens; returns the output folder."""
    out = Path(cfg.output_dir).resolve()
    if cfg.fresh and out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    timings, reused = run_stages(out, gpu_data_stages(cfg, out), "make gpu-data")
    print(f"\ngpu data ready in {timings['total']:.0f} s ({len(reused)} stage(s) reused): model repository "
          f"{out / 'model-repo'}, tokens {out / 'tokens' / 'train'} and {out / 'tokens' / 'valid'}")
    return out

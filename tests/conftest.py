"""Shared fixtures. Every test runs offline: no Hub, W&B offline, tokenizers single-threaded."""

from __future__ import annotations

import os
import sys
import sysconfig
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

REPO_ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True, scope="session")
def _isolated_cache(tmp_path_factory):
    """Materialized revisions and measured CPU peaks go to a per-session folder, not ~/.cache."""
    os.environ["CODEPARROT_CACHE"] = str(tmp_path_factory.mktemp("codeparrot-cache"))


def pytest_collection_modifyitems(config, items):
    """Tests marked `gpu` are skipped on machines without CUDA."""
    try:
        import torch

        has_gpu = torch.cuda.is_available()
    except Exception:  # pragma: no cover - torch missing is a broken install, reported elsewhere
        has_gpu = False
    if has_gpu:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO_ROOT


@pytest.fixture(scope="session")
def stdlib_texts() -> list[str]:
    """About 200 real Python files from the running interpreter's standard library (1 KiB ≤ size < 64 KiB),
    in a deterministic order: realistic code for tokenizer, filter and dataset tests."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    texts = []
    for path in sorted(stdlib.glob("*.py")):
        try:
            data = path.read_bytes()
        except OSError:
            continue
        if 1024 <= len(data) < 65536:
            try:
                texts.append(data.decode("utf-8"))
            except UnicodeDecodeError:
                continue
        if len(texts) >= 200:
            break
    assert len(texts) >= 100, f"too few stdlib files found under {stdlib}"
    return texts


@pytest.fixture
def scripts_env() -> dict[str, str]:
    """Environment for running `scripts/*.py` in a subprocess with this interpreter, offline."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO_ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env


@pytest.fixture(scope="session")
def python() -> str:
    return sys.executable

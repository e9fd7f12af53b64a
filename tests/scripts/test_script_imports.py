"""Every script's module level imports only light modules: the heavy ones (torch, transformers, the Hub client,
matplotlib, web frameworks...) load inside `main`, under `run_cli`, so that Ctrl-C while they load (seconds:
train_tokenizer.py and initialize_model.py measured 4-6 s of imports) prints `interrupted` (exit status 130), not
a KeyboardInterrupt traceback from an import.

Checked statically rather than by timing a SIGINT into the imports: in one subprocess each scripts/*.py is loaded
as a module (its `if __name__ == "__main__"` block does not run) and `sys.modules` is read after each."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = sorted(str(p) for p in (REPO_ROOT / "scripts").glob("*.py"))
# Each takes from a third of a second (the Hub client) to seconds (torch) to import on the 2-core machine.
HEAVY = ("torch", "transformers", "tokenizers", "datasets", "huggingface_hub", "accelerate", "matplotlib",
         "gradio", "fastapi", "uvicorn", "pyarrow", "pandas", "ray")

LOADER = r"""
import importlib.util, json, sys

heavy, first_by = set(sys.argv[1].split(",")), {}
for n, script in enumerate(sys.argv[2:]):
    spec = importlib.util.spec_from_file_location(f"script_{n}", script)
    spec.loader.exec_module(importlib.util.module_from_spec(spec))
    for name in sorted(heavy & {m.split(".")[0] for m in sys.modules}):
        first_by.setdefault(name, script)
print(json.dumps(first_by))
"""


def test_scripts_import_no_heavy_module_before_main():
    env = dict(os.environ, HF_HUB_OFFLINE="1", WANDB_MODE="offline", TOKENIZERS_PARALLELISM="false")
    env["PYTHONPATH"] = str(REPO_ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    done = subprocess.run([sys.executable, "-c", LOADER, ",".join(HEAVY), *SCRIPTS], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    loaded = json.loads(done.stdout.strip().splitlines()[-1])
    assert loaded == {}, f"imported at module level (move them into main, after parsing): {loaded}"

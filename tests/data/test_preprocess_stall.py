"""preprocess.py's stall watchdog: an input that stops answering (a named pipe nobody writes to) or a worker that
hangs stops the run within --stall-minutes with the stacks in OUTPUT_DIR.stall.log and one `error:` line, exit
status 75, no output folder, no worker left behind."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from codeparrot.errors import STALL_EXIT

ARGS = ["--stall-minutes", "0.05", "--num-workers", "1", "--no-progress"]
# a worker that never returns its batch (patched in before the script runs; the pool forks it)
HANGING_WORKER = ("import runpy, sys, threading\n"
                  "import codeparrot.data.record_work as p\n"
                  "p.ChunkWorker.__call__ = lambda self, *a: threading.Event().wait()\n"
                  "sys.argv = ['scripts/preprocess.py', *sys.argv[1:]]\n"
                  "runpy.run_path('scripts/preprocess.py', run_name='__main__')\n")


def _records(folder, n=3):
    folder.mkdir(exist_ok=True)
    lines = [json.dumps({"content": f"def f{i}(x):\n    return x + {i}\n" * 3}) for i in range(n)]
    (folder / "a.jsonl").write_text("\n".join(lines) + "\n")
    return folder


def _assert_stalled(done, out_dir, waiting: str):
    lines = (done.stdout + done.stderr).strip().splitlines()
    assert done.returncode == STALL_EXIT, lines
    assert len(lines) == 1 and lines[0].startswith("error: stalled: no progress for "), lines
    assert waiting in lines[0] and f"{out_dir} was not written" in lines[0], lines[0]
    log = out_dir.with_name(f"{out_dir.name}.stall.log").read_text()
    assert "most recent call first" in log and "_pass1" in log, log
    assert not out_dir.exists()


def test_an_input_that_blocks_stops_preprocessing(tmp_path, repo_root, scripts_env):
    data = _records(tmp_path / "in")
    os.mkfifo(data / "b.jsonl")  # read after a.jsonl, never answers
    out_dir = tmp_path / "clean"
    done = subprocess.run([sys.executable, "scripts/preprocess.py", "--input", str(data), "--output-dir",
                           str(out_dir), *ARGS], cwd=repo_root, env=scripts_env, capture_output=True, text=True,
                          timeout=120)
    _assert_stalled(done, out_dir, "preprocess reading the input")


def test_a_hanging_worker_stops_preprocessing(tmp_path, repo_root, scripts_env):
    data = _records(tmp_path / "in")
    out_dir = tmp_path / "clean"
    # the pipes close only when every process holding them is gone: no hung worker may outlive the run
    done = subprocess.run([sys.executable, "-c", HANGING_WORKER, "--input", str(data), "--output-dir", str(out_dir),
                           *ARGS], cwd=repo_root, env=scripts_env, capture_output=True, text=True, timeout=120)
    _assert_stalled(done, out_dir, f"waiting for a worker's batch of records from {data / 'a.jsonl'}:1")

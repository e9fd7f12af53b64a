"""The stall watchdog: a run that stops making progress stops within `stall_minutes` with the stacks of its threads
in its rank log and one `error:` line, exit status 75, instead of hanging silently. The waits users hit: a data
source that blocks (a named pipe nobody writes to), a DataLoader worker that hangs, a collective that never
completes because the other rank hangs (2 gloo processes)."""

from __future__ import annotations

import gzip
import os
import socket
import subprocess
import sys
import threading
import time

import pytest
import yaml

from codeparrot.config import to_dict
from codeparrot.errors import STALL_EXIT
from codeparrot.tools.toy_run import build_toy_run
from codeparrot.watchdog import StallWatchdog

pytestmark = pytest.mark.slow(50)  # stalled training launches: first in `make test`'s order

STALL_MINUTES = 0.1  # 6 s: longer than the set-up (loading, 2 processes joining) on a loaded 2-core machine


@pytest.fixture
def scripts_env(scripts_env):
    # a given peak: no 2-second matmul measurement at start (a set-up without progress, as long as the limit)
    return {**scripts_env, "CODEPARROT_PEAK_TFLOPS": "1", "OMP_NUM_THREADS": "1"}


@pytest.fixture(scope="module")
def toy(tmp_path_factory, stdlib_texts):
    return build_toy_run(tmp_path_factory.mktemp("stall"), stdlib_texts[:20], vocab_size=300)


def _stuck_data(tmp_path, toy, one_record: bool = False) -> str:
    """A named pipe nobody writes to, `b.jsonl` (opening it for reading blocks forever, as a read from a file
    system that stopped answering does); with `one_record`, a folder that holds it after `a.jsonl`, the first
    record of the toy's train shard."""
    folder = tmp_path / "data"
    folder.mkdir()
    os.mkfifo(folder / "b.jsonl")
    if not one_record:
        return str(folder / "b.jsonl")
    lines = gzip.decompress(next(toy.train_data.glob("*.gz")).read_bytes()).splitlines(keepends=True)
    (folder / "a.jsonl").write_bytes(lines[0])
    return str(folder)


def _config(toy, tmp_path, train: str, **overrides) -> tuple[str, object]:
    run_dir = tmp_path / "run"
    cfg = toy.config(max_steps=10_000, stall_minutes=STALL_MINUTES, **{
        "output_dir": str(run_dir), "data.train": train, "data.valid": "", "data.seq_length": 32,
        "batch.micro_batch_size": 2, "checkpoint.push": False, "logging.log_steps": 1000, **overrides})
    path = tmp_path / "stall.yaml"
    path.write_text(yaml.safe_dump(to_dict(cfg)))
    return str(path), run_dir


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _assert_stalled(done, run_dir, ranks, blocked_at: str):
    out = done.stdout + done.stderr
    assert done.returncode == STALL_EXIT, out
    errors = [line for line in out.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, out  # one line for the whole job
    assert errors[0].startswith("error: stalled: no progress for ") and "rank 0 waiting for step " in errors[0], out
    assert "data.train" in errors[0] and blocked_at in errors[0] and "--resume auto" in errors[0], errors[0]
    assert "Traceback" not in out and "ChildFailedError" not in out, out
    for rank in ranks:
        log = (run_dir / "logs" / f"rank-{rank}.log").read_text()
        assert "error: stalled" in log and f"rank {rank} waiting" in log, log
        assert "most recent call first" in log and "in train" in log, log  # faulthandler's dump, the loop's frame
    assert not (run_dir / "checkpoints").exists() or not any((run_dir / "checkpoints").iterdir())


def test_a_data_source_that_blocks_stops_the_run(toy, tmp_path, repo_root, scripts_env):
    config, run_dir = _config(toy, tmp_path, _stuck_data(tmp_path, toy))
    start = time.monotonic()
    done = subprocess.run([sys.executable, "scripts/train.py", "--config", config], cwd=repo_root, env=scripts_env,
                          capture_output=True, text=True, timeout=120)
    _assert_stalled(done, run_dir, [0], "records.py")
    assert time.monotonic() - start < 90


def test_a_hanging_dataloader_worker_stops_the_run(toy, tmp_path, repo_root, scripts_env):
    # the worker reads the one record of a.jsonl, then blocks in b.jsonl; the main thread waits for its first batch
    config, run_dir = _config(toy, tmp_path, _stuck_data(tmp_path, toy, one_record=True), **{"data.num_workers": 1})
    done = subprocess.run([sys.executable, "scripts/train.py", "--config", config], cwd=repo_root, env=scripts_env,
                          capture_output=True, text=True, timeout=120)
    _assert_stalled(done, run_dir, [0], "next(train_iter)")


def test_a_collective_that_never_completes_stops_both_ranks(toy, tmp_path, repo_root, scripts_env):
    # two readers, two files, records dealt in turn: rank 0's first record (a.jsonl's one record, longer than a
    # token buffer; no shuffle buffers, so nothing more is read before the first batch) gives it its micro-batch,
    # which it computes and then waits in the gradient all-reduce for a partner that never comes: rank 1's first
    # record is in the pipe, where it hangs. Stalls at step 1, after the set-up alone.
    config, run_dir = _config(toy, tmp_path, _stuck_data(tmp_path, toy, one_record=True),
                              **{"data.shuffle_buffer": 0, "data.sequence_shuffle_buffer": 0})
    env = {**scripts_env, "ACCELERATE_USE_CPU": "1"}
    done = subprocess.run([sys.executable, "scripts/launch.py", "--config_file", "accelerate_config.yaml",
                           "--num_processes", "2", "--mixed_precision", "no", "--main_process_port",
                           str(_free_port()), "scripts/train.py", "--config", config],
                          cwd=repo_root, env=env, capture_output=True, text=True, timeout=180)
    _assert_stalled(done, run_dir, [0, 1], "train.py")
    first = {rank: (run_dir / "logs" / f"rank-{rank}.log").read_text().splitlines()[0] for rank in (0, 1)}
    assert "waiting for step 1 " in first[0] and "run_micro_step" in first[0], first[0]  # in the backward's all-reduce
    assert "waiting for step 1 " in first[1] and "records.py" in first[1], first[1]  # in the pipe


def test_beats_keep_it_quiet_and_a_stall_dumps_every_thread(tmp_path):
    fired = []
    log = tmp_path / "logs" / "rank-0.log"
    release = threading.Event()

    def stuck_in_a_read():
        release.wait()

    helper = threading.Thread(target=stuck_in_a_read, name="reader")
    helper.start()
    watchdog = StallWatchdog(0.01, log, describe=lambda step: f"rank 0 waiting for step {step + 1}",
                             poll_seconds=0.05, exit=fired.append).start()
    try:
        for step in range(1, 20):  # 1.9 s of beats every 0.1 s: three times the 0.6 s limit, never silent that long
            time.sleep(0.1)
            watchdog.beat(step)
        assert not fired
        deadline = time.monotonic() + 10
        while not fired and time.monotonic() < deadline:
            time.sleep(0.05)
        assert fired == [STALL_EXIT]
        text = log.read_text()
        assert "rank 0 waiting for step 20" in text
        assert "stuck_in_a_read" in text  # every thread's stack, not only the loop's
    finally:
        release.set()
        helper.join()
        watchdog.stop()

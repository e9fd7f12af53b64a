"""User errors through the real `accelerate launch`, as the README runs training: the one-line error is printed
once (by the main process only), and the launch command the README shows prints no warning block."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest

LAUNCH = [sys.executable, "-m", "accelerate.commands.launch"]
WARNING_BLOCK = "were not passed to `accelerate launch`"
ERROR = "error: command line: unknown config key optim.lrr (did you mean optim.lr?)"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(repo_root, scripts_env, launcher_flags):
    env = {**scripts_env, "ACCELERATE_USE_CPU": "1", "OMP_NUM_THREADS": "1"}
    cmd = [*LAUNCH, *launcher_flags, "scripts/train.py", "--config", "configs/train/tiny.yaml", "--optim.lrr", "2"]
    return subprocess.run(cmd, cwd=repo_root, env=env, capture_output=True, text=True, timeout=120)


def test_one_process_error_is_the_last_and_only_line(repo_root, scripts_env):
    # the README's one-process command; -q: accelerate's single-process launcher exits quietly instead of
    # re-raising CalledProcessError, and the four values given leave no warning block
    done = _launch(repo_root, scripts_env, ["-q", "--num_processes", "1", "--num_machines", "1",
                                            "--mixed_precision", "no", "--dynamo_backend", "no"])
    assert done.returncode != 0
    out = (done.stdout + done.stderr).strip().splitlines()
    assert out == [ERROR], out


@pytest.mark.parametrize("flags", [
    ["--config_file", "accelerate_config.yaml", "--num_processes", "2", "--mixed_precision", "no"],
    ["--multi_gpu", "--num_processes", "2", "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"],
])
def test_two_processes_print_the_error_once_without_a_warning_block(repo_root, scripts_env, flags):
    done = _launch(repo_root, scripts_env, [*flags, "--main_process_port", str(_free_port())])
    assert done.returncode != 0
    everything = done.stdout + done.stderr
    assert everything.count("error: ") == 1 and ERROR in everything, everything
    assert WARNING_BLOCK not in everything
    # the error comes before anything the launcher reports about the failed process
    assert everything.strip().splitlines()[0] == ERROR, everything

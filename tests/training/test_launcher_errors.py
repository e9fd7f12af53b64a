"""User errors through the real launcher, as the README runs training.

`scripts/launch.py` (accelerate's launcher run in-process, the README's training command): the one-line error is
the last and only line, with 1 and 2 processes, and a crash ends with one line naming the rank and exit status.
Plain `accelerate launch`: the error is printed once (by the main process only) and the launch commands the
README shows print no warning block. SIGTERM sent to the one-process launcher reaches the run.

The launches that are not signalled run in two processes, not one each (tests/script_cases.py): one runs every
`python scripts/launch.py ...` case, the other every `python -m accelerate.commands.launch ...` case. A launcher
process is mostly its torch import (~2.7 s of CPU on the 2-core test machine) and each case's own work takes
milliseconds; the processes a launch starts are new ones, as always. The first case of each driver is the
fresh-process one (an import-time message would show there), and the SIGTERM tests start `scripts/launch.py` as
a process of its own. The two launchers are not mixed in one driver: `scripts/launch.py` sets
CODEPARROT_LAUNCHER_REPORTS in its process, which a later plain `accelerate launch` would pass on."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from ..script_cases import accelerate_launch_script, run_cases

LAUNCH = [sys.executable, "scripts/launch.py"]
WARNING_BLOCK = "were not passed to `accelerate launch`"
ERROR = "error: command line: unknown config key optim.lrr (did you mean optim.lr?)"
ONE_PROCESS = ["--num_processes", "1", "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _two_processes(repo_root) -> list[str]:
    return ["--config_file", str(repo_root / "accelerate_config.yaml"), "--num_processes", "2", "--mixed_precision",
            "no", "--main_process_port", str(_free_port())]


def _crash_script(folder):
    folder.mkdir()
    crash = folder / "crash.py"
    # One write per line (print's separate writes interleave between the ranks), and both ranks' lines out before
    # either exits: once one rank fails, the launcher stops the other, maybe before it printed.
    crash.write_text("import os, sys, time\nfrom pathlib import Path\n"
                     "os.write(2, f\"rank {os.environ['RANK']} crashing\\n\".encode())\n"
                     f"Path({str(folder)!r}, 'printed-' + os.environ['RANK']).touch()\n"
                     f"deadline = time.time() + 30\n"
                     f"while len(list(Path({str(folder)!r}).glob('printed-*'))) < 2 and time.time() < deadline:\n"
                     "    time.sleep(0.05)\n"
                     "raise SystemExit(3)\n", encoding="utf-8")
    return crash


def _stalled_script(folder):
    # Both ranks' watchdogs report a stall (exit 75, resumable). Rank 1 leaves first; torch then stops rank 0 with
    # SIGTERM while it waits to leave. The job still ends with rank 0's line and the stall's status, not 2.
    folder.mkdir()
    stalled = folder / "stalled.py"
    stalled.write_text("import os, time\nfrom pathlib import Path\n"
                       "from codeparrot.errors import STALL_EXIT, report_error_line\n"
                       "rank = os.environ['RANK']\n"
                       "report_error_line(f'error: stalled: rank {rank} waiting for step 3', STALL_EXIT)\n"
                       f"Path({str(folder)!r}, 'reported-' + rank).touch()\n"
                       "if rank == '1':\n"
                       f"    while not Path({str(folder)!r}, 'reported-0').exists():\n"
                       "        time.sleep(0.05)\n"
                       "    os._exit(STALL_EXIT)\n"
                       "time.sleep(60)\n", encoding="utf-8")
    return stalled


@pytest.fixture(scope="module")
def launched(repo_root, tmp_path_factory) -> dict[str, subprocess.CompletedProcess]:
    """Every launch the tests below inspect, by name, each as its own command line (`python scripts/launch.py
    ARGV`, or `python -m accelerate.commands.launch ARGV` for the names starting with "accelerate"), run by one
    case driver per launcher. Paths are absolute: the drivers run in pytest's directory."""
    folder = tmp_path_factory.mktemp("launches")
    env = {**os.environ, "PYTHONPATH": str(repo_root) + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "ACCELERATE_USE_CPU": "1", "OMP_NUM_THREADS": "1"}  # the scripts' environment (scripts_env), on the CPU
    typo = [str(repo_root / "scripts" / "train.py"), "--config", str(repo_root / "configs" / "train" / "tiny.yaml"),
            "--optim.lrr", "2"]
    two_gpus = ["--multi_gpu", "--num_processes", "2", "--num_machines", "1", "--mixed_precision", "no",
                "--dynamo_backend", "no"]
    # in order; the first of each driver is the one that pays the imports, and the one-process launches come
    # first: a 2-process launch leaves torch elastic's signal handlers (and TORCHELASTIC_SIGNALS_TO_HANDLE) set in
    # its launcher's process, as only a later 2-process launch would have them in a process of its own
    launch_cases = {"one": [*ONE_PROCESS, *typo], "one-quiet": ["-q", *ONE_PROCESS, *typo],
                    "two": [*_two_processes(repo_root), *typo],
                    "crash": [*_two_processes(repo_root), str(_crash_script(folder / "crash"))],
                    "stalled": [*_two_processes(repo_root), str(_stalled_script(folder / "stalled"))]}
    accelerate_cases = {
        "accelerate-one-quiet": ["-q", *ONE_PROCESS, *typo],
        "accelerate-two-config": ["--config_file", str(repo_root / "accelerate_config.yaml"), "--num_processes", "2",
                                  "--mixed_precision", "no", "--main_process_port", str(_free_port()), *typo],
        "accelerate-two-flags": [*two_gpus, "--main_process_port", str(_free_port()), *typo]}
    shim = accelerate_launch_script(folder)
    done = {}
    for script, cases in ((repo_root / "scripts" / "launch.py", launch_cases), (shim, accelerate_cases)):
        results = run_cases(sys.executable, env, [(script, argv) for argv in cases.values()], timeout=600)
        done.update(zip(cases, results))
    return done


@pytest.mark.parametrize("processes", ["one", "one-quiet", "two"])
def test_launch_script_leaves_the_error_as_the_only_line(launched, processes):
    # -q (accelerate's quiet flag) must not turn the user error's status 2 into accelerate's generic 1
    done = launched[processes]
    assert done.returncode == 2
    assert (done.stdout + done.stderr).strip().splitlines() == [ERROR], done.stdout + done.stderr


def test_launch_script_ends_a_crash_with_one_line_naming_rank_and_status(launched):
    done = launched["crash"]
    crash = done.args[-1]
    assert done.returncode == 3
    lines = (done.stdout + done.stderr).strip().splitlines()
    assert "ChildFailedError" not in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert lines[-1].startswith(f"error: {crash} failed on rank ") and "with exit status 3" in lines[-1], lines
    assert sorted(lines[:-1]) == ["rank 0 crashing", "rank 1 crashing"], lines


def test_accelerate_launch_one_process_quiet_error_is_the_only_line(launched):
    # -q: accelerate's single-process launcher exits quietly instead of re-raising CalledProcessError, and the
    # four values given leave no warning block
    done = launched["accelerate-one-quiet"]
    assert done.returncode != 0
    assert (done.stdout + done.stderr).strip().splitlines() == [ERROR]


@pytest.mark.parametrize("flags", ["config", "flags"])
def test_accelerate_launch_two_processes_print_the_error_once_without_a_warning_block(launched, flags):
    # the README's config file, or the same launch given as flags
    done = launched[f"accelerate-two-{flags}"]
    assert done.returncode != 0
    everything = done.stdout + done.stderr
    assert WARNING_BLOCK not in everything
    # printed at most once (by the main process; torch may stop it first when rank 1 fails first), and always in
    # torch's ChildFailedError report, read from the error file run_cli writes
    assert everything.splitlines().count(ERROR) <= 1, everything
    assert f"traceback : {ERROR}" in everything, everything


def test_a_recorded_stall_keeps_its_status_when_the_launcher_stops_that_rank_first(launched):
    done = launched["stalled"]
    assert done.returncode == 75, done.stdout + done.stderr
    assert (done.stdout + done.stderr).strip().splitlines() == ["error: stalled: rank 0 waiting for step 3"]


@pytest.mark.parametrize("run_handles_it", [True, False])
def test_sigterm_sent_to_the_one_process_launcher_reaches_the_run(repo_root, scripts_env, tmp_path, run_handles_it):
    # Kubernetes and `kill PID` signal only the launcher; accelerate's one-process launcher would die and leave
    # the run orphaned. The run gets the SIGTERM (a training run saves a checkpoint), the job leaves with its status;
    # a run that has not taken SIGTERM over yet (still importing torch) is stopped, and that is no failure either.
    run = tmp_path / "run.py"
    handler = ("signal.signal(signal.SIGTERM, lambda *_: (stopped.touch(), sys.exit(143)))\n" if run_handles_it
               else "")
    run.write_text("import signal, sys, time\nfrom pathlib import Path\n"
                   f"stopped = Path({str(tmp_path)!r}, 'stopped')\n{handler}"
                   f"Path({str(tmp_path)!r}, 'ready').touch()\n"
                   "time.sleep(60)\n", encoding="utf-8")
    env = {**scripts_env, "ACCELERATE_USE_CPU": "1", "OMP_NUM_THREADS": "1"}
    launcher = subprocess.Popen([*LAUNCH, *ONE_PROCESS, str(run)], cwd=repo_root, env=env, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while not (tmp_path / "ready").exists() and launcher.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert launcher.poll() is None, launcher.communicate()[0]
    launcher.send_signal(signal.SIGTERM)
    output = launcher.communicate(timeout=30)[0]
    assert launcher.returncode == 143, output
    if run_handles_it:
        assert (tmp_path / "stopped").exists() and output.strip() == "", output  # the run's status, its own words
    else:
        assert output.strip() == "stopped by SIGTERM", output

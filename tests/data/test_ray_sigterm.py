"""SIGTERM in `preprocess.py --engine ray` (codeparrot/data/ray_cluster.py): Ray takes SIGTERM over (`ray.init`
installs `sys.exit(15)`; `ray.shutdown` leaves it at its default action at the C level), so without care a stopped
run ended with status 15 or was killed outright, its temporary output left, and a SIGTERM while Ray started its
processes left some running. A stand-in `ray` package does what the real one does to the signal, in a
few milliseconds instead of a Ray start's seconds; only the process under test is signalled."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

FAKE_RAY = '''
import ctypes, os, signal, sys, time
from . import _private, util
_initialized = False

def init(**kwargs):
    global _initialized
    def sigterm_handler(signum, frame):  # ray.init's own, installed first thing
        sys.exit(signum)
    _private.utils.set_sigterm_handler(sigterm_handler)
    print("ray starting", flush=True)
    if os.environ.get("FAKE_RAY_JOIN_HANGS"):  # an address that never answers: Ray retries for minutes
        time.sleep(60)
    if os.environ.get("FAKE_RAY_SIGTERM_DURING_INIT"):
        os.kill(os.getpid(), signal.SIGTERM)  # as if sent while the GCS and raylet start
    time.sleep(0.2)
    _initialized = True
    print("ray started", flush=True)

def is_initialized():
    return _initialized

def shutdown():
    global _initialized
    _initialized = False
    ctypes.CDLL(None).signal(signal.SIGTERM, 0)  # SIG_DFL at the C level, Python's table unchanged (as Ray's core)
    print("ray shut down", flush=True)
'''


def _fake_ray(tmp_path) -> str:
    package = tmp_path / "fake" / "ray"
    (package / "_private").mkdir(parents=True)
    (package / "__init__.py").write_text(FAKE_RAY)
    (package / "_private" / "__init__.py").write_text("from . import utils\n")
    (package / "_private" / "utils.py").write_text(
        "import signal\n\ndef set_sigterm_handler(handler):\n    signal.signal(signal.SIGTERM, handler)\n")
    (package / "util.py").write_text("def get_node_ip_address():\n    return '127.0.0.1'\n")
    return str(tmp_path / "fake")


def _run(program: str, tmp_path, scripts_env, signal_after: str | None = None, **env) -> tuple[int, str, str]:
    env = {**scripts_env, **env, "PYTHONPATH": _fake_ray(tmp_path) + os.pathsep + scripts_env["PYTHONPATH"]}
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(program)], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    if signal_after:
        seen, deadline = [], time.monotonic() + 30
        while time.monotonic() < deadline and (line := proc.stdout.readline()):
            seen.append(line)
            if line.strip() == signal_after:
                break
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
        return proc.returncode, "".join(seen) + out, err
    out, err = proc.communicate(timeout=30)
    return proc.returncode, out, err


def test_a_sigterm_while_ray_starts_stops_the_started_ray_then_the_cli(tmp_path, scripts_env):
    code, out, err = _run("""
        from codeparrot.data.ray_cluster import start_local_ray
        from codeparrot.errors import run_cli
        def main():
            start_local_ray(1)
            print("working", flush=True)
        run_cli(main)
    """, tmp_path, scripts_env, FAKE_RAY_SIGTERM_DURING_INIT="1")
    assert (code, out, err) == (143, "ray starting\nray started\nray shut down\n", "stopped by SIGTERM\n")


def test_a_sigterm_after_ray_ran_still_unwinds_the_cli(tmp_path, scripts_env):
    code, out, err = _run("""
        import time
        from codeparrot.data.ray_cluster import ray_shutdown, start_local_ray
        from codeparrot.errors import run_cli
        def main():
            start_local_ray(1)
            try:
                print("working", flush=True)
                ray_shutdown()
                print("ready", flush=True)
                time.sleep(30)
            finally:  # where the CLI removes its temporary output folder
                print("cleaned up", flush=True)
        run_cli(main)
    """, tmp_path, scripts_env, signal_after="ready")
    assert (code, err) == (143, "stopped by SIGTERM\n") and out.endswith("ready\ncleaned up\n"), (code, out, err)


def test_a_sigterm_during_a_join_that_never_answers_stops_the_cli_at_once(tmp_path, scripts_env):
    # nothing is started here to stop first: the CLI's own stop, not a hold until the join gives up
    code, out, err = _run("""
        from codeparrot.data.ray_cluster import ray_init
        from codeparrot.errors import run_cli
        run_cli(lambda: ray_init(False, address="127.0.0.1:6999"))
    """, tmp_path, scripts_env, signal_after="ray starting", FAKE_RAY_JOIN_HANGS="1")
    assert (code, err) == (143, "stopped by SIGTERM\n"), (code, out, err)

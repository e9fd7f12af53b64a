"""SIGTERM in a CLI: `run_cli` unwinds like Ctrl-C and says so (status 143); `signals_passed_to_children` hands it
(and a Ctrl-C the child did not get) to the child a CLI waits for. Real processes and real signals: only the process
under test is signalled (or, for a terminal's Ctrl-C, its foreground group, through a pseudo-terminal)."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time

CHILD = ("import signal, sys, time\n"
         "signal.signal(signal.SIGTERM, lambda *_: (print('child got SIGTERM', flush=True), sys.exit(143)))\n"
         "print('child ready', flush=True)\n"
         "time.sleep(60)\n")


def _start(program: str, scripts_env) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(program)], env=scripts_env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _wait_for(proc: subprocess.Popen, line: str) -> list[str]:
    seen = []
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        got = proc.stdout.readline()
        if not got:
            break
        seen.append(got.rstrip("\n"))
        if seen[-1] == line:
            return seen
    raise AssertionError(f"never printed {line!r}: {seen} {proc.stderr.read() if proc.poll() is not None else ''}")


def test_sigterm_unwinds_a_cli_like_ctrl_c_and_a_second_one_does_not_cut_its_cleanup(scripts_env):
    proc = _start("""
        import time
        from codeparrot.errors import run_cli
        def main():
            try:
                print("ready", flush=True)
                time.sleep(60)
            finally:  # where a CLI removes its temporary output
                print("cleaning", flush=True)
                time.sleep(0.5)
                print("cleaned up", flush=True)
        run_cli(main)
    """, scripts_env)
    _wait_for(proc, "ready")
    proc.send_signal(signal.SIGTERM)
    _wait_for(proc, "cleaning")
    proc.send_signal(signal.SIGTERM)  # a scheduler's and a parent's: the same stop
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 143 and out == "cleaned up\n" and err == "stopped by SIGTERM\n", (out, err)


def test_a_waiting_cli_passes_sigterm_to_its_child_and_stops_itself_when_it_has_none(scripts_env):
    proc = _start(f"""
        import subprocess, sys, time
        from codeparrot.child_signals import signals_passed_to_children
        from codeparrot.errors import run_cli
        def main():
            with signals_passed_to_children() as sigterm:
                code = subprocess.run([sys.executable, "-c", {CHILD!r}]).returncode
            print(f"child left with {{code}}, received {{sigterm.received}}", flush=True)
            with signals_passed_to_children():
                print("no child", flush=True)
                time.sleep(60)
        run_cli(main)
    """, scripts_env)
    _wait_for(proc, "child ready")
    proc.send_signal(signal.SIGTERM)  # the parent alone, as Kubernetes or `kill PID` does
    assert _wait_for(proc, "no child")[-3:] == ["child got SIGTERM", "child left with 143, received True", "no child"]
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 143 and err == "stopped by SIGTERM\n", (out, err)


def test_a_library_that_raises_its_own_keyboard_interrupt_for_sigterm_still_stops_as_sigterm(scripts_env):
    """Ray's ray.get/ray.wait raise a new KeyboardInterrupt when a signal handler raised inside them: a SIGTERM
    there is still `stopped by SIGTERM` (143), not Ctrl-C's `interrupted` (130)."""
    proc = _start("""
        import time
        from codeparrot.errors import run_cli
        def main():
            try:
                print("ready", flush=True)
                time.sleep(60)
            except KeyboardInterrupt:
                raise KeyboardInterrupt() from None
        run_cli(main)
    """, scripts_env)
    _wait_for(proc, "ready")
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 143 and err == "stopped by SIGTERM\n", (out, err)


def test_a_stopped_gpu_data_stage_names_the_command_that_resumes_it(scripts_env, tmp_path):
    """`make gpu-data` runs the demo's data stages: a stage it stops names `make gpu-data`, not `make demo`."""
    proc = _start(f"""
        import sys
        from codeparrot.errors import run_cli
        from codeparrot.tools import gpu_data
        from codeparrot.tools.demo import Stage
        child = "import time; print('stage ready', flush=True); time.sleep(60)"
        gpu_data.gpu_data_stages = lambda cfg, out: [Stage("export", [sys.executable, "-c", child], [])]
        run_cli(lambda: gpu_data.run_gpu_data(gpu_data.GpuDataConfig(output_dir={str(tmp_path / "out")!r})))
    """, scripts_env)
    _wait_for(proc, "stage ready")
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 143 and err.splitlines() == [
        "gpu-data stage 'export' was stopped (re-run `make gpu-data` to resume from it)", "stopped by SIGTERM"], err


def test_outside_a_cli_a_sigterm_with_no_child_keeps_its_default_action(scripts_env):
    # a notebook or a test calling run_stages / launch() directly: nothing ignored afterwards, the default kept
    proc = _start("""
        import signal, time
        from codeparrot.child_signals import signals_passed_to_children
        with signals_passed_to_children():
            pass
        print(signal.getsignal(signal.SIGTERM) == signal.SIG_DFL, flush=True)
        with signals_passed_to_children():
            print("no child", flush=True)
            time.sleep(60)
    """, scripts_env)
    assert _wait_for(proc, "no child") == ["True", "no child"]
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGTERM


def test_a_process_of_a_multi_process_launch_leaves_the_sigterm_line_to_its_launcher(scripts_env):
    # torch elastic SIGTERMs the other processes when one fails: that one's error is the only line to show
    proc = _start("""
        import time
        from codeparrot.errors import run_cli
        def main():
            print("ready", flush=True)
            time.sleep(60)
        run_cli(main)
    """, {**scripts_env, "TORCHELASTIC_RUN_ID": "none", "RANK": "0"})
    _wait_for(proc, "ready")
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 143 and err == "", (out, err)


# A child that takes a second to stop after Ctrl-C (a training run's clean-up) and counts the SIGINTs it gets.
SLOW_CHILD = ("import signal, sys, time\n"
              "def stop(*_):\n"
              "    print('child got SIGINT', flush=True)\n"
              "    time.sleep(1.0)\n"
              "    print('child stopped', flush=True)\n"
              "    sys.exit(130)\n"
              "signal.signal(signal.SIGINT, stop)\n"
              "print('child ready', flush=True)\n"
              "time.sleep(60)\n")

WAITING_CLI = f"""
    import os, subprocess, sys
    if len(sys.argv) > 1:  # a terminal: this new session's controlling one, its foreground group this process's
        os.close(os.open(sys.argv[1], os.O_RDWR))
    from codeparrot.child_signals import signals_passed_to_children
    from codeparrot.errors import run_cli
    def main():
        with signals_passed_to_children() as stop:
            code = subprocess.run([sys.executable, "-c", {SLOW_CHILD!r}]).returncode
        print(f"child left with {{code}}, interrupted {{stop.interrupted}}", flush=True)
        raise KeyboardInterrupt
    run_cli(main)
"""


def _start_session(program: str, scripts_env, *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(program), *args], env=scripts_env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)


def test_ctrl_c_to_a_waiting_cli_alone_is_passed_on_and_the_cli_waits_for_its_child(scripts_env):
    """`kill -INT PID` of a CLI without a terminal: it used to leave 0.25 s later, the child still running."""
    proc = _start_session(WAITING_CLI, scripts_env)
    _wait_for(proc, "child ready")
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert out.splitlines() == ["child got SIGINT", "child stopped", "child left with 130, interrupted True"], out
    assert proc.returncode == 130 and err == "interrupted\n", err


def test_a_terminals_ctrl_c_reaches_the_child_once_and_the_cli_waits_for_it(scripts_env):
    """The terminal signals its whole foreground group: the CLI passes nothing on (a second KeyboardInterrupt
    would cut the child's clean-up short) and still waits for the child."""
    import os
    import pty

    master, slave = pty.openpty()
    try:
        proc = _start_session(WAITING_CLI, scripts_env, os.ttyname(slave))
        _wait_for(proc, "child ready")
        os.write(master, b"\x03")  # Ctrl-C typed in the terminal
        out, err = proc.communicate(timeout=30)
    finally:
        os.close(master)
        os.close(slave)
    assert out.splitlines() == ["child got SIGINT", "child stopped", "child left with 130, interrupted True"], out
    assert proc.returncode == 130

"""`accelerate launch`, with the processes' own error as the last thing printed.

`accelerate launch` reports a failed process with a report of its own, printed after everything the processes
printed: one process gives a `CalledProcessError` traceback (silenced by `-q`), several processes give torch
elastic's ~40-line `ChildFailedError` traceback plus an `E... failed (exitcode: 2)` log line. A script's report
cannot switch that off: the launcher prints it in its own process once the children have exited. So
`scripts/launch.py` runs accelerate's own launcher in-process (same flags, same code path, same processes)
and replaces its report with at most one line:

- a process that exited with status 2 met a user error: its processes don't print it (`LAUNCHER_REPORTS_ENV`)
  but write it into torch elastic's per-process error file, and the launcher prints the first one, once, after
  every process has exited (printing it from the main process would race: torch stops the other processes as
  soon as one fails, so a rank-1 failure could stop rank 0 before it printed); exit status 2; a stall the
  watchdog reported (training/watchdog.py) likewise, exit status 75;
- any other failure (a crash whose traceback the process printed, a signal) gets one `error:` line naming
  the rank, the exit status or signal, and where its output is;
- Ctrl-C prints `interrupted` and exits 130; SIGTERM sent to the launcher alone reaches the processes
  (codeparrot/child_signals.py), and the job leaves with their status (a training run: 143 after its checkpoint).
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys

from codeparrot.child_signals import signals_passed_to_children
from codeparrot.errors import LAUNCHER_REPORTS_ENV, PREEMPTED_EXIT, REPORTED_EXITS, USER_ERROR_EXIT, Terminated

# torch elastic's loggers report each failed process ("failed (exitcode: 2) local_rank: 0 ...") and the
# SIGTERM it sends the other ranks; the one-line summary below says the same once.
QUIET_LOGGERS = "torch.distributed"


def _quiet_torch_elastic() -> None:
    """Raise every already-created torch.distributed logger to CRITICAL (they set their own level at import)."""
    for name in list(logging.Logger.manager.loggerDict):
        if name.startswith(QUIET_LOGGERS):
            logging.getLogger(name).setLevel(logging.CRITICAL)


def describe_exit(code: int) -> str:
    """'exit status 1' / 'signal 9 (SIGKILL)' for a process return code (negative = killed by that signal)."""
    if code < 0:
        try:
            return f"signal {-code} ({signal.Signals(-code).name})"
        except ValueError:
            return f"signal {-code}"
    return f"exit status {code}"


def recorded_error(message) -> tuple[str, int] | None:
    """The `error: ...` line `report_error_line` wrote into a failed process's error file (torch parses it as
    `message`) and the exit status recorded beside it (the process itself may have been stopped by a signal
    before it left with that status: another rank failed first)."""
    if not isinstance(message, dict):
        return None
    line, status = message.get("message"), (message.get("extraInfo") or {}).get("exitStatus", USER_ERROR_EXIT)
    if not isinstance(line, str) or not line.startswith("error: ") or status not in REPORTED_EXITS:
        return None
    return line, status


def failure_line(script: str, rank: int | None, code: int) -> str | None:
    """The one line that replaces the launcher's report, or None when the process printed its `error:` line."""
    if code in REPORTED_EXITS:
        return None
    where = f"rank {rank}" if rank is not None else "its process"
    hint = " (killed from outside: out of memory?)" if code == -signal.SIGKILL else "; its output is above"
    return f"error: {script} failed on {where} with {describe_exit(code)}{hint}"


def launch(argv: list[str]) -> int:
    """Run `accelerate launch ARGV` in this process; return the exit status to leave with (0 when it succeeded)."""
    # accelerate's launcher imports torch; import it only when a launch is asked for (--help stays fast)
    import torch.distributed.launcher.api  # noqa: F401
    import torch.distributed.run  # noqa: F401  (creates the elastic loggers, quietened next)
    from accelerate.commands.launch import launch_command, launch_command_parser
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    _quiet_torch_elastic()
    args = launch_command_parser().parse_args(argv)
    # `-q` makes accelerate's one-process launcher `sys.exit(1)` on any failure, hiding a user error's status 2;
    # the report is replaced below anyway, so let it raise CalledProcessError and keep the process's own status
    args.quiet = False
    script = getattr(args, "training_script", "the script")
    # read by run_cli in the processes; it only holds back its print where torch elastic gave an error file
    # (the multi-process launchers), the one-process launcher lets the process print
    os.environ[LAUNCHER_REPORTS_ENV] = "1"
    stop = None
    try:
        # accelerate's one-process launcher leaves SIGTERM to kill it and Ctrl-C to end it 0.25 s later, orphaning
        # the run: pass them on and wait (the run saves a checkpoint and leaves with 143 on SIGTERM); several
        # processes: torch elastic's agent takes them over and forwards them
        with signals_passed_to_children() as stop:
            launch_command(args)
    except ChildFailedError as err:
        # a user error any process recorded (all ranks run the same checks; the lowest rank's is shown) is the
        # cause: the other processes were stopped because of it, their SIGTERM is not news
        # (a user error, status 2, or a stall the watchdog reported, status 75: codeparrot/watchdog.py)
        recorded = sorted((rank, recorded_error(f.message)) for rank, f in err.failures.items()
                          if recorded_error(f.message))
        if recorded:
            line, status = recorded[0][1]
            print(line, file=sys.stderr, flush=True)
            return status
        rank, failure = err.get_first_failure()
        line = failure_line(script, rank, failure.exitcode)
        if line:
            print(line, file=sys.stderr, flush=True)
        # a signal has a negative code; leave with the shell's 128 + signal convention
        return failure.exitcode if failure.exitcode > 0 else 128 - failure.exitcode
    except subprocess.CalledProcessError as err:  # the one-process launcher
        if stop is not None and stop.interrupted and err.returncode in (130, -signal.SIGINT):
            if err.returncode < 0:  # killed by it, silently (130: run_cli said "interrupted" in the run)
                print("interrupted", file=sys.stderr, flush=True)
            return 130
        if stop is not None and stop.received and err.returncode == -signal.SIGTERM:
            # the SIGTERM passed on reached the run before it took SIGTERM over (while it imported torch): a stop
            print("stopped by SIGTERM", file=sys.stderr, flush=True)
            return PREEMPTED_EXIT
        line = failure_line(script, None, err.returncode)
        if line:
            print(line, file=sys.stderr, flush=True)
        return err.returncode if err.returncode > 0 else 128 - err.returncode
    except SignalException as err:  # the launcher's own SIGTERM (or SIGHUP...): forwarded, the processes waited for
        # (SIGTERM: a training run saves a checkpoint and says so itself; training/stop_signal.py)
        name = signal.Signals(err.sigval).name
        print(f"interrupted by {name}", file=sys.stderr, flush=True)
        return 128 + int(err.sigval)
    except Terminated:  # before any process started: run_cli says so
        raise
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr, flush=True)
        return 130
    return 0

"""Many command lines of the project's scripts in ONE fresh Python process, each as `python scripts/NAME.py ...`.

A bad-input test checks a dozen command lines; as a subprocess each, every one pays the interpreter start and
the torch/transformers import (3-5 s on the 2-core machine) for a check that takes milliseconds. Here a driver
process runs them in sequence, each exactly as the interpreter runs a script: `runpy.run_path(script,
run_name="__main__")` with its own `sys.argv`, its own file descriptors 1 and 2 (so what C code writes, e.g.
torch's warnings, is caught too), the exit status from `SystemExit`, and an uncaught exception printed as the
interpreter prints it (a traceback on stderr, exit status 1) so that a test asserting "no traceback" still can
fail. Between cases the warning filters are reset to the process's own, so a warning a later case triggers is
shown again as it would be in a new process. The first case of each script is the one that pays its imports (an
import-time message appears there only): keep a happy or error path of every script as a real subprocess
elsewhere, as the suites do.

`run_cases(python, env, cases) -> [subprocess.CompletedProcess]`, where each case is `(script path, argv)`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

# Runs in the child: argv[1] is the JSON file of cases, argv[2] the JSON file of results.
DRIVER = r'''
import json, os, runpy, sys, traceback, warnings

cases = json.load(open(sys.argv[1], encoding="utf-8"))
results_path = sys.argv[2]
saved_filters = list(warnings.filters)
saved_stdio = (os.dup(1), os.dup(2))
original_argv = list(sys.argv)
results = []
for script, argv in cases:
    warnings.resetwarnings()  # invalidates the "already shown" registries: a warning shows again
    warnings.filters[:] = saved_filters
    out_path, err_path = results_path + ".out", results_path + ".err"
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        sys.stdout.flush(); sys.stderr.flush()
        os.dup2(out.fileno(), 1); os.dup2(err.fileno(), 2)
    sys.stdout = open(1, "w", encoding="utf-8", errors="replace", closefd=False, buffering=1)
    sys.stderr = open(2, "w", encoding="utf-8", errors="replace", closefd=False, buffering=1)
    sys.argv = [script, *argv]
    sys.path[0] = os.path.dirname(os.path.abspath(script))  # as `python SCRIPT` sets it
    code = 0
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as stop:
        if stop.code is None:
            code = 0
        elif isinstance(stop.code, int):
            code = stop.code
        else:  # sys.exit("message"): printed on stderr, status 1, as the interpreter does
            print(stop.code, file=sys.stderr)
            code = 1
    except BaseException:  # what the interpreter would do with an uncaught exception
        traceback.print_exc()
        code = 1
    sys.stdout.flush(); sys.stderr.flush()
    os.dup2(saved_stdio[0], 1); os.dup2(saved_stdio[1], 2)
    sys.stdout, sys.stderr = sys.__stdout__, sys.__stderr__
    sys.argv, sys.path[0] = original_argv, ""
    with open(out_path, encoding="utf-8", errors="replace") as f:
        stdout = f.read()
    with open(err_path, encoding="utf-8", errors="replace") as f:
        stderr = f.read()
    results.append({"returncode": code, "stdout": stdout, "stderr": stderr})
with open(results_path, "w", encoding="utf-8") as f:
    json.dump(results, f)
'''


# `python -m accelerate.commands.launch ARGV` as a script a case can run: the same runpy call `-m` makes
ACCELERATE_LAUNCH = ("import runpy\n"
                     "runpy.run_module('accelerate.commands.launch', run_name='__main__', alter_sys=True)\n")


def accelerate_launch_script(folder: Path) -> Path:
    """A script in `folder` that runs `accelerate launch` with its own argv: `(that script, launch argv)` is a case
    that starts the launch's processes as `python -m accelerate.commands.launch ARGV` does."""
    script = folder / "accelerate_launch.py"
    script.write_text(ACCELERATE_LAUNCH, encoding="utf-8")
    return script


def run_cases(python: str, env: dict[str, str], cases: list[tuple[Path | str, list]],
              timeout: float = 300) -> list[subprocess.CompletedProcess]:
    """Run every `(script, argv)` of `cases` in one new `python` process with `env`; one CompletedProcess each
    (args = [python, script, *argv]), in order."""
    cases = [(str(script), [str(a) for a in argv]) for script, argv in cases]
    with tempfile.TemporaryDirectory(prefix="script-cases-") as folder:
        spec, results = Path(folder) / "cases.json", Path(folder) / "results.json"
        spec.write_text(json.dumps(cases), encoding="utf-8")
        done = subprocess.run([python, "-c", DRIVER, str(spec), str(results)], capture_output=True, text=True,
                              env=env, timeout=timeout)
        if done.returncode != 0 or not results.exists():
            raise AssertionError(f"the case driver itself failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
        found = json.loads(results.read_text(encoding="utf-8"))
    return [subprocess.CompletedProcess([python, script, *argv], r["returncode"], r["stdout"], r["stderr"])
            for (script, argv), r in zip(cases, found)]


if __name__ == "__main__":  # pragma: no cover - a manual check: python tests/script_cases.py scripts/x.py --help
    for result in run_cases(sys.executable, dict(os.environ), [(sys.argv[1], sys.argv[2:])]):
        print(result.returncode, result.stdout, result.stderr, sep="\n")

"""Every tool module with a `__main__` (the benchmark areas run alone, `python -m codeparrot.tools.benchmarks.<area>`)
parses its flags before it measures anything: `--help` prints and exits 0 at once, without Ray or torch (a
benchmark's `--help` used to start Ray five times and run for minutes), and an unknown flag is an error, status 2.

One interpreter runs every module twice through `runpy` (as `python -m` does), which is cheaper than a process each.
"""

from __future__ import annotations

import json
import subprocess

# Run in the child: argv[1:] are the module names. Prints one JSON object: per module and argv, the exit status
# and output; and whether ray or torch got imported along the way.
_CHILD = r"""
import contextlib, io, json, runpy, sys, warnings

warnings.simplefilter("ignore", RuntimeWarning)  # runpy: "found in sys.modules" for a module another imported
results = {}
for module in sys.argv[1:]:
    for args in (["--help"], ["--no-such-flag"]):
        out, err = io.StringIO(), io.StringIO()
        sys.argv = [module, *args]
        code = "returned"
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                runpy.run_module(module, run_name="__main__", alter_sys=True)
            except SystemExit as exit:
                code = exit.code
        results[f"{module} {args[0]}"] = {"code": code, "out": out.getvalue(), "err": err.getvalue()}
print(json.dumps({"results": results, "ray": "ray" in sys.modules, "torch": "torch" in sys.modules}))
"""


def _modules_with_main(repo_root) -> list[str]:
    tools = repo_root / "codeparrot" / "tools"
    files = sorted([*tools.glob("*.py"), *(tools / "benchmarks").glob("*.py")])
    return [".".join(f.relative_to(repo_root).with_suffix("").parts) for f in files
            if 'if __name__ == "__main__":' in f.read_text(encoding="utf-8")]


def test_every_tool_module_parses_its_flags_before_it_runs(python, scripts_env, repo_root):
    modules = _modules_with_main(repo_root)
    assert "codeparrot.tools.benchmarks.ray_engine" in modules and "codeparrot.tools.benchmarks.data" in modules
    result = subprocess.run([python, "-c", _CHILD, *modules], cwd=repo_root, env=scripts_env, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    for module in modules:
        shown, bad = report["results"][f"{module} --help"], report["results"][f"{module} --no-such-flag"]
        assert shown["code"] == 0 and shown["out"].startswith("usage: "), (module, shown)
        assert bad["code"] == 2 and "error: " in bad["err"], (module, bad)
    # the flag is named where the module's positional arguments do not come first (torch_request.py has two)
    ray_engine = report["results"]["codeparrot.tools.benchmarks.ray_engine --no-such-flag"]
    assert "unrecognized arguments: --no-such-flag" in ray_engine["err"]
    # what the benchmark measures is the description (the module's docstring)
    assert "`preprocess --engine ray` benchmark" in report["results"]["codeparrot.tools.benchmarks.ray_engine --help"][
        "out"]
    assert not report["ray"] and not report["torch"], report

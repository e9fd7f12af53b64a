"""Every script keeps its command line: the same flags, dests, defaults, nargs, required and choices as the
snapshot `cli_flags.json` (taken before the flags were generated from the stages' dataclasses), and a
`--help` that exits 0 and names every flag.

Each script runs in a subprocess with `argparse.ArgumentParser.parse_known_args` patched to print the parser
it built and exit, so nothing but the parser is exercised (no model, data or network).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from codeparrot.data.preprocess_config import available_cores

REPO_ROOT = Path(__file__).resolve().parents[2]
SNAPSHOT = json.loads((Path(__file__).with_name("cli_flags.json")).read_text(encoding="utf-8"))
SCRIPTS = sorted(SNAPSHOT)
MARK = "FLAGS-JSON "

# Defaults that depend on the machine: the snapshot holds the core count of the machine it was taken on.
MACHINE_DEFAULTS = {
    ("preprocess", "--num-workers"): available_cores,
    ("pretokenize", "--num-workers"): lambda: max(1, os.cpu_count() or 1),
}

# Run as `python -c DUMPER scripts/NAME.py`: the script runs with the argument `--help` (so that a script that
# refuses an empty command line still reaches its parser), and its first parse prints the parser as JSON and exits.
# A default that is not JSON (a Path, a function) is compared as its repr, exactly as the snapshot stored it.
DUMPER = r"""
import argparse, json, runpy, sys

def describe(parser):
    out = {}
    for a in parser._actions:
        if isinstance(a, argparse._SubParsersAction):
            out["<subcommands>"] = {name: describe(p) for name, p in sorted(a.choices.items())}
            continue
        if isinstance(a, argparse._HelpAction):
            continue
        default = a.default
        try:
            json.dumps(default)
        except TypeError:
            default = repr(default)
        out[" ".join(a.option_strings) or a.dest] = {
            "dest": a.dest, "default": default, "nargs": a.nargs, "required": a.required,
            "choices": list(a.choices) if a.choices else None}
    return out

def dump(self, args=None, namespace=None):
    print("FLAGS-JSON " + json.dumps(describe(self), sort_keys=True, default=repr))
    sys.exit(0)

argparse.ArgumentParser.parse_known_args = dump
script = sys.argv[1]
sys.argv = [script, "--help"]
runpy.run_path(script, run_name="__main__")
"""


def _env() -> dict[str, str]:
    env = dict(os.environ, HF_HUB_OFFLINE="1", WANDB_MODE="offline", TOKENIZERS_PARALLELISM="false")
    env["PYTHONPATH"] = str(REPO_ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=REPO_ROOT, env=_env(), capture_output=True, text=True,
                          timeout=180)


@pytest.fixture(scope="module")
def dumped() -> dict[str, subprocess.CompletedProcess]:
    """{script: the dumper's process}; the scripts run two at a time (most of the cost is importing)."""
    def dump(name: str) -> tuple[str, subprocess.CompletedProcess]:
        return name, _run("-c", DUMPER, f"scripts/{name}.py")

    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(pool.map(dump, SCRIPTS))


def _expected(name: str) -> dict:
    expected = json.loads(json.dumps(SNAPSHOT[name]))
    for (script, flag), default in MACHINE_DEFAULTS.items():
        if script == name:
            expected[flag]["default"] = default()
    return expected


def test_every_snapshot_script_still_exists():
    """A script renamed or removed would silently drop out of the comparison (new scripts are not in it)."""
    present = {p.stem for p in (REPO_ROOT / "scripts").glob("*.py")}
    assert [name for name in SCRIPTS if name not in present] == []


@pytest.mark.parametrize("name", SCRIPTS)
def test_flags_are_unchanged(dumped, name):
    proc = dumped[name]
    lines = [line for line in proc.stdout.splitlines() if line.startswith(MARK)]
    assert proc.returncode == 0 and lines, f"{name}: no parser dumped\n{proc.stderr[-2000:]}"
    actual, expected = json.loads(lines[0][len(MARK):]), _expected(name)
    assert sorted(actual) == sorted(expected), f"{name}: flags added/removed"
    for flag, spec in expected.items():
        assert actual[flag] == spec, f"{name} {flag}: {actual[flag]} != {spec} (snapshot)"


def _flags(spec: dict) -> list[str]:
    """Every option string (and positional dest) of a parser description, subcommands' included."""
    out = []
    for key, value in spec.items():
        if key == "<subcommands>":
            for sub in value.values():
                out += _flags(sub)
        else:
            out += key.split()
    return out


@pytest.mark.parametrize("name", SCRIPTS)
def test_help_exits_0_and_names_every_flag(name):
    subcommands = list(SNAPSHOT[name].get("<subcommands>", {}))
    texts = []
    for args in [["--help"]] + [[sub, "--help"] for sub in subcommands]:
        proc = _run(f"scripts/{name}.py", *args)
        assert proc.returncode == 0, f"{name} {' '.join(args)}: exit {proc.returncode}\n{proc.stderr[-2000:]}"
        texts.append(proc.stdout)
    text = "\n".join(texts)
    # A positional shows as its metavar: export_local's src_dirs as SRC_DIR.
    missing = [flag for flag in _flags(SNAPSHOT[name])
               if flag not in text and (flag.startswith("-") or flag.upper().rstrip("S") not in text)]
    assert missing == [], f"{name} --help does not mention {missing}"

"""Every script keeps its command line: the same flags, dests, defaults, nargs, required and choices as the
snapshot `cli_flags.json` (taken before the flags were generated from the stages' dataclasses), and a
`--help` that exits 0 and names every flag.

The scripts run in one subprocess with `argparse.ArgumentParser.parse_known_args` patched to print the parser
each built and end that script, so nothing but the parsers is exercised (no model, data or network); the
`--help` runs go through tests/script_cases.py, every script and subcommand in one more process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from codeparrot.data.preprocess_config import available_cores

from ..script_cases import run_cases

pytestmark = pytest.mark.slow(20)  # every script imported: first in `make test`'s order

REPO_ROOT = Path(__file__).resolve().parents[2]
SNAPSHOT = json.loads((Path(__file__).with_name("cli_flags.json")).read_text(encoding="utf-8"))
SCRIPTS = sorted(SNAPSHOT)
MARK = "FLAGS-JSON "

# Defaults that depend on the machine: the snapshot holds the core count of the machine it was taken on.
MACHINE_DEFAULTS = {
    ("preprocess", "--num-workers"): available_cores,
    ("pretokenize", "--num-workers"): lambda: max(1, os.cpu_count() or 1),
}

# Run as `python -c DUMPER scripts/A.py scripts/B.py ...` (one process for all: most of the cost is importing):
# each script runs with the argument `--help` (so that a script that refuses an empty command line still reaches
# its parser), and its first parse prints {script: parser} as JSON and ends that script.
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
    print("FLAGS-JSON " + json.dumps({script: describe(self)}, sort_keys=True, default=repr), flush=True)
    sys.exit(0)

argparse.ArgumentParser.parse_known_args = dump
for script in sys.argv[1:]:
    sys.argv = [script, "--help"]
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit:
        pass
"""


def _env() -> dict[str, str]:
    env = dict(os.environ, HF_HUB_OFFLINE="1", WANDB_MODE="offline", TOKENIZERS_PARALLELISM="false")
    env["PYTHONPATH"] = str(REPO_ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=REPO_ROOT, env=_env(), capture_output=True, text=True,
                          timeout=180)


@pytest.fixture(scope="module")
def dumped() -> dict[str, dict]:
    """{script: its parser as the dumper described it}, from one process running every script."""
    proc = _run("-c", DUMPER, *[f"scripts/{name}.py" for name in SCRIPTS])
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = {}
    for line in proc.stdout.splitlines():
        if line.startswith(MARK):
            found.update(json.loads(line[len(MARK):]))
    return {Path(script).stem: spec for script, spec in found.items()}


@pytest.fixture(scope="module")
def helps() -> dict[tuple[str, ...], subprocess.CompletedProcess]:
    """{(script, *args): the run of `python scripts/NAME.py [SUBCOMMAND] --help`}, every script and subcommand
    in one process (tests/script_cases.py)."""
    calls = [(name, *args) for name in SCRIPTS
             for args in [["--help"]] + [[sub, "--help"] for sub in SNAPSHOT[name].get("<subcommands>", {})]]
    results = run_cases(sys.executable, _env(), [(REPO_ROOT / "scripts" / f"{call[0]}.py", call[1:])
                                                 for call in calls], timeout=600)
    return dict(zip(calls, results))


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
    assert name in dumped, f"{name}: no parser dumped"
    actual, expected = dumped[name], _expected(name)
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
def test_help_exits_0_and_names_every_flag(helps, name):
    texts = []
    for call, proc in helps.items():
        if call[0] == name:
            args = " ".join(call[1:])
            assert proc.returncode == 0, f"{name} {args}: exit {proc.returncode}\n{proc.stderr[-2000:]}"
            texts.append(proc.stdout)
    text = "\n".join(texts)
    # A positional shows as its metavar: export_local's src_dirs as SRC_DIR.
    missing = [flag for flag in _flags(SNAPSHOT[name])
               if flag not in text and (flag.startswith("-") or flag.upper().rstrip("S") not in text)]
    assert missing == [], f"{name} --help does not mention {missing}"

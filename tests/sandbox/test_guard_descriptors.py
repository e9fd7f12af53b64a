"""The guard sees what it guards (issue 29, attack 5): an audit event names a path, not the descriptor it is
relative to, so a program opening `proc/<pid>/environ` relative to a descriptor of `/` read and listed
/proc past the guard's path rule, `os.rename` with a destination `dir_fd` moved a file out of the
workspace, and a sqlite URI (or SQL's ATTACH) created files anywhere. In guard-only mode (no namespaces,
no private uid: the guard is the last barrier) each reached the host. Now descriptors of folders outside
the workspace cannot be opened, every `dir_fd` argument is checked, sqlite URIs are refused, and where the
guard is the last barrier sqlite is refused altogether; that mode runs only with an explicit opt-in.
"""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys

import pytest

import codeparrot.sandbox
from codeparrot.sandbox import Program, SandboxConfig

from .program_preludes import AS_UNPRIVILEGED

CHECK_ONE = "def check(candidate):\n    assert candidate() == 1\n"


@pytest.fixture
def bait():
    """A process of ours (the guard-only programs' uid) holding a token in its environment."""
    token = "hf_bait_token_" + os.urandom(6).hex()
    proc = subprocess.Popen(["sleep", "60"], env={"HF_TOKEN": token, "PATH": os.environ.get("PATH", "/usr/bin")})
    yield proc.pid, token
    proc.kill()
    proc.wait()


@pytest.mark.parametrize("mode", ["guard-only", "full"])
def test_descriptor_tricks_do_not_pass_the_guard(start_box, default_box, bait, tmp_path, mode):
    if mode == "full":
        box = default_box
    else:
        box = start_box(SandboxConfig(timeout=3.0, namespaces=False, drop_privileges=False, allow_root=True))
    pid, token = bait
    tmp_path.chmod(0o777)
    host = str(tmp_path)
    cases = {
        "environ relative to a descriptor of /": "import os\ndef f():\n    root = os.open('/', os.O_RDONLY)\n"
            f"    fd = os.open('proc/{pid}/environ', os.O_RDONLY, dir_fd=root)\n"
            f"    return 1 if {token!r}.encode() in os.read(fd, 1 << 20) else 0\n",
        "/proc listed through descriptors": "import os\ndef f():\n    root = os.open('/', os.O_RDONLY)\n"
            "    proc = os.open('proc', os.O_RDONLY | os.O_DIRECTORY, dir_fd=root)\n"
            f"    return 1 if '{pid}' in os.listdir(proc) else 0\n",
        "O_PATH descriptor of /": "import os\ndef f():\n    root = os.open('/', os.O_PATH)\n"
            f"    return 1 if os.stat('proc/{pid}', dir_fd=root) else 0\n",
        "rename out through dst_dir_fd": "import os\ndef f():\n    open('loot', 'w').write('x')\n"
            f"    out = os.open({host!r}, os.O_RDONLY)\n    os.rename('loot', 'renamed', dst_dir_fd=out)\n"
            "    return 1\n",
        "replace with a workspace dst_dir_fd": "import os\ndef f():\n    open('a', 'w').write('x')\n"
            "    os.mkdir('d')\n    here = os.open('d', os.O_RDONLY)\n    os.replace('a', 'b', dst_dir_fd=here)\n"
            "    return 1\n",
        "sqlite URI": f"import sqlite3\ndef f():\n    db = sqlite3.connect('file:{host}/uri.db?mode=rwc', uri=True)\n"
            "    db.execute('create table t(a)')\n    db.commit()\n    return 1\n",
        "sqlite ATTACH": f"import sqlite3\ndef f():\n    db = sqlite3.connect(':memory:')\n"
            f"    db.execute(\"attach database '{host}/attached.db' as x\")\n    db.execute('create table x.t(a)')\n"
            "    return 1\n",
    }
    results = dict(zip(cases, box.run([Program("", code, CHECK_ONE, "f") for code in cases.values()])))
    for name, result in results.items():
        assert not result.passed, (name, result)
    assert os.listdir(host) == []  # nothing renamed, created or attached there
    for name in ("environ relative to a descriptor of /", "/proc listed through descriptors", "O_PATH descriptor of /"):
        assert results[name].detail == "sandbox refused os.open of a folder outside the workspace /", results[name]
    assert results["replace with a workspace dst_dir_fd"].detail == "sandbox refused os.rename with dir_fd"
    assert results["sqlite URI"].detail == "sandbox refused sqlite3.connect of a URI" or mode == "guard-only"
    if mode == "guard-only":  # the host's tree: the guard refuses, and is the last barrier (so: no sqlite)
        assert results["rename out through dst_dir_fd"].detail == f"sandbox refused os.open of a folder outside the " \
            f"workspace {os.path.realpath(host)}", results["rename out through dst_dir_fd"]
        for name in ("sqlite URI", "sqlite ATTACH"):
            assert results[name].detail == "sandbox refused sqlite3.connect (no read-only filesystem: the guard " \
                "is the last barrier)", results[name]
    else:  # the minimal view: the host folder does not exist there, whatever the guard says
        assert "FileNotFoundError" in results["rename out through dst_dir_fd"].detail
        assert results["sqlite ATTACH"].status == "failed", results["sqlite ATTACH"]


# As an unprivileged user without namespaces (namespaces=False: what a machine without user namespaces gets),
# the guard would be the last barrier: refused, unless explicitly accepted.
GUARD_ONLY_RUN = AS_UNPRIVILEGED + r'''
from codeparrot.errors import CodeParrotError
from codeparrot.sandbox import Program, Sandbox, SandboxConfig
got = {}
for name, config in (("default", SandboxConfig(namespaces=False, drop_privileges=False)),
                     ("opted in", SandboxConfig(namespaces=False, drop_privileges=False, allow_guard_only=True))):
    try:
        with Sandbox(config, num_workers=1) as box:
            box.start()
            program = Program("", "def f():\n    return 1\n", "def check(c):\n    assert c() == 1\n", "f")
            got[name] = box.run([program])[0].status
    except CodeParrotError as err:
        got[name] = str(err)
print(json.dumps(got))
'''


def test_guard_only_mode_needs_an_explicit_opt_in():
    out = subprocess.run([sys.executable, "-c", GUARD_ONLY_RUN], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    if "skip" in got:
        pytest.skip(got["skip"])
    assert "the audit-hook guard would be the last barrier" in got["default"], got
    assert got["opted in"] == "passed", got


def test_guard_only_mode_starts_no_process_outside_the_guard(start_box, tmp_path):
    """`subprocess` announces a spawn from Python (`sys.audit`, which a program can replace) and then calls
    `_posixsubprocess.fork_exec`, which raises no audit event: in guard-only mode with `allow_processes` (here
    as root) that ran `/bin/sh` on the host, outside the guard, and a library the program wrote could be
    mapped to run. Without a read-only view spawning is never granted (a weaker-mode note says so), and
    `_posixsubprocess` is never loaded there, not even by a preloaded module (`_asyncio` imports asyncio,
    which imports subprocess): so `import subprocess` is refused by the guard at its import, before any
    system call. `_imp.create_dynamic` builds a module under any name from its library: the guard refuses
    that name by its last part, and (test below) the library is not mapped, where the allowlist lets nothing
    more be mapped executable (with it mapped, `x._posixsubprocess` passed both)."""
    box = start_box(SandboxConfig(timeout=3.0, namespaces=False, drop_privileges=False, allow_root=True,
                                  allow_processes=True))
    tmp_path.chmod(0o777)
    marker = tmp_path / "spawned"
    # None where the interpreter has it built in (Debian's): `_imp.create_builtin` then, the allowlist's to stop
    library = next((p for d in sys.path if d.endswith("lib-dynload") for p in glob.glob(d + "/_posixsubprocess.*")),
                   None)
    cases = {
        "spawn, sys.audit replaced": "import subprocess, sys\ndef f():\n    sys.audit = lambda *args: None\n"
                                     f"    subprocess.run(['/bin/sh', '-c', 'touch {marker}'])\n    return 1\n",
        "import subprocess": "def f():\n    import subprocess\n    return 1\n",
        "import asyncio": "def f():\n    import asyncio\n    return 1\n",
        "built under another name": "import _imp\nclass Spec:\n    name = 'x._posixsubprocess'\n"
                                    f"    origin = {library!r}\n"
                                    "def f():\n    return 1 if _imp.create_dynamic(Spec).fork_exec else 0\n",
        "nothing loaded": "import sys\ndef f():\n    return 1 if not [name for name in sys.modules if "
                          "name.split('.')[0] in ('_posixsubprocess', 'subprocess', 'asyncio', '_asyncio')] else 0\n",
    }
    if library is None:
        del cases["built under another name"]
    results = dict(zip(cases, box.run([Program("", code, CHECK_ONE, "f") for code in cases.values()])))
    assert not marker.exists()
    assert results.pop("nothing loaded").passed
    for name, result in results.items():
        assert not result.passed, (name, result)
        refused = "x._posixsubprocess" if name == "built under another name" else "_posixsubprocess"
        assert result.detail == f"sandbox refused import of {refused}", (name, result)
    assert not box.layers["spawning"] and any("allow_processes" in note for note in box.layers["notes"])


# The warm-up itself, with no seccomp filter and no guard: no module it preloads brings in a module of
# NOT_PRELOADED (here `_asyncio` -> asyncio -> subprocess -> _posixsubprocess), nor even maps its library.
WARM_UP = r'''
import json, sys
sys.path.insert(0, sys.argv[1])
import zygote
zygote.warm_up({"program_seccomp": False, "seccomp": False, "readonly_root": False, "spawning": False})
with open("/proc/self/maps") as maps:
    mapped = sorted({line.split()[-1].rsplit("/", 1)[-1] for line in maps if "lib-dynload" in line})
left_out = [name for name in zygote.extension_modules()
            if name not in sys.modules and not name.startswith(zygote.NOT_PRELOADED)]
print(json.dumps({"modules": sorted(sys.modules), "mapped": mapped, "left out": left_out}))
'''


def test_the_warm_up_loads_nothing_that_spawns_or_writes_unaudited():
    folder = os.path.dirname(codeparrot.sandbox.__file__)  # server.py's siblings, imported as it does
    out = subprocess.run([sys.executable, "-I", "-S", "-c", WARM_UP, folder], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    refused = ("_posixsubprocess", "subprocess", "asyncio", "readline", "_posixshmem", "_multiprocessing", "_dbm")
    assert [name for name in got["modules"] if name.split(".")[0] in refused] == [], got["modules"]
    assert [name for name in got["mapped"] if name.split(".")[0] in refused] == [], got["mapped"]
    # All the others are loaded; `_asyncio` is not, as it imports asyncio, which imports subprocess.
    assert got["left out"] == ["_asyncio"], got

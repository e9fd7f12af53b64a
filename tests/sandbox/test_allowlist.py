"""The program's seccomp allowlist (codeparrot/sandbox/seccomp.py): what a pure-Python program needs runs,
every other kernel interface fails with an errno, and no native code but the interpreter's own can load.

Native code reaches the kernel from an interpreter the program spawns (guard off, processes allowed: the
looser, spawning variant of the filter); the default filter is tested with what a pure-Python program can
do (the import machinery, the mmap module, os.memfd_create), the guard's containment rules off. Skipped where the kernel offers no seccomp.
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import shutil
import subprocess
import time

import pytest

from codeparrot.sandbox import Program, Sandbox, SandboxConfig
from codeparrot.sandbox.seccomp import ALLOWED, ARCHES, build

# x86_64 numbers of calls a program must not make, and the arguments that make each a real attempt.
AF_UNIX, AF_INET, AF_NETLINK, AF_VSOCK, SOCK_STREAM, SOCK_RAW = 1, 2, 16, 40, 1, 3
REFUSED = {
    "memfd_create": (319, "b'x', 0"), "memfd_secret": (447, "0"),
    "io_uring_setup": (425, "8, ctypes.create_string_buffer(120)"),
    "add_key": (248, "b'user', b'k', b'v', 1, -4"), "request_key": (249, "b'user', b'k', None, -4"),
    "keyctl": (250, "0, -4, 1"), "bpf": (321, "0, ctypes.create_string_buffer(128), 128"),
    "perf_event_open": (298, "ctypes.create_string_buffer(128), 0, -1, -1, 0"), "userfaultfd": (323, "0"),
    "ptrace": (101, "16, 1, 0, 0"), "process_vm_readv": (310, "1, 0, 0, 0, 0, 0"),
    "mount": (165, "b'none', b'/tmp', b'tmpfs', 0, 0"), "unshare": (272, "0x10000000"), "setns": (308, "0, 0"),
    "pidfd_open": (434, "1, 0"), "personality": (135, "0x0400000"), "prctl": (157, "4, 1, 0, 0, 0"),
    "shmget": (29, "0, 1 << 20, 0o1000 | 0o600"), "msgget": (68, "0, 0o1000 | 0o600"),
    "mq_open": (240, "b'q', 0o100 | 2, 0o600, 0"), "socket(AF_UNIX)": (41, f"{AF_UNIX}, {SOCK_STREAM}, 0"),
    "socket(AF_INET)": (41, f"{AF_INET}, {SOCK_STREAM}, 0"), "socket(AF_NETLINK)": (41, f"{AF_NETLINK}, {SOCK_RAW}, 0"),
    "socket(AF_VSOCK)": (41, f"{AF_VSOCK}, {SOCK_STREAM}, 0"), "socketpair(AF_INET)": (53, f"{AF_INET}, {SOCK_STREAM}, 0, ctypes.create_string_buffer(8)"),
    "clone3": (435, "ctypes.create_string_buffer(88), 88"),
    "mmap(PROT_EXEC, anonymous)": (9, "0, 4096, 7, 0x22, -1, 0"), "mprotect(PROT_EXEC)": (10, "0, 4096, 5"),
    "ioctl(TIOCSTI)": (16, "0, 0x5412, ctypes.create_string_buffer(1)"),
    "setpriority": (141, "0, 0, 19"),
    # fcntl commands that make the kernel signal a process of the caller's choosing, or touch others' files
    "fcntl(F_SETOWN)": (72, "0, 8, 1"), "fcntl(F_SETOWN_EX)": (72, "0, 15, ctypes.create_string_buffer(8)"),
    "fcntl(F_SETSIG)": (72, "0, 10, 9"), "fcntl(F_SETFL, O_ASYNC)": (72, "0, 4, 0o20000"),
    "fcntl(F_SETLEASE)": (72, "0, 1024, 0"), "fcntl(F_NOTIFY)": (72, "0, 1026, 0x80000001"),
    "fcntl(F_SETPIPE_SZ)": (72, "0, 1031, 1 << 20"),
    # shared kernel objects two workers can both name (issue 29): locks on the view's inodes, shared futexes
    # (keyed by inode for file mappings), KSM merging, page-cache eviction, host-wide counters
    "flock": (73, "0, 1"), "fcntl(F_SETLK)": (72, "0, 6, ctypes.create_string_buffer(32)"),
    "fcntl(F_GETLK)": (72, "0, 5, ctypes.create_string_buffer(32)"),
    "fcntl(F_OFD_SETLK)": (72, "0, 37, ctypes.create_string_buffer(32)"),
    "futex(FUTEX_WAKE, shared)": (202, "ctypes.create_string_buffer(4), 1, 1, 0, 0, 0"),
    "futex(FUTEX_CMP_REQUEUE, shared)": (202, "ctypes.create_string_buffer(4), 4, 1, 1, 0, 0"),
    "madvise(MADV_MERGEABLE)": (28, "0, 4096, 12"), "madvise(MADV_PAGEOUT)": (28, "0, 4096, 21"),
    "sysinfo": (99, "ctypes.create_string_buffer(128)"),
}


def _start(start_box, config: SandboxConfig) -> Sandbox:
    if os.uname().machine != "x86_64":
        pytest.skip("the refused-call table of this test uses x86_64 numbers")
    box = start_box(config)
    if not box.layers["program_seccomp"]:
        pytest.skip(f"no seccomp on this kernel: {box.layers['notes']}")
    return box


@pytest.fixture(scope="module")
def kernel_box(start_box):
    """The default sandbox with the guard's containment rules off: what the kernel layers do alone."""
    return _start(start_box, SandboxConfig(timeout=5.0, guard=False))


@pytest.fixture(scope="module")
def native_box(start_box):
    """Guard off and spawning allowed, so a program can start an interpreter without any audit hook and
    run ctypes there: native code meeting only the kernel (the spawning variant of the allowlist)."""
    return _start(start_box, SandboxConfig(timeout=10.0, guard=False, allow_processes=True))


def _assert_passes(box: Sandbox, program: str, check: str) -> None:
    """Run `program` (defining f) against `check`: its assertions are what the test asserts."""
    result = box.run([Program("", program, check, "f")])[0]
    assert result.passed, result


def _native(code: str) -> str:
    """A completion whose f() runs `code` in a spawned interpreter (no audit hook) and returns its stdout
    and stderr."""
    return (f"import subprocess, sys\nCODE = {code!r}\ndef f():\n"
            "    out = subprocess.run([sys.executable, '-c', CODE], capture_output=True, text=True)\n"
            "    return out.stdout + out.stderr\n")


def test_every_route_off_the_allowlist_fails_with_an_errno(native_box):
    """Each call, made from native code, returns -1 with EPERM or ENOSYS; a socket pair of unix sockets
    (asyncio's self-pipe) and the program's signals to itself still work."""
    lines = ["import ctypes, os, socket", "libc = ctypes.CDLL(None, use_errno=True)",
             "libc.syscall.restype = ctypes.c_long", "got = {}"]
    for name, (number, args) in REFUSED.items():
        lines += ["ctypes.set_errno(0)", f"r = libc.syscall({number}{', ' if args else ''}{args})",
                  f"got[{name!r}] = (r, ctypes.get_errno())"]
    lines += ["a, b = socket.socketpair()", "a.send(b'ok')", "got['socketpair'] = b.recv(2)",
              "os.kill(os.getpid(), 0)",
              "word = ctypes.create_string_buffer(4)",  # a private futex wake (what glibc does) still works
              "got['private futex'] = (libc.syscall(202, word, 1 | 128, 1, 0, 0, 0), ctypes.get_errno())",
              "print(repr(got))"]
    check = ("def check(candidate):\n    out = candidate()\n    got = eval(out)\n"
             "    assert got.pop('socketpair') == b'ok', out\n    assert got.pop('private futex')[0] == 0, out\n"
             "    let = {k: v for k, v in got.items() if not (v[0] == -1 and v[1] in (1, 38))}\n"
             "    assert not let, let\n    assert len(got) == %d, out\n" % len(REFUSED))
    _assert_passes(native_box, _native("\n".join(lines) + "\n"), check)


def test_threads_asyncio_and_the_standard_library_work_under_the_filter(kernel_box):
    """What the allowlist was measured on: threads, a thread pool, an epoll loop over a socket pair (what
    asyncio does; asyncio itself rebuilds code objects at import, which the guard's integrity rules
    refuse), temporary files, clocks, compression, sqlite, decimal (extension modules the program loads),
    hashing."""
    program = ("import select, socket, concurrent.futures, decimal, hashlib, lzma, sqlite3, tempfile, threading, time, zlib\n"
               "def f():\n    out = []\n    t = threading.Thread(target=out.append, args=(1,)); t.start(); t.join()\n"
               "    with concurrent.futures.ThreadPoolExecutor(2) as pool:\n        out += list(pool.map(abs, [-2, -3]))\n"
               "    a, b = socket.socketpair(); poll = select.epoll(); poll.register(b, select.EPOLLIN)\n"
               "    a.send(b'4'); poll.poll(1); out.append(int(b.recv(1)))\n"
               "    with tempfile.TemporaryDirectory() as d:\n        open(d + '/x', 'w').write('5')\n"
               "        out.append(int(open(d + '/x').read()))\n"
               "    db = sqlite3.connect(':memory:'); out.append(db.execute('select 6').fetchone()[0])\n"
               "    out.append(int(decimal.Decimal('7.0')))\n    out.append(len(lzma.compress(zlib.compress(b'8'))) > 0)\n"
               "    out.append(hashlib.sha256(b'').hexdigest()[:2])\n    time.sleep(0.001)\n    return out\n")
    _assert_passes(kernel_box, program, "def check(candidate):\n    assert candidate() == [1, 2, 3, 4, 5, 6, 7, True, 'e3']\n")


def test_fcntl_works_for_flags_and_duplicates_but_takes_no_lock(kernel_box):
    """What programs use fcntl for passes the allowlist's command rule: status and descriptor flags
    (non-blocking, close-on-exec), duplicates, the pipe size. Locks do not: record, open-file-description and
    flock locks on the shared view are a channel between workers (test_concurrent_samples.py), so each lock
    call fails with an errno (EPERM from the fcntl rule, ENOSYS for flock, off the list)."""
    program = ("import errno, fcntl, os, struct\ndef f():\n    r, w = os.pipe()\n    os.set_blocking(r, False)\n"
               "    out = [os.get_blocking(r)]\n    os.set_inheritable(w, True)\n"
               "    out.append(os.get_inheritable(w))\n"
               "    out.append(fcntl.fcntl(r, fcntl.F_DUPFD, 20) >= 20)\n"
               "    out.append(fcntl.fcntl(r, fcntl.F_DUPFD_CLOEXEC, 30) >= 30)\n"
               "    out.append(fcntl.fcntl(r, fcntl.F_GETPIPE_SZ) > 0)\n"
               "    lock = struct.pack('h', fcntl.F_WRLCK) + bytes(30)\n"
               "    with open('locked', 'w') as f:\n"
               "        for attempt in (lambda: fcntl.lockf(f, fcntl.LOCK_EX), lambda: fcntl.flock(f, fcntl.LOCK_SH),\n"
               "                        lambda: fcntl.fcntl(f, fcntl.F_OFD_SETLK, lock),\n"
               "                        lambda: fcntl.fcntl(f, fcntl.F_GETLK, lock)):\n"
               "            try:\n                attempt()\n                out.append('locked')\n"
               "            except OSError as err:\n                out.append(errno.errorcode[err.errno])\n"
               "    return out\n")
    _assert_passes(kernel_box, program, "def check(candidate):\n    got = candidate()\n"
                   "    assert got == [False, True, True, True, True, 'EPERM', 'ENOSYS', 'EPERM', 'EPERM'], got\n")


def test_no_host_wide_counter_is_in_reach(kernel_box):
    """What a program running beside another could read to hear it (its locks, its thread count, its memory,
    its CPU time): the program's /proc holds its own process folders only (`subset=pid`), and `sysinfo` is
    off the allowlist (before: /proc/loadavg's thread count carried 50 bits/s between two programs)."""
    if not kernel_box.layers.get("fresh_proc") or kernel_box.layers.get("proc_options", "") is None:
        pytest.skip(f"no /proc of the program's own, or no subset=pid on this kernel: {kernel_box.layers['notes']}")
    program = ("import os\ndef f():\n    return [p for p in ('/proc/locks', '/proc/loadavg', '/proc/meminfo', "
               "'/proc/stat', '/proc/sys/fs/file-nr', '/proc/pressure/cpu') if os.path.exists(p)]\n")
    _assert_passes(kernel_box, program, "def check(candidate):\n    got = candidate()\n    assert got == [], got\n")


def test_fcntl_cannot_signal_another_process(start_box):
    """Guard-only mode (no PID namespace, no private uid: a host process is in reach and `kill` is refused
    by the filter's signal rule), the program asks the kernel to do the kill for it: F_SETOWN names the
    victim, F_SETSIG picks SIGKILL, O_ASYNC arms the pipe, a write fires it. Each step is refused and the
    victim (a process of the same uid) lives; without the fcntl rule it was SIGKILLed."""
    box = start_box(SandboxConfig(timeout=5.0, namespaces=False, drop_privileges=False, allow_root=True))
    if not box.layers["program_seccomp"]:
        pytest.skip(f"no seccomp on this kernel: {box.layers['notes']}")
    victim = subprocess.Popen(["sleep", "60"])
    try:
        attack = ("import fcntl, os, signal\ndef f():\n    got = []\n    for n in range(3):\n"
                  "        r, w = os.pipe()\n        steps = [(fcntl.F_SETOWN, %d), (10, signal.SIGKILL),\n"
                  "                 (fcntl.F_SETFL, fcntl.fcntl(r, fcntl.F_GETFL) | os.O_ASYNC)]\n"
                  "        if n == 1:\n            steps = steps[1:] + steps[:1]\n"
                  "        for command, arg in steps:\n            try:\n                fcntl.fcntl(r, command, arg)\n"
                  "                got.append('ok')\n            except OSError as err:\n"
                  "                got.append(err.errno)\n        os.write(w, b'x')\n    return got\n") % victim.pid
        result = box.run([Program("", attack, "def check(candidate):\n    raise RuntimeError(candidate())\n", "f")])[0]
        time.sleep(0.2)
        assert victim.poll() is None, (victim.returncode, result)
        assert result.detail == "RuntimeError: " + repr([1] * 9), result
    finally:
        victim.kill()
        victim.wait()


def test_every_extension_module_of_the_interpreter_loads(kernel_box):
    """The interpreter's own native code is not caught by the executable-memory rule: every module of
    lib-dynload imports (but _tkinter, no display; _asyncio, whose import rebuilds code objects, an event
    the guard's integrity rules refuse)."""
    program = ("import os, sys\ndef f():\n    failed = []\n    for folder in sys.path:\n"
               "        if os.path.basename(folder) != 'lib-dynload':\n            continue\n"
               "        for name in sorted(os.listdir(folder)):\n            module = name.split('.')[0]\n"
               "            if name.endswith('.so') and module not in ('_tkinter', '_asyncio'):\n"
               "                try:\n                    __import__(module)\n"
               "                except ImportError as err:\n                    failed.append((module, str(err)[-60:]))\n"
               "    return failed\n")
    _assert_passes(kernel_box, program, "def check(candidate):\n    failed = candidate()\n    assert failed == [], failed\n")


# A loadable extension module without Python headers: dlopen succeeds, then its init fails (returns NULL),
# which tells "loaded" apart from "refused before any of it could run".
NATIVE_SOURCE = "int codeparrot_answer(void) { return 42; }\nvoid *PyInit_answer(void) { return 0; }\n"


@pytest.fixture(scope="module")
def shared_library(tmp_path_factory):
    """A small shared library built now with the C compiler; it loads in this process (positive control)."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler (cc) to build a native library at test time")
    folder = tmp_path_factory.mktemp("native")
    (folder / "answer.c").write_text(NATIVE_SOURCE)
    subprocess.run([compiler, "-shared", "-fPIC", "-o", str(folder / "answer.so"), str(folder / "answer.c")],
                   check=True, capture_output=True)
    assert ctypes.CDLL(str(folder / "answer.so")).codeparrot_answer() == 42
    spec = importlib.util.spec_from_file_location("answer", folder / "answer.so")
    with pytest.raises(SystemError):  # dlopen worked, the init ran: what "loaded" looks like
        importlib.util.module_from_spec(spec)
    return (folder / "answer.so").read_bytes()


IMPORT_ROUTES = r"""import importlib.machinery, importlib.util, mmap, os
def load(path):
    try:
        loader = importlib.machinery.ExtensionFileLoader('answer', path)  # whatever the file name
        importlib.util.module_from_spec(importlib.util.spec_from_file_location('answer', path, loader=loader))
    except SystemError:
        return 'loaded'
    except ImportError as err:
        return str(err)[-70:]
    return 'loaded'
def routes(data):
    got = {}
    open('answer.so', 'wb').write(data)
    got['workspace file'] = load(os.path.abspath('answer.so'))
    try:
        fd = os.memfd_create('x')
        os.write(fd, data)
        got['memfd'] = load('/proc/self/fd/%d' % fd)
    except OSError as err:
        got['memfd'] = str(err)
    try:
        with open('/dev/shm/answer.so', 'wb') as out:
            out.write(data)
        got['/dev/shm'] = load('/dev/shm/answer.so')
    except OSError as err:
        got['/dev/shm'] = str(err)
    try:
        mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
        got['anonymous exec'] = 'loaded'
    except OSError as err:
        got['anonymous exec'] = str(err)
    try:  # a private, writable, executable copy of a file it may read (the interpreter): W^X says no
        import sys
        with open(sys.executable, 'rb') as binary:
            mmap.mmap(binary.fileno(), 4096, flags=mmap.MAP_PRIVATE,
                      prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
        got['writable exec copy'] = 'loaded'
    except OSError as err:
        got['writable exec copy'] = str(err)
    try:
        with open('/dev/zero', 'rb') as zero:
            mmap.mmap(zero.fileno(), 4096, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_EXEC)
        got['/dev/zero exec'] = 'loaded'
    except OSError as err:
        got['/dev/zero exec'] = str(err)
    return got
"""
CHECK_NOTHING_LOADED = ("def check(candidate):\n    got = candidate()\n    got = eval(got) if isinstance(got, str) else got\n"
                        "    assert len(got) >= 6, got\n    assert 'loaded' not in got.values(), got\n")


def test_no_native_code_of_a_python_program_loads(kernel_box, shared_library):
    """The default filter: the library arrives as bytes in the completion; written to the workspace, to a
    memfd or to /dev/shm and imported, or as anonymous or /dev/zero executable memory, none of it runs."""
    _assert_passes(kernel_box, IMPORT_ROUTES + f"DATA = {shared_library!r}\ndef f():\n    return routes(DATA)\n",
                   CHECK_NOTHING_LOADED)


def test_no_native_code_loads_even_from_native_code(native_box, shared_library):
    """From a spawned interpreter without audit hook (spawning variant of the filter), the same routes plus
    ctypes.CDLL of the workspace file and of an unlinked file through /proc/self/fd: none runs."""
    code = IMPORT_ROUTES + f"""import ctypes
DATA = {shared_library!r}
got = routes(DATA)
def cdll(path):
    try:
        return ctypes.CDLL(path).codeparrot_answer() == 42 and 'loaded'
    except OSError as err:
        return str(err)[-70:]
got['ctypes workspace'] = cdll(os.path.abspath('answer.so'))
fd = os.open('unlinked.so', os.O_RDWR | os.O_CREAT, 0o700)
os.write(fd, DATA)
os.unlink('unlinked.so')
got['ctypes unlinked'] = cdll('/proc/self/fd/%d' % fd)
print(repr(got))
"""
    _assert_passes(native_box, _native(code), CHECK_NOTHING_LOADED)


def test_the_filter_holds_only_measured_calls():
    """No dangerous call on the allowlist (a regression guard for edits to it), and the filter assembles for
    every architecture it has a table for, with and without spawning."""
    assert not ({"memfd_create", "memfd_secret", "io_uring_setup", "io_uring_enter", "bpf", "ptrace", "keyctl",
                 "add_key", "socket", "userfaultfd", "perf_event_open", "mount", "unshare", "setns", "prctl",
                 "shmget", "shmat", "flock", "futex", "madvise"} & ALLOWED)  # futex, madvise: restricted
    for machine in ARCHES:
        for spawning, exec_files in ((False, False), (False, True), (True, True)):
            assert 0 < build(1, True, spawning, exec_files, machine=machine).len <= 4096

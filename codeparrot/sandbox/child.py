"""What runs inside a sandboxed program's process: the audit-hook guard and the program (stdlib only).

Loaded by the sandbox worker (`server.py`, a `python -I -S` process); its functions run in a freshly forked
child that already has its limits, namespaces, seccomp filter and unprivileged uid (see `client.py` for
the layers).

Two ways to run a program:
- `serve_candidate` (every job with an entry point, the default): execute prompt + completion, then
  answer the trusted checker's calls of the entry point over plain-data pipes (`channel.py`). The verdict
  is decided in the checker's process (`checker.py`), which the program cannot reach: nothing in this
  process (no nonce, no checker frame, no module or builtin the test uses) takes part in it.
- `run_program` (the in-process fallback: no entry point, or, only with `in_process_fallback=True`, a
  test that passes arguments that are not plain data; such results are marked `in-process (why)`): the
  test runs here, after the program, with
  the integrity measures below. Best effort only: code in the same interpreter can in principle reach it.

The guard's lines. The audit hook writes on the result pipe (fd 3): `D <nonce> <event>` when it refuses an
event, `F <nonce> <exception>` for a failure detail (raised as the event `codeparrot.fail` by `_fail`,
called from the frame that raised the first `codeparrot.start`, before any program code ran), and, in the
fallback only, `P <nonce>` for a pass (the event `codeparrot.report`, accepted only from `_after_program`
called directly by that frame, after `check(candidate)` returned). The 32-hex-digit nonce is read from a
pipe the server fills after the fork and kept only in the hook's closure (never in argv, env, files,
globals, or a frame program code can reach without frame walking), so lines the program writes are only
output; in isolated mode the server ignores `P` lines altogether.

The fallback's integrity measures. The test runs in its own namespace: builtins are a snapshot taken
before the program ran (a completion that shadows or patches `abs`, `isinstance`, `len`, `AssertionError`...
does not affect the test; `assert` itself raises the C-level AssertionError); prompt helpers the test calls
(e.g. `poly` in HumanEval/32) come from executing the prompt alone, not from the completion's
redefinitions; modules the prompt or test import that were already loaded get their pre-program contents
back (undoing `math.fabs = ...`), and modules the program loaded are dropped so the test imports fresh
ones. Everything the checker uses after program code has run was bound before it ran (a test checks the
bytecode).

Guard events refused always ("integrity"): ctypes, gc introspection (get_objects/referrers/referents),
function/code construction, sys.settrace/setprofile/_current_frames/addaudithook, sub-interpreters,
opening /proc/*/mem. Refused with `contain=True` ("containment", the only barrier when the kernel offers
no namespaces): sockets, fork/exec/spawn/subprocess/system, signals to other processes, rlimit changes,
writes/removals/renames outside the workspace, symlinks/hardlinks, any path under /proc (opened, listed
or scanned), non-string paths. Paths are resolved the way the kernel does (symlinks followed, `..` after
them, with `os.lstat`/`os.readlink` bound before program code runs), so `/dev/fd/../../<pid>/environ`
is a /proc path and `/dev/fd/../../self/cwd/../../../x` is outside the workspace; a path that passes
through /proc on the way counts as /proc. `os.open` may carry a `dir_fd` the hook cannot see: there a
relative path with `..` is refused. A refused event ends the process at once (`D <nonce> <event>` on the
result pipe): no exception that program code could catch, and no traceback holding the hook's frame.

Not prevented in the fallback (documented limits; the isolated checker is immune to all of them): a
candidate returning an object whose `__eq__` always says True; code that walks interpreter frames
(sys._getframe / tracebacks, which stdlib modules need) or runs a signal handler inside the hook to reach
the nonce or patch the test's namespace; `dup2` over the result pipe; import hooks left in
`sys.meta_path`. None of them weakens containment, which the operating system enforces. In guard-only
mode, native code is out of any audit hook's reach: ctypes is refused (its dlopen/dlsym/call events), but
a syscall made from native code some other way (a memory-corruption bug) is not seen by the guard; the
seccomp allowlist the worker installs (`seccomp.py`) is what limits the kernel interface there, and it
refuses new executable memory, so no extension module the program brings can load at all.
Functions that signal other processes without an audit event (`os.pidfd_open`,
`signal.pidfd_send_signal`, ...) are removed before the guard installs, a speed bump only.
"""

import os
import sys

_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC
_INTEGRITY = frozenset({
    "gc.get_objects", "gc.get_referrers", "gc.get_referents", "function.__new__", "code.__new__",
    "sys.settrace", "sys.setprofile", "sys._current_frames", "sys.addaudithook",
    "cpython.PyInterpreterState_New", "cpython.run_command", "cpython.run_file", "cpython.run_module",
})
_CONTAIN = frozenset({
    "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork", "os.forkpty", "subprocess.Popen",
    "os.killpg", "signal.pthread_kill", "os.symlink", "os.link", "resource.setrlimit", "resource.prlimit",
    "syslog.openlog", "syslog.syslog", "os.chroot", "webbrowser.open", "os.startfile", "pty.spawn",
    "os.mkfifo", "os.mknod", "os.chflags", "os.lchflags", "os.setxattr", "os.removexattr",
})
# Path-taking events: (index of the path argument(s), index of dir_fd or None). Checked after resolving
# symlinks; the last component is followed except for these (they act on the link itself).
_NO_FOLLOW = frozenset({"os.remove", "os.rmdir", "os.mkdir", "os.rename", "shutil.rmtree", "shutil.move"})
_PATH_EVENTS = {
    "os.remove": ((0,), 1), "os.rmdir": ((0,), 1), "os.mkdir": ((0,), 2), "os.rename": ((0, 1), 2),
    "os.truncate": ((0,), None), "os.chmod": ((0,), 2), "os.chown": ((0,), 3), "os.utime": ((0,), 3),
    "os.chdir": ((0,), None), "shutil.rmtree": ((0,), 1), "shutil.move": ((0, 1), None),
    "shutil.copyfile": ((1,), None), "shutil.copytree": ((1,), None), "sqlite3.connect": ((0,), None),
}
# A fresh import of posix/_signal would bring back the functions zygote.py removed.
_NO_IMPORT = frozenset({"_posixsubprocess", "_xxsubinterpreters", "_xxinterpchannels", "posix", "_signal"})


def install_guard(nonce_fd: int, result_fd: int, workspace: str, contain: bool, reporter, failer) -> None:
    """Read the nonce from `nonce_fd` and install the audit hook. Everything the hook touches is bound to
    a local here, so patching builtins or modules later cannot change what the hook does."""
    _read, _close, _write, _exit, _getpid = os.read, os.close, os.write, os._exit, os.getpid
    _getcwd, _getframe, _type, _str, _bytes, _int, _len = os.getcwd, sys._getframe, type, str, bytes, int, len
    _lstat, _readlink, _item, _OSError = os.lstat, os.readlink, tuple.__getitem__, OSError  # stat_result is patchable
    _BaseException = BaseException
    integrity, contain_events, path_events, no_import = _INTEGRITY, _CONTAIN, _PATH_EVENTS, _NO_IMPORT
    no_follow, write_flags = _NO_FOLLOW, _WRITE_FLAGS
    nonce = b""
    while _len(nonce) < 32:
        chunk = _read(nonce_fd, 32 - _len(nonce))
        if not chunk:
            break
        nonce += chunk
    _close(nonce_fd)
    me = _getpid()
    state = [None, False]  # [checker frame, reported]

    def deny(event):
        try:
            _write(result_fd, b"D " + nonce + b" " + event.encode("ascii", "replace")[:120] + b"\n")
        finally:
            _exit(252)

    def absolute(path):
        """An exact str/bytes path made absolute against the working directory (as a str), or None."""
        if _type(path) is _bytes:
            path = path.decode("utf-8", "surrogateescape")
        elif _type(path) is not _str:
            return None
        if not path.startswith("/"):
            path = _getcwd() + "/" + path
        return path

    def resolve(path, follow_last):
        """(resolved path, passed through /proc) of an absolute path, the way the kernel walks it: each
        symlink replaced by its target, `..` applied to what it resolved to. A component that does not
        exist (or cannot be examined) is kept as written, like the kernel creating or failing there."""
        todo = path.split("/")
        todo.reverse()
        done, proc, links = "", False, 0
        while todo:
            part = todo.pop()
            if part == "" or part == ".":
                continue
            if part == "..":
                done = done[:done.rfind("/")] if done else ""
                continue
            candidate = done + "/" + part
            if candidate == "/proc" or candidate.startswith("/proc/"):
                proc = True
            if not todo and not follow_last:
                done = candidate
                break
            try:
                mode = _item(_lstat(candidate), 0)
            except _OSError:
                done = candidate
                continue
            if mode & 0o170000 != 0o120000:  # not a symlink
                done = candidate
                continue
            links += 1
            if links > 40:  # the kernel's ELOOP
                return candidate, proc
            target = _readlink(candidate)
            if target.startswith("/"):
                done = ""
            more = target.split("/")
            more.reverse()
            todo.extend(more)
        return done or "/", proc

    ws = resolve(workspace, True)[0]

    def inside(path):
        return path is not None and (path == ws or path.startswith(ws + "/"))

    def exact(value, kind):
        return _type(value) is kind  # identity: never calls program code (no __eq__/__hash__ of a subclass)

    def check(event, args):
        if event in integrity or event.startswith("ctypes."):
            deny(event)
        if event == "open":
            path, mode, flags = args
            if exact(path, _int):
                return
            full = absolute(path)
            if full is None:
                deny("open of a non-string path")
            real, proc = resolve(full, True)
            tail = real.rsplit("/", 1)[-1]
            if (proc and tail == "mem") or (mode is None and full.rsplit("/", 1)[-1] == "mem"):
                deny("open " + real)
            if contain:
                if proc:
                    deny("open " + real)
                relative = not (path.startswith("/") if exact(path, _str) else path.startswith(b"/"))
                if mode is None and relative and ".." in full.split("/"):  # os.open with an unseen dir_fd
                    deny("os.open of a relative path with ..")
                writing = exact(flags, _int) and flags & write_flags
                if writing and (not inside(real) or (mode is None and relative)):
                    deny("open for writing " + real)
        elif event == "codeparrot.start":
            if state[0] is None:
                state[0] = _getframe(2)
        elif event == "codeparrot.report":  # from `reporter`'s code, called directly by the registered frame
            frame = _getframe(2)
            if state[0] is not None and not state[1] and frame.f_code is reporter and frame.f_back is state[0]:
                state[1] = True
                _write(result_fd, b"P " + nonce + b"\n")
        elif event == "codeparrot.fail":  # from `failer`'s code, called by the registered frame or `reporter`
            frame = _getframe(2)
            caller = frame.f_back
            if (state[0] is not None and frame.f_code is failer and exact(args[0], _str)
                    and (caller is state[0] or (caller.f_code is reporter and caller.f_back is state[0]))):
                _write(result_fd, b"F " + nonce + b" " + args[0].encode("utf-8", "replace") + b"\n")
        elif not contain:
            return
        elif event in contain_events or event.startswith("socket."):
            deny(event)
        elif event == "import":
            if not exact(args[0], _str) or args[0] in no_import:
                deny("import of " + (args[0] if exact(args[0], _str) else "a non-string name"))
        elif event == "os.kill":
            if not exact(args[0], _int) or args[0] != me:
                deny(event)
        elif event == "os.listdir" or event == "os.scandir":
            target = args[0]
            if target is None or exact(target, _int):  # the working directory, or an fd opened through us
                return
            full = absolute(target)
            if full is None:
                deny(event + " of a non-string path")
            real, proc = resolve(full, True)
            if proc:
                deny(event + " " + real)
        elif event in path_events:
            where, dir_fd_at = path_events[event]
            if dir_fd_at is not None and _len(args) > dir_fd_at:
                dir_fd = args[dir_fd_at]
                if not (dir_fd is None or (exact(dir_fd, _int) and (dir_fd == -1 or dir_fd == -100))):
                    deny(event + " with dir_fd")
            for i in where:
                if exact(args[i], _int) or (exact(args[i], _str) and event == "sqlite3.connect"
                                            and args[i] == ":memory:"):
                    continue
                full = absolute(args[i])
                if full is None or not inside(resolve(full, event not in no_follow)[0]):
                    deny(event + " outside the workspace")

    def hook(event, args):
        try:
            check(event, args)
        except _BaseException as err:  # never let an exception (and its traceback to our frames) escape
            deny("guard error " + _type(err).__name__)

    sys.addaudithook(hook)


def run_program(job: dict, result_fd: int) -> None:
    """Execute prompt + completion, then the test and `check(candidate)`; report through the audit hook.

    Never returns: the process ends with os._exit. Failure details go through the guard (`_fail` raises
    `codeparrot.fail`), which writes `F <nonce> <ExceptionType>: <message>` to `result_fd`.
    """
    import builtins

    prompt, completion, test, entry_point = job["prompt"], job["completion"], job["test"], job.get("entry_point")
    # Modules the prompt or test import that are already loaded: their contents now, restored before the test.
    snapshots = [(name, sys.modules[name], dict(vars(sys.modules[name])))
                 for name in _imported_modules(prompt + "\n" + test) if name in sys.modules]
    # Bind everything used after program code has run (the program may patch builtins and modules).
    b = {"exec": exec, "compile": compile, "dict": dict, "set": set, "list": list, "type": type, "str": str,
         "BaseException": BaseException, "write": os.write, "exit": os._exit, "audit": sys.audit, "sys": sys,
         "setattr": setattr, "modules": sys.modules, "baseline": set(sys.modules),
         "pristine": dict(builtins.__dict__), "result_fd": result_fd, "snapshots": snapshots, "vars": vars,
         "after": _after_program, "fail": _fail}
    b["audit"]("codeparrot.start")  # registers this frame as the only one allowed to report a pass
    try:
        program = compile(prompt + completion, "<program>", "exec")
        test_code = compile(test, "<test>", "exec")
    except BaseException as err:
        _fail(b, "", err)
    helpers = None
    if prompt:  # the prompt alone (trusted problem text): the helpers the test may call, unpatched
        helpers = {"__builtins__": dict(b["pristine"]), "__name__": "__sandbox__"}
        try:
            exec(compile(prompt, "<prompt>", "exec"), helpers)
        except BaseException:
            helpers = None
    program_ns = {"__builtins__": builtins, "__name__": "__sandbox__"}
    fail, after = b["fail"], b["after"]
    caught = b["BaseException"]
    try:
        exec(program, program_ns)
    except caught as err:
        fail(b, "while running the program: ", err)
    after(b, program_ns, helpers, test_code, entry_point)


def _imported_modules(source: str) -> list[str]:
    """Absolute module names (and their parents) named by import statements in `source`; a line scan,
    enough for test code (an import the scan misses is only left unrestored, never mis-executed)."""
    names = []
    for line in source.splitlines():
        line = line.strip()
        if line.startswith("import "):
            targets = [part.split(" as ")[0].strip() for part in line[7:].split(",")]
        elif line.startswith("from ") and " import " in line:
            targets = [line[5:].split(" import ")[0].strip()]
        else:
            continue
        for target in targets:
            parts = target.split(".")
            if all(p.isidentifier() for p in parts):
                names.extend(".".join(parts[:i]) for i in range(1, len(parts) + 1))
    return list(dict.fromkeys(names))


def _fail(b: dict, prefix: str, err=None) -> None:
    """Write `F <prefix><Type>: <message>` and exit. Uses only the bound names in `b`."""
    text = prefix
    if err is not None:
        try:
            text += b["type"](err).__name__ + ": " + b["str"](err)[:400]
        except b["BaseException"]:
            text += "<unprintable exception>"
    try:
        b["audit"]("codeparrot.fail", text.replace("\n", " ")[:500])  # the guard writes it, with the nonce
    finally:
        b["exit"](1)


def _after_program(b, program_ns, helpers, test_code, entry_point):
    """Build the test's namespace, run the test and `check(candidate)`, report. Reads no global name:
    everything comes from `b`, bound before the program ran (a test checks this on the bytecode)."""
    _dict, _str, _type, BaseExc, modules, fail = b["dict"], b["str"], b["type"], b["BaseException"], \
        b["modules"], b["fail"]
    for name, module, contents in b["snapshots"]:  # undo patches like `math.fabs = lambda x: 0`
        namespace = b["vars"](module)
        _dict.clear(namespace)
        _dict.update(namespace, contents)
        modules[name] = module
    if _type(modules) is _dict:
        for name in b["list"](modules):
            if name not in b["baseline"]:
                del modules[name]
    b["setattr"](b["sys"], "modules", modules)
    pristine = b["pristine"]
    test_ns = {"__builtins__": _dict(pristine), "__name__": "__sandbox__"}
    source = helpers if helpers is not None else program_ns
    for name, value in _dict.items(source):
        if _type(name) is _str and not _str.startswith(name, "__") and name not in pristine:
            test_ns[name] = value
    candidate = None
    if entry_point:
        if entry_point not in program_ns:
            fail(b, "NameError: the program does not define " + entry_point)
        test_ns[entry_point] = candidate = program_ns[entry_point]
    try:
        b["exec"](test_code, test_ns)
        if entry_point:
            check = _dict.get(test_ns, "check")
            if check is None:
                fail(b, "NameError: the test does not define check()")
            check(candidate)
    except BaseExc as err:
        fail(b, "", err)
    b["audit"]("codeparrot.report")
    b["exit"](0)


REPORTER_CODE = _after_program.__code__  # the only code allowed to raise `codeparrot.report`
FAILER_CODE = _fail.__code__  # the only code allowed to raise `codeparrot.fail`


def serve_candidate(job: dict, call_fd: int, reply_fd: int, channel) -> None:
    """The untrusted half of the isolated check: execute prompt + completion, greet the checker, then
    answer its calls of the entry point (plain data in, plain data out; see `channel`) until it hangs up.

    Nothing here decides the verdict: the checker, in another process, does. A program that patches this
    loop, writes its own frames or never answers only breaks its own answers. Failures before the greeting
    (syntax error, an exception at module level, no entry point) go through the guard's `F` line, so the
    harness can say why the program ended. Never returns.
    """
    import builtins

    b = {"type": type, "str": str, "BaseException": BaseException, "audit": sys.audit, "exit": os._exit}
    b["audit"]("codeparrot.start")  # this frame may report failure details (see _fail)
    entry_point = job["entry_point"]
    namespace = {"__builtins__": builtins, "__name__": "__sandbox__"}
    try:
        program = compile(job["prompt"] + job["completion"], "<program>", "exec")
    except BaseException as err:
        _fail(b, "", err)
    try:
        exec(program, namespace)
    except BaseException as err:
        _fail(b, "while running the program: ", err)
    function = namespace.get(entry_point)
    if not callable(function):
        _fail(b, "NameError: the program does not define " + entry_point)
    send, receive, loads, dumps, encode, decode = (channel.send, channel.receive, channel.loads, channel.dumps,
                                                   channel.encode, channel.decode)
    try:
        send(reply_fd, b'"ready"')
        while True:
            frame = receive(call_fd)
            if frame is None:  # the checker is done
                os._exit(0)
            args, kwargs = decode(loads(frame))
            try:
                reply = {"ok": encode(function(*args, **kwargs), exact=False)}
            except BaseException as err:  # the candidate's exception, by name: the checker re-raises it
                try:
                    reply = {"raise": [type(err).__name__, str(err)[:400]]}
                except BaseException:
                    reply = {"raise": [type(err).__name__, "<unprintable>"]}
            send(reply_fd, dumps(reply))
    except BaseException as err:
        _fail(b, "call channel: ", err)

"""What runs inside a sandboxed program's process: the program itself (stdlib only).

Loaded by the sandbox worker (`server.py`, a `python -I -S` process); its functions run in a freshly forked
child that already has its limits, namespaces, seccomp filter, unprivileged uid and the audit-hook guard
(`guard.py`; see `client.py` for the layers).

Two ways to run a program:
- `serve_candidate` (every job with an entry point, the default): execute prompt + completion, then
  answer the trusted checker's calls of the entry point over plain-data pipes (`channel.py`). The verdict
  is decided in the checker's process (`checker.py`), which the program cannot reach: nothing in this
  process (no nonce, no checker frame, no module or builtin the test uses) takes part in it, and the calls
  it receives are the same whether its answers are right or wrong (`rewrite.py`).
- `run_program` (the in-process fallback: no entry point, or, only with `in_process_fallback=True`, a
  test that passes arguments that are not plain data; such results are marked `in-process (why)`): the
  test runs here, after the program, with the integrity measures below. Best effort only: code in the same
  interpreter can in principle reach it.

The fallback's integrity measures. The test runs in its own namespace: builtins are a snapshot taken
before the program ran (a completion that shadows or patches `abs`, `isinstance`, `len`, `AssertionError`...
does not affect the test; `assert` itself raises the C-level AssertionError); prompt helpers the test calls
(e.g. `poly` in HumanEval/32) come from executing the prompt alone, not from the completion's
redefinitions; modules the prompt or test import that were already loaded get their pre-program contents
back (undoing `math.fabs = ...`), and modules the program loaded are dropped so the test imports fresh
ones. Everything the checker uses after program code has run was bound before it ran (a test checks the
bytecode). Pass and failure lines go through the guard (`guard.py`: `P`/`F` with the nonce).

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
`signal.pidfd_send_signal`, ...) are removed before the guard installs (`zygote.py`), a speed bump only.
"""

import os
import sys


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

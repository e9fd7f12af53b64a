"""The server's side of one job in the sandbox worker: `run_job` (stdlib only).

Imported by `server.py` (with this folder on `sys.path`, so the stdlib-only siblings below load by their plain
names); its docstring tells the whole story. Per job `run_job` makes the program's pipes and hands them to the
zygote (`zygote.py`, which forks the watchdog and the program), forks the trusted checker (`_checker`, running
`checker.py`) for a job with an entry point, writes the program its code and the nonce, waits for the verdict
or the deadline, lets the watchdog end the program, collects what it wrote and returns the result: status,
detail, seconds, and where the verdict was decided.
"""

import marshal
import os
import resource
import select
import signal
import socket
import time

import cgroup
import channel
import checker
import rewrite
from cgroup import MEMORY_GROUP
from cleanup import remove_tree
from kernel import PR_SET_DUMPABLE, PR_SET_PDEATHSIG, prctl, probe
from verdict import WATCHDOG_ERROR, classify, watchdog_report

_TESTS = {}  # test text -> (its code as `rewrite.record_all` makes it, or the exception that raised; notes)
_TESTS_KEPT = 512  # distinct tests cached (a HumanEval run has 164)


def _test_code(test: str) -> tuple:
    """The rewritten test, compiled once per distinct test in the server and inherited by each checker it
    forks (about 1 ms, the first time), and what `rewrite.answer_dependent` names."""
    if test not in _TESTS:
        if len(_TESTS) >= _TESTS_KEPT:
            _TESTS.clear()
        try:
            _TESTS[test] = rewrite.prepare(test)
        except BaseException as err:  # noqa: BLE001 - the checker reports it as the test's failure
            _TESTS[test] = (err, [])
    return _TESTS[test]


def _reap_orphans() -> None:
    """We are a child subreaper: processes orphaned below us become our children; collect their exits."""
    while True:
        try:
            if os.waitpid(-1, os.WNOHANG)[0] == 0:
                return
        except ChildProcessError:
            return


def _drain(fd: int) -> bytes:
    os.set_blocking(fd, False)
    chunks = []
    while True:
        try:
            chunk = os.read(fd, 65536)
        except BlockingIOError:
            break
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks)


def _sweep_uid(uid: int) -> None:
    """No PID namespace: kill every process of the program's private uid (setsid escapees included).
    kill(-1) reaches all processes this uid may signal; three passes catch children forked meanwhile."""
    def killer():
        os.setresuid(uid, uid, uid)
        for _ in range(3):
            try:
                os.kill(-1, signal.SIGKILL)  # never the caller itself
            except ProcessLookupError:
                return
            time.sleep(0.002)
    probe(killer)


def _checker(cfg: dict, job: dict, call_w: int, reply_r: int, verdict_w: int, unused, test_code) -> None:
    """Child of the server: the trusted checker (see checker.py), with limits, born in the worker's memory
    cgroup (its memory counts in the same `memory_mb` as the program's). Never returns."""
    try:
        cgroup.oom_score_adj(0)  # after the program, before the worker (which is -1000 where we may say so)
        for fd in unused:
            os.close(fd)
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        prctl(PR_SET_DUMPABLE, 0)  # not ptrace-able nor /proc/<pid>/mem-readable by a same-uid program
        os.setsid()
        devnull = os.open("/dev/null", os.O_RDWR)
        for fd in (0, 1, 2):  # fd 1 is the server's protocol pipe: a test's print() must not land there
            os.dup2(devnull, fd)
        os.close(devnull)
        limit = int(cfg["memory_mb"]) << 20
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        cpu = int(-(-float(job["timeout"]) // 1)) + 1
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    except BaseException as err:
        try:
            os.write(verdict_w, f"E checker setup: {err}".encode())
        finally:
            os._exit(WATCHDOG_ERROR)
    checker.run(job, call_w, reply_r, verdict_w, test_code)


def _wait_readable(fd: int, deadline: float) -> bool:
    """Is `fd` readable (for a pidfd: has its process ended) before `deadline` (monotonic seconds)?"""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(max(0.0, deadline - time.monotonic()) * 1000))


def run_job(cfg: dict, layers: dict, job: dict, zygote) -> dict:
    """Run one program. With an entry point the check is isolated: the trusted checker (its own process)
    runs the test and calls the candidate over plain-data pipes; the program's process, a descendant of
    the zygote, only answers calls and never receives the test. Without one (the test is the program) the
    in-process check runs and the result says so (`checker`). A test passing arguments that are not plain
    data (verdict `N`) fails the sample with that reason; only with `in_process_fallback` is it rerun
    in-process (marked)."""
    start = time.monotonic()
    timeout = float(job["timeout"])
    isolated = bool(job.get("entry_point")) and job.get("_mode") != "in-process"
    nonce_r, nonce_w = os.pipe()
    res_r, res_w = os.pipe()
    err_r, err_w = os.pipe()
    code_r, code_w = os.pipe()
    stop_r, stop_w = os.pipe()
    status_r, status_w = os.pipe()
    program_fds, ours = [res_w, nonce_r, err_w], [nonce_w, res_r, err_r]
    if isolated:
        call_r, call_w = os.pipe()
        reply_r, reply_w = os.pipe()
        verdict_r, verdict_w = os.pipe()
        program_fds += [call_r, reply_w]
    _zygote_pid, control = zygote
    oom_before = cgroup.oom_kills(MEMORY_GROUP["dir"], MEMORY_GROUP["kind"]) if MEMORY_GROUP else 0
    header = {"_n": job["_n"], "timeout": timeout}
    socket.send_fds(control, [marshal.dumps(header)], program_fds + [code_r, stop_r, status_w])
    for fd in program_fds[:3] + [code_r, stop_r, status_w]:
        os.close(fd)
    code = {"prompt": job["prompt"], "completion": job["completion"], "entry_point": job.get("entry_point")}
    if not isolated:
        code["test"] = job["test"]  # the in-process fallback: the test runs beside the program (marked)
    check_pid, notes = None, []
    if isolated:
        test_code, notes = _test_code(job["test"])
        check_pid = os.fork()
        if check_pid == 0:
            _checker(cfg, job, call_w, reply_r, verdict_w,
                     unused=ours + [call_r, reply_w, verdict_r, code_w, stop_w, status_r, control.fileno()],
                     test_code=test_code)
        for fd in (call_r, reply_w, call_w, reply_r, verdict_w):
            os.close(fd)
    try:
        channel.send(code_w, marshal.dumps(code))
    except OSError:  # the program ended during its setup: the error pipe says why
        pass
    os.close(code_w)
    nonce = os.urandom(16).hex().encode()  # made after the fork: no copy of it in the program's memory
    try:
        os.write(nonce_w, nonce)
    except OSError:
        pass
    os.close(nonce_w)
    deadline = start + timeout
    verdict = ("", "")
    if isolated:
        check_fd = os.pidfd_open(check_pid)
        checked = _wait_readable(check_fd, deadline)
        if not checked:
            signal.pidfd_send_signal(check_fd, signal.SIGKILL)
        os.waitpid(check_pid, 0)
        os.close(check_fd)
        text = _drain(verdict_r).decode("utf-8", "replace")
        os.close(verdict_r)
        if checked and text[:1] in ("P", "F", "N", "E"):  # the answer is in: the program is not needed
            verdict = (text[:1], text[2:])
            os.close(stop_w)  # the watchdog kills it (its own unreaped child, through a pidfd)
            stop_w = None
        elif checked:
            verdict = ("X", text[2:])
    # The watchdog writes the program's wait status when it has reaped it (and EOF follows as it exits).
    timed_out = not _wait_readable(status_r, deadline if verdict[0] in ("", "X") else time.monotonic() + 10)
    if stop_w is not None:
        os.close(stop_w)  # the deadline: the watchdog kills the program (and the kernel, its whole namespace)
    if timed_out:
        if not _wait_readable(status_r, time.monotonic() + 10):
            raise RuntimeError("the watchdog did not end the program")  # the worker is replaced
        timed_out = verdict[0] in ("", "X")
    status, watchdog_failure = watchdog_report(_drain(status_r))  # the program's wait status, or why not
    os.close(status_r)
    if not layers["pid_namespace"] and layers["uid"] is not None:
        _sweep_uid(layers["uid"])  # setsid escapees outside the program's group: by uid, not by pid
    data, errors = _drain(res_r), _drain(err_r)
    os.close(res_r)
    os.close(err_r)
    remove_tree(os.path.join(cfg["workspace"], f"job-{job['_n']}"))
    _reap_orphans()
    mode = job.get("_mode_detail", "in-process" + ("" if job.get("entry_point") else " (the test is the program)"))
    # The sandbox's own failures come only from channels the program never holds (the watchdog's report,
    # the setup's error pipe, closed before program code runs): never from the program's exit status.
    if watchdog_failure:
        state, detail = "error", "sandbox: " + watchdog_failure
    elif errors.strip():
        state, detail = "error", "sandbox: " + errors.decode("utf-8", "replace").strip().splitlines()[0][2:]
    elif verdict[0] == "P":
        state, detail = "passed", ""
    elif verdict[0] == "F" and verdict[1].startswith("MemoryError"):  # the candidate hit RLIMIT_AS
        state, detail = "killed", "memory limit (MemoryError)"
    elif verdict[0] == "F":
        state, detail = "failed", verdict[1]
    elif verdict[0] == "E":
        state, detail = "error", verdict[1]
    elif verdict[0] == "N" and cfg.get("in_process_fallback"):  # asked for: the test beside the program, marked
        return run_job(cfg, layers, {**job, "_mode": "in-process", "_mode_detail": f"in-process ({verdict[1]})"},
                       zygote)
    elif verdict[0] == "N":
        # Rerunning in-process would hand the test (the answer key) to the program, and the program can
        # provoke this verdict itself (a return value the test passes back that cannot cross the channel):
        # never a pass it could earn that way.
        state, detail = "failed", (f"not checked: {verdict[1]}; the in-process fallback (the test in the "
                                   f"program's process) is off (SandboxConfig.in_process_fallback)")
    else:
        state, detail = classify(data, nonce, status, timed_out, timeout, accept_pass=not isolated)
        if isolated and state == "failed" and detail.startswith("the program exited") and verdict[1]:
            detail += f" ({verdict[1]})"
    if state in ("killed", "failed") and MEMORY_GROUP and \
            cgroup.oom_kills(MEMORY_GROUP["dir"], MEMORY_GROUP["kind"]) > oom_before:
        state, detail = "killed", f"memory limit (cgroup, {int(cfg['memory_mb'])} MiB)"
    where = "isolated" + (f"; answer-dependent calls: {', '.join(notes)}" if notes else "") if isolated else mode
    return {"status": state, "detail": detail, "seconds": round(time.monotonic() - start, 4), "checker": where}

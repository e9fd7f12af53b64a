"""How a job ended, in words: the watchdog's report, the guard's lines, the program's wait status and the
deadline as (status, detail) (stdlib only; used by the sandbox worker, `job.py`).

The sandbox's own failures travel only on channels the program never holds: the watchdog's report on the
status pipe (`W` + the program's wait status, or `E` + why it failed) and the setup's error pipe. A
program's exit status is only ever "the program exited with N" and a signal only "killed by signal S"
(the wait status says which); no number a program can choose reads as the sandbox's state.
"""

import os
import signal

# Exit statuses of our own processes when they fail (the watchdog, the program's setup, the checker's setup).
# Nothing is decided from them: each failure is also reported out of band (status pipe, error pipe).
WATCHDOG_ERROR, SETUP_ERROR = 250, 251

_SIGNAL_DETAIL = {signal.SIGXCPU: "CPU time limit (SIGXCPU)", signal.SIGXFSZ: "file size limit (SIGXFSZ)",
                  signal.SIGKILL: "killed by SIGKILL (a limit, or the program killed itself)",
                  signal.SIGSEGV: "SIGSEGV (stack overflow or memory limit)"}


def watchdog_report(reply: bytes) -> tuple:
    """(the program's wait status or None, "" or why the watchdog failed) from what it wrote on the status
    pipe: `W` + 4 bytes once it has reaped the program, `E` + a message when it failed itself."""
    if reply[:1] == b"W" and len(reply) >= 5:
        return int.from_bytes(reply[1:5], "little"), ""
    if reply[:1] == b"E":
        return None, "watchdog: " + reply[1:].decode("utf-8", "replace").strip()[:300]
    return None, "the watchdog ended without reporting how the program ended"


def classify(data: bytes, nonce: bytes, status, timed_out: bool, timeout: float,
             accept_pass: bool = True) -> tuple[str, str]:
    """(status, detail) of a program from the result pipe and its wait status (`status`, from `os.waitpid`).

    Only lines carrying the nonce come from the guard (`P <nonce>` a pass, read only with `accept_pass`, i.e.
    in the in-process fallback; `D <nonce> <event>` a refusal; `F <nonce> <exception>` a failure); anything
    else on the result pipe is program output.
    """
    lines = data.split(b"\n")
    if accept_pass and b"P " + nonce in lines:  # in-process mode only: the guard's pass line
        return "passed", ""
    if timed_out:
        return "timed out", f"wall-clock limit of {timeout:g}s"
    text = {}
    for line in lines:
        tag = line[:1]
        if tag in (b"D", b"F") and tag not in text and line.startswith(tag + b" " + nonce + b" "):
            text[tag] = line[len(nonce) + 3:].decode("utf-8", "replace")
    if b"D" in text:
        return "killed", f"sandbox refused {text[b'D']}"
    if b"F" in text:
        if text[b"F"].startswith("MemoryError") or ": MemoryError" in text[b"F"]:
            return "killed", "memory limit (MemoryError)"
        return "failed", text[b"F"]
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        return "killed", _SIGNAL_DETAIL.get(sig, f"killed by signal {sig}")
    return "failed", f"the program exited with status {os.WEXITSTATUS(status)} before the check finished"

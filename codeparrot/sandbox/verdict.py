"""How a job ended, in words: the guard's lines, the watchdog's exit code and the deadline as (status, detail)
(stdlib only; used by the sandbox worker, `server.py`)."""

import signal

WATCHDOG_ERROR, SETUP_ERROR = 250, 251  # exit codes of our own failures (never a program's verdict)

_SIGNAL_DETAIL = {signal.SIGXCPU: "CPU time limit (SIGXCPU)", signal.SIGXFSZ: "file size limit (SIGXFSZ)",
                  signal.SIGKILL: "killed by SIGKILL (a limit, or the program killed itself)",
                  signal.SIGSEGV: "SIGSEGV (stack overflow or memory limit)"}


def classify(data: bytes, errors: bytes, nonce: bytes, code: int, timed_out: bool,
             timeout: float, accept_pass: bool = True) -> tuple[str, str]:
    """(status, detail) from the result pipe, the error pipe and the watchdog's exit code.

    Only lines carrying the nonce come from the guard (`P <nonce>` a pass, read only with `accept_pass`, i.e.
    in the in-process fallback; `D <nonce> <event>` a refusal; `F <nonce> <exception>` a failure); anything
    else on the result pipe is program output. `errors` holds what the watchdog or the program's setup
    reported before any program code ran.
    """
    if errors.strip():
        return "error", errors.decode("utf-8", "replace").strip().splitlines()[0][2:]
    if code == WATCHDOG_ERROR:  # a program's exit code reaches us as 0..127 (or 128 + signal)
        return "error", "watchdog failed"
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
    if code >= 128:
        sig = code - 128
        return "killed", _SIGNAL_DETAIL.get(sig, f"killed by signal {sig}")
    return "failed", f"exited with code {code} before the check finished"

"""The trusted checker: runs the test's assertions in a process no program code ever runs in (stdlib only).

Forked by the worker (`job.py`) for each job, beside the program's process, in the worker's memory cgroup.
It executes the prompt alone (the problem's own helpers, e.g. `poly`, `encode_cyclic`: trusted text) and
the test, rewritten by `rewrite.record_all` in the server, in a fresh namespace of its own interpreter,
then calls `check(candidate)` where `candidate` is a proxy: each call sends the arguments over the call
pipe as plain data (`channel`), and the program's process (`child.serve_candidate`) runs the real function
and sends back its return value, or the name and message of the exception it raised, as plain data. So
the verdict is computed by code and objects the program cannot reach: no nonce to steal, no frame or
module to patch, no `__eq__` of its own in the comparison.

Every call of the test runs whatever the answers: failed assertions and exceptions (the candidate's own,
re-raised here) are recorded, the next statement runs, and the verdict is decided after the last call
(`rewrite.py`). So a passing and a failing program see the same calls and are ended the same way: being
called again tells a program nothing. A reply is decoded only within `channel.MAX_FRAME` bytes and
`channel.MAX_VALUES` values; a larger one is that call's failure.

The verdict is one line on a pipe only the server holds:
  `P`            check(candidate) returned and nothing was recorded;
  `F <detail>`   something was recorded (the first: the assertion, the candidate's exception, a reply that
                 is not plain data or too large), or the test itself failed;
  `X <detail>`   the program's process ended or broke the protocol (the server then asks how it ended);
  `N <reason>`   the test cannot run this way (an argument that is not plain data): the sample fails with
                 that reason, or, only with `SandboxConfig.in_process_fallback`, reruns in-process (marked).
"""

import builtins
import os
import types

import channel
import rewrite

FALLBACK_EXIT = 3  # the checker's exit code after writing an `N` verdict


class _ProgramEnded(BaseException):
    """The candidate's process is gone (EOF) or sent garbage: not a test failure, an ending to classify.
    A BaseException so that a test's `except Exception` cannot swallow it."""


class _NeedsInProcess(BaseException):
    """An argument the test passes is not plain data: this test cannot run with the candidate isolated."""


def _raise_from_program(name, message) -> None:
    """Re-raise the candidate's exception on our side: a builtin exception class of that name (so a test
    expecting e.g. ValueError still works), else RuntimeError naming it."""
    cls = getattr(builtins, name, None) if type(name) is str else None
    text = message if type(message) is str else ""
    if isinstance(cls, type) and issubclass(cls, Exception):
        try:
            error = cls(text)
        except Exception:
            error = RuntimeError(f"{name}: {text}")
    else:
        error = RuntimeError(f"{name}: {text}")
    raise error


def make_proxy(call_fd: int, reply_fd: int, entry_point: str):
    def candidate(*args, **kwargs):
        try:
            request = channel.dumps(channel.encode([list(args), kwargs], exact=True))
        except channel.NotTransferable as err:
            raise _NeedsInProcess(f"an argument of {entry_point}() is not plain data ({err})")
        try:
            channel.send(call_fd, request)
            frame = channel.receive(reply_fd)
        except (OSError, ValueError) as err:
            raise _ProgramEnded(f"the program broke the call channel ({err})")
        if frame is None:
            raise _ProgramEnded("the program ended during a call")
        try:
            reply = channel.loads(frame)
        except channel.TooLarge as err:  # decoded, it could hold far more memory than its bytes: this call fails
            raise TypeError(f"{entry_point}() returned {err}, more than the checker decodes")
        except ValueError as err:
            raise _ProgramEnded(f"the program sent a malformed reply ({err})")
        if type(reply) is not dict or len(reply) != 1:
            raise _ProgramEnded("the program sent a malformed reply")
        if "ok" in reply:
            try:
                return channel.decode(reply["ok"])
            except (channel.NotTransferable, TypeError) as err:  # TypeError: an unhashable key
                raise TypeError(f"{entry_point}() returned something that is not plain data ({err})")
        if "raise" in reply and type(reply["raise"]) is list and len(reply["raise"]) == 2:
            _raise_from_program(*reply["raise"])
        raise _ProgramEnded("the program sent a malformed reply")
    candidate.__name__ = entry_point
    return candidate


def _detail(err: BaseException) -> str:
    try:
        text = f"{type(err).__name__}: {err}"
    except Exception:
        text = type(err).__name__
    return text.replace("\n", " ")[:500]


def check(job: dict, call_fd: int, reply_fd: int, test_code) -> tuple[str, str]:
    """(verdict letter, detail) for `job` (prompt, entry_point), the candidate behind the two fds and the
    test's code from `rewrite.record_all` (or the exception compiling it raised)."""
    namespace = {"__name__": "__checker__", "__builtins__": builtins}
    try:
        if job["prompt"]:
            exec(compile(job["prompt"], "<prompt>", "exec"), namespace)
    except BaseException:  # a prompt that does not run alone (it needs the completion): no helpers
        namespace = {"__name__": "__checker__", "__builtins__": builtins}
    # Wait for the program's greeting: it has executed prompt + completion and found the entry point.
    try:
        hello = channel.receive(reply_fd)
    except (OSError, ValueError) as err:
        return "X", f"the program broke the call channel ({err})"
    if hello != b'"ready"':
        return "X", "the program ended before the check"
    candidate = make_proxy(call_fd, reply_fd, job["entry_point"])
    namespace[job["entry_point"]] = candidate
    # The same few operations whether an answer is right or wrong (no exception raised for a failed
    # assertion): what the program could time between its reply and the next call barely differs.
    failures = [0, "", None]  # how many, the first one's detail, its message and the values it reads

    def failed(ok, detail, message=None):
        if not ok:
            failures[0] += 1
            if failures[0] == 1:
                failures[1] = detail
                if message is not None:  # evaluated after the last call, with the values of now
                    try:
                        failures[2] = (message, [cell.cell_contents for cell in message.__closure__ or ()])
                    except ValueError:  # a name not bound yet: the source text will do
                        pass

    def record(err):
        failures[0] += 1
        if failures[0] == 1:
            failures[1] = _detail(err)

    namespace.update({rewrite.ASSERT: failed, rewrite.RECORD: record, rewrite.EXCEPTION: Exception})
    try:
        if isinstance(test_code, BaseException):
            raise test_code
        exec(test_code, namespace)
        test_check = namespace.get("check")
        if test_check is None:
            return "F", "NameError: the test does not define check()"
        test_check(candidate)
        _hang_up(call_fd)
    except _ProgramEnded as err:  # after a recorded failure, that failure is the better detail
        return ("F", _message(failures[1], failures[2])) if failures[0] else ("X", str(err))
    except _NeedsInProcess as err:
        return "N", str(err)
    except BaseException as err:
        _hang_up(call_fd)
        record(err)
    if not failures[0]:
        return "P", ""
    return "F", _message(failures[1], failures[2])


def _hang_up(call_fd: int) -> None:
    """End of input for the program, before any failure is put into words: it ends at the same moment
    whether its answers were right or wrong (formatting a message may take a while)."""
    try:
        os.close(call_fd)
    except OSError:
        pass


def _message(detail: str, message) -> str:
    """The first failed assertion's detail with its message evaluated now, after the last call, on the
    values its names had when it failed (the source text when that fails)."""
    if message is None:
        return detail
    function, values = message
    cells = tuple(types.CellType(value) for value in values) or None
    try:
        text = str(types.FunctionType(function.__code__, function.__globals__, closure=cells)())
    except Exception:  # noqa: BLE001 - a message that does not evaluate: its source text stays
        return detail
    return ("AssertionError: " + text).replace("\n", " ")[:500]


def run(job: dict, call_fd: int, reply_fd: int, verdict_fd: int, test_code) -> None:
    """Entry point in the forked checker process: check, write the verdict line, exit. Never returns."""
    try:
        letter, detail = check(job, call_fd, reply_fd, test_code)
    except BaseException as err:  # noqa: BLE001 - a bug here is reported as the checker's, not a verdict
        letter, detail = "E", "checker: " + _detail(err)
    try:
        os.write(verdict_fd, (letter + " " + detail).encode("utf-8", "replace")[:2000])
    finally:
        os._exit(FALLBACK_EXIT if letter == "N" else 0)

"""Per-process log files, as the original training wrote: `<run>/logs/rank-N.log` holds the warnings (Python
warnings and WARNING-or-worse log records) and uncaught errors of process N, every rank, not only the main one
whose console the user watches: uncaught exceptions and the `error: ...` line of a CodeParrotError, which run_cli
prints on the main process only (so that it appears once on the console). The console output is unchanged
(warnings still go to stderr as before)."""

from __future__ import annotations

import logging
import sys
import traceback
import warnings
from pathlib import Path

from codeparrot.errors import add_error_listener

_current: logging.FileHandler | None = None  # this process's rank log (one per process; a new run replaces it)
_console: logging.Handler | None = None
_previous_showwarning = warnings.showwarning  # what ours passes on to (the console, or a test's recorder)
_previous_excepthook = sys.excepthook


def _show_warning(message, category, filename, lineno, file=None, line=None):
    if _current is not None:
        text = warnings.formatwarning(message, category, filename, lineno, line).rstrip()
        _current.handle(logging.makeLogRecord({"name": "py.warnings", "levelno": logging.WARNING,
                                               "levelname": "WARNING", "msg": text}))
    _previous_showwarning(message, category, filename, lineno, file, line)


def _excepthook(kind, value, tb):
    if _current is not None:
        text = "".join(traceback.format_exception(kind, value, tb)).rstrip()
        _current.handle(logging.makeLogRecord({"name": "uncaught", "levelno": logging.ERROR, "levelname": "ERROR",
                                               "msg": text}))
        _current.flush()
    _previous_excepthook(kind, value, tb)


def _record_error_line(line: str) -> None:
    """The `error: ...` line of a CodeParrotError reported by run_cli (printed by the main process only)."""
    if _current is not None:
        _current.handle(logging.makeLogRecord({"name": "codeparrot", "levelno": logging.ERROR, "levelname": "ERROR",
                                               "msg": line}))
        _current.flush()


def open_rank_log(run_dir: Path, rank: int) -> Path:
    """Start appending this process's warnings and errors to `<run_dir>/logs/rank-<rank>.log` (returned)."""
    global _current, _console, _previous_showwarning, _previous_excepthook
    path = Path(run_dir) / "logs" / f"rank-{rank}.log"
    path.parent.mkdir(parents=True, exist_ok=True)
    root = logging.getLogger()
    close_rank_log()
    if not root.handlers:
        # Without handlers, logging prints WARNING+ records to stderr by itself (its "last resort"); a file
        # handler on the root would silence that, so an equivalent console handler keeps the console as it was.
        _console = logging.StreamHandler(sys.stderr)
        _console.setLevel(logging.WARNING)
        root.addHandler(_console)
    _current = logging.FileHandler(path, encoding="utf-8")
    _current.setLevel(logging.WARNING)
    _current.setFormatter(logging.Formatter(f"%(asctime)s rank {rank} %(levelname)s %(name)s: %(message)s"))
    root.addHandler(_current)
    if warnings.showwarning is not _show_warning:
        _previous_showwarning, warnings.showwarning = warnings.showwarning, _show_warning
    if sys.excepthook is not _excepthook:
        _previous_excepthook, sys.excepthook = sys.excepthook, _excepthook
    add_error_listener(_record_error_line)
    return path


def close_rank_log() -> None:
    """Stop writing the rank log (the console handler added for it goes too)."""
    global _current, _console
    root = logging.getLogger()
    for handler in (_current, _console):
        if handler is not None:
            root.removeHandler(handler)
            handler.close()
    _current = _console = None

"""Outputs that cannot be written: found before the work (`ensure_writable_file`, `ensure_writable_dir`), and,
where a write still fails (a disk that fills meanwhile), one line naming the file (`OutputWriteError`) that is
still an OSError for code that handles a failed write itself.

Root writes into read-only folders, so a folder that refuses files is simulated by making the temporary file
fail as the system would; a regular file where a folder should be refuses root too."""

from __future__ import annotations

import errno
import pickle
import tempfile

import pytest

from codeparrot.atomic_io import atomic_write_json, atomic_write_text, ensure_writable_dir, ensure_writable_file
from codeparrot.errors import CodeParrotError, OutputWriteError, run_cli


def _read_only(monkeypatch):
    def refuse(*args, **kwargs):
        raise PermissionError(errno.EACCES, "Permission denied", kwargs.get("dir"))

    monkeypatch.setattr(tempfile, "NamedTemporaryFile", refuse)
    monkeypatch.setattr(tempfile, "mkstemp", refuse)


def test_an_output_file_is_checked_before_the_work(tmp_path, monkeypatch):
    afile = tmp_path / "afile"
    afile.write_text("")
    with pytest.raises(CodeParrotError, match=rf"^--output {tmp_path} is a directory; give the path of the PNG"):
        ensure_writable_file(tmp_path, what="PNG")
    with pytest.raises(CodeParrotError, match=rf"^cannot write --samples-file {afile}/sub/x\.json: {afile} is a "
                                              r"file, not a directory; give a path in a folder you can write to$"):
        ensure_writable_file(afile / "sub" / "x.json", "--samples-file")
    with pytest.raises(CodeParrotError, match=rf"^output directory {afile}/sub: {afile} is a file, not a directory$"):
        ensure_writable_dir(afile / "sub")
    assert ensure_writable_file(tmp_path / "new" / "x.json") == tmp_path / "new" / "x.json"
    assert (tmp_path / "new").is_dir() and list((tmp_path / "new").iterdir()) == []  # the probe is gone
    _read_only(monkeypatch)
    with pytest.raises(CodeParrotError, match=rf"^cannot write --output {tmp_path}/x\.json: {tmp_path} is not "
                                              r"writable \(Permission denied\)"):
        ensure_writable_file(tmp_path / "x.json")


def test_a_failed_write_is_one_line_and_still_an_oserror(tmp_path, monkeypatch):
    afile = tmp_path / "afile"
    afile.write_text("")
    with pytest.raises(OutputWriteError, match=rf"^cannot write {afile}/x\.json: {afile} is a file, not a directory$"):
        atomic_write_json(afile / "x.json", {})
    with pytest.raises(OutputWriteError, match=rf"^cannot write {tmp_path}: it is a directory$"):
        atomic_write_text(tmp_path, "x")

    def disk_full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr("os.fsync", disk_full)
    with pytest.raises(OSError) as caught:  # what callers that handle a failed write catch
        atomic_write_text(tmp_path / "r.json", "x")
    err = caught.value
    assert isinstance(err, CodeParrotError) and err.errno == errno.ENOSPC
    assert str(err) == f"cannot write {tmp_path / 'r.json'}: No space left on device"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]  # no temporary file left
    again = pickle.loads(pickle.dumps(err))  # from a worker process
    assert type(again) is OutputWriteError and str(again) == str(err) and again.errno == errno.ENOSPC


def test_run_cli_prints_a_failed_write_as_one_line(tmp_path, capsys):
    afile = tmp_path / "afile"
    afile.write_text("")
    with pytest.raises(SystemExit) as stop:
        run_cli(lambda: atomic_write_text(afile / "x.json", "x"))
    assert stop.value.code == 2
    assert capsys.readouterr().err == f"error: cannot write {afile}/x.json: {afile} is a file, not a directory\n"


def test_a_plot_that_cannot_be_saved_is_one_line(tmp_path):
    from codeparrot.tools.plots import plot_checkpoint_losses

    afile = tmp_path / "afile"
    afile.write_text("")
    with pytest.raises(OutputWriteError, match=rf"^cannot write {afile}/p\.png: {afile} is a file, not a directory$"):
        plot_checkpoint_losses([(1, 2.0), (2, 1.5)], afile / "p.png", "t")
    with pytest.raises(OutputWriteError, match=rf"^cannot write {tmp_path}: it is a directory$"):
        plot_checkpoint_losses([(1, 2.0), (2, 1.5)], tmp_path, "t")

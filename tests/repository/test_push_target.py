"""A model repository that checkpoint pushes could not write is refused before training (before: found at the
first push, after the first checkpoint interval, then four attempts, a `UserWarning` with a source line, and a last
line that named the final model only), and the end of a run says when its pushes failed.

Root writes into read-only folders, so the unwritable cases here are ones that refuse root too: a folder where
the writers' lock file should be, a plain folder instead of a repository."""

from __future__ import annotations

import os
import subprocess
import sys
from types import SimpleNamespace

import pytest

from codeparrot.errors import CodeParrotError
from codeparrot.repository.local import LocalGitRepository
from codeparrot.repository.pusher import check_push_target

ADVICE = r"; make it writable, or train without pushing \(--checkpoint.push false\)$"


def test_a_repository_pushes_could_not_write_is_refused(tmp_path):
    repo = LocalGitRepository(tmp_path / "repo", create=True)
    check_push_target(str(repo.path))  # writable: nothing to say
    check_push_target(str(tmp_path / "not-yet"))  # the first push creates it
    check_push_target("hf://someone/model")  # the Hub's to say, at the first push
    (repo.git_dir / "codeparrot.lock").mkdir()
    with pytest.raises(CodeParrotError, match=rf"^checkpoints cannot be pushed to {repo.path}: "
                                              rf"{repo.git_dir}/codeparrot.lock is not writable \(Is a directory\)"
                                              + ADVICE):
        check_push_target(str(repo.path))
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "config.json").write_text("{}")
    with pytest.raises(CodeParrotError, match=rf"^checkpoints cannot be pushed to {plain}: {plain} exists but is not "
                                              r"a git repository; train from a checkpoint repository, or without "
                                              r"pushing \(--checkpoint.push false\)$"):
        check_push_target(str(plain))


@pytest.mark.skipif(os.geteuid() != 0 or not os.path.exists("/usr/bin/setpriv"),
                    reason="simulates a read-only folder for root (setpriv drops CAP_DAC_OVERRIDE)")
def test_a_read_only_repository_is_refused(tmp_path, scripts_env):
    repo = LocalGitRepository(tmp_path / "repo", create=True)
    (repo.git_dir / "objects").chmod(0o555)
    drop = "-dac_override,-dac_read_search"
    done = subprocess.run(["setpriv", f"--bounding-set={drop}", f"--inh-caps={drop}", sys.executable, "-c",
                           "import sys; from codeparrot.repository.pusher import check_push_target; "
                           "check_push_target(sys.argv[1])", str(repo.path)],
                          env=scripts_env, capture_output=True, text=True, timeout=60, check=False)
    assert f"CodeParrotError: checkpoints cannot be pushed to {repo.path}: {repo.git_dir}/objects is not writable " \
           "(Permission denied)" in done.stderr, done.stderr


def test_the_end_of_a_run_says_its_pushes_failed(capsys):
    from codeparrot.training.model_io import push_outcome, report_push_errors

    errors = ["push 'step 2' to repo@e3 failed after 4 attempts (the local checkpoint is kept): cannot lock"]
    none_went = SimpleNamespace(repo_ref="repo", branch="e3", commits=[])
    assert push_outcome(none_went, errors) == ("; 1 push(es) to repo@e3 FAILED (warnings above; the checkpoints are "
                                               "kept on disk)")
    assert push_outcome(SimpleNamespace(repo_ref="repo", branch="e3", commits=["0123456789abcdef"]), []) == \
        "; pushed to repo branch e3, commit 0123456789ab"
    assert push_outcome(None, errors) == ""
    report_push_errors(errors)
    assert capsys.readouterr().err == f"warning: {errors[0]}\n"

"""An experiment branch starts from the revision its run started from (a fine-tune of an experiment, a restart
from a promoted checkpoint), not always from `main`: its history shows where it came from. Checked with git
itself on the local backend."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from codeparrot.repository.pusher import CheckpointPusher
from codeparrot.repository.refs import open_repository


@pytest.fixture(autouse=True)
def isolated_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("CODEPARROT_CACHE", str(tmp_path / "cache"))


def folder_with(root: Path, name: str, text: str) -> Path:
    folder = root / name
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(text)
    return folder


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture
def repo_with_an_experiment(tmp_path):
    """main: initial model + one more commit; exp-a: branched off main's first commit, two steps of its own."""
    path = tmp_path / "repo"
    repo = open_repository(str(path), create=True)
    repo.commit_folder(folder_with(tmp_path, "init", '{"v": 0}'), "main", "initial model")
    repo.create_branch("exp-a", "main")
    repo.commit_folder(folder_with(tmp_path, "a1", '{"v": 1}'), "exp-a", "step 100")
    repo.commit_folder(folder_with(tmp_path, "a2", '{"v": 2}'), "exp-a", "step 200")
    repo.commit_folder(folder_with(tmp_path, "m1", '{"v": 3}'), "main", "promote other (step 5)")
    return path


@pytest.mark.parametrize("parent", ["exp-a", "exp-a~1"], ids=["branch", "commit"])
def test_pushed_branch_starts_at_the_revision_the_run_started_from(repo_with_an_experiment, tmp_path, parent):
    path = repo_with_an_experiment
    parent_head = git(path, "rev-parse", parent)
    pusher = CheckpointPusher(str(path), "exp-b", from_revision=parent, backoff_s=0.01)
    pusher.push(folder_with(tmp_path, "b1", '{"v": 10}'), "step 300")
    assert pusher.wait() == []
    assert git(path, "merge-base", "exp-b", parent) == parent_head  # exp-b continues its parent's history
    assert git(path, "rev-parse", "exp-b~1") == parent_head  # its first commit sits right on the parent's head
    assert git(path, "merge-base", "exp-b", "main") != git(path, "rev-parse", "main")  # not main's head
    steps = [c.step for c in open_repository(str(path)).list_commits("exp-b")]
    assert steps[0] == 300 and 100 in steps and (200 in steps) == (parent == "exp-a")


def test_default_parent_is_main_and_an_existing_branch_is_kept(repo_with_an_experiment, tmp_path):
    path = repo_with_an_experiment
    pusher = CheckpointPusher(str(path), "exp-c", backoff_s=0.01)
    pusher.push(folder_with(tmp_path, "c1", '{"v": 20}'), "step 1")
    assert pusher.wait() == [] and git(path, "rev-parse", "exp-c~1") == git(path, "rev-parse", "main")
    # resuming a run on its own branch: the branch exists and goes on from its own head
    head = git(path, "rev-parse", "exp-a")
    again = CheckpointPusher(str(path), "exp-a", from_revision="main", backoff_s=0.01)
    again.push(folder_with(tmp_path, "a3", '{"v": 4}'), "step 300")
    assert again.wait() == [] and git(path, "rev-parse", "exp-a~1") == head


def test_unknown_parent_revision_is_a_reported_push_failure(repo_with_an_experiment, tmp_path):
    pusher = CheckpointPusher(str(repo_with_an_experiment), "exp-d", from_revision="no-such-branch",
                              max_retries=0, backoff_s=0.01)
    pusher.push(folder_with(tmp_path, "d1", '{"v": 30}'), "step 1")
    (error,) = pusher.wait()
    assert "no-such-branch" in error and "exp-d" in error

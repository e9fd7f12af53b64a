"""What a HumanEval run records about the weights it sampled (codeparrot.repository.provenance): the commit a Hub or
local revision names, resolved offline here (a Hub cache laid out as huggingface_hub writes it, and a stand-in for
the Hub's API), and nothing where a commit would not name the files loaded."""

from __future__ import annotations

import subprocess
from types import SimpleNamespace

import pytest

from codeparrot.errors import CodeParrotError
from codeparrot.repository.provenance import pinned_commit

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def fake_hub_cache(cache, repo_id: str, files: dict[str, bytes], commit: str = COMMIT, ref: str = "main"):
    """`repo_id` at `commit` in a Hub cache at `cache` (`ref` pointing at it), as snapshot_download leaves it."""
    folder = cache / f"models--{repo_id.replace('/', '--')}"
    (folder / "refs").mkdir(parents=True, exist_ok=True)
    (folder / "refs" / ref).write_text(commit)
    snapshot = folder / "snapshots" / commit
    snapshot.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (snapshot / name).write_bytes(data)
    return snapshot


def test_a_hub_revision_is_pinned_to_its_commit_offline_and_online(tmp_path, monkeypatch):
    """Before, a Hub model was recorded by its branch name only (results could not say which weights made them, and
    a resumed run mixed the samples of two commits once the branch moved). Offline, the commit is the one the Hub
    cache records for the revision, which is what loading uses; online, what the Hub answers, without a download."""
    from huggingface_hub import constants, errors

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    fake_hub_cache(tmp_path / "hub", "user/m", {"config.json": b"{}"})
    fake_hub_cache(tmp_path / "hub", "user/m", {"config.json": b"{}"}, commit="f" * 40, ref="exp-1")
    assert pinned_commit("user/m", None) == pinned_commit("hf://user/m", "main") == COMMIT
    assert pinned_commit("user/m", "exp-1") == "f" * 40
    assert pinned_commit("user/m", "a" * 40) == "a" * 40  # a full commit id needs no lookup
    assert pinned_commit("user/other", "main") is None  # not cached: loading says why

    asked = []

    class Api:  # the Hub's answer to GET /api/models/{repo}/revision/{revision}
        def model_info(self, repo_id, revision):
            asked.append((repo_id, revision))
            if revision == "gone":
                from httpx2 import Request, Response

                response = Response(404, request=Request("GET", f"https://huggingface.co/api/models/{repo_id}"))
                raise errors.RevisionNotFoundError("404 Revision Not Found", response=response)
            return SimpleNamespace(sha="b" * 40)

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    assert pinned_commit("user/m", None, api=Api()) == "b" * 40 and asked == [("user/m", "main")]
    with pytest.raises(CodeParrotError, match=r"^revision 'gone' not found in Hub repository user/m$"):
        pinned_commit("user/m", "gone", api=Api())

    class Unreachable:  # online, no answer (no network, a timeout): loading falls back to the cache, so does the pin
        def model_info(self, repo_id, revision):
            from httpx2 import ConnectError

            raise ConnectError("[Errno 101] Network is unreachable")

    assert pinned_commit("user/m", "exp-1", api=Unreachable()) == "f" * 40
    with pytest.raises(CodeParrotError, match=r"^resolving user/other@main failed: ConnectError"):
        pinned_commit("user/other", None, api=Unreachable())  # nothing cached: loading would fail too


def _git(path, *args):
    subprocess.run(["git", "-C", str(path), "-c", "user.name=t", "-c", "user.email=t@t", *args], check=True,
                   capture_output=True)


def test_a_worktree_used_as_checked_out_is_pinned_only_while_its_files_are_a_commits(tmp_path):
    """A cloned model used in place (no --revision) was recorded without any commit. Its HEAD pins it while the files
    are exactly HEAD's; a changed or new file (weights may be either) makes a commit name other weights: none then."""
    clone = tmp_path / "clone"
    clone.mkdir()
    (clone / "config.json").write_text("{}")
    _git(clone, "init", "-q")
    _git(clone, "add", "config.json")
    _git(clone, "commit", "-q", "-m", "model")
    head = subprocess.run(["git", "-C", str(clone), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    assert pinned_commit(str(clone), None) == head
    (clone / "model.safetensors").write_bytes(b"weights")  # untracked
    assert pinned_commit(str(clone), None) is None
    (clone / "model.safetensors").unlink()
    (clone / "config.json").write_text('{"n_layer": 2}')  # modified
    assert pinned_commit(str(clone), None) is None
    assert pinned_commit(str(tmp_path / "clone"), "HEAD") == head  # an explicit revision: the repository's commit
    assert pinned_commit(str(tmp_path), None) is None  # a plain folder

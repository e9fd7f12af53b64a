"""Checkpoint repositories: the local git backend end to end, the pusher, and the Hub backend at HfApi."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import threading
import time
from concurrent.futures import Future
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from codeparrot.errors import CodeParrotError
from codeparrot.repository.base import is_hub_ref, parse_step
from codeparrot.repository.local import LocalGitRepository, git_lfs_available
from codeparrot.repository.pusher import CheckpointPusher
from codeparrot.repository.refs import open_repository, resolve_model_dir


@pytest.fixture(autouse=True)
def isolated_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("CODEPARROT_CACHE", str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def tiny(stdlib_texts, tmp_path_factory):
    """A tiny model + tokenizer saved as an initial-model folder (what initialize_model.py commits)."""
    from codeparrot.repository.model import ModelConfig, build_model, to_gpt2_config
    from codeparrot.tokenizer import train_tokenizer

    tokenizer = train_tokenizer(stdlib_texts[:10], vocab_size=400, show_progress=False)
    model = build_model(to_gpt2_config(ModelConfig(n_layer=2, n_embd=32, n_head=2, n_positions=64), tokenizer), 0)
    folder = tmp_path_factory.mktemp("init")
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return SimpleNamespace(model=model, tokenizer=tokenizer, folder=folder)


def _checkpoint(tiny, root: Path, name: str, shift: float) -> tuple[Path, dict]:
    """A checkpoint folder whose weights are the tiny model's shifted by `shift` (distinct per step)."""
    state = {k: v + shift for k, v in tiny.model.state_dict().items()}
    tiny.model.load_state_dict(state)
    folder = root / name
    tiny.model.save_pretrained(folder)
    tiny.tokenizer.save_pretrained(folder)
    return folder, {k: v.clone() for k, v in tiny.model.state_dict().items()}


def _load_weights(folder) -> dict:
    from transformers import GPT2LMHeadModel

    return GPT2LMHeadModel.from_pretrained(str(folder)).state_dict()


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_experiments_on_branches_end_to_end(tiny, tmp_path):
    repo = open_repository(str(tmp_path / "repo"), create=True)
    assert isinstance(repo, LocalGitRepository) and repo.bare
    initial = repo.commit_folder(tiny.folder, "main", "initial model")
    saved = {}
    for run in ("run-a", "run-b"):
        repo.create_branch(run)
        repo.create_branch(run)  # idempotent
        for step in (100, 200, 300):
            folder, weights = _checkpoint(tiny, tmp_path / "ckpt", f"{run}-{step}", 0.01)
            saved[run, step] = (repo.commit_folder(folder, run, f"step {step}"), weights)

    branches = {b.name: b for b in repo.list_branches()}
    assert list(branches)[0] == "main" and set(branches) == {"main", "run-a", "run-b"}
    assert branches["main"].latest_step is None and branches["main"].commit_id == initial
    assert branches["run-a"].latest_step == branches["run-b"].latest_step == 300
    assert branches["run-b"].commit_id == saved["run-b", 300][0]
    log = repo.list_commits("run-a")
    assert [c.step for c in log] == [300, 200, 100, None]  # newest first, down to the initial model
    assert [c.commit_id for c in log[:3]] == [saved["run-a", s][0] for s in (300, 200, 100)]
    assert log[-1].commit_id == initial and log[-1].message == "initial model"

    # An older checkpoint, by commit id, comes back bit-identical and loads with from_pretrained.
    commit, weights = saved["run-a", 100]
    out = repo.download(commit[:10], tmp_path / "older")
    assert _same(_load_weights(out), weights)
    assert not _same(weights, saved["run-a", 300][1])
    from transformers import AutoTokenizer

    assert AutoTokenizer.from_pretrained(str(out)).get_vocab() == tiny.tokenizer.get_vocab()

    # Promote run-b's step 200: a new commit on main with exactly those files, naming its source.
    promoted = repo.promote(saved["run-b", 200][0])
    main_log = repo.list_commits("main")
    assert main_log[0].commit_id == promoted and main_log[1].commit_id == initial
    assert saved["run-b", 200][0][:12] in main_log[0].message and main_log[0].step == 200
    assert repo.list_branches()[0].latest_step == 200
    assert _same(_load_weights(resolve_model_dir(str(tmp_path / "repo"))), saved["run-b", 200][1])
    assert repo.promote(saved["run-b", 200][0]) == promoted  # again: main holds those files, no second commit
    assert [c.commit_id for c in repo.list_commits("main")] == [c.commit_id for c in main_log]
    from codeparrot.repository.promotion import promote_commit

    assert promote_commit(repo, saved["run-b", 200][0])[-1].startswith("main now:    unchanged")

    # resolve_model_dir materializes a revision once, in a cache folder named by its commit id.
    cached = resolve_model_dir(str(tmp_path / "repo"), "run-a")
    assert cached.name == saved["run-a", 300][0] and _same(_load_weights(cached), saved["run-a", 300][1])
    stamp = cached.stat().st_mtime_ns
    assert resolve_model_dir(str(tmp_path / "repo"), "run-a") == cached and cached.stat().st_mtime_ns == stamp
    assert resolve_model_dir(str(tiny.folder)) == tiny.folder  # a plain model folder is used as is

    # It is an ordinary git repository.
    git_log = subprocess.run(["git", f"--git-dir={tmp_path / 'repo'}", "log", "--format=%s", "run-b"],
                             capture_output=True, text=True, check=True).stdout.split("\n")
    assert git_log[:4] == ["step 300", "step 200", "step 100", "initial model"]


@pytest.mark.parametrize("use_lfs", [False, pytest.param(True, marks=pytest.mark.skipif(
    not git_lfs_available(), reason="git-lfs is not installed"))], ids=["plain-git", "git-lfs"])
def test_commit_replaces_the_tree_and_keeps_bytes(tmp_path, use_lfs):
    repo = LocalGitRepository(tmp_path / "repo", create=True, use_lfs=use_lfs)
    assert repo.lfs_enabled == use_lfs
    first = tmp_path / "a"
    (first / "sub").mkdir(parents=True)
    (first / "old.bin").write_bytes(b"\x00\xff" * 10)
    (first / "model.safetensors").write_bytes(os.urandom(4096))
    (first / "sub" / "crlf.txt").write_bytes(b"line\r\nend  \r\n")
    (first / ".gitignore").write_text("*.bin\n")  # the folder's own ignore rules must not drop files
    repo.commit_folder(first, "main", "step 1")
    stored = subprocess.run(["git", f"--git-dir={tmp_path / 'repo'}", "cat-file", "blob", "main:model.safetensors"],
                            capture_output=True, check=True).stdout
    assert stored.startswith(b"version https://git-lfs") == use_lfs  # LFS keeps only a pointer in git
    second = tmp_path / "b"
    second.mkdir()
    (second / "new.txt").write_text("only me")
    repo.commit_folder(second, "main", "step 2")
    assert sorted(p.name for p in repo.download("main~1", tmp_path / "d1").rglob("*") if p.is_file()) == [
        ".gitignore", "crlf.txt", "model.safetensors", "old.bin"]
    assert (tmp_path / "d1" / "model.safetensors").read_bytes() == (first / "model.safetensors").read_bytes()
    assert (tmp_path / "d1" / "sub" / "crlf.txt").read_bytes() == b"line\r\nend  \r\n"
    assert (tmp_path / "d1" / "old.bin").read_bytes() == b"\x00\xff" * 10
    assert [p.name for p in repo.download("main", tmp_path / "d2").iterdir()] == ["new.txt"]


def test_lfs_repository_without_git_lfs_is_a_clear_error(tmp_path, monkeypatch):
    from codeparrot.repository import local as repository_local

    subprocess.run(["git", "init", "-q", "--bare", str(tmp_path / "repo")], check=True)
    subprocess.run(["git", f"--git-dir={tmp_path / 'repo'}", "config", "codeparrot.lfs", "true"], check=True)
    monkeypatch.setattr(repository_local, "git_lfs_available", lambda: False)
    with pytest.raises(CodeParrotError, match="git-lfs, which is not installed"):
        open_repository(str(tmp_path / "repo"))


def test_hostile_git_config_and_no_identity(tmp_path, monkeypatch):
    """CI has no identity; a user may sign commits and convert CRLF globally: none of it may leak in."""
    home = tmp_path / "home"
    home.mkdir()
    (home / ".gitconfig").write_text("[core]\n\tautocrlf = true\n[commit]\n\tgpgSign = true\n"
                                     "[user]\n\tuseConfigOnly = true\n")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(home / ".gitconfig"))
    for var in ("GIT_AUTHOR_NAME", "GIT_AUTHOR_EMAIL", "GIT_COMMITTER_NAME", "GIT_COMMITTER_EMAIL", "EMAIL"):
        monkeypatch.delenv(var, raising=False)
    folder = tmp_path / "f"
    folder.mkdir()
    (folder / "a.txt").write_bytes(b"x\r\n")
    repo = open_repository(str(tmp_path / "repo"), create=True)
    repo.commit_folder(folder, "exp", "step 5")
    assert (repo.download("exp", tmp_path / "out") / "a.txt").read_bytes() == b"x\r\n"


def test_non_bare_repository_worktree_is_left_alone(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    git = ["git", "-C", str(work), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(git[:3] + ["init", "-q", "-b", "main"], check=True)
    (work / "README").write_text("mine\n")
    subprocess.run(git + ["add", "README"], check=True)
    subprocess.run(git + ["commit", "-q", "-m", "user commit"], check=True)
    repo = open_repository(str(work))
    folder = tmp_path / "ckpt"
    folder.mkdir()
    (folder / "w.bin").write_bytes(b"123")
    repo.commit_folder(folder, "exp", "step 1")
    status = subprocess.run(git + ["status", "--porcelain"], capture_output=True, text=True, check=True).stdout
    assert status == "" and sorted(p.name for p in work.iterdir()) == [".git", "README"]
    assert [c.message for c in repo.list_commits("exp")] == ["step 1", "user commit"]
    assert resolve_model_dir(str(work)) == work  # no revision: the worktree as checked out
    assert (resolve_model_dir(str(work), "exp") / "w.bin").read_bytes() == b"123"
    with pytest.raises(CodeParrotError, match="checked out"):
        repo.commit_folder(folder, "main", "step 2")


def test_concurrent_writers_lose_no_commit(tmp_path):
    path = str(tmp_path / "repo")
    open_repository(path, create=True)
    folders = []
    for i in range(8):
        folders.append(tmp_path / f"f{i}")
        folders[-1].mkdir()
        (folders[-1] / "x").write_text(str(i))
    errors = []

    def writer(i):
        try:
            open_repository(path).commit_folder(folders[i], "shared", f"step {i}")
        except Exception as err:  # pragma: no cover - reported below
            errors.append(err)

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert sorted(c.step for c in open_repository(path).list_commits("shared")) == list(range(8))


def test_references_and_bad_input(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert is_hub_ref("user/model") and is_hub_ref("hf://user/model")
    assert not is_hub_ref("./user/model") and not is_hub_ref("/abs/path") and not is_hub_ref("a/b/c")
    (tmp_path / "outputs").mkdir()
    assert not is_hub_ref("outputs/repo")  # a folder named like the owner exists here: a local path
    (tmp_path / "plain").mkdir()
    with pytest.raises(CodeParrotError, match="not a git repository"):
        open_repository("plain")
    with pytest.raises(CodeParrotError, match="repository not found"):
        open_repository("outputs/missing")
    with pytest.raises(CodeParrotError, match="no revision"):
        resolve_model_dir("plain", "main")
    repo = open_repository("outputs/repo", create=True)
    folder = tmp_path / "f"
    folder.mkdir()
    (folder / "x").write_text("1")
    repo.commit_folder(folder, "main", "initial model")
    with pytest.raises(CodeParrotError, match=r"revision 'nope' not found .*branches: main"):
        repo.download("nope", tmp_path / "out")
    assert not (tmp_path / "out").exists()
    with pytest.raises(CodeParrotError, match="not found"):
        repo.promote("deadbeef")
    with pytest.raises(CodeParrotError, match="branch 'nope' not found"):
        repo.list_commits("nope")
    with pytest.raises(CodeParrotError, match="invalid branch name"):
        repo.create_branch("bad name")
    with pytest.raises(CodeParrotError, match="invalid revision"):
        repo.download("--output=/etc", tmp_path / "out")
    with pytest.raises(CodeParrotError, match="not empty"):
        repo.download("main", folder)
    with pytest.raises(CodeParrotError, match="not found"):
        repo.create_branch("exp", from_revision="nope")
    assert [b.name for b in repo.list_branches()] == ["main"]
    assert parse_step("step 1200") == 1200 and parse_step("promote run@abc (step 7)") == 7
    assert parse_step("initial model") is None and parse_step("stepping 3") is None


# --- CheckpointPusher ------------------------------------------------------------------------------------


def test_pusher_does_not_block_and_survives_deleted_checkpoints(tiny, tmp_path, monkeypatch):
    path = str(tmp_path / "repo")
    open_repository(path, create=True).commit_folder(tiny.folder, "main", "initial model")
    real, release = LocalGitRepository.commit_folder, threading.Event()

    def blocked_commit(self, *args, **kwargs):  # a slow remote: nothing commits until the test says so
        assert release.wait(30)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(LocalGitRepository, "commit_folder", blocked_commit)
    pusher = CheckpointPusher(path, "run-a")
    saved = {}
    for step in (1, 2):
        folder, saved[step] = _checkpoint(tiny, tmp_path / "ckpts", f"step-{step}", 0.5)
        (folder / "optimizer.pt").write_bytes(b"state")
        pusher.push(folder, f"step {step}", include=["*.safetensors", "*.json"])  # returns at once
        shutil.rmtree(folder)  # the trainer rotates old checkpoints away right after the push
    # Both pushes returned while the first commit is still blocked: training was never held up.
    branches = {b.name: b for b in open_repository(path).list_branches()}
    assert pusher.commits == [] and branches.get("run-a", branches["main"]).latest_step is None
    release.set()
    assert pusher.wait() == []
    log = open_repository(path).list_commits("run-a")
    assert [c.step for c in log] == [2, 1, None] and pusher.commits == [log[1].commit_id, log[0].commit_id]
    out = open_repository(path).download("run-a~1", tmp_path / "out")
    assert _same(_load_weights(out), saved[1]) and not (out / "optimizer.pt").exists()
    assert not (tmp_path / "ckpts" / ".codeparrot-push").exists()  # staging cleaned up


def test_pusher_retries_then_reports_without_raising(tmp_path, monkeypatch, caplog):
    path = str(tmp_path / "repo")
    open_repository(path, create=True)
    folder = tmp_path / "ckpt"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(b"weights")
    real, attempts = LocalGitRepository.commit_folder, []

    def flaky(self, *args, **kwargs):
        attempts.append(1)
        if len(attempts) <= 2:
            raise OSError("disk hiccup")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(LocalGitRepository, "commit_folder", flaky)
    pusher = CheckpointPusher(path, "exp", max_retries=3, backoff_s=0.01)
    pusher.push(folder, "step 10")
    assert pusher.wait() == [] and len(attempts) == 3
    assert [c.step for c in open_repository(path).list_commits("exp")] == [10]

    # A push that can never succeed (the target is a file, not a repository) is reported, not raised.
    (tmp_path / "not-a-repo").write_text("")
    broken = CheckpointPusher(str(tmp_path / "not-a-repo"), "exp", max_retries=2, backoff_s=0.01)
    with caplog.at_level(logging.WARNING, logger="codeparrot.repository"):
        broken.push(folder, "step 20")
        broken.push(tmp_path / "missing-folder", "step 30")
        errors = broken.wait()
    assert len(errors) == 2
    assert "step 20" in errors[1] and "3 attempts" in errors[1] and "not a git repository" in errors[1]
    assert "step 30" in errors[0] and "not a folder" in errors[0]
    assert any("failed after 3 attempts" in r.getMessage() for r in caplog.records)
    assert (folder / "model.safetensors").read_bytes() == b"weights"  # the local checkpoint is intact


# --- Hub backend, tested at the HfApi boundary (no Hub is reachable here) ---------------------------------


class FakeHfApi:
    """Records every HfApi call; `upload_folder(run_as_future=True)` completes only when `release` is set."""

    def __init__(self):
        self.calls = []
        self.release = threading.Event()
        self.release.set()

    def create_repo(self, **kw):
        self.calls.append(("create_repo", kw))

    def create_branch(self, **kw):
        self.calls.append(("create_branch", kw))

    def upload_folder(self, **kw):
        files = sorted(p.name for p in Path(kw["folder_path"]).iterdir())
        self.calls.append(("upload_folder", {**kw, "files": files}))
        info = SimpleNamespace(oid=f"{len(self.calls):040x}")
        if not kw.get("run_as_future"):
            return info
        future = Future()
        threading.Thread(target=lambda: (self.release.wait(10), future.set_result(info))).start()
        return future

    def list_repo_refs(self, **kw):
        self.calls.append(("list_repo_refs", kw))
        return SimpleNamespace(branches=[SimpleNamespace(name="main", target_commit="a" * 40),
                                         SimpleNamespace(name="run-a", target_commit="b" * 40)])

    def list_repo_commits(self, **kw):
        from datetime import datetime, timezone

        self.calls.append(("list_repo_commits", kw))
        titles = {"main": ["initial model"], "run-a": ["step 20", "step 10", "initial model"]}.get(kw["revision"])
        if titles is None:
            from httpx2 import Request, Response
            from huggingface_hub.errors import RevisionNotFoundError

            response = Response(404, request=Request("GET", "https://huggingface.co/api/models/u/m/commits/x"))
            raise RevisionNotFoundError("404 Revision Not Found hf_SECRETSECRETSECRET", response=response)
        when = datetime(2024, 5, 1, tzinfo=timezone.utc)
        return [SimpleNamespace(commit_id=f"{i:040x}", title=t, created_at=when) for i, t in enumerate(titles)]

    def list_repo_files(self, **kw):
        self.calls.append(("list_repo_files", kw))
        return [".gitattributes", "config.json", "model.safetensors"] + (["stale.txt"] if kw["revision"] == "main"
                                                                         else [])

    def create_commit(self, **kw):
        self.calls.append(("create_commit", kw))
        return SimpleNamespace(oid="c" * 40)


def test_hub_backend_calls_at_hfapi_boundary_push_is_branch_from_main_and_non_blocking(tmp_path, monkeypatch):
    from codeparrot.repository import hub

    fake = FakeHfApi()
    monkeypatch.setattr(hub, "HfApi", lambda *a, **k: fake)
    folder = tmp_path / "step-10"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(b"w")
    (folder / "optimizer.pt").write_bytes(b"o")
    fake.release.clear()  # the upload hangs until released
    pusher = CheckpointPusher("user/codeparrot", "run-a", backoff_s=0.01)
    pusher.push(folder, "step 10", include=["*.safetensors"])  # returns while the upload cannot finish
    deadline = time.time() + 5
    while not any(name == "upload_folder" for name, _ in fake.calls) and time.time() < deadline:
        time.sleep(0.01)
    assert not pusher.commits  # upload still in flight: training went on
    fake.release.set()
    assert pusher.wait() == []
    names = [name for name, _ in fake.calls]
    assert names == ["create_repo", "create_branch", "upload_folder"]
    assert fake.calls[0][1] == {"repo_id": "user/codeparrot", "repo_type": "model", "exist_ok": True,
                                "private": None}
    assert fake.calls[1][1] == {"repo_id": "user/codeparrot", "branch": "run-a", "revision": "main",
                                "exist_ok": True, "repo_type": "model"}
    upload = fake.calls[2][1]
    assert upload["revision"] == "run-a" and upload["commit_message"] == "step 10"
    assert upload["run_as_future"] is True and upload["delete_patterns"] == "*"
    assert upload["files"] == ["model.safetensors"]  # only the included files went up
    assert len(pusher.commits) == 1


def test_hub_backend_calls_at_hfapi_boundary_browse_and_promote(tmp_path, monkeypatch):
    from huggingface_hub import CommitOperationCopy, CommitOperationDelete

    from codeparrot.repository.hub import HubRepository

    fake = FakeHfApi()
    repo = HubRepository("user/codeparrot", api=fake)
    assert fake.calls == []  # opening without create makes no call
    branches = repo.list_branches()
    assert [(b.name, b.latest_step) for b in branches] == [("main", None), ("run-a", 20)]
    assert branches[1].date.startswith("2024-05-01")
    assert [c.step for c in repo.list_commits("run-a")] == [20, 10, None]
    fake.calls.clear()
    assert repo.promote("run-a") == "c" * 40
    commit = fake.calls[-1][1]
    assert commit["revision"] == "main" and "promote run-a@" in commit["commit_message"]
    assert "(step 20)" in commit["commit_message"]
    copies = [op for op in commit["operations"] if isinstance(op, CommitOperationCopy)]
    deletes = [op for op in commit["operations"] if isinstance(op, CommitOperationDelete)]
    assert sorted(op.path_in_repo for op in copies) == ["config.json", "model.safetensors"]
    assert all(op.src_revision == "0" * 40 for op in copies)  # pinned to the resolved commit
    assert [op.path_in_repo for op in deletes] == ["stale.txt"]
    with pytest.raises(CodeParrotError) as err:
        repo.list_commits("nope")
    assert "revision 'nope' not found" in str(err.value) and "SECRET" not in str(err.value)


def test_hub_errors_are_one_line_and_never_show_tokens():
    from codeparrot.repository.hub import hub_error, scrub

    err = hub_error(RuntimeError("401 for https://x?token=hf_abcdefghijklmnopqrstu\nmore"), "uploading to", "u/m")
    assert "hf_abcdefghijklmnopqrstu" not in str(err) and "\n" not in str(err)
    assert scrub("Bearer hf_0123456789abcdef") == "Bearer hf_***"


def test_hub_snapshot_offline_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(CodeParrotError, match="offline|not found"):
        resolve_model_dir("nobody-here/not-cached-model", "main")


def test_a_missing_folder_that_reads_as_a_hub_id_names_both_readings(monkeypatch):
    """`owner/name` with no folder `owner` here is a Hub id, but a mistyped or not yet made folder (the README's
    gpu_data/model-repo before `make gpu-data`) must not read as a Hub failure only; `hf://` is the Hub alone."""
    from huggingface_hub import constants

    from codeparrot.repository.refs import open_repository

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    both = (r"^nobody-here/not-cached-model: no such folder, and nobody-here/not-cached-model@main is not in the "
            r"local Hub cache either \(the Hub is offline: HF_HUB_OFFLINE=1\)$")
    with pytest.raises(CodeParrotError, match=both):
        resolve_model_dir("nobody-here/not-cached-model", "main")
    with pytest.raises(CodeParrotError, match=both):
        open_repository("nobody-here/not-cached-model").resolve_revision("main")
    with pytest.raises(CodeParrotError, match=r"^downloading nobody-here/not-cached-model@main: the Hub is offline"):
        resolve_model_dir("hf://nobody-here/not-cached-model", "main")

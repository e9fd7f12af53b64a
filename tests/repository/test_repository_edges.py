"""Checkpoint repositories at their edges: git-lfs clones, references that are URLs, run marks on pushed
checkpoints, the Hub's metrics and cache, concurrent creation and staging, odd branch names, the writers' lock
and dates from other time zones."""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from datetime import datetime, timezone
from pathlib import Path
from types import SimpleNamespace

import pytest

from codeparrot.errors import CodeParrotError
from codeparrot.repository import pusher as repository_pusher
from codeparrot.repository.base import (
    BranchInfo,
    CheckpointRepository,
    is_hub_ref,
    main_then_newest,
    strip_scheme,
    validate_branch_name,
    with_run_mark,
)
from codeparrot.repository.local import LFS_ATTRIBUTES, LocalGitRepository, git_lfs_available
from codeparrot.repository.metrics import branch_checkpoints, pushed_losses
from codeparrot.repository.promotion import promote_best
from codeparrot.repository.pusher import CheckpointPusher
from codeparrot.repository.refs import cache_root, open_repository, resolve_model_dir

POINTER = (b"version https://git-lfs.github.com/spec/v1\n"
           b"oid sha256:ec426ce26d0000000000000000000000000000000000000000000000000000000\nsize 1000\n")


@pytest.fixture(autouse=True)
def isolated_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("CODEPARROT_CACHE", str(tmp_path / "cache"))


def folder_with(root: Path, name: str, files: dict[str, bytes | str]) -> Path:
    folder = root / name
    folder.mkdir(parents=True)
    for rel, data in files.items():
        (folder / rel).write_bytes(data if isinstance(data, bytes) else data.encode())
    return folder


def git(*args: str, env: dict | None = None) -> str:
    return subprocess.run(["git", *args], check=True, capture_output=True, text=True,
                          env={**os.environ, **(env or {})}).stdout


# --- 1. git-lfs: clones convert, pointers are refused ----------------------------------------------------------


@pytest.mark.skipif(not git_lfs_available(), reason="git-lfs is not installed")
def test_lfs_repository_clones_with_its_weights(tmp_path):
    """info/attributes is not cloned: the LFS rules must travel in the tree, or a clone holds pointer files."""
    repo = LocalGitRepository(tmp_path / "repo.git", create=True, use_lfs=True)
    weights = os.urandom(5000)
    repo.commit_folder(folder_with(tmp_path, "f", {"config.json": "{}", "model.safetensors": weights}), "main",
                       "initial model")
    # a git-lfs user's clone (git lfs install: the filter in the global config, here a throwaway one)
    home = tmp_path / "home"
    home.mkdir()
    env = {"HOME": str(home), "GIT_CONFIG_GLOBAL": str(home / ".gitconfig")}
    subprocess.run(["git", "lfs", "install", "--skip-repo"], check=True, capture_output=True, cwd=home,
                   env={**os.environ, **env})
    git("clone", "-q", str(tmp_path / "repo.git"), str(tmp_path / "clone"), env=env)
    assert (tmp_path / "clone" / "model.safetensors").read_bytes() == weights
    assert git(f"--git-dir={tmp_path / 'repo.git'}", "show", "main:.gitattributes") == LFS_ATTRIBUTES
    # what the repository hands out is the committed folder, without the rules it added
    assert sorted(p.name for p in repo.download("main", tmp_path / "out").iterdir()) == [
        "config.json", "model.safetensors"]


def test_lfs_pointer_files_are_refused_and_never_cached(tmp_path):
    """A clone of an LFS repository made without git-lfs holds pointer files: materializing it is a one-line
    error naming `git lfs pull`, nothing is cached under the commit id, loading it names the file."""
    from codeparrot.repository.model import load_pretrained_model

    bare = open_repository(str(tmp_path / "repo.git"), create=True)
    commit = bare.commit_folder(folder_with(tmp_path, "f", {"config.json": "{}", "model.safetensors": POINTER}),
                                "main", "initial model")
    git("clone", "-q", str(tmp_path / "repo.git"), str(tmp_path / "clone"))
    for ref, revision in ((tmp_path / "repo.git", "main"), (tmp_path / "clone", "main"), (tmp_path / "clone", None)):
        with pytest.raises(CodeParrotError) as err:
            resolve_model_dir(str(ref), revision)
        assert "model.safetensors is a git-lfs pointer" in str(err.value) and "git lfs pull" in str(err.value)
        assert "\n" not in str(err.value)
    assert not (cache_root() / commit).exists()  # the cache keyed by the commit id holds no pointer files
    # a cache folder an older version filled with pointers is not used
    (cache_root() / commit).mkdir(parents=True)
    (cache_root() / commit / "model.safetensors").write_bytes(POINTER)
    with pytest.raises(CodeParrotError, match="git-lfs pointer"):
        resolve_model_dir(str(tmp_path / "repo.git"), "main")
    assert not (cache_root() / commit).exists()
    with pytest.raises(CodeParrotError, match="git-lfs pointer"):
        bare.download("main", tmp_path / "out")
    assert not (tmp_path / "out").exists()

    # a plain folder (copied out of such a clone): safetensors' own error becomes one line naming the file
    config = json.dumps({"model_type": "gpt2", "vocab_size": 16, "n_positions": 8, "n_embd": 8, "n_layer": 1,
                         "n_head": 2})
    plain = folder_with(tmp_path, "plain", {"config.json": config, "model.safetensors": POINTER})
    with pytest.raises(CodeParrotError) as err:
        load_pretrained_model(str(plain))
    assert f"{plain / 'model.safetensors'}: it is a git-lfs pointer" in str(err.value)
    assert "git lfs pull" in str(err.value) and "\n" not in str(err.value)
    (plain / "model.safetensors").write_bytes(b"\xff" * 64)  # not a pointer, not safetensors either
    with pytest.raises(CodeParrotError, match=f"cannot load the weights {plain / 'model.safetensors'}: "):
        load_pretrained_model(str(plain))


# --- 2, 3, 13. references: file://, pasted URLs, what is local -------------------------------------------------


def test_file_scheme_does_not_bypass_the_initial_model_guard(tmp_path):
    from codeparrot.repository.initialize import check_can_initialize

    repo = open_repository(str(tmp_path / "repo"), create=True)
    repo.commit_folder(folder_with(tmp_path, "f", {"config.json": "{}"}), "main", "initial model")
    with pytest.raises(CodeParrotError, match="already has an initial model"):
        check_can_initialize(f"file://{tmp_path / 'repo'}")
    check_can_initialize(f"file://{tmp_path / 'repo'}", force=True)


def test_urls_are_refused_without_showing_credentials_and_create_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    secret = "hf_abcdefghijklmnopqrstuv"
    for url in (f"https://me:{secret}@huggingface.co/u/m", f"https://{secret}@example.com/u/m", "http://host/u/m",
                "ssh://git@host/repo.git", f"s3://bucket/{secret}"):
        for call in (lambda u=url: open_repository(u, create=True), lambda u=url: resolve_model_dir(u),
                     lambda u=url: is_hub_ref(u)):
            with pytest.raises(CodeParrotError) as err:
                call()
            message = str(err.value)
            assert message.startswith("unsupported repository reference") and "\n" not in message, message
            assert secret not in message and "me:" not in message, message
    assert list(tmp_path.iterdir()) == []  # no folder named after a URL
    # a pasted Hub address is the Hub id it names; hf:// and file:// stay as they were
    assert is_hub_ref("https://huggingface.co/u/m") and strip_scheme("https://huggingface.co/u/m/") == "u/m"
    assert strip_scheme("hf://u/m") == "u/m" and strip_scheme(f"file://{tmp_path}") == str(tmp_path)


def test_initialize_docstring_example_is_local_and_an_empty_folder_is_a_new_repository(
        tmp_path, monkeypatch, repo_root, stdlib_texts):
    import re

    from codeparrot.repository.initialize import check_can_initialize, initialize_model
    from codeparrot.repository.model import ModelConfig
    from codeparrot.tokenizer import train_tokenizer

    monkeypatch.chdir(tmp_path)  # no folder "models" here
    doc = (repo_root / "scripts" / "initialize_model.py").read_text()
    example = re.search(r"--repo (\S+)", doc).group(1)
    assert not is_hub_ref(example)  # the example creates a local repository, as it says
    (tmp_path / "empty").mkdir()
    check_can_initialize("empty")  # an empty folder is a new repository, not "exists but is not a git repository"
    tokenizer = train_tokenizer(stdlib_texts[:3], vocab_size=300, show_progress=False)
    cfg = ModelConfig(n_layer=1, n_embd=16, n_head=2, n_positions=16)
    commit = initialize_model(cfg, tokenizer, "empty")
    repo = open_repository("empty")
    assert isinstance(repo, LocalGitRepository) and repo.bare and repo.list_commits("main")[0].commit_id == commit
    with pytest.raises(CodeParrotError, match="already has an initial model"):
        check_can_initialize(f"file://{tmp_path / 'empty'}")


# --- 4. run marks: a branch started from another experiment's branch ---------------------------------------------


def _run(root: Path, repo: Path, name: str, parent: str, losses: dict[int, float]) -> None:
    """A training run `name` pushing one checkpoint per step of `losses` (its own validation loss each)."""
    pusher = CheckpointPusher(str(repo), name, from_revision=parent, backoff_s=0.01)
    run_dir = root / name
    for step, loss in losses.items():
        run_dir.mkdir(exist_ok=True)
        with open(run_dir / "metrics.jsonl", "a") as f:
            f.write(json.dumps({"step": step, "val_loss": loss, "val_tokens": 100}) + "\n")
        ckpt = folder_with(run_dir / "checkpoints", f"step-{step}", {"w.bin": f"{name} {step}"})
        pusher.push(ckpt, f"step {step}")
    assert pusher.wait() == []


def test_promote_and_plot_choose_among_the_branchs_own_run_only(tmp_path, capsys):
    path = tmp_path / "repo"
    repo = open_repository(str(path), create=True)
    repo.commit_folder(folder_with(tmp_path, "init", {"w.bin": "init"}), "main", "initial model")
    _run(tmp_path, path, "exp-a", "main", {100: 3.0, 200: 2.9})  # pretraining
    _run(tmp_path, path, "exp-b", "exp-a", {100: 3.6, 200: 3.4})  # a fine-tune of it, its steps from 0 again
    assert [(c.step, m["val_loss"]) for c, m in pushed_losses(repo, "exp-b")] == [(100, 3.6), (200, 3.4)]
    assert [c.step for c in branch_checkpoints(repo, "exp-a")] == [100, 200]
    lines = promote_best(repo, "exp-b")
    assert "chosen: exp-b: step 200" in lines[0] and "of its 2 checkpoint(s)" in lines[0]
    assert not any(line.startswith("note:") for line in lines)
    assert git(f"--git-dir={path}", "show", "main:w.bin") == "exp-b 200"
    assert capsys.readouterr().err == ""
    log = repo.list_commits("exp-b")
    assert [(c.step, c.run) for c in log] == [(200, "exp-b"), (100, "exp-b"), (200, "exp-a"), (100, "exp-a"),
                                              (None, None)]
    assert [c.message for c in log[:2]] == ["step 200", "step 100"]  # the subject stays as training wrote it


def test_unmarked_checkpoints_keep_todays_choice_and_say_so(tmp_path, capsys):
    """Commits pushed before runs marked theirs cannot be told apart: all are kept, as before, with a note."""
    path = tmp_path / "repo"
    repo = open_repository(str(path), create=True)
    repo.commit_folder(folder_with(tmp_path, "init", {"w.bin": "init"}), "main", "initial model")
    for step in (10, 20):
        repo.commit_folder(folder_with(tmp_path, f"old-{step}", {"w.bin": str(step)}), "old", f"step {step}")
    assert [c.step for c in branch_checkpoints(repo, "old")] == [10, 20]
    assert "note: 2 checkpoint(s) of 'old' carry no run mark" in capsys.readouterr().err
    notes: list[str] = []
    assert [c.step for c in branch_checkpoints(repo, "old", notes)] == [10, 20] and len(notes) == 1
    lines = promote_best(repo, "old")
    assert "its newest checkpoint (step 20)" in lines[0] and lines[1].startswith("note: 2 checkpoint(s)")
    assert capsys.readouterr().err == ""  # the report carries the note: it is not printed twice


# --- 4, 5. the Hub: run marks travel in the description; only a missing metrics.json is "no metrics" -------------


class HubApi:
    """The HfApi calls promote and the pusher make, on an in-memory repository: branch exp-b (steps 100, 200 of
    its own, marked) started from exp-a's (steps 100, 200, marked exp-a). `fail`: commit id -> the exception
    `hf_hub_download` raises for its metrics.json."""

    def __init__(self, tmp: Path, fail: dict[str, Exception] | None = None):
        self.tmp, self.fail, self.calls = tmp, fail or {}, []
        when = datetime(2024, 5, 1, tzinfo=timezone.utc)

        def commit(cid: str, title: str, run: str | None):
            return SimpleNamespace(commit_id=cid * 40, title=title, created_at=when,
                                   message=f"\n\nCodeParrot-Run: {run}\n" if run else "")

        self.history = {"main": [commit("0", "initial model", None)]}
        self.history["exp-a"] = [commit("2", "step 200", "exp-a"), commit("1", "step 100", "exp-a")]
        self.history["exp-b"] = [commit("4", "step 200", "exp-b"), commit("3", "step 100", "exp-b")]
        self.history["exp-b"] += self.history["exp-a"] + self.history["main"]
        self.history["exp-a"] += self.history["main"]
        self.loss = {"1" * 40: 3.0, "2" * 40: 2.9, "3" * 40: 3.6, "4" * 40: 3.4}

    def list_repo_refs(self, **kw):
        return SimpleNamespace(branches=[SimpleNamespace(name=n, target_commit=c[0].commit_id)
                                         for n, c in self.history.items()])

    def list_repo_commits(self, revision, **kw):
        if revision in self.history:
            return self.history[revision]
        return [c for cs in self.history.values() for c in cs if c.commit_id == revision][:1]

    def list_repo_files(self, **kw):
        return ["w.bin", "metrics.json"]

    def hf_hub_download(self, repo_id, filename, revision=None, repo_type=None, **kw):
        self.calls.append(("hf_hub_download", repo_id, filename, revision, repo_type))
        if revision in self.fail:
            raise self.fail[revision]
        path = self.tmp / f"{revision}.json"
        path.write_text(json.dumps({"step": 1, "val_loss": self.loss[revision]}))
        return str(path)

    def create_commit(self, **kw):
        self.calls.append(("create_commit", kw["commit_message"]))
        return SimpleNamespace(oid="c" * 40)


def _http_error(cls, status: int, text: str):
    from httpx2 import Request, Response

    request = Request("GET", "https://huggingface.co/user/m/resolve/x/metrics.json")
    return cls(text, response=Response(status, request=request))


def test_hub_promote_uses_the_run_marks_and_fails_loudly_when_metrics_cannot_be_read(tmp_path):
    from huggingface_hub import errors

    from codeparrot.repository.hub import HubRepository

    api = HubApi(tmp_path)
    repo = HubRepository("user/m", api=api)
    lines = promote_best(repo, "exp-b")
    assert "step 200 (444444444444)" in lines[0]
    assert api.calls[-1] == ("create_commit", "promote 444444444444 (step 200)")
    assert ("hf_hub_download", "user/m", "metrics.json", "4" * 40, "model") in api.calls  # through repo.api
    assert [(c.step, c.run) for c in repo.list_commits("exp-b")][:3] == [(200, "exp-b"), (100, "exp-b"),
                                                                         (200, "exp-a")]

    # a checkpoint without metrics.json (404 for the file): no loss for it, the others still compete
    api = HubApi(tmp_path, fail={"4" * 40: _http_error(errors.RemoteEntryNotFoundError, 404, "404 Entry Not Found")})
    assert "step 100 (333333333333)" in promote_best(HubRepository("user/m", api=api), "exp-b")[0]

    # any other failure (a 502, a rate limit, an offline cache miss) must not silently drop the best checkpoint
    for failure in (_http_error(errors.HfHubHTTPError, 502, "502 Bad Gateway hf_SECRETSECRETSECRET\nmore"),
                    errors.LocalEntryNotFoundError("not in the cache")):
        api = HubApi(tmp_path, fail={"3" * 40: failure})
        with pytest.raises(CodeParrotError) as err:
            promote_best(HubRepository("user/m", api=api), "exp-b")
        message = str(err.value)
        assert f"reading metrics.json of user/m@{'3' * 40}" in message and "\n" not in message, message
        assert "SECRET" not in message and not any(c[0] == "create_commit" for c in api.calls)


def test_hub_push_carries_the_run_mark_in_the_commit_description(tmp_path, monkeypatch):
    from concurrent.futures import Future

    from codeparrot.repository import hub

    uploads = []

    class Api:
        def create_repo(self, **kw):
            pass

        def create_branch(self, **kw):
            pass

        def upload_folder(self, **kw):
            uploads.append(kw)
            future = Future()
            future.set_result(SimpleNamespace(oid="d" * 40))
            return future

    monkeypatch.setattr(hub, "HfApi", lambda *a, **k: Api())
    pusher = CheckpointPusher("user/m", "run-a", backoff_s=0.01)
    pusher.push(folder_with(tmp_path, "step-10", {"w.bin": "x"}), "step 10")
    assert pusher.wait() == []
    assert uploads[0]["commit_message"] == "step 10"
    assert uploads[0]["commit_description"] == "CodeParrot-Run: run-a"


# --- 10. the Hub cache, offline ---------------------------------------------------------------------------------


def test_offline_hub_download_reads_the_cache(tmp_path, monkeypatch):
    """`download` of a Hub revision the cache holds works offline, and writes real files (not cache links)."""
    from huggingface_hub import constants

    from codeparrot.repository.hub import HubRepository

    cache = tmp_path / "hub"
    commit = "0123456789abcdef0123456789abcdef01234567"
    folder = cache / "models--user--m"
    (folder / "refs").mkdir(parents=True)
    (folder / "refs" / "main").write_text(commit)
    (folder / "blobs").mkdir()
    snapshot = folder / "snapshots" / commit
    (snapshot / "sub").mkdir(parents=True)
    for rel, data in {"config.json": b'{"a": 1}', "sub/model.safetensors": b"weights"}.items():
        blob = folder / "blobs" / f"blob-{len(data)}"
        blob.write_bytes(data)
        (snapshot / rel).symlink_to(os.path.relpath(blob, (snapshot / rel).parent))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    for revision in ("main", commit):
        out = HubRepository("user/m", api=object()).download(revision, tmp_path / f"out-{revision[:4]}")
        assert (out / "config.json").read_bytes() == b'{"a": 1}' and not (out / "config.json").is_symlink()
        assert (out / "sub" / "model.safetensors").read_bytes() == b"weights"
        assert sorted(p.name for p in out.iterdir()) == ["config.json", "sub"]
    with pytest.raises(CodeParrotError, match="offline"):
        HubRepository("user/other", api=object()).download("main", tmp_path / "missing")
    assert not (tmp_path / "missing").exists()


# --- 6, 7. the pusher's staging folders -------------------------------------------------------------------------


class InstantRepository(CheckpointRepository):
    """Commits instantly: the worker finishes a push right as the next one is being staged."""

    ref = "instant"

    def __init__(self):
        self.messages = []

    def create_branch(self, *args, **kwargs):
        pass

    def commit_folder(self, folder, branch, message):
        self.messages.append(message)
        return "0" * 40

    def list_branches(self):
        return []

    def list_commits(self, branch):
        return []

    def _write_revision(self, *args):
        pass

    def promote(self, *args):
        pass


def test_staging_survives_the_root_being_removed_between_mkdir_and_staging(tmp_path, monkeypatch):
    """The worker (or another process's pusher) removes the empty staging root after its last push; a push
    staging at that moment made the root and then found it gone."""
    import tempfile

    ckpts = tmp_path / "checkpoints"
    folder = folder_with(ckpts, "step-1", {"config.json": "{}"})
    real_mkdtemp, real_mkstemp, removed = tempfile.mkdtemp, tempfile.mkstemp, []

    def removing_root_first(real):
        def make(*args, dir=None, **kwargs):
            if not removed:  # the other party's rmdir lands right after this push's mkdir
                os.rmdir(dir)
                removed.append(dir)
            return real(*args, dir=dir, **kwargs)
        return make

    monkeypatch.setattr(tempfile, "mkdtemp", removing_root_first(real_mkdtemp))
    monkeypatch.setattr(tempfile, "mkstemp", removing_root_first(real_mkstemp))
    pusher = CheckpointPusher("instant", "exp", backoff_s=0)
    pusher._repo = InstantRepository()
    pusher.push(folder, "step 1")
    assert pusher.wait() == [] and removed and len(pusher.commits) == 1
    monkeypatch.undo()

    # and for real: many instant pushes race the worker's removal of the root (none dropped for a newer one)
    pusher = CheckpointPusher("instant", "exp", backoff_s=0, max_waiting=200)
    pusher._repo = InstantRepository()
    folders = [folder_with(ckpts, f"step-{i}", {"config.json": "{}"}) for i in range(2, 202)]
    for i, folder in enumerate(folders):
        pusher.push(folder, f"step {i}")
    assert pusher.wait() == [] and len(pusher.commits) == 200
    assert not (ckpts / ".codeparrot-push").exists()


@pytest.mark.skipif(repository_pusher.fcntl is None, reason="needs flock")
def test_stale_staging_folders_are_removed_when_a_pusher_starts(tmp_path):
    import fcntl

    ckpts = tmp_path / "checkpoints"
    root = ckpts / ".codeparrot-push"
    old_layout = folder_with(root, "step-5-abc", {"model.safetensors": "left by a run killed mid-push"})
    dead = folder_with(root, "step-6-def", {"model.safetensors": "its pusher died"})
    (root / "step-6-def.lock").write_text("")
    live = folder_with(root, "step-7-ghi", {"model.safetensors": "another pusher is committing it"})
    with open(root / "step-7-ghi.lock", "a+") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # a live pusher holds its folder's lock
        pusher = CheckpointPusher("instant", "exp", backoff_s=0)
        pusher._repo = repo = InstantRepository()
        pusher.push(folder_with(ckpts, "step-8", {"config.json": "{}"}), "step 8")
        assert pusher.wait() == [] and repo.messages == [with_run_mark("step 8", "exp")]
        assert not old_layout.exists() and not dead.exists() and not (root / "step-6-def.lock").exists()
        assert live.is_dir() and (root / "step-7-ghi.lock").exists()
        assert sorted(p.name for p in root.iterdir()) == ["step-7-ghi", "step-7-ghi.lock"]


def test_pending_pushes_are_listed_and_wait_can_time_out(tmp_path):
    release = threading.Event()

    class Slow(InstantRepository):
        def commit_folder(self, folder, branch, message):
            assert release.wait(30)
            return super().commit_folder(folder, branch, message)

    pusher = CheckpointPusher("instant", "exp", backoff_s=0)
    pusher._repo = Slow()
    for step in (1, 2):
        pusher.push(folder_with(tmp_path / "ckpts", f"step-{step}", {"config.json": "{}"}), f"step {step}")
    pusher.push(tmp_path / "missing", "step 3")  # not staged: an error at once, never pending
    started = time.monotonic()
    errors = pusher.wait(timeout=0.2)
    assert 0.2 <= time.monotonic() - started < 10
    assert pusher.pending() == ["step 1", "step 2"] and len(errors) == 1 and "step 3" in errors[0]
    release.set()
    assert pusher.wait(timeout=30) == errors and pusher.pending() == [] and len(pusher.commits) == 2


def test_pushes_queued_behind_a_slow_one_are_bounded_and_the_newest_is_kept(tmp_path, caplog):
    """A repository slower than the saves: the oldest waiting push is dropped (its staged hard links with it, so
    checkpoints keep_last deleted do not pile up on disk) and the newest, e.g. the final one, always goes out."""
    release, started = threading.Event(), threading.Event()

    class Slow(InstantRepository):
        def commit_folder(self, folder, branch, message):
            started.set()
            assert release.wait(30)
            return super().commit_folder(folder, branch, message)

    pusher = CheckpointPusher("instant", "exp", backoff_s=0, max_waiting=2)
    pusher._repo = repo = Slow()
    ckpts = tmp_path / "ckpts"
    pusher.push(folder_with(ckpts, "step-1", {"config.json": "{}"}), "step 1")
    assert started.wait(30)  # step 1 in flight
    for step in (2, 3, 4, 5):
        pusher.push(folder_with(ckpts, f"step-{step}", {"config.json": "{}"}), f"step {step}")
    assert pusher.pending() == ["step 1", "step 4", "step 5"] and pusher.superseded == ["step 2", "step 3"]
    staged = sorted(p.name.rsplit("-", 1)[0] for p in (ckpts / ".codeparrot-push").iterdir() if p.is_dir())
    assert staged == ["step-1", "step-4", "step-5"]  # the dropped pushes' links are gone
    assert "push 'step 2' to instant@exp dropped" in caplog.text
    release.set()
    assert pusher.wait(timeout=30) == []
    assert repo.messages == [with_run_mark(f"step {n}", "exp") for n in (1, 4, 5)]
    assert not (ckpts / ".codeparrot-push").exists()


# --- 8. two processes creating the same new repository ----------------------------------------------------------


def test_concurrent_creation_keeps_the_first_repository(tmp_path, monkeypatch):
    """Another process publishes the repository (and commits to it) while this one is still initializing its
    own: this one opens theirs instead of replacing it."""
    path = tmp_path / "repo"
    real_run = LocalGitRepository._run
    raced = []

    def run(self, cmd, *args, **kwargs):
        if not raced and cmd[:2] == ["git", "init"]:
            raced.append(1)
            other = LocalGitRepository(path, create=True)  # the other process, first to publish
            other.commit_folder(folder_with(tmp_path, "theirs", {"w.bin": "theirs"}), "other", "step 1")
        return real_run(self, cmd, *args, **kwargs)

    monkeypatch.setattr(LocalGitRepository, "_run", run)
    mine = LocalGitRepository(path, create=True)
    mine.commit_folder(folder_with(tmp_path, "mine", {"w.bin": "mine"}), "mine", "step 1")
    assert raced and {b.name for b in open_repository(str(path)).list_branches()} == {"other", "mine"}
    assert not mine.created  # it knows it did not make it (initialize_model then never removes it)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".repo.")]  # no temporary left behind


def test_two_runs_initializing_one_new_repository_commit_one_initial_model(tmp_path, monkeypatch):
    """Two runs of initialize_model.py on the same new repository at the same moment: one commits the initial
    model, the other stops as if it had found it there (both used to commit one: the check for an initial model
    was made outside the repository's lock, by both, before either committed)."""
    from codeparrot.repository import initialize
    from codeparrot.repository.model import ModelConfig

    monkeypatch.setattr(initialize, "to_gpt2_config", lambda cfg, tokenizer: None)  # no model: only the race
    monkeypatch.setattr(initialize, "build_model", lambda config, seed: None)
    both_built, both_checked = threading.Barrier(2, timeout=30), threading.Barrier(2, timeout=1)

    def save(model, folder, tokenizer):
        (Path(folder) / "w.bin").write_text("weights")
        both_built.wait()  # both found no repository; they race from here

    def commit_folder(self, *args):
        try:
            both_checked.wait()  # the old order gets here twice; under the lock only one does, and waits 1 s
        except threading.BrokenBarrierError:
            pass
        return real_commit(self, *args)

    real_commit = LocalGitRepository.commit_folder
    monkeypatch.setattr(initialize, "save_model_folder", save)
    monkeypatch.setattr(LocalGitRepository, "commit_folder", commit_folder)
    path, results = tmp_path / "repo", []

    def run():
        try:
            results.append(initialize.initialize_model(ModelConfig(), None, str(path)))
        except CodeParrotError as err:
            results.append(str(err))

    runs = [threading.Thread(target=run) for _ in range(2)]
    for thread in runs:
        thread.start()
    for thread in runs:
        thread.join(30)
    initial = [c.commit_id for c in open_repository(str(path)).list_commits("main") if c.message == "initial model"]
    assert len(initial) == 1 and sorted(results, key=len) == [initial[0], f"{path} already has an initial model on "
                                                                          "main (--force adds another)"]


# --- 9. branch names with Unicode separators --------------------------------------------------------------------


def test_branch_names_with_unicode_separators(tmp_path):
    for bad in ("x\x85y", "a\u2028b", "a\u2029b", "exp\u00a0nbsp", "zero\u200bwidth", "tab\tx", "e\u3000x"):
        with pytest.raises(CodeParrotError, match="invalid branch name"):
            validate_branch_name(bad)
    for good in ("exp-é", "exp/a", "日本語", "run_1.5"):
        assert validate_branch_name(good) == good
    path = tmp_path / "repo"
    repo = open_repository(str(path), create=True)
    commit = repo.commit_folder(folder_with(tmp_path, "f", {"w.bin": "x"}), "main", "initial model")
    for name in ("a\u2028b", "x\x85y", "exp\u00a0nbsp"):  # made with git itself: the listing must still work
        git(f"--git-dir={path}", "update-ref", f"refs/heads/{name}", commit)
    assert {b.name for b in repo.list_branches()} == {"main", "a\u2028b", "x\x85y", "exp\u00a0nbsp"}
    with pytest.raises(CodeParrotError) as err:
        repo.list_commits("nope")
    assert "\n" not in str(err.value) and "exp\u00a0nbsp" in str(err.value)


# --- 11. the writers' lock says whom it waits for ---------------------------------------------------------------


@pytest.mark.skipif(repository_pusher.fcntl is None, reason="needs flock")
def test_waiting_for_the_lock_is_reported(tmp_path, capfd):
    import fcntl

    path = tmp_path / "repo"
    repo = open_repository(str(path), create=True)
    folder = folder_with(tmp_path, "f", {"w.bin": "x"})
    with open(path / "codeparrot.lock", "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        lock.write("process 4242 on trainer-7\n")
        lock.flush()
        done = []
        writer = threading.Thread(target=lambda: done.append(repo.commit_folder(folder, "exp", "step 1")))
        writer.start()
        deadline, err = time.monotonic() + 30, ""
        while "waiting" not in err and time.monotonic() < deadline:
            time.sleep(0.05)
            err += capfd.readouterr().err
        assert not done  # it waits, saying for whom
        fcntl.flock(lock, fcntl.LOCK_UN)
    writer.join(30)
    assert done and err.strip() == f"waiting for the lock on {path} held by process 4242 on trainer-7"


# --- 12. dates from machines in other time zones ----------------------------------------------------------------


def test_list_sorts_by_instant_not_by_the_date_text(tmp_path, monkeypatch):
    path = tmp_path / "repo"
    repo = open_repository(str(path), create=True)
    monkeypatch.setenv("GIT_COMMITTER_DATE", "2024-05-01T00:00:00+00:00")
    repo.commit_folder(folder_with(tmp_path, "f", {"w.bin": "x"}), "main", "initial model")
    # 03:00 UTC, committed in Tokyo: its text sorts after the newer run's
    monkeypatch.setenv("GIT_COMMITTER_DATE", "2024-05-01T12:00:00+09:00")
    repo.commit_folder(tmp_path / "f", "older-in-tokyo", "step 1")
    monkeypatch.setenv("GIT_COMMITTER_DATE", "2024-05-01T04:00:00+00:00")
    repo.commit_folder(tmp_path / "f", "newer-in-utc", "step 1")
    assert [b.name for b in repo.list_branches()] == ["main", "newer-in-utc", "older-in-tokyo"]
    dated = [BranchInfo("b", "0", "2024-05-01T10:00:00+09:00", None), BranchInfo("main", "0", "", None),
             BranchInfo("c", "0", "", None), BranchInfo("a", "0", "2024-05-01T02:00:00+00:00", None)]
    assert [b.name for b in main_then_newest(dated)] == ["main", "a", "b", "c"]  # no date (a mirror): last


def test_a_filesystem_without_locks_still_takes_commits_and_says_so_once(tmp_path, monkeypatch, capsys):
    """NFS without its lock daemon answers flock with ENOLCK: commits go on (git's compare-and-swap of the branch
    still refuses a lost update) with one note per repository; any other failure to lock is a one-line error."""
    import errno

    from codeparrot import file_lock

    def no_locks(fd, op):
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

    monkeypatch.setattr(file_lock.fcntl, "flock", no_locks)
    repo = LocalGitRepository(tmp_path / "repo", create=True)
    for n in range(2):
        repo.commit_folder(folder_with(tmp_path, f"f{n}", {"config.json": f'{{"n": {n}}}'}), "main", f"commit {n}")
    assert [line for line in capsys.readouterr().err.splitlines() if "cannot be locked here" in line] == [
        f"note: {repo.git_dir / 'codeparrot.lock'} cannot be locked here ({os.strerror(errno.ENOLCK)}); writers of "
        f"{repo.ref} are not serialized (a concurrent push to the same branch fails instead of waiting)"]
    assert git("--git-dir", str(repo.git_dir), "log", "--format=%s", "main").split("\n")[:2] == ["commit 1", "commit 0"]

    def denied(fd, op):
        raise OSError(errno.EACCES, os.strerror(errno.EACCES))

    monkeypatch.setattr(file_lock.fcntl, "flock", denied)
    with pytest.raises(CodeParrotError, match=r"^cannot lock .*codeparrot\.lock: Permission denied$"):
        repo.commit_folder(folder_with(tmp_path, "f2", {"config.json": "{}"}), "main", "commit 2")

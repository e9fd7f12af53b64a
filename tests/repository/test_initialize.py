"""Model initialization against the Hub: two runs creating and initializing one new Hub repository at once."""

from __future__ import annotations

import threading
from datetime import datetime, timezone
from pathlib import Path
from types import SimpleNamespace

from codeparrot.errors import CodeParrotError
from codeparrot.repository import hub, initialize
from codeparrot.repository.model import ModelConfig


class HubStore:
    """The HfApi calls initialization makes, on one in-memory Hub repository shared by every client, with the Hub's
    rules: `create_repo(exist_ok=True)` succeeds for every caller and the first one gets the "initial commit";
    `upload_folder` makes one commit holding exactly the folder's files, refused (412) when `parent_commit` is
    given and is no longer the branch's head. `meet`: uploads wait (up to 2 s) until this many have started."""

    def __init__(self, meet: int = 1):
        self.branches: dict[str, list[SimpleNamespace]] = {}  # name -> commits, newest first
        self.lock, self.meet = threading.Lock(), threading.Barrier(meet, timeout=2)

    def _commit(self, branch: str, title: str, files: dict[str, str]) -> SimpleNamespace:
        commits = self.branches.setdefault(branch, [])
        commit = SimpleNamespace(commit_id=f"{sum(map(len, self.branches.values())) + 1:040x}", title=title,
                                 created_at=datetime(2024, 5, 1, tzinfo=timezone.utc), message=title, files=files)
        commits.insert(0, commit)
        return commit

    def create_repo(self, **kw):
        with self.lock:
            if not self.branches:
                self._commit("main", "initial commit", {".gitattributes": ""})

    def list_repo_refs(self, **kw):
        with self.lock:
            return SimpleNamespace(branches=[SimpleNamespace(name=name, target_commit=commits[0].commit_id)
                                             for name, commits in self.branches.items()])

    def list_repo_commits(self, **kw):
        with self.lock:
            return list(self.branches[kw["revision"]])

    def upload_folder(self, **kw):
        from httpx2 import Request, Response
        from huggingface_hub.errors import HfHubHTTPError

        files = {p.name: p.read_text() for p in Path(kw["folder_path"]).iterdir()}
        try:
            self.meet.wait()  # both runs upload before either commit lands
        except threading.BrokenBarrierError:
            pass
        with self.lock:
            head = self.branches[kw["revision"]][0].commit_id
            if kw.get("parent_commit") not in (None, head):
                request = Request("POST", "https://huggingface.co/api/models/me/cp/commit/main")
                raise HfHubHTTPError("412 Precondition Failed: A commit has happened since. Please refresh and try "
                                     "again.", response=Response(412, request=request))
            return SimpleNamespace(oid=self._commit(kw["revision"], kw["commit_message"], files).commit_id)


def test_two_runs_initializing_one_new_hub_repository_commit_one_initial_model(monkeypatch):
    """Two runs of initialize_model.py creating the same new Hub repository at the same moment: both creations
    succeed, both find main without an initial model, both upload. One initial model is committed; the other run
    stops as if it had found it there (the Hub has no lock: the commit names the head it checked as its parent,
    and the Hub refuses it once main has moved). Before, both committed: two "initial model" commits, and the run
    that reported success first had its weights replaced by the other run's."""
    store = HubStore(meet=2)
    monkeypatch.setattr(hub, "HfApi", lambda *a, **k: store)
    monkeypatch.setattr(initialize, "to_gpt2_config", lambda cfg, tokenizer: tokenizer)  # no model: only the race
    monkeypatch.setattr(initialize, "build_model", lambda config, seed: f"weights of run {config}")
    monkeypatch.setattr(initialize, "save_model_folder", lambda model, folder, tokenizer: (
        (Path(folder) / "model.safetensors").write_text(model), (Path(folder) / "tokenizer.json").write_text(
            f"tokenizer of run {tokenizer}")))
    results: dict[str, str] = {}

    def run(name: str) -> None:
        try:
            results[name] = initialize.initialize_model(ModelConfig(), name, "hf://me/cp")
        except CodeParrotError as err:
            results[name] = str(err)

    runs = [threading.Thread(target=run, args=(name,)) for name in "ab"]
    for thread in runs:
        thread.start()
    for thread in runs:
        thread.join(30)
    main = store.branches["main"]
    assert [c.title for c in main] == ["initial model", "initial commit"]
    winner = next(name for name, result in results.items() if result == main[0].commit_id)
    loser = "b" if winner == "a" else "a"
    assert results[loser] == "hf://me/cp already has an initial model on main (--force adds another)"
    # main's weights and tokenizer are the same run's: the one that was told it committed them
    assert main[0].files == {"model.safetensors": f"weights of run {winner}", "tokenizer.json":
                             f"tokenizer of run {winner}", "model_config.yaml": main[0].files["model_config.yaml"]}


def test_a_tokenizer_commit_racing_an_initialization_on_the_hub_never_replaces_the_model(monkeypatch, tmp_path):
    """train_tokenizer.py --repo checks main for an initial model, then commits; on the Hub (no lock) an
    initialization landing in between had its weights replaced by the tokenizer's tree. The tokenizer's commit
    names the head it checked as its parent: the Hub refuses it, and the check again says why."""
    from codeparrot.repository.refs import open_repository
    from codeparrot.tokenizer import _commit_tokenizer

    store = HubStore()
    monkeypatch.setattr(hub, "HfApi", lambda *a, **k: store)
    repo = open_repository("hf://me/cp", create=True)
    real_upload = store.upload_folder

    def initialized_first(**kw):  # the other run's initial model lands right after the tokenizer's check
        with store.lock:
            store._commit("main", "initial model", {"model.safetensors": "weights"})
        return real_upload(**kw)

    store.upload_folder = initialized_first
    tok = tmp_path / "tok"
    tok.mkdir()
    (tok / "tokenizer.json").write_text("{}")
    try:
        _commit_tokenizer(repo, "hf://me/cp", tok, "tokenizer (vocab 300)")
    except CodeParrotError as err:
        assert str(err).startswith("hf://me/cp already has an initial model on main: committing the tokenizer")
    else:
        raise AssertionError("the tokenizer was committed over the initial model")
    assert [c.title for c in store.branches["main"]] == ["initial model", "initial commit"]

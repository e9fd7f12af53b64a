"""Model initialization: a preset + a tokenizer -> a freshly initialized GPT-2 committed as "initial model".

One sequence for `scripts/initialize_model.py`, the demo, the toy run and the benchmarks: check the
repository (no second initial model on `main` unless forced), build the model, save weights + tokenizer +
the resolved preset into a temporary folder, commit it to `main`. A local repository created here is removed
again if the commit fails, so nothing is left half-made.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import yaml

from codeparrot.config import to_dict
from codeparrot.errors import CodeParrotError
from codeparrot.repository.base import INITIAL_MESSAGE, CheckpointRepository, is_hub_ref
from codeparrot.repository.model import ModelConfig, build_model, to_gpt2_config
from codeparrot.repository.refs import open_repository


def check_no_initial_model(repo: CheckpointRepository, ref: str, force: bool) -> None:
    """Refuse a second "initial model" on `main` unless `force` (a new commit on top then)."""
    if not force and any(b.name == "main" for b in repo.list_branches()) and any(
            c.message == INITIAL_MESSAGE for c in repo.list_commits("main")):
        raise CodeParrotError(f"{ref} already has an initial model on main (--force adds another)")


def check_can_initialize(repo_ref: str, force: bool = False) -> None:
    """The cheap checks before any weights exist: an existing local path must be a repository without an
    initial model (a Hub repository is checked in `initialize_model`, after every input is known good)."""
    path = Path(repo_ref).expanduser()
    if not is_hub_ref(repo_ref) and path.exists():
        check_no_initial_model(open_repository(repo_ref), repo_ref, force)


def initialize_model(cfg: ModelConfig, tokenizer, repo_ref: str, seed: int = 42, force: bool = False) -> str:
    """Build the GPT-2 of preset `cfg` with `tokenizer`'s vocabulary, initialized with `seed`, and commit it
    with the tokenizer and the preset to `main` of `repo_ref` (created if missing). Returns the commit id."""
    repo_ref = str(repo_ref)
    hub = is_hub_ref(repo_ref)
    repo_path = Path(repo_ref).expanduser()
    local_new = not hub and not repo_path.exists()
    repo = None if local_new else open_repository(repo_ref, create=hub)
    if repo is not None:
        check_no_initial_model(repo, repo_ref, force)
    model = build_model(to_gpt2_config(cfg, tokenizer), seed=seed)
    with tempfile.TemporaryDirectory(prefix="codeparrot-init-") as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        (Path(tmp) / "model_config.yaml").write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))
        try:
            if repo is None:
                repo = open_repository(repo_ref, create=True)
            return repo.commit_folder(tmp, "main", INITIAL_MESSAGE)
        except BaseException:
            if local_new and repo_path.exists():  # nothing half-created: remove the repository we just made
                shutil.rmtree(repo_path, ignore_errors=True)
            raise

"""Model initialization: a preset + a tokenizer -> a freshly initialized GPT-2 committed as "initial model".

One sequence for `scripts/initialize_model.py`, the demo, the toy run and the benchmarks: check the
repository (no second initial model on `main` unless forced), build the model, save weights + tokenizer +
the resolved preset into a temporary folder, commit it to `main`. A local repository created here is removed
again if the commit fails, so nothing is left half-made (an empty folder given as the repository is left empty).
Where two processes create (or initialize) the same local repository at once, one creates it and the check for an
initial model and the commit happen under the repository's writer lock: the second one sees the first's commit and
stops as if it had found it before it began. The Hub has no lock: there the commit names the head of `main` that
was checked as its parent, and the Hub refuses it once another run's initial model has landed.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import yaml

from codeparrot.config import REQUIRED, doc, to_dict
from codeparrot.errors import CodeParrotError
from codeparrot.repository.base import INITIAL_MESSAGE, CheckpointRepository, is_hub_ref, main_state, strip_scheme
from codeparrot.repository.hub import HubRepository
from codeparrot.repository.local import LocalGitRepository
from codeparrot.repository.model import (
    ModelConfig,
    build_model,
    count_parameters,
    load_model_config,
    matmul_parameters,
    save_model_folder,
    to_gpt2_config,
)
from codeparrot.repository.refs import open_repository
from codeparrot.tokenizer import load_tokenizer


@dataclass
class InitializeConfig:
    """scripts/initialize_model.py: which preset and tokenizer make the initial model, and where it goes."""

    model_config: str = doc(REQUIRED, "model preset YAML, e.g. configs/model/tiny.yaml")
    tokenizer: str = doc(REQUIRED, "tokenizer folder (train_tokenizer.py output), or a repository to take it from")
    repo: str | None = doc(None, "checkpoint repository: a local path (a bare git repository is created if "
                                 "missing or an empty folder) or a Hub id OWNER/NAME. A path starting with ./, / "
                                 "or ~, file://PATH, or one whose first folder exists here is local; hf://OWNER/NAME "
                                 "is always the Hub (so: ./models/small, not models/small, for a new folder "
                                 "models/); required unless --count-only")
    seed: int = doc(42, "seed of the weight initialization (default: 42)")
    count_only: bool = doc(False, "print the parameter count (computed on the meta device, nothing allocated) and "
                                  "exit")
    force: bool = doc(False, "commit even if main already has an initial model (adds a new commit on top)")

    def validate(self) -> None:
        if not self.repo and not self.count_only:
            raise CodeParrotError("--repo is required (or pass --count-only)")


def check_no_initial_model(repo: CheckpointRepository, ref: str, force: bool) -> str | None:
    """Refuse a second "initial model" on `main` unless `force` (a new commit on top then). Returns the commit
    `main` points at (None: no `main` yet), the parent a Hub commit of the initial model must have."""
    head, initialized = main_state(repo)
    if initialized and not force:
        raise CodeParrotError(f"{ref} already has an initial model on main (--force adds another)")
    return head


def _commit_to_hub(repo: HubRepository, folder: str, ref: str, force: bool) -> str:
    """Commit `folder` as the initial model on the Hub's `main`, only on top of the head just checked: the Hub
    has no lock, and two runs creating the same repository both find it without an initial model. The Hub
    refuses the later commit once main has moved; checked again, that run then stops as if it had found the
    other's initial model before it began (a move by another kind of commit is retried on the new head)."""
    parent = check_no_initial_model(repo, ref, force)
    for _ in range(3):
        try:
            return repo.commit_folder(folder, "main", INITIAL_MESSAGE, parent=parent)
        except CodeParrotError:
            moved = check_no_initial_model(repo, ref, force)  # raises if the commit that got in was an initial model
            if parent is None or moved == parent:
                raise  # the commit failed for another reason (or without a head to compare): its own error
            parent = moved
    raise CodeParrotError(f"{ref}: main keeps moving under the initial model's commit; try again")


def _new_local_path(repo_ref: str) -> Path | None:
    """The path of a local repository `repo_ref` that does not exist yet (missing, or an empty folder), else None
    (a Hub id, or an existing local path, the scheme `file://` stripped: `Path("file://x")` never exists)."""
    if is_hub_ref(repo_ref):
        return None
    path = Path(strip_scheme(repo_ref)).expanduser()
    return path if not path.exists() or (path.is_dir() and not any(path.iterdir())) else None


def check_can_initialize(repo_ref: str, force: bool = False) -> None:
    """The cheap checks before any weights exist: an existing local path must be a repository without an
    initial model (a Hub repository is checked in `initialize_model`, after every input is known good)."""
    if not is_hub_ref(repo_ref) and _new_local_path(repo_ref) is None:
        check_no_initial_model(open_repository(repo_ref), repo_ref, force)


def initialize_model(cfg: ModelConfig, tokenizer, repo_ref: str, seed: int = 42, force: bool = False) -> str:
    """Build the GPT-2 of preset `cfg` with `tokenizer`'s vocabulary, initialized with `seed`, and commit it
    with the tokenizer and the preset to `main` of `repo_ref` (created if missing). Returns the commit id."""
    repo_ref = str(repo_ref)
    new_path = _new_local_path(repo_ref)
    was_empty_dir = new_path is not None and new_path.is_dir()
    repo = None if new_path is not None else open_repository(repo_ref, create=is_hub_ref(repo_ref))
    if repo is not None:
        check_no_initial_model(repo, repo_ref, force)
    model = build_model(to_gpt2_config(cfg, tokenizer), seed=seed)
    with tempfile.TemporaryDirectory(prefix="codeparrot-init-") as tmp:
        save_model_folder(model, tmp, tokenizer)
        (Path(tmp) / "model_config.yaml").write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))
        try:
            if repo is None:
                repo = open_repository(repo_ref, create=True)
            if isinstance(repo, HubRepository):
                return _commit_to_hub(repo, tmp, repo_ref, force)
            # checked again with no other writer between the check and the commit: another process creating or
            # initializing the same repository now commits first, and this one then stops here as if it had found
            # the initial model before it began
            with repo.locked() if isinstance(repo, LocalGitRepository) else contextlib.nullcontext():
                check_no_initial_model(repo, repo_ref, force)
                return repo.commit_folder(tmp, "main", INITIAL_MESSAGE)
        except BaseException:
            # nothing half-created: remove the repository this process made, unless another one committed to it
            if new_path is not None and getattr(repo, "created", False) and not _has_branches(repo):
                shutil.rmtree(new_path, ignore_errors=True)
                if was_empty_dir:
                    new_path.mkdir(exist_ok=True)  # as it was given
            raise


def _has_branches(repo: CheckpointRepository) -> bool:
    try:
        return bool(repo.list_branches())
    except Exception:  # noqa: BLE001 - unreadable: keep it rather than delete what may be another's
        return True


def run_initialize(cfg: InitializeConfig, overrides: list[str] | None = None) -> str | None:
    """scripts/initialize_model.py: print the preset's size (with `overrides` of its fields, `--key value`) and,
    unless `cfg.count_only`, commit the initial model. Returns the commit id (None with count_only)."""
    # Everything that can be wrong with the inputs is checked before anything is written, cheap checks first.
    model_cfg = load_model_config(cfg.model_config, overrides or [])
    if not cfg.count_only:
        check_can_initialize(cfg.repo, cfg.force)
    tokenizer = load_tokenizer(cfg.tokenizer)
    config = to_gpt2_config(model_cfg, tokenizer)
    n_params, n_matmul = count_parameters(config), matmul_parameters(config)
    print(f"{Path(cfg.model_config).stem}: {n_params / 1e6:,.1f}M parameters ({n_params:,}; {n_matmul / 1e6:,.1f}M "
          f"in matmuls, the MFU convention) - {model_cfg.n_layer} layers, {model_cfg.n_embd} wide, "
          f"{model_cfg.n_head} heads, context {model_cfg.n_positions}, vocab {config.vocab_size}, attention "
          f"{model_cfg.attn_implementation}")
    if cfg.count_only:
        return None
    commit = initialize_model(model_cfg, tokenizer, cfg.repo, seed=cfg.seed, force=cfg.force)
    print(f"committed the initial model to {cfg.repo} (main, {commit[:12]})")
    return commit

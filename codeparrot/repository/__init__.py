"""Checkpoint repositories: one interface (`base.py`), two backends chosen by the reference, the model presets.

Takes in: a tokenizer (for the vocabulary) and a model preset (`configs/model/*.yaml`). Gives out: a repository
(a local git repository, `local.py`, or a Hugging Face Hub repository, `hub.py`) whose `main` holds the
"initial model" and whose branches hold one commit per training checkpoint; `resolve_model_dir` turns any
reference + revision into a folder `from_pretrained` loads; `model.py` builds, initializes and loads models.
"""

from codeparrot.repository.base import INITIAL_MESSAGE, BranchInfo, CheckpointRepository, CommitInfo, is_hub_ref
from codeparrot.repository.pusher import CheckpointPusher
from codeparrot.repository.refs import cache_root, open_repository, resolve_model_dir

__all__ = ["INITIAL_MESSAGE", "BranchInfo", "CheckpointPusher", "CheckpointRepository", "CommitInfo", "cache_root",
           "is_hub_ref", "open_repository", "resolve_model_dir"]

"""Loaded models, once per checkpoint commit, kept within a memory bound (least recently used first out).

A commit id names content (git hashes the files into it), so it is the whole key: the same checkpoint reached
through another branch (a commit picked under main's dropdown, the side by side's other picker) or another
spelling of the repository (a symlink, a relative path, `hf://`) is the model already loaded, never a second copy.
A second request for the same checkpoint, from any user, gets the already loaded model; two concurrent first
requests load it once (a lock per key). The bound counts parameter and buffer bytes; the model being returned is
never evicted, so one model larger than the bound still loads (alone).
"""

from __future__ import annotations

import re
import threading
from collections import OrderedDict
from typing import Any, Callable

from codeparrot.repository.model import load_model_and_tokenizer

_FULL_COMMIT = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")  # git's SHA-1 and SHA-256 object ids (the Hub's too)
Loader = Callable[[str, str], tuple[Any, Any]]  # (ref, revision) -> (model, tokenizer)


def model_bytes(model) -> int:
    """Bytes held by the model's parameters and buffers (tied weights counted once)."""
    seen, total = set(), 0
    for t in list(model.parameters()) + list(model.buffers()):
        if t.data_ptr() not in seen:
            seen.add(t.data_ptr())
            total += t.numel() * t.element_size()
    return total


class ModelCache:
    """`get(ref, commit)` -> (model, tokenizer), loading `ref` at `commit` on a miss."""

    def __init__(self, max_bytes: int, device: str = "auto", loader: Loader | None = None):
        self.max_bytes = max_bytes
        self.device = device
        self._loader = loader or (lambda ref, rev: load_model_and_tokenizer(ref, rev, device))
        self._models: OrderedDict[str, tuple[Any, Any, int]] = OrderedDict()
        self._lock = threading.Lock()
        self._key_locks: dict[str, threading.Lock] = {}
        self.loads = 0  # how many times a model was actually loaded (for tests and the status line)

    def get(self, ref: str, commit: str) -> tuple[Any, Any]:
        """`commit` must be a full commit id (`Workspace.resolve`): a branch name or a short id would be a
        second key for a model already loaded, and a branch's would go stale when the branch moves."""
        if not _FULL_COMMIT.fullmatch(commit):
            raise ValueError(f"ModelCache.get needs a full commit id, got {commit!r}")
        with self._lock:
            key_lock = self._key_locks.setdefault(commit, threading.Lock())
        with key_lock:
            with self._lock:
                if commit in self._models:
                    self._models.move_to_end(commit)
                    model, tokenizer, _ = self._models[commit]
                    return model, tokenizer
            model, tokenizer = self._loader(ref, commit)
            size = model_bytes(model)
            with self._lock:
                self.loads += 1
                self._models[commit] = (model, tokenizer, size)
                self._evict(keep=commit)
            return model, tokenizer

    def _evict(self, keep: str) -> None:
        while self.used_bytes > self.max_bytes and len(self._models) > 1:
            oldest = next(k for k in self._models if k != keep)
            del self._models[oldest]

    @property
    def used_bytes(self) -> int:
        return sum(size for *_, size in self._models.values())

    def keys(self) -> list[str]:
        """Commit ids of the cached models, least recently used first."""
        with self._lock:
            return list(self._models)

"""Loaded models, once per (branch, checkpoint commit), kept within a memory bound (least recently used first out).

A second request for the same checkpoint, from any user, gets the already loaded model; two concurrent first
requests load it once (a lock per key). The bound counts parameter and buffer bytes; the model being returned is
never evicted, so one model larger than the bound still loads (alone).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any, Callable

from codeparrot.repository.model import load_model_and_tokenizer

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
    """`get(ref, branch, commit)` -> (model, tokenizer), loading `ref` at `commit` on a miss."""

    def __init__(self, max_bytes: int, device: str = "auto", loader: Loader | None = None):
        self.max_bytes = max_bytes
        self.device = device
        self._loader = loader or (lambda ref, rev: load_model_and_tokenizer(ref, rev, device))
        self._models: OrderedDict[tuple[str, str], tuple[Any, Any, int]] = OrderedDict()
        self._lock = threading.Lock()
        self._key_locks: dict[tuple[str, str], threading.Lock] = {}
        self.loads = 0  # how many times a model was actually loaded (for tests and the status line)

    def get(self, ref: str, branch: str, commit: str) -> tuple[Any, Any]:
        key = (branch, commit)
        with self._lock:
            key_lock = self._key_locks.setdefault(key, threading.Lock())
        with key_lock:
            with self._lock:
                if key in self._models:
                    self._models.move_to_end(key)
                    model, tokenizer, _ = self._models[key]
                    return model, tokenizer
            model, tokenizer = self._loader(ref, commit)
            size = model_bytes(model)
            with self._lock:
                self.loads += 1
                self._models[key] = (model, tokenizer, size)
                self._evict(keep=key)
            return model, tokenizer

    def _evict(self, keep: tuple[str, str]) -> None:
        while self.used_bytes > self.max_bytes and len(self._models) > 1:
            oldest = next(k for k in self._models if k != keep)
            del self._models[oldest]

    @property
    def used_bytes(self) -> int:
        return sum(size for *_, size in self._models.values())

    def keys(self) -> list[tuple[str, str]]:
        """Cached (branch, commit) keys, least recently used first."""
        with self._lock:
            return list(self._models)

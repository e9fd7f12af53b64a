"""The running sequences' key/value cache, shared by one forward pass per decoding step, that sequences join and
leave between steps.

Layout: one transformers `DynamicCache` of shape (rows, heads, T, head_dim) per layer, LEFT-padded so that every
row's newest token sits in the last column; a (rows, T) attention mask marks the real columns, and each row keeps its
own position (GPT-2's positions are learned and absolute, so a padded row must be told where it is: its position is
its real length, never T). Then:

- requests join after their prefill (a prompt alone runs unpadded: exactly the forward `generate` runs for it; on a
  GPU the prompts that arrived together run in one forward, left-padded); their caches and the batch's are copied,
  left-padded with zeros to the longest, into one new buffer;
- a decoding step feeds every row's last token with the mask extended by one column;
- finished rows leave by row selection, and the columns where no row is real any more (the padding a long row
  needed) are cut from the left, so T stays the longest running row, never more.

Each layer's keys and values live in a buffer with spare columns (`GrowingLayer`): a step writes its new column in
place, where transformers' `DynamicLayer` concatenates, i.e. copies the whole cache every step (at 8 rows of about
200 tokens, a third of a CPU step in torch's profiler). The buffer is copied only when rows join or leave, or when its
room runs out (then it doubles).

A row alone in the batch runs unpadded with an all-ones mask, the very calls `generate` makes. With others, its
scores differ from its solo run only by float rounding in the attention over the padded columns (the padding's
weights are exactly zero); the tests check that greedy tokens and seeded samples do not change.
"""

from __future__ import annotations

import inspect

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer


def cache_keyword(model) -> str:
    """The forward argument that takes the cache: `cache` since transformers 5.2x (`past_key_values` is deprecated
    there, removed in 5.40), `past_key_values` before."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def _room(columns: int) -> int:
    """Spare columns a new buffer gets: half its width, at least 32 (a join or a leave copies it anyway)."""
    return max(32, columns // 2)


class GrowingLayer(DynamicLayer):
    """A `DynamicLayer` whose `keys`/`values` are the first `length` columns of buffers with room to grow."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, length: int):
        super().__init__()
        self._keys, self._values, self.length = keys, values, length
        self.device, self.is_initialized = keys.device, True
        self._view()

    @classmethod
    def empty(cls, like: torch.Tensor, rows: int, columns: int) -> "GrowingLayer":
        """`rows` rows of `columns` zero columns (padding must be finite: a masked weight of 0 times NaN is NaN)."""
        shape = (rows, like.shape[1], columns + _room(columns), like.shape[3])
        return cls(like.new_zeros(shape), like.new_zeros(shape), columns)

    def _view(self) -> None:
        self.keys = self._keys[:, :, :self.length]
        self.values = self._values[:, :, :self.length]

    def place(self, rows: slice, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Copy `keys`/`values` into `rows`, right-aligned: their last column in this layer's last one."""
        width = keys.shape[2]
        self._keys[rows, :, self.length - width:self.length] = keys
        self._values[rows, :, self.length - width:self.length] = values

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        new = key_states.shape[2]
        if self.length + new > self._keys.shape[2]:  # out of room: double
            grown = GrowingLayer.empty(self._keys, self._keys.shape[0], self.length + max(new, self.length))
            grown.length = self.length
            grown._keys[:, :, :self.length] = self.keys
            grown._values[:, :, :self.length] = self.values
            self._keys, self._values = grown._keys, grown._values
        self._keys[:, :, self.length:self.length + new] = key_states
        self._values[:, :, self.length:self.length + new] = value_states
        self.length += new
        self._view()
        return self.keys, self.values


class KVBatch:
    """Rows of running sequences in one left-padded cache; row order is the order they were added."""

    def __init__(self, model):
        self.model = model
        self.cache_kw = cache_keyword(model)
        self.device = next(model.parameters()).device
        self.cache: DynamicCache | None = None
        self.mask: torch.Tensor | None = None  # (rows, T) long, 1 = a real token
        self.positions: torch.Tensor | None = None  # (rows,) long: the position of each row's next token

    @property
    def rows(self) -> int:
        return 0 if self.mask is None else self.mask.shape[0]

    @property
    def columns(self) -> int:
        return 0 if self.mask is None else self.mask.shape[1]

    def prefill(self, prompts: list[list[int]], all_logits: bool = False
                ) -> tuple[torch.Tensor, DynamicCache, torch.Tensor, torch.Tensor | None]:
        """Run `prompts` (one row each) into a fresh cache, left-padded to the longest with a mask and per-row
        positions (prompts of one length, e.g. one request's n copies as generate expands them, run unpadded: the
        very call generate makes). Returns (the last position's float32 logits (rows, vocab), the cache, its
        (rows, length) mask, and with `all_logits` the float32 logits of every position of the first row).

        `all_logits` is for a prompt's log-probabilities, which one row gives: the forward keeps only the last
        position's logits (as without it), and the first row's hidden states, caught on their way out of the base
        model, go through the output layer alone. Asking the forward for every position's logits made them for
        every row: a 1,000-token prompt with n=16 over a 50k vocabulary is 3 GB of float32 logits, 16 of them
        thrown away."""
        width = max(len(p) for p in prompts)
        ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts], device=self.device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=self.device)
        cache = DynamicCache()
        first_row: list[torch.Tensor] = []
        hook = self.model.base_model.register_forward_hook(
            lambda module, args, out: first_row.append(out.last_hidden_state[0].clone())) if all_logits else None
        try:
            out = self.model(input_ids=ids, attention_mask=mask, use_cache=True, **{self.cache_kw: cache},
                             position_ids=(mask.cumsum(-1) - 1).clamp(min=0), logits_to_keep=1)
        finally:
            if hook is not None:
                hook.remove()
        logits = out.logits[:, -1].to(copy=True, dtype=torch.float32)
        prompt_logits = self.model.get_output_embeddings()(first_row[0]).float() if all_logits else None
        return logits, cache, mask, prompt_logits

    def add(self, parts: list[tuple[DynamicCache, torch.Tensor]]) -> None:
        """Append the rows of (cache, mask) pairs that `prefill` made, all in one copy: requests that arrive
        together join together."""
        old = self.rows
        total = old + sum(mask.shape[0] for _, mask in parts)
        width = max([self.columns, *(mask.shape[1] for _, mask in parts)])
        layers = []
        for i in range(len(parts[0][0].layers)):
            layer = GrowingLayer.empty(parts[0][0].layers[i].keys, total, width)
            if old:
                layer.place(slice(0, old), self.cache.layers[i].keys, self.cache.layers[i].values)
            start = old
            for cache, mask in parts:
                layer.place(slice(start, start + mask.shape[0]), cache.layers[i].keys, cache.layers[i].values)
                start += mask.shape[0]
            layers.append(layer)
        self.cache = DynamicCache()
        self.cache.layers = layers
        merged = torch.zeros(total, width, dtype=torch.long, device=self.device)
        positions = torch.empty(total, dtype=torch.long, device=self.device)
        if old:
            merged[:old, width - self.columns:] = self.mask
            positions[:old] = self.positions
        start = old
        for _, mask in parts:
            merged[start:start + mask.shape[0], width - mask.shape[1]:] = mask
            positions[start:start + mask.shape[0]] = mask.sum(dim=1)
            start += mask.shape[0]
        self.mask, self.positions = merged, positions

    def step(self, tokens: list[int]) -> torch.Tensor:
        """Feed each row its newest token; the next-token float32 logits (rows, vocab)."""
        self.mask = torch.cat([self.mask, self.mask.new_ones(self.rows, 1)], dim=1)
        ids = torch.tensor(tokens, device=self.device)[:, None]
        out = self.model(input_ids=ids, attention_mask=self.mask, use_cache=True, **{self.cache_kw: self.cache},
                         position_ids=self.positions[:, None])
        self.positions = self.positions + 1
        return out.logits[:, -1].to(copy=True, dtype=torch.float32)

    def keep(self, rows: list[int]) -> None:
        """Keep only `rows` (increasing indices), then cut the columns no kept row uses."""
        if len(rows) == self.rows:
            return
        if not rows:
            self.clear()
            return
        index = torch.tensor(rows, device=self.device)
        mask = self.mask[index]
        used = mask.any(dim=0).nonzero()
        first = int(used[0]) if len(used) else 0
        width = mask.shape[1] - first
        layers = []
        for layer in self.cache.layers:
            kept = GrowingLayer.empty(layer.keys, len(rows), width)
            kept.place(slice(None), layer.keys[index, :, first:], layer.values[index, :, first:])
            layers.append(kept)
        self.cache.layers = layers
        self.mask = mask[:, first:]
        self.positions = self.positions[index]

    def clear(self) -> None:
        self.cache = self.mask = self.positions = None

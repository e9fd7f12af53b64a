"""Fill-in-the-middle on the memory-mapped path: whole documents rearranged, then packed into sequences.

Without FIM, sequence i is the fixed slice tokens[i*L : (i+1)*L]. A slice cuts documents anywhere (mid-token,
mid-UTF-8 character), and rearranging a document changes its token count (3 sentinels, 3 pieces tokenized
apart), so FIM cannot be applied to slices without splitting pieces of documents or truncating and padding
(Megatron-LM pads with <fim_pad>). Here every document is rearranged whole (character-level split points,
`codeparrot/fim/transform.py`, the same transform as the streaming path) and the result is packed:

    this reader's windows, in the order and split the non-FIM path uses (window i = tokens[i*L : (i+1)*L])
      --> the documents that START inside each window, each read whole up to its EOS (past the window's end when
          it runs on): every document starts in exactly one window, so each belongs to one reader per epoch,
          whatever the number of processes and workers
      --> each decoded to its exact text (the data keeps special-token strings as text, so it round-trips);
          kept as its own ids, or rearranged (FimTransform.split(text, epoch), pieces re-tokenized together)
      --> appended to a carry; each sequence is the carry's first L tokens (int64 [L]); the rest carries over,
          across windows and epochs (nothing is padded, so <fim_pad> never appears)
      --> a sequence shuffle buffer (`data.sequence_shuffle_buffer` sequences, seeded per reader, as in the JSONL
          path): a file longer than L fills several consecutive sequences, which the buffer spreads apart

Position: (epoch, windows consumed, carried tokens, documents this epoch, empty epochs in a row, the shuffle
buffer and its RNG): the carry is under L tokens plus what is left of the last window's documents, the buffer
sequence_shuffle_buffer × L tokens (2 MiB at 1,024 × 1,024). A resume continues with the next sequence exactly,
and needs the same FIM rates (checked).

Cost per reader: every document is decoded once per epoch (about 1.5M tokens/s on one core) and the rearranged
ones are tokenized again (their 3 pieces), so at fim_rate 0.5 a reader serves about what the JSONL path does:
117k tokens/s measured on one busy core of the 2-core development machine (32,768 vocabulary, seq_length 1024;
27M tokens/s without FIM). Plan DataLoader workers (`data.num_workers`) for it. An epoch holds a few percent
more tokens than without FIM (3 sentinels per rearranged document, the pieces' separate tokenization).
"""

from __future__ import annotations

import os

import numpy as np
import torch

from codeparrot.errors import CodeParrotError
from codeparrot.fim.encoding import plain_text_encoder
from codeparrot.training.datasets.resumable import check_fim_matches, check_state_matches

_SCAN = 1 << 16  # tokens searched per step for the EOS of a document that runs past its window
# Epochs in a row in which a reader's windows held no document start before it is an error, not a hang (only
# data whose documents are far longer than seq_length × readers can do that).
_MAX_EMPTY_EPOCHS = 8


class PretokenizedFimIterator:
    """One reader's FIM sequences from a `PretokenizedDataset` whose `fim` is set (module docstring)."""

    def __init__(self, ds, reader_id: int, n_readers: int, state: dict | None):
        from codeparrot.training.datasets.pretokenized import TOKENS_NAME, VERSION

        self.ds, self.reader_id, self.n_readers, self.version = ds, reader_id, n_readers, VERSION
        mm = np.memmap(os.path.join(ds.path, TOKENS_NAME), dtype=np.dtype(ds.index["dtype"]), mode="r")
        self.tokens = np.asarray(mm)
        self.eos = int(ds.index["eos_token_id"])
        self.encoder = plain_text_encoder(ds.tokenizer)
        self.epoch, self.pos, self.docs_in_epoch, self.empty_epochs = 0, 0, 0, 0
        self.carry = np.empty(0, dtype=self.tokens.dtype)  # rearranged stream not yet served
        size, L = ds.sequence_shuffle_buffer, ds.seq_length
        self.rng = np.random.Generator(np.random.PCG64([ds.seed, reader_id, n_readers]))  # the shuffle buffer's
        self.seq_buffer, self.seq_fill = np.empty((size, L), dtype=self.tokens.dtype), 0  # [size, L]
        self.exhausted = False  # a finite pass has ended (only the shuffle buffer drains now)
        if state is not None and state.get("started"):
            check_state_matches(state, self._identity(), "data, seq_length, seed")
            check_fim_matches(state, ds.fim)
            if len(state["seq_buffer"]) > size:
                raise CodeParrotError(f"data state holds {len(state['seq_buffer'])} shuffled sequences but "
                                      f"sequence_shuffle_buffer is {size}")
            self.epoch, self.pos = int(state["epoch"]), int(state["pos"])
            self.docs_in_epoch, self.empty_epochs = int(state["docs_in_epoch"]), int(state["empty_epochs"])
            self.carry = state["carry"].numpy().astype(self.tokens.dtype)
            self.rng.bit_generator.state = state["rng"]
            self.seq_fill, self.exhausted = len(state["seq_buffer"]), bool(state["exhausted"])
            self.seq_buffer[: self.seq_fill] = state["seq_buffer"].numpy()
        self.indices = ds.order(self.epoch, reader_id, n_readers)

    def _identity(self) -> dict:
        ds = self.ds
        return {"reader_id": self.reader_id, "n_readers": self.n_readers, "n_tokens": ds.index["n_tokens"],
                "seq_length": ds.seq_length, "seed": ds.seed, "shuffle": ds.shuffle}

    def __iter__(self):
        return self

    # --- documents --------------------------------------------------------------------------------------------
    def _eos_from(self, start: int) -> int:
        """Position of the first EOS at or after `start` (the end of the file if none: pretokenize always ends a
        record with EOS, so that only happens to a truncated file)."""
        pos, n = start, len(self.tokens)
        while pos < n:
            hits = np.flatnonzero(self.tokens[pos : pos + _SCAN] == self.eos)
            if len(hits):
                return pos + int(hits[0])
            pos += _SCAN
        return n

    def _window_documents(self, window: int) -> list[np.ndarray]:
        """The documents starting in `window`, each as its token ids then EOS, some rearranged."""
        L, tokens, eos = self.ds.seq_length, self.tokens, self.eos
        a, b = window * L, (window + 1) * L
        eos_at = a + np.flatnonzero(tokens[a:b] == eos)  # EOS positions inside the window, ascending
        starts = ([a] if a == 0 or tokens[a - 1] == eos else []) + [int(e) + 1 for e in eos_at if e + 1 < b]
        spans = []
        for s in starts:
            k = int(np.searchsorted(eos_at, s))
            spans.append((s, int(eos_at[k]) if k < len(eos_at) else self._eos_from(b)))
        fim = self.ds.fim
        plans = [fim.split(self.encoder.decode(tokens[s:e].tolist()), self.epoch) for s, e in spans]
        # One batched call for the pieces of every rearranged document of the window.
        rearranged = [(i, split) for i, split in enumerate(plans) if split is not None]
        pieces = self.encoder.batch([p for _, sp in rearranged for p in (sp.prefix, sp.middle, sp.suffix)])
        docs: list[np.ndarray] = []
        for s, e in spans:  # kept documents keep their ids (and the EOS that follows them)
            docs.append(np.append(tokens[s:e], np.array([eos], dtype=tokens.dtype)))
        for j, (i, split) in enumerate(rearranged):
            ids = fim.arrange(split, pieces[3 * j], pieces[3 * j + 1], pieces[3 * j + 2], eos)
            docs[i] = np.asarray(ids, dtype=tokens.dtype)
        self.docs_in_epoch += len(docs)
        return docs

    # --- sequences --------------------------------------------------------------------------------------------
    def _next_epoch(self) -> None:
        if len(self.indices) == 0:
            raise CodeParrotError(f"reader {self.reader_id} of {self.n_readers} has no sequences of "
                                  f"{self.ds.path} ({self.ds.n_sequences} in all): use fewer processes/workers")
        self.empty_epochs = 0 if self.docs_in_epoch else self.empty_epochs + 1
        if self.empty_epochs > _MAX_EMPTY_EPOCHS:
            raise CodeParrotError(f"reader {self.reader_id} of {self.n_readers} found no document start in its "
                                  f"windows of {self.ds.path} in {self.empty_epochs} epochs in a row: the documents "
                                  "are far longer than seq_length × readers; use fewer processes/workers or a "
                                  "longer seq_length")
        self.epoch, self.pos, self.docs_in_epoch = self.epoch + 1, 0, 0
        self.indices = self.ds.order(self.epoch, self.reader_id, self.n_readers)

    def _next_packed(self) -> np.ndarray | None:
        """The next L tokens of the packed stream [L], or None at the end of a finite pass (its last partial
        sequence is dropped, as without FIM)."""
        L = self.ds.seq_length
        parts, have = [self.carry], len(self.carry)
        try:
            while have < L:
                if self.pos >= len(self.indices):
                    if not self.ds.infinite:
                        self.exhausted = True
                        return None
                    self._next_epoch()
                window = int(self.indices[self.pos])
                self.pos += 1
                for doc in self._window_documents(window):
                    parts.append(doc)
                    have += len(doc)
        finally:  # the position stays exact whatever ends the loop
            self.carry = np.concatenate(parts) if len(parts) > 1 else parts[0]
        sequence, self.carry = self.carry[:L], self.carry[L:]
        return sequence

    def __next__(self) -> torch.Tensor:
        size = self.ds.sequence_shuffle_buffer
        if size == 0:
            sequence = None if self.exhausted else self._next_packed()
            if sequence is None:
                raise StopIteration
            return torch.from_numpy(sequence.astype(np.int64))
        # The JSONL path's buffer: fill it, then each new sequence takes the slot of a uniformly drawn one.
        while self.seq_fill < size and not self.exhausted and (new := self._next_packed()) is not None:
            self.seq_buffer[self.seq_fill] = new
            self.seq_fill += 1
        new = None if self.seq_fill < size or self.exhausted else self._next_packed()
        if self.seq_fill == 0:
            raise StopIteration
        j = int(self.rng.integers(self.seq_fill))
        sequence = self.seq_buffer[j].copy()
        if new is not None:
            self.seq_buffer[j] = new
        else:  # draining at the end of a finite pass
            self.seq_fill -= 1
            self.seq_buffer[j] = self.seq_buffer[self.seq_fill]
        return torch.from_numpy(sequence.astype(np.int64))

    def state_dict(self) -> dict:
        return {"kind": "pretokenized", "version": self.version, "started": True, **self._identity(),
                "epoch": self.epoch, "pos": self.pos, "docs_in_epoch": self.docs_in_epoch,
                "empty_epochs": self.empty_epochs, "carry": torch.from_numpy(self.carry.copy()),
                "exhausted": self.exhausted, "rng": self.rng.bit_generator.state,
                "seq_buffer": torch.from_numpy(self.seq_buffer[: self.seq_fill].copy()), **self.ds.fim.describe()}

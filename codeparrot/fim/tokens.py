"""The four FIM sentinel tokens, by name, and their ids in a tokenizer (looked up by string, never by position)."""

from __future__ import annotations

from dataclasses import dataclass

from codeparrot.errors import CodeParrotError

FIM_PREFIX = "<fim_prefix>"
FIM_MIDDLE = "<fim_middle>"
FIM_SUFFIX = "<fim_suffix>"
FIM_PAD = "<fim_pad>"
# The order new tokenizers reserve them in (right after <|endoftext|>, inside the configured vocabulary size).
FIM_TOKENS = (FIM_PREFIX, FIM_MIDDLE, FIM_SUFFIX, FIM_PAD)


@dataclass(frozen=True)
class FimTokenIds:
    """The sentinels' ids in one tokenizer."""

    prefix: int
    middle: int
    suffix: int
    pad: int

    def all(self) -> tuple[int, int, int, int]:
        return self.prefix, self.middle, self.suffix, self.pad


def _token_id(tokenizer, token: str) -> int | None:
    """The id of `token` as ONE token of `tokenizer`, or None: an unknown token maps to the unknown id (or None)
    in transformers, and a tokenizer without it would split the string into bytes."""
    vocab = tokenizer.get_vocab()
    return vocab.get(token)


def has_fim_tokens(tokenizer) -> bool:
    return all(_token_id(tokenizer, token) is not None for token in FIM_TOKENS)


def fim_token_ids(tokenizer, what: str = "fill-in-the-middle") -> FimTokenIds:
    """The sentinels' ids; a one-line `CodeParrotError` naming the missing ones when the tokenizer lacks any
    (a tokenizer trained before FIM was added: retrain it, or keep FIM off). `what` names what asked for FIM."""
    ids = {token: _token_id(tokenizer, token) for token in FIM_TOKENS}
    missing = [token for token, i in ids.items() if i is None]
    if missing:
        name = getattr(tokenizer, "name_or_path", "") or "the tokenizer"
        raise CodeParrotError(f"{what} needs the FIM tokens, but {name} lacks {', '.join(missing)} (a tokenizer "
                              "trained before they were reserved: train a new one with scripts/train_tokenizer.py, "
                              "or turn FIM off)")
    return FimTokenIds(*(ids[token] for token in FIM_TOKENS))

"""The infilling prompt (PSM) that inference, the app and the server build, and the cleanup of what comes back."""

from __future__ import annotations

from codeparrot.fim.tokens import FIM_MIDDLE, FIM_PREFIX, FIM_SUFFIX, FIM_TOKENS


def fim_prompt(prefix: str, suffix: str) -> str:
    """PSM: the text before the cursor, the text after it, then `<fim_middle>`: the model writes the middle.
    The sentinels are added as text; a tokenizer that has them as special tokens encodes each as one id."""
    return f"{FIM_PREFIX}{prefix}{FIM_SUFFIX}{suffix}{FIM_MIDDLE}"


def strip_sentinels(completion: str) -> str:
    """The middle up to the first sentinel, if a decoded completion holds one (generation stops at them; this is
    the guard for text decoded without that stop, e.g. a batch row that ran on)."""
    cut = min((i for i in (completion.find(token) for token in FIM_TOKENS) if i >= 0), default=len(completion))
    return completion[:cut]


def fim_prompt_ids(tokenizer, prefix: str, suffix: str, what: str = "infilling") -> list[int]:
    """The PSM prompt as ids, the way the model saw rearranged documents in training: EOS (every document
    follows one), `<fim_prefix>`, the prefix, `<fim_suffix>`, the suffix, `<fim_middle>`; prefix and suffix
    tokenized as plain text (a literal `<fim_middle>` in the user's code stays text), never stripped. A
    tokenizer without the FIM tokens is a one-line `CodeParrotError` naming `what`."""
    from codeparrot.fim.encoding import plain_text_encoder
    from codeparrot.fim.tokens import fim_token_ids

    ids = fim_token_ids(tokenizer, what)
    prefix_ids, suffix_ids = plain_text_encoder(tokenizer).batch([prefix, suffix])
    return [tokenizer.eos_token_id, ids.prefix, *prefix_ids, ids.suffix, *suffix_ids, ids.middle]

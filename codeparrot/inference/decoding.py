"""How generated tokens are drawn and read back, the same on every path that generates from a checkpoint:
scripts/generate.py and the app (`codeparrot.inference.completion`) and HumanEval (`codeparrot.humaneval`).

Drawing: the caller's settings alone (the flags, HumanEval's protocol) decide. `model.generate` fills every setting
it is not passed from the checkpoint's generation config (generation_config.json, or the generation settings of an
older config.json, which transformers moves there when loading): a repetition penalty, no_repeat_ngram_size,
min_new_tokens, beams, bad_words_ids... A third-party checkpoint would then silently change greedy and sampled
completions alike, and a HumanEval number would depend on a file no flag names. Inside `flags_only(model)` the
model's generation config is blank, so every setting not passed comes from transformers' global defaults;
`checkpoint_note` says once, when a checkpoint's config would have added something, what was ignored.

Reading back: ids become text exactly (`DECODE_KWARGS`). Special tokens are kept as their text, not skipped: a
sequence ends at EOS (or, infilling, at a FIM sentinel) before it is decoded, so a special token that reaches the
decoder is one the model emitted in the middle of its code, e.g. `<fim_prefix>` in a left-to-right completion.
Skipping it would glue the text around it and score a completion the model never wrote; as text it stays in the
completion and the program fails as the model's output would.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

from transformers import GenerationConfig

# Exact decoding for code: special tokens kept (module docstring) and no "clean up" of spaces before punctuation
# (" ." -> "."), which some GPT-2 tokenizer configs enable by default and which would rewrite `a .b` or `x , y`.
DECODE_KWARGS = {"skip_special_tokens": False, "clean_up_tokenization_spaces": False}

# Entries of a generation config that do not change which tokens are drawn (bookkeeping, caching, what generate
# returns), or that every caller here passes itself (padding) or that a decoder-only model given a prompt never
# uses (BOS, the decoder start): not worth a note when ignored.
_NOT_DECODING = frozenset({
    "transformers_version", "use_cache", "cache_implementation", "cache_config", "max_cache_len",
    "output_attentions", "output_hidden_states", "output_scores", "output_logits", "return_dict_in_generate",
    "compile_config", "disable_compile", "low_memory", "prefill_chunk_size", "bos_token_id", "pad_token_id",
    "decoder_start_token_id",
})


@contextmanager
def flags_only(model) -> Iterator[None]:
    """Inside, `model.generate` takes every setting it is not passed from transformers' defaults, never from the
    checkpoint's generation config (module docstring); the model's own config is back afterwards. Passing a
    `generation_config=` to `generate` is not enough: transformers fills its unset fields from the model's.
    It swaps an attribute of `model`: calls generating with one model at the same time must be serialized (the
    app's generation lock, HumanEval's single loop)."""
    saved, model.generation_config = model.generation_config, GenerationConfig()
    try:
        yield
    finally:
        model.generation_config = saved


def checkpoint_settings(model, eos_token_id: int | None) -> dict:
    """What the checkpoint's generation config would add to a `generate` call (and `flags_only` ignores): every
    setting it holds that can change the tokens drawn; its EOS id only where it names ids other than
    `eos_token_id` (those would end a sequence too)."""
    config = getattr(model, "generation_config", None)
    if config is None:
        return {}
    settings = {k: v for k, v in config.to_diff_dict().items() if not k.startswith("_") and k not in _NOT_DECODING}
    eos = settings.get("eos_token_id")
    if eos is not None and set(eos if isinstance(eos, (list, tuple)) else [eos]) <= {eos_token_id}:
        del settings["eos_token_id"]
    return settings


def checkpoint_note(model, eos_token_id: int | None, decides: str = "the flags") -> str | None:
    """One line telling the user which settings of the checkpoint's generation config were ignored (None when
    there are none); `decides` names what decided instead (plural: "the flags")."""
    settings = checkpoint_settings(model, eos_token_id)
    if not settings:
        return None
    listed = ", ".join(f"{k}={v!r}" for k, v in sorted(settings.items()))
    return f"note: the checkpoint's generation config sets {listed}; ignored: only {decides} decide how tokens are " \
           "drawn"

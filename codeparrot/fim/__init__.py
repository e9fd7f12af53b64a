"""Fill-in-the-middle (FIM): the sentinel tokens, the prompt format inference and serving share, and the training
transform both data paths share (`codeparrot.fim.transform`).

The format is StarCoder's (Bavarian et al. 2022; SantaCoder/StarCoder/StarCoder2), with StarCoder's spelling
(underscores: SantaCoder's hyphenated `<fim-prefix>` is a different string, and users were bitten by the
difference). Ids are always looked up by string, never by position.

    PSM: <fim_prefix>PREFIX<fim_suffix>SUFFIX<fim_middle>MIDDLE        (what inference and editors send)
    SPM: <fim_prefix><fim_suffix>SUFFIX<fim_middle>PREFIX MIDDLE       (the paper's variant 2, StarCoder's SPM)

At inference the model is given the PSM prompt and writes the middle; it ends the middle with EOS (`<|endoftext|>`,
as it learned: every training document ends with EOS, so a transformed one does too). A completion never
contains a sentinel: generation stops at any of them.

Modules: `tokens.py` (names, ids), `prompt.py` (the PSM prompt as text and as ids, the cleanup of a decoded
middle), `encoding.py` (document text encoded with special-token strings kept as text), `transform.py` (the
training transform). The whole story: docs/fim.md.
"""

from codeparrot.fim.tokens import (FIM_MIDDLE, FIM_PAD, FIM_PREFIX, FIM_SUFFIX, FIM_TOKENS, FimTokenIds,
                                   fim_token_ids, has_fim_tokens)
from codeparrot.fim.prompt import fim_prompt, fim_prompt_ids, strip_sentinels

__all__ = ["FIM_MIDDLE", "FIM_PAD", "FIM_PREFIX", "FIM_SUFFIX", "FIM_TOKENS", "FimTokenIds", "fim_token_ids",
           "has_fim_tokens", "fim_prompt", "fim_prompt_ids", "strip_sentinels"]

"""Settings of the interactive tools: `GenerateConfig` (scripts/generate.py) and `HighlightConfig`
(scripts/highlight.py).

The scripts' flags are generated from these fields (`codeparrot.config_flags.parse_config`). Kept apart from
`completion.py` and `highlight.py` so that `--help` and a bad flag answer without importing torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from codeparrot.config import REQUIRED, doc
from codeparrot.errors import CodeParrotError

MODEL_HELP = ("model repository: a local checkpoint repository (path), a Hub id (user/name), or a plain folder that "
              "from_pretrained loads")
REVISION_HELP = "branch (experiment), tag or commit to load (default: main)"
DEVICE_HELP = "cpu, cuda, cuda:1, ... (default: cuda when available)"
# What torch.manual_seed takes (a negative seed wraps around: -1 is 2**64 - 1); outside it, it raises ValueError
# ("Overflow when unpacking long long"), after the model has loaded.
SEED_RANGE = (-2**63, 2**64 - 1)


def check_sampling(temperature: float, top_p: float, seed: int | None) -> None:
    """The sampling settings of generate.py (and `generate_completions`), checked before any model loads."""
    # nan passes every comparison-based check (nan < 0 is False) and then decodes greedily; inf divides the
    # logits to nothing. Neither is a temperature.
    if not (math.isfinite(temperature) and temperature >= 0):
        raise CodeParrotError(f"--temperature must be a finite number >= 0 (0 = greedy), got {temperature}")
    if not 0 < top_p <= 1:  # also false for nan
        raise CodeParrotError(f"--top-p must be in (0, 1], got {top_p}")
    if seed is not None and not SEED_RANGE[0] <= seed <= SEED_RANGE[1]:
        raise CodeParrotError(f"--seed must be in [-2**63, 2**64 - 1] (torch's seed range), got {seed}")


@dataclass
class GenerateConfig:
    """One prompt completed with HumanEval's prompt format and stop rules, streamed to the terminal; with a
    suffix, the code between the prompt and the suffix filled in (fill-in-the-middle)."""

    model: str = doc(REQUIRED, MODEL_HELP)
    revision: str | None = doc(None, REVISION_HELP)
    prompt: str | None = doc(None, "prompt text; '-' reads it from stdin", exclusive="prompt", required=True)
    prompt_file: str | None = doc(None, "read the prompt from this UTF-8 file", exclusive="prompt")
    suffix: str | None = doc(None, "infill: the code after the cursor ('-' reads it from stdin); the model writes "
                                   "the middle between the prompt and this (PSM prompt, both used exactly as given, "
                                   "not stripped); a sample ends at EOS, a FIM sentinel or --max-new-tokens, never "
                                   "at HumanEval's stop strings. Needs a model whose tokenizer has the FIM tokens",
                             exclusive="suffix")
    suffix_file: str | None = doc(None, "infill: read the suffix from this UTF-8 file", exclusive="suffix")
    max_new_tokens: int = doc(128, "most tokens to generate per sample (default 128)")
    temperature: float = doc(0.2, "sampling temperature; 0 = greedy decoding (default 0.2, HumanEval's)")
    top_p: float = doc(0.95, "nucleus sampling mass (default 0.95); no top-k cut")
    num_return_sequences: int = doc(1, "samples to draw (default 1)")
    seed: int | None = doc(None, "random seed (-2**63 to 2**64 - 1); same seed, device and software give the same "
                                 "samples (default: a fresh seed, printed so the run can be repeated)")
    stop: bool = doc(True, "do not stop at HumanEval's stop strings (EOS and --max-new-tokens still end a sample)",
                     flag="--no-stop", inverted=True)
    strip_prompt: bool = doc(True, "keep the prompt's leading/trailing whitespace (HumanEval strips it)",
                             flag="--no-strip", inverted=True)
    device: str = doc("auto", DEVICE_HELP)
    output: str | None = doc(None, "also write the samples, settings, commit and dtype to this JSON file")
    quiet: bool = doc(False, "no live streaming; print the samples when done")

    def validate(self) -> None:
        if self.max_new_tokens < 1 or self.num_return_sequences < 1:
            raise CodeParrotError("--max-new-tokens and --num-return-sequences must be at least 1")
        check_sampling(self.temperature, self.top_p, self.seed)
        if self.prompt == "-" and self.suffix == "-":
            raise CodeParrotError("--prompt - and --suffix - both read stdin: give one of them as a file "
                                  "(--prompt-file / --suffix-file) or as text")


@dataclass
class HighlightConfig:
    """One source file scored token by token and rendered as a self-contained HTML page."""

    file: str = doc(REQUIRED, "the source file to score (UTF-8)", flag="file")
    model: str = doc(REQUIRED, MODEL_HELP)
    output: str = doc(REQUIRED, "HTML page to write (atomically)")
    revision: str | None = doc(None, REVISION_HELP)
    top_k: int = doc(5, "alternatives shown per token on hover (default 5)")
    lines: int = doc(10, "most surprising lines to print and list (default 10)")
    rank_by: Literal["mean", "max"] = doc("mean", "rank lines by their mean or their max token loss (default mean)")
    context: int | None = doc(None, "tokens per scoring window (default: the model's full context)")
    stride: int | None = doc(None, "new tokens scored per window after the first; each then sees at least context "
                                   "- stride + 1 tokens of context (default context/2; 1 = full context for every "
                                   "token, slowest)")
    max_loss: float = doc(8.0, "loss (nats) at the top of the colour scale; higher losses are clipped (default 8, "
                               "p ≈ 0.0003); fixed so that pages of different checkpoints compare")
    device: str = doc("auto", DEVICE_HELP)

    def validate(self) -> None:
        if self.lines < 0:
            raise CodeParrotError(f"--lines must be >= 0, got {self.lines}")
        # Checked here, not only where they are used: that is after the model has scored the whole file.
        if not (math.isfinite(self.max_loss) and self.max_loss > 0):
            raise CodeParrotError(f"--max-loss must be a finite number > 0, got {self.max_loss}")
        if self.context is not None and self.context < 2:  # one input token and one target at the least
            raise CodeParrotError(f"--context must be at least 2, got {self.context}")
        if self.stride is not None and self.stride < 1:
            raise CodeParrotError(f"--stride must be at least 1, got {self.stride}")
        if self.stride is not None and self.context is not None and self.stride > self.context:
            raise CodeParrotError(f"--stride must be at most --context ({self.context}), got {self.stride}")

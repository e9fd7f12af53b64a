"""How the next token of one request's sequences is chosen: the settings, and a chooser per request.

The chooser reproduces what `model.generate` does for that request run alone (what scripts/generate.py calls):
float32 logits, then transformers' own warpers in generate's order (temperature, top-k, top-p, each only when it
changes something), softmax, and `torch.multinomial` over all `n` sequences of the request at once; greedy is the
argmax. Two details make a request's samples independent of its batch-mates and equal to generate's for the same
seed:

- each request draws from its own `torch.Generator`, seeded with its seed, never from the global one, so another
  request's draws cannot shift its random stream;
- multinomial draws one exponential per (row, vocabulary entry) whatever the probabilities (PyTorch's one-sample
  path), and generate keeps sampling a finished row (then replaces the token with padding). So the chooser always
  samples `n` rows, filling finished ones with a uniform row: the generator advances exactly as in generate.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch
from transformers import LogitsProcessorList, TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper


MIN_TEMPERATURE = 1e-5  # below it sampling is greedy (as vLLM); logits of ±100 ÷ 1e-5 stay finite in float32


@dataclass(frozen=True)
class SamplingParams:
    """What one request asked for, already validated by its API layer (`codeparrot.serving.params`)."""

    max_new_tokens: int
    n: int = 1  # sequences generated from the prompt
    temperature: float = 0.0  # below MIN_TEMPERATURE (0 included): greedy (argmax), else sampling
    top_p: float = 1.0
    top_k: int = 0  # 0: no top-k cut
    seed: int | None = None  # sampling only; None draws a fresh one (reported back)
    stop: tuple[str, ...] = ()  # stop strings, searched in the decoded text
    top_logprobs: int = 0  # alternatives reported per generated token
    prompt_logprobs: bool = False  # log-probabilities of the prompt's tokens too (one full prefill)
    stream: bool = False  # send every token as it comes

    @property
    def greedy(self) -> bool:
        """Argmax: temperature 0, or one so small that logits ÷ temperature overflow float32 (1e-40 does; the APIs
        accept any value down to 0): the distribution it asks for is the argmax to float precision anyway."""
        return self.temperature < MIN_TEMPERATURE


def fresh_seed() -> int:
    """A seed for a sampled request that gave none: reported in the answer, so the request can be repeated."""
    return random.SystemRandom().randrange(2**63)


class TokenChooser:
    """Chooses the next tokens of one request's `n` sequences, given the logits of those still running."""

    def __init__(self, params: SamplingParams, device: torch.device):
        self.n = params.n
        self.greedy = params.greedy
        self.seed = None if self.greedy else (params.seed if params.seed is not None else fresh_seed())
        self.warpers = LogitsProcessorList()
        self.generator = None
        if not self.greedy:
            if params.temperature != 1.0:
                self.warpers.append(TemperatureLogitsWarper(params.temperature))
            if params.top_k:
                self.warpers.append(TopKLogitsWarper(top_k=params.top_k, min_tokens_to_keep=1))
            if params.top_p < 1.0:
                self.warpers.append(TopPLogitsWarper(top_p=params.top_p, min_tokens_to_keep=1))
            self.generator = torch.Generator(device=device)
            self.generator.manual_seed(self.seed)

    def choose(self, logits: torch.Tensor, rows: list[int]) -> list[int]:
        """Next token of each running sequence. `logits`: (len(rows), vocab) float32, row i for sequence `rows[i]`
        (indices into the request's n sequences, increasing)."""
        if self.greedy:
            return torch.argmax(logits, dim=-1).tolist()
        scores = self.warpers(None, logits)
        probs = torch.nn.functional.softmax(scores, dim=-1)
        if len(rows) < self.n:  # finished sequences still draw, as in generate (see the module docstring)
            full = torch.ones(self.n, probs.shape[-1], dtype=probs.dtype, device=probs.device)
            full[rows] = probs
            probs = full
        picked = torch.multinomial(probs, num_samples=1, generator=self.generator).squeeze(1)
        return picked[rows].tolist() if len(rows) < self.n else picked.tolist()

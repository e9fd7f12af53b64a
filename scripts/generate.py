"""Complete code with a checkpoint, streaming tokens to the terminal as they are generated.

    python scripts/generate.py --model REPO [--revision BRANCH_OR_COMMIT] --prompt "def fib(n):"
    echo "def fib(n):" | python scripts/generate.py --model REPO --prompt -
    python scripts/generate.py --model REPO --prompt-file stub.py --num-return-sequences 3 --seed 0
    python scripts/generate.py --model REPO --prompt-file before.py --suffix-file after.py   # fill in the middle

The prompt is EOS + the stripped prompt and a completion ends at EOS or at the first HumanEval stop string
(\\nclass, \\ndef, \\n#, \\n@, \\nprint, \\nif), exactly as `scripts/human_eval.py` scores it, so what you see
here is what HumanEval would execute. Sample 1 streams live; further samples are printed when done. --output
saves them with what reproduces them: the settings, the seed, the commit the revision named (the one loaded)
and the dtype the weights were loaded in.

Only these flags decide how tokens are drawn: settings a checkpoint's generation_config.json would add (a
repetition penalty, no_repeat_ngram_size, min_new_tokens, beams, banned words...) are ignored, and a note on stderr
names them. A special token the model writes inside a completion (a FIM sentinel, say) is shown as its text: it
is part of what the model wrote, and HumanEval would execute it too.

With --suffix or --suffix-file the model fills in the middle between the prompt and the suffix (fill-in-the-middle,
docs/fim.md): it reads <fim_prefix> prompt <fim_suffix> suffix <fim_middle>, nothing stripped, and the middle ends
at EOS or a FIM sentinel (never shown); the output is prompt + middle + suffix. The model's tokenizer must have
the FIM tokens.
"""

from __future__ import annotations

from codeparrot.atomic_io import ensure_writable_file
from codeparrot.config_flags import parse_config
from codeparrot.errors import run_cli
from codeparrot.inference.config import GenerateConfig


def main(argv: list[str] | None = None) -> int:
    cfg = parse_config(GenerateConfig, argv, __doc__)
    if cfg.output:  # before torch loads and the model generates, not when writing the samples
        ensure_writable_file(cfg.output, what="JSON file")
    from codeparrot.inference.completion import run_generate  # after parsing: --help stays fast

    run_generate(cfg)
    return 0


if __name__ == "__main__":
    run_cli(main)

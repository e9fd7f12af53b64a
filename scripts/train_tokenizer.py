"""Train CodeParrot's tokenizer: a GPT-2-style byte-level BPE, from scratch, on the clean training shards.

    python scripts/train_tokenizer.py --dataset clean/train --output-dir tokenizer [--vocab-size 32768]
        [--n-examples 32768] [--repo REPO]

Streams the first --n-examples files, trains, then prints and saves (tokenizer_stats.json) the bytes per
token it achieves on the validation split. `AutoTokenizer.from_pretrained(OUTPUT_DIR)` loads the result.
"""

from __future__ import annotations

from codeparrot.config_flags import parse_config
from codeparrot.errors import run_cli


def main(argv: list[str] | None = None) -> int:
    # transformers and tokenizers: imported inside run_cli, so Ctrl-C while they load is `interrupted`
    from codeparrot.tokenizer import TokenizerTrainingConfig, train_tokenizer_on_dataset

    train_tokenizer_on_dataset(parse_config(TokenizerTrainingConfig, argv, __doc__))
    return 0


if __name__ == "__main__":
    run_cli(main)

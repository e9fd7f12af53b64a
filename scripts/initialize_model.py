"""Initialize a GPT-2 model from a preset and commit it as "initial model" to a checkpoint repository.

    python scripts/initialize_model.py --model-config configs/model/codeparrot-small.yaml \\
        --tokenizer tokenizer --repo ./models/codeparrot-small [--n_layer 6 ...]

--repo is a local path when it starts with ./, / or ~ (or file://), or when its first folder exists here; a
new or empty folder becomes a bare git repository. Otherwise OWNER/NAME is a Hub repository (hf://OWNER/NAME
always is): `models/codeparrot-small` without a folder `models` here would be the Hub id models/codeparrot-small.

The vocabulary size and BOS/EOS/PAD ids come from the tokenizer. The commit on `main` holds config.json,
the weights (model.safetensors), the tokenizer and the preset (model_config.yaml). Any further
`--key value` flags override preset fields (e.g. `--n_positions 2048`).
"""

from __future__ import annotations

from codeparrot.config import describe
from codeparrot.config_flags import config_from_args, config_parser
from codeparrot.errors import run_cli


def main(argv: list[str] | None = None) -> int:
    # torch and transformers: imported inside run_cli, so Ctrl-C while they load is `interrupted`, not a traceback
    from codeparrot.repository.initialize import InitializeConfig, run_initialize
    from codeparrot.repository.model import ModelConfig

    parser = config_parser(InitializeConfig, __doc__)
    parser.epilog = "preset fields (override with --FIELD VALUE):\n" + describe(ModelConfig)
    args, overrides = parser.parse_known_args(argv)  # unknown --key value pairs override preset fields
    run_initialize(config_from_args(InitializeConfig, args), overrides)
    return 0


if __name__ == "__main__":
    run_cli(main)

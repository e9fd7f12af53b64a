"""Initialize a GPT-2 model from a preset and commit it as "initial model" to a checkpoint repository.

    python scripts/initialize_model.py --model-config configs/model/codeparrot-small.yaml \\
        --tokenizer tokenizer --repo models/codeparrot-small [--n_layer 6 ...]

The vocabulary size and BOS/EOS/PAD ids come from the tokenizer. The commit on `main` holds config.json,
the weights (model.safetensors), the tokenizer and the preset (model_config.yaml). Any further
`--key value` flags override preset fields (e.g. `--n_positions 2048`).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from codeparrot.errors import run_cli


def parse_args(argv: list[str] | None = None) -> tuple[argparse.Namespace, list[str]]:
    from codeparrot.config import describe
    from codeparrot.repository.model import ModelConfig

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="preset fields (override with --FIELD VALUE):\n" + describe(ModelConfig))
    p.add_argument("--model-config", required=True, help="model preset YAML, e.g. configs/model/tiny.yaml")
    p.add_argument("--tokenizer", required=True,
                   help="tokenizer folder (train_tokenizer.py output), or a repository to take it from")
    p.add_argument("--repo", help="checkpoint repository: a local path (a bare git repository is created if "
                                  "missing) or a Hub id user/name; required unless --count-only")
    p.add_argument("--seed", type=int, default=42, help="seed of the weight initialization (default: 42)")
    p.add_argument("--count-only", action="store_true",
                   help="print the parameter count (computed on the meta device, nothing allocated) and exit")
    p.add_argument("--force", action="store_true",
                   help="commit even if main already has an initial model (adds a new commit on top)")
    args, overrides = p.parse_known_args(argv)
    if not args.repo and not args.count_only:
        p.error("--repo is required (or pass --count-only)")
    return args, overrides


def main(argv: list[str] | None = None) -> int:
    args, overrides = parse_args(argv)
    from codeparrot.repository.initialize import check_can_initialize, initialize_model
    from codeparrot.repository.model import count_parameters, load_model_config, matmul_parameters, to_gpt2_config
    from codeparrot.tokenizer import load_tokenizer

    # Everything that can be wrong with the inputs is checked before anything is written, cheap checks first.
    cfg = load_model_config(args.model_config, overrides)
    if args.repo and not args.count_only:
        check_can_initialize(args.repo, args.force)
    tokenizer = load_tokenizer(args.tokenizer)
    config = to_gpt2_config(cfg, tokenizer)
    n_params, n_matmul = count_parameters(config), matmul_parameters(config)
    print(f"{Path(args.model_config).stem}: {n_params / 1e6:,.1f}M parameters ({n_params:,}; {n_matmul / 1e6:,.1f}M "
          f"in matmuls, the MFU convention) - {cfg.n_layer} layers, {cfg.n_embd} wide, {cfg.n_head} heads, "
          f"context {cfg.n_positions}, vocab {config.vocab_size}, attention {cfg.attn_implementation}")
    if args.count_only:
        return 0
    commit = initialize_model(cfg, tokenizer, args.repo, seed=args.seed, force=args.force)
    print(f"committed the initial model to {args.repo} (main, {commit[:12]})", file=sys.stdout)
    return 0


if __name__ == "__main__":
    run_cli(main)

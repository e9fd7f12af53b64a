"""Initialize a GPT-2 model from a preset and commit it as "initial model" to a checkpoint repository.

    python scripts/initialize_model.py --model-config configs/model/codeparrot-small.yaml \\
        --tokenizer tokenizer --repo models/codeparrot-small [--n_layer 6 ...]

The vocabulary size and BOS/EOS/PAD ids come from the tokenizer. The commit on `main` holds config.json,
the weights (model.safetensors), the tokenizer and the preset (model_config.yaml). Any further
`--key value` flags override preset fields (e.g. `--n_positions 2048`).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

import yaml

from codeparrot.config import to_dict
from codeparrot.errors import CodeParrotError, run_cli


def parse_args(argv: list[str] | None = None) -> tuple[argparse.Namespace, list[str]]:
    from codeparrot.config import describe
    from codeparrot.model import ModelConfig

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
    from codeparrot.model import build_model, count_parameters, load_model_config, matmul_parameters, to_gpt2_config
    from codeparrot.repository import INITIAL_MESSAGE, is_hub_ref, open_repository
    from codeparrot.tokenizer import load_tokenizer

    def check_no_initial_model(repo) -> None:
        if not args.force and any(b.name == "main" for b in repo.list_branches()) and any(
                c.message == INITIAL_MESSAGE for c in repo.list_commits("main")):
            raise CodeParrotError(f"{args.repo} already has an initial model on main (--force adds another)")

    # Everything that can be wrong with the inputs is checked before anything is written, cheap checks first.
    cfg = load_model_config(args.model_config, overrides)
    repo, local_new, hub = None, False, bool(args.repo) and is_hub_ref(args.repo)
    repo_path = Path(args.repo).expanduser() if args.repo else None
    if args.repo and not hub and not args.count_only:
        local_new = not repo_path.exists()
        if not local_new:  # an existing path must already be a repository
            repo = open_repository(args.repo)
            check_no_initial_model(repo)
    tokenizer = load_tokenizer(args.tokenizer)
    config = to_gpt2_config(cfg, tokenizer)
    n_params, n_matmul = count_parameters(config), matmul_parameters(config)
    print(f"{Path(args.model_config).stem}: {n_params / 1e6:,.1f}M parameters ({n_params:,}; {n_matmul / 1e6:,.1f}M "
          f"in matmuls, the MFU convention) - {cfg.n_layer} layers, {cfg.n_embd} wide, {cfg.n_head} heads, "
          f"context {cfg.n_positions}, vocab {config.vocab_size}, attention {cfg.attn_implementation}")
    if args.count_only:
        return 0
    if hub:  # create_repo(exist_ok=True) only once every input is known to be good
        repo = open_repository(args.repo, create=True)
        check_no_initial_model(repo)

    model = build_model(config, seed=args.seed)
    with tempfile.TemporaryDirectory(prefix="codeparrot-init-") as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        (Path(tmp) / "model_config.yaml").write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))
        try:
            if repo is None:
                repo = open_repository(args.repo, create=True)
            commit = repo.commit_folder(tmp, "main", INITIAL_MESSAGE)
        except BaseException:
            if local_new and repo_path.exists():  # nothing half-created: remove the repository we just made
                shutil.rmtree(repo_path, ignore_errors=True)
            raise
    print(f"committed the initial model to {args.repo} (main, {commit[:12]})", file=sys.stdout)
    return 0


if __name__ == "__main__":
    run_cli(main)

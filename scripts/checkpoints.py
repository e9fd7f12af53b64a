"""Browse and manage a checkpoint repository (a local git repository path, or a Hub id user/name).

    python scripts/checkpoints.py list REPO                                   experiments: branches, latest step, date
    python scripts/checkpoints.py log REPO --branch NAME                      checkpoints on a branch, newest first
    python scripts/checkpoints.py download REPO --revision REV --output-dir DIR   a folder from_pretrained loads
    python scripts/checkpoints.py promote REPO --revision REV                 make a checkpoint the main model
    python scripts/checkpoints.py plot REPO --branch NAME --dataset PATH --output PNG   validation loss per checkpoint

REV is a branch, a tag or a commit id (as `log` prints it, full or abbreviated).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict

from codeparrot.errors import run_cli


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    repo_help = "repository: a local git repository path or a Hub id user/name (hf://user/name to force the Hub)"

    ls = sub.add_parser("list", help="experiments (branches) with their latest step and date")
    ls.add_argument("repo", metavar="REPO", help=repo_help)
    ls.add_argument("--json", action="store_true", help="print JSON instead of a table")

    log = sub.add_parser("log", help="checkpoints (commits) on a branch, newest first")
    log.add_argument("repo", metavar="REPO", help=repo_help)
    log.add_argument("--branch", default="main", help="the experiment branch (default: main)")
    log.add_argument("--json", action="store_true", help="print JSON instead of a table")

    dl = sub.add_parser("download", help="materialize a revision as a folder that from_pretrained loads")
    dl.add_argument("repo", metavar="REPO", help=repo_help)
    dl.add_argument("--revision", required=True, help="branch, tag or commit id")
    dl.add_argument("--output-dir", required=True, help="new (or empty) folder to write the files into")

    pr = sub.add_parser("promote", help="a new commit on main with a revision's files (the experiment's best "
                                        "checkpoint becomes the repository's model)")
    pr.add_argument("repo", metavar="REPO", help=repo_help)
    pr.add_argument("--revision", required=True, help="branch, tag or commit id to promote")

    pl = sub.add_parser("plot", help="validation loss of every checkpoint on a branch, as a PNG and a table")
    pl.add_argument("repo", metavar="REPO", help=repo_help)
    pl.add_argument("--branch", required=True, help="the experiment branch")
    pl.add_argument("--dataset", required=True, help="validation data: a pretokenized folder or JSON/JSONL(.gz) shards")
    pl.add_argument("--output", required=True, help="PNG to write (a JSON of the points is written beside it)")
    pl.add_argument("--max-eval-steps", type=int, default=20, help="batches per checkpoint, -1 for the whole split (default: 20)")
    pl.add_argument("--batch-size", type=int, default=8, help="sequences per batch (default: 8)")
    pl.add_argument("--seq-length", type=int, default=None, help="tokens per sequence (default: the model's context)")
    return p.parse_args(argv)


def plot_branch(repo, args: argparse.Namespace) -> None:
    """Score each "step N" commit of the branch on the same validation batches and plot loss against step."""
    from pathlib import Path

    from codeparrot.atomic_io import atomic_write_json
    from codeparrot.tools.plots import plot_checkpoint_losses
    from codeparrot.training.validation import validation_loss

    commits = sorted((c for c in repo.list_commits(args.branch) if c.step is not None), key=lambda c: c.step)
    points = []
    for c in commits:
        result = validation_loss(args.repo, args.dataset, revision=c.commit_id, max_eval_steps=args.max_eval_steps,
                                 batch_size=args.batch_size, seq_length=args.seq_length)
        points.append({"step": c.step, "commit": c.commit_id, "loss": result["loss"], "perplexity": result["perplexity"]})
        print(f"step {c.step:>8}  {c.commit_id[:12]}  loss {result['loss']:.4f}  perplexity {result['perplexity']:.2f}",
              flush=True)
    png = plot_checkpoint_losses([(p["step"], p["loss"]) for p in points], args.output,
                                 f"{args.branch}: validation loss per checkpoint")
    atomic_write_json(Path(args.output).with_suffix(".json"), points)
    print(f"plot written to {png}")


def _table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(str(r[i])) for r in [header] + rows) for i in range(len(header))]
    return "\n".join("  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip() for r in [header] + rows)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from codeparrot.repository.refs import open_repository

    repo = open_repository(args.repo)
    if args.command == "list":
        branches = repo.list_branches()
        if args.json:
            print(json.dumps([asdict(b) for b in branches], indent=2))
        elif not branches:
            print(f"{args.repo}: no branches yet")
        else:
            print(_table([[b.name, "-" if b.latest_step is None else b.latest_step, b.date, b.commit_id[:12]]
                          for b in branches], ["branch", "latest step", "date", "commit"]))
    elif args.command == "log":
        commits = repo.list_commits(args.branch)
        if args.json:
            print(json.dumps([asdict(c) for c in commits], indent=2))
        else:
            print(_table([[c.commit_id[:12], "-" if c.step is None else c.step, c.date, c.message] for c in commits],
                         ["commit", "step", "date", "message"]))
    elif args.command == "download":
        out = repo.download(args.revision, args.output_dir)
        print(f"{args.repo}@{args.revision} -> {out}")
    elif args.command == "promote":
        commit = repo.promote(args.revision)
        print(f"promoted {args.revision} to main of {args.repo}: {commit[:12]}")
    elif args.command == "plot":
        plot_branch(repo, args)
    return 0


if __name__ == "__main__":
    run_cli(main)

"""scripts/checkpoints.py: browse and manage a checkpoint repository from the command line.

One dataclass per subcommand (its flags are generated from the fields, as for every other script) and one
function that runs it. `list` and `log` read the repository, `download` materializes a revision, `promote`
moves `main` (see `codeparrot.repository.promotion`), `plot` draws the validation loss of every checkpoint of
a branch from the losses pushed with them or computed on a dataset.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

from codeparrot.atomic_io import atomic_write_json
from codeparrot.config import REQUIRED, doc
from codeparrot.errors import CodeParrotError
from codeparrot.repository.metrics import branch_checkpoints, describe_eval, pushed_losses
from codeparrot.repository.promotion import promote_best
from codeparrot.repository.refs import open_repository

REPO_HELP = ("repository: a local git repository path (starting with ./, /, ~ or file://, or whose first folder exists) "
             "or a Hub id user/name (hf://user/name forces the Hub)")


def _repo_field():
    return doc(REQUIRED, REPO_HELP, flag="repo", metavar="REPO")


@dataclass
class ListConfig:
    """experiments (branches) with their latest step and date"""

    repo: str = _repo_field()
    json: bool = doc(False, "print JSON instead of a table")


@dataclass
class LogConfig:
    """checkpoints (commits) on a branch, newest first"""

    repo: str = _repo_field()
    branch: str = doc("main", "the experiment branch (default: main)")
    json: bool = doc(False, "print JSON instead of a table")


@dataclass
class DownloadConfig:
    """materialize a revision as a folder that from_pretrained loads"""

    repo: str = _repo_field()
    revision: str = doc(REQUIRED, "branch, tag or commit id")
    output_dir: str = doc(REQUIRED, "new (or empty) folder to write the files into")


@dataclass
class PromoteConfig:
    """a new commit on main with a checkpoint's files (a branch: its checkpoint with the lowest pushed validation
    loss; a commit/tag: exactly it)"""

    repo: str = _repo_field()
    revision: str = doc(REQUIRED, "branch (its best checkpoint by pushed validation loss), tag or commit id to "
                                  "promote")


@dataclass
class PlotConfig:
    """validation loss of every checkpoint on a branch, as a PNG and a table"""

    repo: str = _repo_field()
    branch: str = doc(REQUIRED, "the experiment branch")
    output: str = doc(REQUIRED, "PNG to write (a JSON of the points is written beside it)")
    dataset: str | None = doc(None, "validation data (a pretokenized folder or JSON/JSONL(.gz) shards) to compute "
                                    "every checkpoint's loss on; default: the losses pushed with the checkpoints "
                                    "(metrics.json)")
    max_eval_steps: int = doc(20, "batches per checkpoint, -1 for the whole split (default: 20)")
    batch_size: int = doc(8, "sequences per batch (default: 8)")
    seq_length: int | None = doc(None, "tokens per sequence (default: the model's context)")
    progress: bool = doc(True, "no progress of the --dataset evaluations (without it: a bar per checkpoint where "
                               "stderr is a terminal, else periodic lines with the rates)", flag="--no-progress",
                         inverted=True)


def _table(rows: list[list], header: list[str]) -> str:
    widths = [max(len(str(r[i])) for r in [header] + rows) for i in range(len(header))]
    return "\n".join("  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip() for r in [header] + rows)


def run_list(cfg: ListConfig) -> None:
    branches = open_repository(cfg.repo).list_branches()
    if cfg.json:
        print(json.dumps([asdict(b) for b in branches], indent=2))
    elif not branches:
        print(f"{cfg.repo}: no branches yet")
    else:
        print(_table([[b.name, "-" if b.latest_step is None else b.latest_step, b.date, b.commit_id[:12]]
                      for b in branches], ["branch", "latest step", "date", "commit"]))


def run_log(cfg: LogConfig) -> None:
    commits = open_repository(cfg.repo).list_commits(cfg.branch)
    if cfg.json:
        print(json.dumps([asdict(c) for c in commits], indent=2))
    else:
        print(_table([[c.commit_id[:12], "-" if c.step is None else c.step, c.date, c.message] for c in commits],
                     ["commit", "step", "date", "message"]))


def run_download(cfg: DownloadConfig) -> None:
    out = open_repository(cfg.repo).download(cfg.revision, cfg.output_dir)
    print(f"{cfg.repo}@{cfg.revision} -> {out}")


def run_promote(cfg: PromoteConfig) -> None:
    lines = promote_best(open_repository(cfg.repo), cfg.revision)
    print(f"promoted {cfg.revision} to main of {cfg.repo}")
    print("\n".join(f"  {line}" for line in lines))


def run_plot(cfg: PlotConfig) -> None:
    """Validation loss of each "step N" commit of the branch against step: the losses pushed with the
    checkpoints, or each checkpoint scored on the same batches of --dataset. Every figure says what the loss
    was measured on (sequences x tokens per sequence)."""
    # Heavy, and only needed here: matplotlib for the figure, torch (through validation) for --dataset.
    from codeparrot.tools.plots import plot_checkpoint_losses

    repo = open_repository(cfg.repo)
    points = []
    if cfg.dataset is None:
        for c, m in pushed_losses(repo, cfg.branch):
            points.append({"step": c.step, "commit": c.commit_id, "loss": m["val_loss"],
                           "perplexity": m.get("perplexity"), "eval_step": m.get("step"),
                           "measured_on": describe_eval(m)})
        if not points:
            raise CodeParrotError(f"no validation loss was pushed with the checkpoints of {cfg.branch!r} in "
                                  f"{cfg.repo}; give --dataset to compute them")
        source = "as pushed with the checkpoints"
    else:
        from codeparrot.training.validation import validation_loss

        checkpoints = branch_checkpoints(repo, cfg.branch)
        for i, c in enumerate(checkpoints, start=1):
            # A bar per checkpoint (each its own evaluation, after its own model load): its total is known
            # (--max-eval-steps or the split's batches) and its rate is the evaluation's, without the loads.
            label = f"checkpoint {i}/{len(checkpoints)} (step {c.step})" if cfg.progress else None
            result = validation_loss(cfg.repo, cfg.dataset, revision=c.commit_id, max_eval_steps=cfg.max_eval_steps,
                                     batch_size=cfg.batch_size, seq_length=cfg.seq_length, progress=label)
            points.append({"step": c.step, "commit": c.commit_id, "loss": result["loss"],
                           "perplexity": result["perplexity"], "measured_on": result["measured_on"]})
        source = f"on {cfg.dataset}"
    for p in points:
        print(f"step {p['step']:>8}  {p['commit'][:12]}  validation loss {p['loss']:.4f}  perplexity "
              f"{p['perplexity']:.2f}  on {p['measured_on']}", flush=True)
    measured = sorted({p["measured_on"] for p in points})
    png = plot_checkpoint_losses([(p["step"], p["loss"]) for p in points], cfg.output,
                                 f"{cfg.branch}: validation loss per checkpoint {source}",
                                 measured_on="measured on " + "; ".join(measured))
    atomic_write_json(Path(cfg.output).with_suffix(".json"), points)
    print(f"plot written to {png}")


# subcommand -> (its config, the function that runs it); the help line is the config's docstring.
COMMANDS: dict[str, tuple[type, Callable]] = {
    "list": (ListConfig, run_list),
    "log": (LogConfig, run_log),
    "download": (DownloadConfig, run_download),
    "promote": (PromoteConfig, run_promote),
    "plot": (PlotConfig, run_plot),
}

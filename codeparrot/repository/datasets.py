"""Dataset repositories: publishing the clean (or pretokenized) dataset, and reading one back for training.

    python scripts/preprocess.py --input export/ --output-dir clean --push hf://datasets/me/codeparrot-clean
    python scripts/pretokenize.py --dataset clean --tokenizer tok --output-dir tokens --push /shared/tokens.git
    python scripts/train.py ... --data.train /shared/tokens.git --data.valid /shared/tokens.git

Where a push goes: the repositories the checkpoints use (`open_repository`). A Hub id (`OWNER/NAME` or
`hf://datasets/OWNER/NAME`) is a Hub *dataset* repository (created on the first push; the token comes from
`HF_TOKEN` / `hf auth login` and is never read here); a path is a local bare git repository (created on the
first push), which another machine reads over a shared file system or after `git clone`.

What a push commits on `main`, one commit per push: exactly the output folder's files (hidden ones skipped), so
a later push replaces what an earlier one held, plus a dataset card `README.md` with the statistics and the
command that produced the data. For clean data the card's YAML header maps `train/*.json.gz` to the `train`
split and `valid/*.json.gz` to `validation`: the layout `datasets.load_dataset` (and the Hub viewer) reads.

How training reads it back (`resolve_dataset`, which `build_dataset` applies to data.train and data.valid; a
trailing `@REVISION` picks a branch, tag or commit, default `main`):
- a local git repository (bare, or a `git clone` of one): the revision is materialized once per commit id in
  the cache (as model revisions are; a clone without `@REVISION` is read as checked out), and its `train/` or
  `valid/` folder is the split, clean shards or pretokenized tokens alike;
- `hf://datasets/OWNER/NAME[@REVISION]`: downloaded once into the Hub cache (`snapshot_download`), then read
  the same way, clean or pretokenized;
- `OWNER/NAME`: streamed with `datasets` (clean data only; unchanged).
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from codeparrot.errors import CodeParrotError
from codeparrot.redaction import scrub_secrets
from codeparrot.repository.base import CheckpointRepository, is_hub_ref, strip_scheme
from codeparrot.repository.hub import hub_snapshot
from codeparrot.repository.local import is_git_repository
from codeparrot.repository.refs import open_repository, resolve_model_dir

CARD_NAME = "README.md"
HUB_DATASET_PREFIX = "hf://datasets/"
SPLIT_FOLDERS = {"train": "train", "valid": "valid", "validation": "valid"}  # build_dataset's split -> folder


# --- publishing --------------------------------------------------------------------------------------------
def open_dataset_repository(ref: str, output_dir: str | os.PathLike) -> CheckpointRepository:
    """The dataset repository `ref` names, created when missing. Called before the work starts, so a typo, a
    path that is not a repository or a missing Hub login fails in seconds, not after hours of preprocessing.
    A local repository inside `output_dir` (which the run replaces) is refused."""
    if not is_hub_ref(ref):
        path, out = Path(strip_scheme(ref)).expanduser().resolve(), Path(output_dir).expanduser().resolve()
        if path == out or out in path.parents:
            raise CodeParrotError(f"--push {ref} is inside --output-dir {output_dir}, which each run replaces: "
                                  "push to a repository outside it")
    return open_repository(ref, create=True, repo_type="dataset")


def command_line(argv: list[str] | None = None) -> str:
    """The command that is running (`python scripts/NAME.py ARGS`), shell-quoted, credentials scrubbed."""
    argv = list(sys.argv if argv is None else argv)
    if argv and os.path.isabs(argv[0]) and Path(argv[0]).is_relative_to(Path.cwd()):
        argv[0] = os.path.relpath(argv[0])  # as typed from the repository root
    return scrub_secrets("python " + shlex.join(argv))


def push_dataset(repo: CheckpointRepository, folder: str | os.PathLike, card: str, message: str,
                 branch: str = "main") -> str:
    """One commit on `branch` of `repo` whose tree is the non-hidden files of `folder` plus `README.md` =
    `card`; returns the commit id. `folder` itself is left untouched: the commit is built from a hidden
    staging folder next to it, of hard links (copies across file systems), so a 50 GB output costs no space."""
    folder = Path(folder)
    with tempfile.TemporaryDirectory(dir=folder.parent, prefix=f".{folder.name}.push-") as staging:
        stage = Path(staging)
        _link_tree(folder, stage)
        (stage / CARD_NAME).write_text(card, encoding="utf-8")
        commit = repo.commit_folder(stage, branch, message)
    print(f"pushed {folder} to {repo.ref}@{branch}: commit {commit}", file=sys.stderr)
    return commit


def publish_clean(repo: CheckpointRepository | None, folder: str | os.PathLike, stats: dict[str, Any]) -> dict:
    """Push a preprocess output `folder` (its `stats.json` = `stats`) to `repo` with its card; no-op for None.
    Returns `stats`."""
    if repo is not None:
        message = f"preprocess: {stats['kept_train']:,} train + {stats['kept_valid']:,} valid files"
        push_dataset(repo, folder, clean_dataset_card(stats, command_line(), repo.ref), message)
    return stats


def publish_pretokenized(repo: CheckpointRepository, folder: str | os.PathLike,
                         indexes: dict[str, dict[str, Any]]) -> str:
    """Push a pretokenize output `folder` (`indexes`: {subfolder or ".": its index.json}) to `repo` with its
    card; returns the commit id."""
    parts = ", ".join(f"{name} {index['n_tokens']:,}" for name, index in indexes.items() if name != ".")
    total = sum(index["n_tokens"] for index in indexes.values())
    message = f"pretokenize: {total:,} tokens" + (f" ({parts})" if parts else "")
    return push_dataset(repo, folder, pretokenized_dataset_card(indexes, command_line(), repo.ref), message)


def _link_tree(src: Path, dst: Path) -> None:
    for entry in sorted(src.iterdir()):
        if entry.name.startswith("."):
            continue  # unfinished outputs (.x.partial, .x.tmp-*)
        target = dst / entry.name
        if entry.is_dir():
            target.mkdir()
            _link_tree(entry, target)
        elif entry.is_file() and entry.name != CARD_NAME:
            try:
                os.link(entry, target)
            except OSError:
                shutil.copy2(entry, target)


def _card(title: str, yaml_configs: str, intro: str, command: str, rows: list[tuple[str, str]],
          use: str) -> str:
    table = "\n".join(f"| {name} | {value} |" for name, value in rows)
    return (f"---\n{yaml_configs}tags:\n- code\n- python\n---\n\n# {title}\n\n{intro}\n\n"
            f"## How it was made\n\n```bash\n{command}\n```\n\n## Statistics\n\n| | |\n|---|---:|\n{table}\n\n"
            f"## Training on it\n\n{use}\n")


def clean_dataset_card(stats: dict[str, Any], command: str, ref: str) -> str:
    """The dataset card of a preprocess output, from its `stats.json` (`stats`)."""
    splits = [("train", "train")] + ([("validation", "valid")] if stats.get("kept_valid") else [])
    configs = "configs:\n- config_name: default\n  data_files:\n" + "".join(
        f"  - split: {split}\n    path: {folder}/*.json.gz\n" for split, folder in splits)
    total = max(int(stats.get("input_records", 0)), 1)
    rows = [("input records", f"{stats.get('input_records', 0):,}")]
    rows += [(f"bad records: {reason}", f"{count:,}") for reason, count in stats.get("bad_records", {}).items()]
    rows.append(("exact duplicates", f"{stats.get('exact_duplicates', 0):,}"))
    rows += [(f"filtered: {reason}", f"{count:,}") for reason, count in stats.get("filtered", {}).items()]
    rows += [(f"filtered: {reason}", f"off ({why})") for reason, why in stats.get("filters_off", {}).items()]
    rows.append(("HumanEval decontamination", f"{stats.get('decontaminated', 0):,}"))
    if stats.get("config", {}).get("near_dedup"):
        rows.append((f"near duplicates ({stats.get('near_duplicate_clusters', 0):,} clusters)",
                     f"{stats.get('near_duplicates', 0):,}"))
    for split in ("train", "valid"):
        kept = int(stats.get(f"kept_{split}", 0))
        rows.append((f"kept: {split}", f"{kept:,} ({100 * kept / total:.1f}%)"))
    rows.append(("MB in / out", f"{stats.get('bytes_in', 0) / 1e6:,.1f} / {stats.get('bytes_out', 0) / 1e6:,.1f}"))
    intro = ("Python files cleaned by CodeParrot's preprocessing: exact and (optionally) near deduplication, "
             "heuristic filters, HumanEval decontamination. Gzip JSON lines, one file per line with its original "
             "columns; `stats.json` holds every count and the full configuration"
             + (", `duplicate_clusters.json` the near-duplicate clusters." if stats.get("config", {}).get("near_dedup")
                else "."))
    use = _train_command(ref, bool(stats.get("kept_valid"))) + (
        "A local repository is read at `main` (append `@REVISION` to pin a commit); a Hub repository as "
        "`hf://datasets/OWNER/NAME` (downloaded once) or `OWNER/NAME` (streamed with `datasets`).")
    return _card("CodeParrot clean dataset", configs, intro, command, rows, use)


def _train_command(ref: str, has_valid: bool) -> str:
    valid = f" --data.valid {ref}" if has_valid else ""
    return (f"```bash\naccelerate launch scripts/train.py --config configs/train/codeparrot-small.yaml \\\n"
            f"    --data.train {ref}{valid}\n```\n\n")


def pretokenized_dataset_card(indexes: dict[str, dict[str, Any]], command: str, ref: str) -> str:
    """The dataset card of a pretokenize output; `indexes`: {output folder relative to the root ("." for a
    single one): its index.json}."""
    rows = []
    for name, index in indexes.items():
        where = "" if name == "." else f"{name}: "
        rows += [(f"{where}tokens", f"{index['n_tokens']:,} ({index['dtype']})"),
                 (f"{where}files", f"{index['n_records']:,} from {len(index.get('files', []))} shard(s)")]
    first = next(iter(indexes.values()), {})
    rows += [("vocabulary", f"{first.get('vocab_size', 0):,} tokens, EOS id {first.get('eos_token_id')}"),
             ("tokenizer fingerprint", f"`{first.get('tokenizer_fingerprint', '?')}`")]
    intro = ("Clean Python files tokenized once by CodeParrot's `scripts/pretokenize.py`: per split a `tokens.bin` "
             "(every file's tokens followed by EOS) and its `index.json` (counts, dtype, tokenizer fingerprint). "
             "Training checks that its tokenizer matches the fingerprint.")
    use = _train_command(ref, "valid" in indexes) + (
        "A local repository is read at `main` (append `@REVISION` to pin a commit); a Hub repository as "
        "`hf://datasets/OWNER/NAME` (downloaded once; pretokenized data cannot be streamed).")
    return _card("CodeParrot pretokenized dataset", "", intro, command, rows, use)


# --- reading back ------------------------------------------------------------------------------------------
def _split_revision(text: str) -> tuple[str, str | None]:
    """(repository reference, revision or None) of `REF@REVISION`; a path that exists as typed has no revision."""
    base, at, revision = text.rpartition("@")
    if not at or "/" in revision or os.path.exists(os.path.expanduser(strip_scheme(text))):
        return text, None
    return base, revision


def resolve_dataset(data: Any, split: str) -> Any:
    """What `build_dataset` reads for `data` and `split` ("train", "valid" or "validation"): the split folder
    of a dataset repository's revision (module docstring), or `data` unchanged when it is no repository."""
    if not isinstance(data, (str, os.PathLike)):
        return data
    text, revision = _split_revision(os.fspath(data))
    if text.startswith(HUB_DATASET_PREFIX):
        folder = hub_snapshot(text[len(HUB_DATASET_PREFIX):], revision, repo_type="dataset")
    elif not text.startswith("hf://") and is_git_repository(Path(strip_scheme(text)).expanduser()):
        folder = resolve_model_dir(strip_scheme(text), revision)  # the revision materialized once per commit
    else:
        return data
    return os.fspath(dataset_split_folder(folder, split, os.fspath(data)))


def dataset_split_folder(folder: Path, split: str, label: str) -> Path:
    """`folder/train` or `folder/valid` for `split`; `folder` itself when it holds no split folders (a dataset
    published without splits). A missing split is a one-line error naming `label`."""
    name = SPLIT_FOLDERS.get(split)
    if name is None:
        raise CodeParrotError(f"unknown split {split!r} (train, valid or validation)")
    if (folder / name).is_dir():
        return folder / name
    others = [n for n in ("train", "valid") if (folder / n).is_dir()]
    if others:
        raise CodeParrotError(f"{label} has no {name}/ split (it has {', '.join(others)}/); "
                              "was its valid split empty? (--valid-fraction)")
    return folder

"""`preprocess.py --push REPO` / `pretokenize.py --push REPO`: the dataset goes to a dataset repository (local git
backend end to end here; the Hub read side through an olah mirror when one is installed) and training reads it
back from the repository alone: a bare repository, a `git clone` of it, or a pinned `@REVISION`."""

from __future__ import annotations

import gzip
import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from codeparrot.errors import CodeParrotError
from codeparrot.repository.datasets import dataset_split_folder, resolve_dataset
from codeparrot.repository.local import LocalGitRepository
from codeparrot.training.datasets.loader import build_dataset
from codeparrot.training.datasets.pretokenized import PretokenizedDataset

L = 64  # sequence length of the datasets read back


def _texts(folder: Path) -> list[str]:
    return [json.loads(line)["content"] for p in sorted(folder.glob("*.json.gz")) for line in gzip.open(p)]


def _flat(dataset) -> np.ndarray:
    return torch.cat(list(dataset)).numpy()


def _tree(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, stdlib_texts) -> Path:
    path = tmp_path_factory.mktemp("corpus") / "export.jsonl"
    path.write_text("".join(json.dumps({"repo_name": f"r{i}", "path": f"m{i}.py", "content": t}) + "\n"
                            for i, t in enumerate(stdlib_texts[:40])), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def tokenizer_dir(code_tokenizer, tmp_path_factory) -> Path:
    from codeparrot.tokenizer import save_tokenizer

    return save_tokenizer(code_tokenizer, tmp_path_factory.mktemp("tok") / "tokenizer")


@pytest.fixture
def cli(repo_root, python, scripts_env, tmp_path):
    scripts_env["CODEPARROT_CACHE"] = str(tmp_path / "cache")

    def cli(script: str, *args) -> subprocess.CompletedProcess:
        return subprocess.run([python, str(repo_root / "scripts" / script), *map(str, args)], capture_output=True,
                              text=True, env=scripts_env, timeout=180)
    return cli


def _preprocess(cli, corpus, out, repo, valid_fraction="0.25"):
    proc = cli("preprocess.py", "--input", corpus, "--output-dir", out, "--num-workers", "0", "--no-progress",
               "--valid-fraction", valid_fraction, "--push", repo)
    assert proc.returncode == 0, proc.stderr
    return json.loads((out / "stats.json").read_text())


def test_preprocess_push_commits_the_output_and_a_card_and_training_reads_it_back(
        cli, corpus, tmp_path, code_tokenizer, eos_joined):
    repo_path, out = tmp_path / "clean.git", tmp_path / "clean"
    stats = _preprocess(cli, corpus, out, repo_path)
    repo = LocalGitRepository(repo_path)
    assert repo.bare
    [first] = repo.list_commits("main")
    assert first.message == f"preprocess: {stats['kept_train']} train + {stats['kept_valid']} valid files"
    assert stats["kept_train"] > 0 and stats["kept_valid"] > 0
    pushed = repo.download("main", tmp_path / "pushed")
    card = (pushed / "README.md").read_text()
    tree = _tree(pushed)
    del tree["README.md"]
    assert tree == _tree(out)  # exactly the output: train/ valid/ shards and stats.json, byte for byte
    assert any(name.startswith("valid/") for name in tree) and "stats.json" in tree
    assert not (out / "README.md").exists() and not list(tmp_path.glob(".*push*"))  # output untouched, no staging
    # The card: the exact command, the counts, and the YAML that maps the folders to splits.
    assert "python scripts/preprocess.py --input" in card and f"--push {repo_path}" in card
    assert f"| kept: train | {stats['kept_train']:,}" in card and f"| input records | {stats['input_records']:,} |" in card
    assert "- split: validation\n    path: valid/*.json.gz" in card and f"--data.train {repo_path}" in card

    # `datasets` (what streams a Hub id, `HubRecordStream`) reads the pushed layout through the card alone.
    from datasets import load_dataset

    valid = load_dataset(str(pushed), split="validation", cache_dir=str(tmp_path / "hf"))
    assert valid.num_rows == stats["kept_valid"] and valid["content"] == _texts(out / "valid")

    # Training reads the repository itself: each split is the folder of that split, materialized from git.
    for split, folder in (("train", "train"), ("validation", "valid")):
        ds = build_dataset(str(repo_path), code_tokenizer, L, split=split, shuffle=False)
        seqs = _flat(ds)
        ref = eos_joined(code_tokenizer, _texts(out / folder))
        assert len(seqs) == len(ref) // L * L > 0
        np.testing.assert_array_equal(seqs, ref[: len(seqs)])

    # A second push is a second commit on main; `@REVISION` pins the first, a `git clone` reads the newest.
    stats2 = _preprocess(cli, corpus, out, repo_path, valid_fraction="0.5")
    commits = repo.list_commits("main")
    assert [c.commit_id for c in commits][1:] == [first.commit_id] and len(commits) == 2
    assert stats2["kept_valid"] != stats["kept_valid"]
    pinned = resolve_dataset(f"{repo_path}@{first.commit_id}", "valid")
    assert len(list(Path(pinned).glob("*.json.gz"))) and _texts(Path(pinned)) != _texts(out / "valid")
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "--quiet", str(repo_path), str(clone)], check=True)
    assert Path(resolve_dataset(str(clone), "validation")) == clone / "valid"
    assert _texts(clone / "valid") == _texts(out / "valid")
    np.testing.assert_array_equal(_flat(build_dataset(str(clone), code_tokenizer, L, split="validation",
                                                      shuffle=False)),
                                  _flat(build_dataset(str(out / "valid"), code_tokenizer, L, shuffle=False)))


def test_pretokenize_push_from_a_clone_of_the_clean_repository_and_training_on_it(
        cli, corpus, tmp_path, tokenizer_dir, code_tokenizer):
    clean_repo, tokens_repo = tmp_path / "clean.git", tmp_path / "tokens.git"
    stats = _preprocess(cli, corpus, tmp_path / "clean", clean_repo)
    clone = tmp_path / "clean-clone"  # the other machine: a clone of the clean data is a preprocess output root
    subprocess.run(["git", "clone", "--quiet", str(clean_repo), str(clone)], check=True)
    proc = cli("pretokenize.py", "--dataset", clone, "--tokenizer", tokenizer_dir, "--output-dir", tmp_path / "tok",
               "--num-workers", "1", "--quiet", "--push", tokens_repo)
    assert proc.returncode == 0, proc.stderr
    repo = LocalGitRepository(tokens_repo)
    [commit] = repo.list_commits("main")
    index = {s: json.loads((tmp_path / "tok" / s / "index.json").read_text()) for s in ("train", "valid")}
    total = index["train"]["n_tokens"] + index["valid"]["n_tokens"]
    assert commit.message == (f"pretokenize: {total:,} tokens (train {index['train']['n_tokens']:,}, "
                              f"valid {index['valid']['n_tokens']:,})")
    assert index["train"]["n_records"] == stats["kept_train"]
    pushed = repo.download("main", tmp_path / "pushed")
    card = (pushed / "README.md").read_text()
    assert "python scripts/pretokenize.py --dataset" in card and f"--push {tokens_repo}" in card
    assert index["train"]["tokenizer_fingerprint"] in card and f"{index['valid']['n_tokens']:,}" in card
    tree = _tree(pushed)
    del tree["README.md"]
    assert tree == _tree(tmp_path / "tok")
    for split, folder in (("train", "train"), ("validation", "valid")):
        ds = build_dataset(str(tokens_repo), code_tokenizer, L, split=split, shuffle=False)
        assert isinstance(ds, PretokenizedDataset)
        tokens = np.fromfile(tmp_path / "tok" / folder / "tokens.bin", dtype=index[folder]["dtype"])
        seqs = _flat(ds)
        assert len(seqs) == len(tokens) // L * L > 0
        np.testing.assert_array_equal(seqs, tokens[: len(seqs)])


def test_bad_push_targets_fail_before_the_work_in_one_line(cli, corpus, tmp_path):
    not_a_repo = tmp_path / "notes"
    not_a_repo.mkdir()
    (not_a_repo / "todo.txt").write_text("keep me")
    proc = cli("preprocess.py", "--input", corpus, "--output-dir", tmp_path / "out", "--num-workers", "0",
               "--push", not_a_repo)
    err = proc.stderr.strip()
    assert proc.returncode != 0 and err.startswith("error: ") and "\n" not in err and "not a git repository" in err
    assert not (tmp_path / "out").exists() and (not_a_repo / "todo.txt").read_text() == "keep me"
    inside = cli("preprocess.py", "--input", corpus, "--output-dir", tmp_path / "out", "--push", tmp_path / "out/r")
    assert inside.returncode != 0 and inside.stderr.startswith("error: --push") and "inside --output-dir" in inside.stderr
    assert not (tmp_path / "out").exists()


def test_a_repository_without_the_asked_split_is_a_one_line_error(tmp_path):
    (tmp_path / "train").mkdir()
    assert dataset_split_folder(tmp_path, "train", "r") == tmp_path / "train"
    with pytest.raises(CodeParrotError, match="r has no valid/ split"):
        dataset_split_folder(tmp_path, "validation", "r")
    shutil.rmtree(tmp_path / "train")
    assert dataset_split_folder(tmp_path, "validation", "r") == tmp_path  # published without splits
    assert resolve_dataset(str(tmp_path), "train") == str(tmp_path)  # a plain folder is not a repository


@pytest.mark.slow
def test_hub_read_side_through_an_olah_mirror(cli, corpus, tmp_path, olah_mirror, python, scripts_env):
    """The pushed layout served by a real Hub API server (olah, offline mode, serving the pushed git repository
    as the dataset user/clean): `hf://datasets/user/clean` downloads it, `user/clean` streams it with `datasets`."""
    pushed = tmp_path / "mirrors" / "datasets" / "user" / "clean"
    LocalGitRepository(pushed, create=True, use_lfs=False)  # olah reads plain git objects
    stats = _preprocess(cli, corpus, tmp_path / "clean", pushed)
    scripts_env.update(HF_ENDPOINT=olah_mirror(), HF_HUB_OFFLINE="0", HF_DATASETS_OFFLINE="0",
                       HF_HOME=str(tmp_path / "hf-home"))
    code = ("import gzip, json, pathlib; from datasets import load_dataset; "
            "from codeparrot.repository.datasets import resolve_dataset; "
            "folder = pathlib.Path(resolve_dataset('hf://datasets/user/clean', 'validation')); "
            "texts = [json.loads(l)['content'] for p in sorted(folder.glob('*.json.gz')) for l in gzip.open(p)]; "
            "streamed = [r['content'] for r in load_dataset('user/clean', split='validation', streaming=True)]; "
            "print(json.dumps([texts, streamed]))")
    proc = subprocess.run([python, "-c", code], capture_output=True, text=True, env=scripts_env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    downloaded, streamed = json.loads(proc.stdout.splitlines()[-1])
    assert downloaded == streamed == _texts(tmp_path / "clean" / "valid") and len(downloaded) == stats["kept_valid"]


def test_a_hub_push_creates_a_dataset_repository_and_uploads_output_and_card(tmp_path, monkeypatch):
    """The Hub write path at the HfApi boundary (no Hub is reachable here): `hf://datasets/OWNER/NAME` is a
    dataset repository, created, and one upload_folder holds the output and the card."""
    from types import SimpleNamespace

    from codeparrot.repository import hub
    from codeparrot.repository.datasets import open_dataset_repository, push_dataset

    calls = []

    class RecordingHfApi:
        def create_repo(self, **kw):
            calls.append(("create_repo", kw))

        def upload_folder(self, **kw):
            folder = Path(kw.pop("folder_path"))
            calls.append(("upload_folder", {**kw, "files": sorted(_tree(folder))}))
            assert (folder / "README.md").read_text() == "card"  # the staging folder lives during the upload
            return SimpleNamespace(oid="f" * 40)

    monkeypatch.setattr(hub, "HfApi", RecordingHfApi)
    out = tmp_path / "clean"
    (out / "train").mkdir(parents=True)
    (out / "train" / "file-000000000001.json.gz").write_bytes(b"x")
    (out / "stats.json").write_text("{}")
    (out / ".valid.tmp-1").mkdir()  # an unfinished folder is never published
    repo = open_dataset_repository("hf://datasets/me/clean", out)
    assert push_dataset(repo, out, "card", "preprocess: 1 train + 0 valid files") == "f" * 40
    assert calls[0] == ("create_repo", {"repo_id": "me/clean", "repo_type": "dataset", "exist_ok": True,
                                        "private": None})
    upload = calls[1][1]
    assert upload["repo_id"] == "me/clean" and upload["repo_type"] == "dataset" and upload["revision"] == "main"
    assert upload["files"] == ["README.md", "stats.json", "train/file-000000000001.json.gz"]
    assert upload["commit_message"] == "preprocess: 1 train + 0 valid files"

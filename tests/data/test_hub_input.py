"""`--input hf://datasets/OWNER/NAME` / `--dataset-id`: a dataset repository streamed with `datasets`. Tested
offline against a real local dataset repository folder (JSONL shards under data/, as on the Hub), not a mock."""

from __future__ import annotations

import gzip
import hashlib
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from codeparrot.data.hub_input import HubInput, parse_hub_spec, resolve_inputs
from codeparrot.data.preprocess import PreprocessConfig, preprocess
from codeparrot.errors import CodeParrotError


def _rows(folder: Path) -> list[dict]:
    return [json.loads(line) for p in sorted(folder.glob("*.json.gz")) for line in gzip.open(p, "rt")]


@pytest.fixture(scope="module")
def dataset_repo(tmp_path_factory, stdlib_texts) -> Path:
    """A dataset repository as `git clone` gives it: README and two JSONL shards of the export's columns, with
    an exact duplicate and a row without text."""
    repo = tmp_path_factory.mktemp("dataset-repo")
    rows = [{"repo_name": f"r{i}", "path": f"m{i}.py", "copies": "1", "size": len(t), "content": t, "license": "mit"}
            for i, t in enumerate(stdlib_texts[:24])]
    rows.insert(10, dict(rows[3], repo_name="fork"))  # exact duplicate: the first occurrence wins
    rows.insert(15, dict(rows[4], content=None))  # a row without text: a bad record
    rows.insert(20, dict(rows[5], path="near.py", content=rows[5]["content"] + "\nnear_duplicate = 1\n"))
    (repo / "data").mkdir()
    for shard, part in enumerate((rows[:13], rows[13:])):
        with open(repo / "data" / f"train-{shard:05d}-of-00002.jsonl", "w", encoding="utf-8") as f:
            f.writelines(json.dumps(r) + "\n" for r in part)
    (repo / "README.md").write_text("---\nconfigs:\n- config_name: default\n  data_files:\n  - split: train\n"
                                    "    path: data/train-*.jsonl\n---\n# a tiny export\n")
    return repo


def test_a_streamed_dataset_repository_gives_the_same_output_as_its_files(dataset_repo, tmp_path):
    common = dict(num_workers=0, progress=False, valid_fraction=0.2, near_dedup=True)
    hub = preprocess(PreprocessConfig([], str(tmp_path / "hub"), dataset_id=str(dataset_repo), **common))
    files = preprocess(PreprocessConfig([str(dataset_repo / "data")], str(tmp_path / "files"), **common))
    assert hub["exact_duplicates"] == files["exact_duplicates"] == 1
    assert hub["bad_records"] == files["bad_records"] == {"non-string text": 1}
    assert hub["bad_record_examples"]["non-string text"] .startswith(f"{dataset_repo}:train:16 ")  # dataset:split:row
    for key in ("kept_train", "kept_valid", "filtered", "decontaminated", "bytes_in", "bytes_out"):
        assert hub[key] == files[key], key
    for split in ("train", "valid"):
        assert _rows(tmp_path / "hub" / split) == _rows(tmp_path / "files" / split)  # every field passes through
    assert hub["kept_train"] > 0 and hub["inputs"] == [f"{dataset_repo}:train"]


def test_hub_specs_are_parsed_and_mixed_with_files_in_order(dataset_repo):
    assert parse_hub_spec("hf://datasets/codeparrot/codeparrot", "valid", "v1") == HubInput(
        "codeparrot/codeparrot", "valid", "v1")
    assert str(HubInput("codeparrot/codeparrot", "train", "abc")) == "hf://datasets/codeparrot/codeparrot@abc:train"
    shard = dataset_repo / "data" / "train-00000-of-00002.jsonl"
    inputs = resolve_inputs([str(shard), "hf://datasets/a/b"], dataset_id="c/d", split="valid")
    assert inputs == [shard, HubInput("a/b", "valid"), HubInput("c/d", "valid")]
    for bad in ("hf://datasets/only-a-name", "hf://datasets/a/b/c"):
        with pytest.raises(CodeParrotError, match="hf://datasets/OWNER/NAME"):
            parse_hub_spec(bad)


def test_stream_errors_are_one_line(dataset_repo, tmp_path, repo_root, python, scripts_env):
    result = subprocess.run([python, str(repo_root / "scripts" / "preprocess.py"), "--dataset-id", str(dataset_repo),
                             "--split", "nope", "--output-dir", str(tmp_path / "o"), "--num-workers", "0"],
                            capture_output=True, text=True, env=scripts_env, timeout=120)
    assert result.returncode != 0 and not (tmp_path / "o").exists()
    assert result.stderr.startswith(f"error: cannot stream {dataset_repo}:nope") and "Traceback" not in result.stderr
    with pytest.raises(CodeParrotError, match="no input"):
        preprocess(PreprocessConfig([], str(tmp_path / "o")))


def test_a_dataset_id_that_is_no_folder_names_both_readings(monkeypatch):
    """--dataset-id takes a folder or a Hub id: a path that cannot be a Hub id is "no such folder" before anything
    streams; one that can, and that the Hub cannot stream either, names both readings."""
    from huggingface_hub import constants

    from codeparrot.data.hub_input import _stream_error

    for path in ("./not-here", "/not/here", "a/b/c", "not-here.jsonl"):
        with pytest.raises(CodeParrotError, match=rf"^--dataset-id {re.escape(path)}: no such folder \(and no Hub id"):
            resolve_inputs([], dataset_id=path)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    offline = ConnectionError("Couldn't reach 'someone/not-here' on the Hub (OfflineModeIsEnabled)")
    hub = resolve_inputs([], dataset_id="someone/not-here")[0]
    assert str(_stream_error(hub, offline)) == (
        "--dataset-id someone/not-here: no such file or folder, and not a Hub dataset either (the Hub is offline: "
        "HF_HUB_OFFLINE=1, and the datasets cache does not hold it)")
    named = parse_hub_spec("hf://datasets/someone/not-here")  # the Hub alone: its own error
    assert str(_stream_error(named, offline)).startswith("cannot stream hf://datasets/someone/not-here:train: ")


def _decisions(out: Path) -> dict:
    """What a run decided: stats without timings, the clusters file, each shard's name and sha256."""
    stats = json.loads((out / "stats.json").read_text())
    return {"stats": {k: v for k, v in stats.items() if k not in ("seconds", "files_per_second", "mb_per_second",
                                                                  "config", "index_bytes_per_file")},
            "clusters": (out / "duplicate_clusters.json").read_bytes(),
            "shards": {str(p.relative_to(out)): hashlib.sha256(p.read_bytes()).hexdigest()
                       for p in sorted(out.rglob("*.gz"))}}


def test_the_ray_engine_reads_a_dataset_repository_shard_by_shard_with_the_local_decisions(dataset_repo, tmp_path,
                                                                                          ray_session):
    """One Ray read task per data file of the split; rows, bad-row locations (dataset:split:row over the whole
    split) and near-duplicate clusters across the two shards are the local engine's."""
    extra = tmp_path / "extra.jsonl"  # a local file before the dataset: input order spans both kinds
    extra.write_text(json.dumps({"repo_name": "x", "path": "x.py", "content": _rows_of(dataset_repo)[7]["content"]})
                     + "\n")
    common = dict(num_workers=2, progress=False, valid_fraction=0.2, near_dedup=True, samples_per_file=8)
    for engine in ("local", "ray"):
        preprocess(PreprocessConfig([str(extra)], str(tmp_path / engine), dataset_id=str(dataset_repo),
                                    engine=engine, **common))
    ray, local = _decisions(tmp_path / "ray"), _decisions(tmp_path / "local")
    assert ray == local
    assert local["stats"]["exact_duplicates"] == 2 and local["stats"]["near_duplicates"] == 1
    assert local["stats"]["bad_record_examples"]["non-string text"].startswith(f"{dataset_repo}:train:16 ")
    clusters = json.loads(local["clusters"])["clusters"]
    assert [m["input"] for m in clusters[0]] == [f"{dataset_repo}:train:6", f"{dataset_repo}:train:21"]


def test_a_shard_failing_mid_stream_is_a_one_line_error_on_both_engines(dataset_repo, tmp_path, ray_session):
    broken = tmp_path / "broken"
    shutil.copytree(dataset_repo, broken)
    (broken / "data" / "train-00001-of-00002.jsonl").write_text('{"content": "x"}\n{"content": \n')
    for engine in ("local", "ray"):
        with pytest.raises(CodeParrotError, match=f"^cannot stream {broken}:train: ") as err:
            preprocess(PreprocessConfig([], str(tmp_path / engine), dataset_id=str(broken), engine=engine,
                                        num_workers=2, progress=False))
        assert "\n" not in str(err.value) and not (tmp_path / engine).exists()


def _rows_of(repo: Path) -> list[dict]:
    return [json.loads(line) for p in sorted((repo / "data").glob("*.jsonl")) for line in p.open()]

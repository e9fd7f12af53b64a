"""Samples of a plain model folder (no commit names its files) are tied to the files: a resumed run whose weights
changed is refused instead of mixing the samples of two models (provenance.weights_fingerprint)."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from codeparrot.errors import CodeParrotError
from codeparrot.humaneval.problems import read_samples
from codeparrot.repository import provenance
from codeparrot.repository.provenance import file_fingerprint, weights_fingerprint

from .conftest import _config


def _options(model, tmp_path, **changes):
    return _config(**{**dict(problems=None, num_tasks=1, timeout=3.0, memory_mb=1024, completions=None,
                             canonical=False, model=str(model), revision=None, n_samples=2, batch_size=2,
                             temperature=[0.8], top_p=0.95, max_new_tokens=2, seed=0, no_strip=False,
                             samples_file=str(tmp_path / "s.jsonl"), output=str(tmp_path / "r.json"), k=[1],
                             allow_code_execution=False, num_workers=1, execute_duplicates=False, no_progress=True,
                             allow_missing_tasks=False), **changes})


def _retrained(weights_file, out):
    """The same model with one tensor changed, as a checkpoint of a later step."""
    weights = load_file(weights_file)
    weights["transformer.h.1.mlp.c_fc.weight"] += 0.01
    save_file(weights, out, metadata={"format": "pt"})


def test_resume_on_a_plain_folder_refuses_other_weights(tiny_model, tmp_path, capsys):
    """Before: the meta recorded {"revision": null} for a plain folder, and a run resumed after its model.safetensors
    was replaced scored the samples of two models together, silently."""
    from codeparrot.humaneval.scoring import run

    model = shutil.copytree(tiny_model, tmp_path / "model")
    original = (model / "model.safetensors").read_bytes()
    run(_options(model, tmp_path))
    meta_file = tmp_path / "s.jsonl.meta.json"
    meta = json.loads(meta_file.read_text())
    assert set(meta["weights"]) == {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"}
    samples = tmp_path / "s.jsonl"
    samples.write_text(samples.read_text().splitlines(keepends=True)[0])  # as if killed after one sample
    _retrained(model / "model.safetensors", model / "model.safetensors")
    with pytest.raises(CodeParrotError) as err:
        run(_options(model, tmp_path))
    assert str(err.value) == (f"{samples} holds samples made with other files in {model}: model.safetensors changed "
                              f"since (their fingerprints are recorded in {meta_file}); put those files back to "
                              "resume, or start over with another --samples-file or after removing both files")
    assert len(read_samples(samples)) == 1
    (model / "model.safetensors").write_bytes(original)  # the weights back: it resumes
    run(_options(model, tmp_path))
    assert len(read_samples(samples)) == 2

    # a meta written before folders were fingerprinted resumes (as it did), with a warning, and records them now
    meta_file.write_text(json.dumps({k: v for k, v in meta.items() if k != "weights"}))
    capsys.readouterr()
    run(_options(model, tmp_path))
    assert "records no fingerprint of the files in" in capsys.readouterr().err
    assert json.loads(meta_file.read_text())["weights"] == meta["weights"]


def test_a_pinned_commit_needs_no_fingerprint(tiny_model):
    assert weights_fingerprint(str(tiny_model), "a" * 40) is None
    assert weights_fingerprint("user/model", None) is None  # the Hub: nothing local (loading says why)
    assert set(weights_fingerprint(str(tiny_model), None)) >= {"config.json", "model.safetensors"}


def test_large_files_are_sampled_in_every_tensor(tiny_model, tmp_path, monkeypatch):
    """Above WHOLE_FILE_BYTES a weights file is fingerprinted by its header and samples of every tensor (hashing
    6 GB costs seconds in every process); a change to any one tensor still changes it, equal files agree."""
    monkeypatch.setattr(provenance, "WHOLE_FILE_BYTES", 0)
    monkeypatch.setattr(provenance, "SAMPLE_BYTES", 16)
    weights = tiny_model / "model.safetensors"
    shutil.copy(weights, tmp_path / "copy.safetensors")
    sampled = file_fingerprint(weights)
    assert sampled.startswith("sampled-sha256:") and file_fingerprint(tmp_path / "copy.safetensors") == sampled
    tensors = load_file(weights)
    for name in ("transformer.ln_f.bias", "transformer.h.0.ln_1.weight"):
        changed = dict(tensors)
        changed[name] = changed[name].clone()
        changed[name][len(changed[name]) // 2] += 1.0  # the middle element only
        save_file(changed, tmp_path / "changed.safetensors")
        assert file_fingerprint(tmp_path / "changed.safetensors") != sampled, name
    blob = tmp_path / "weights.bin"  # not safetensors: windows spread over the whole file
    torch.save(tensors, blob)
    before = file_fingerprint(blob)
    data = bytearray(blob.read_bytes())
    data[0] ^= 1
    blob.write_bytes(bytes(data))
    assert file_fingerprint(blob) != before

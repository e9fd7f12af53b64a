"""Resuming a HumanEval run: a killed run (lost or torn lines) ends with the same samples as an uninterrupted
one, and a rerun with other settings, another commit of the branch or another dtype is refused, naming what differs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from codeparrot.errors import CodeParrotError
from codeparrot.humaneval.problems import merge_samples, read_samples

from .conftest import _config, _load


def test_generation_resumes_exactly(tiny_model, problems, tmp_path):
    """A run killed mid-way (lines lost, a partial line) and resumed ends with the same samples as an
    uninterrupted run; raising n_samples only generates the new indices."""
    from codeparrot.humaneval.generation import SamplingConfig, generate_samples, sample_key

    model, tokenizer = _load(tiny_model)
    tasks = problems[:2]
    cfg = SamplingConfig(n_samples=3, batch_size=2, temperatures=[0.8], max_new_tokens=8, seed=1)
    full = tmp_path / "full.jsonl"
    stats = generate_samples(model, tokenizer, tasks, cfg, Path(str(full) + ".part-0"), set())
    assert stats["samples"] == 6
    reference = {sample_key(s): s["completion"] for s in merge_samples(full)}
    lines = full.read_text().splitlines(keepends=True)
    resumed = tmp_path / "resumed.jsonl"
    resumed.write_text(lines[0] + lines[3] + lines[5] + lines[1][:25])  # lost lines + a torn last line
    done = {sample_key(s) for s in read_samples(resumed)}
    stats = generate_samples(model, tokenizer, tasks, cfg, Path(str(resumed) + ".part-0"), done)
    assert stats["samples"] == 3
    assert {sample_key(s): s["completion"] for s in merge_samples(resumed)} == reference
    cfg.n_samples = 4
    done = {sample_key(s) for s in read_samples(resumed)}
    stats = generate_samples(model, tokenizer, tasks, cfg, Path(str(resumed) + ".part-0"), done)
    assert stats["samples"] == 2 and len(merge_samples(resumed)) == 8


def test_resume_after_a_torn_line_in_the_part_file(tiny_model, problems, tmp_path):
    """A run killed in the middle of appending leaves a partial last line in its part file; the resumed run appends
    to the same file. Its first line must not run on from the torn one (before: one corrupt line in the middle of
    the file, and merging the samples failed on every rerun); the merged samples equal an uninterrupted run's."""
    from codeparrot.humaneval.generation import SamplingConfig, generate_samples, sample_key

    model, tokenizer = _load(tiny_model)
    cfg = SamplingConfig(n_samples=3, batch_size=2, temperatures=[0.8], max_new_tokens=8, seed=1)
    full = tmp_path / "full.jsonl"
    generate_samples(model, tokenizer, problems[:2], cfg, Path(str(full) + ".part-0"), set())
    reference = {sample_key(s): s["completion"] for s in merge_samples(full)}
    resumed = tmp_path / "resumed.jsonl"
    part = Path(str(resumed) + ".part-0")
    lines = full.read_text().splitlines(keepends=True)
    part.write_text("".join(lines[:3]) + lines[3][:30])  # killed while writing the fourth line
    done = {sample_key(s) for s in read_samples(part, duplicates="first")}
    assert generate_samples(model, tokenizer, problems[:2], cfg, part, done)["samples"] == 3
    assert {sample_key(s): s["completion"] for s in merge_samples(resumed)} == reference


def test_resume_is_pinned_to_the_commit_the_revision_named(tiny_model, tmp_path):
    """A repository branch moves as training pushes checkpoints: a resumed run whose --revision (here main, the
    default) now names another commit is refused, naming both commits (before: it went on and the samples file
    mixed two checkpoints, silently); the old commit, named as --revision, resumes; results.json names the commit."""
    import shutil

    from codeparrot.humaneval.scoring import run
    from codeparrot.repository.local import LocalGitRepository

    repo = LocalGitRepository(tmp_path / "repo", create=True, use_lfs=False)
    first = repo.commit_folder(tiny_model, "main", "first checkpoint")
    samples = tmp_path / "s.jsonl"
    base = dict(problems=None, num_tasks=1, timeout=3.0, memory_mb=1024, completions=None, canonical=False,
                model=str(tmp_path / "repo"), revision=None, n_samples=2, batch_size=1, temperature=[0.8],
                top_p=0.95, max_new_tokens=2, seed=0, no_strip=False, samples_file=str(samples),
                output=str(tmp_path / "r.json"), k=[1], allow_code_execution=False, num_workers=1,
                execute_duplicates=False, no_progress=True, allow_missing_tasks=False)
    run(_config(**base))
    samples.write_text(samples.read_text().splitlines(keepends=True)[0])  # as if killed after one sample
    later = tmp_path / "later"
    shutil.copytree(tiny_model, later)
    (later / "step.txt").write_text("a later checkpoint\n")
    second = repo.commit_folder(later, "main", "second checkpoint")
    with pytest.raises(CodeParrotError, match=rf"commit: '{first}' there, '{second}' now"):
        run(_config(**base))
    run(_config(**{**base, "revision": first, "allow_code_execution": True}))
    results = json.loads((tmp_path / "r.json").read_text())
    assert results["config"]["commit"] == first and results["per_task"]["0.8"]["HumanEval/0"]["n"] == 2
    assert results["config"]["dtype"] == "float32"  # the weights as sampled (on a CPU: always float32)


def test_a_hub_model_is_pinned_to_its_commit_and_dtype(tiny_model, tmp_path, monkeypatch):
    """A Hub model's samples were recorded by the branch name only: which weights made a number was lost, and a
    resumed run went on from whatever the branch named by then. The samples' meta now records the commit the revision
    named (resolved before anything loads; here offline, from a Hub cache laid out as huggingface_hub writes it)
    and the dtype the weights were sampled in; a moved branch and another dtype are refused on resume, and the old
    commit, named as --revision, resumes."""
    import shutil

    from huggingface_hub import constants

    from codeparrot.humaneval.scoring import run

    from .test_provenance import COMMIT, fake_hub_cache

    cache = tmp_path / "hub"
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    fake_hub_cache(cache, "user/tiny", {p.name: p.read_bytes() for p in tiny_model.iterdir() if p.is_file()})
    samples, meta_file = tmp_path / "s.jsonl", tmp_path / "s.jsonl.meta.json"
    base = dict(problems=None, num_tasks=1, timeout=3.0, memory_mb=1024, completions=None, canonical=False,
                model="user/tiny", revision=None, n_samples=1, batch_size=1, temperature=[0.8], top_p=0.95,
                max_new_tokens=2, seed=0, no_strip=False, samples_file=str(samples), output=str(tmp_path / "r.json"),
                k=[1], allow_code_execution=False, num_workers=1, execute_duplicates=False, no_progress=True,
                allow_missing_tasks=False)
    run(_config(**base))
    meta = json.loads(meta_file.read_text())
    assert meta["commit"] == COMMIT and meta["dtype"] == "float32" and "revision" not in meta
    later = "c" * 40
    shutil.copytree(cache / "models--user--tiny" / "snapshots" / COMMIT, cache / "models--user--tiny" / "snapshots"
                    / later)
    (cache / "models--user--tiny" / "refs" / "main").write_text(later)  # the branch moved on
    with pytest.raises(CodeParrotError, match=rf"commit: '{COMMIT}' there, '{later}' now"):
        run(_config(**base))
    meta_file.write_text(json.dumps({**meta, "dtype": "bfloat16"}))  # as if sampled on a GPU
    with pytest.raises(CodeParrotError, match=r"made with the weights in bfloat16, now float32"):
        run(_config(**{**base, "revision": COMMIT}))
    meta_file.write_text(json.dumps(meta))
    run(_config(**{**base, "revision": COMMIT}))  # resumes: nothing left to sample
    assert len(read_samples(samples)) == 1
    # samples made before Hub commits were pinned recorded the revision as asked: they resume with it, and go on
    # pinned; another revision is refused as it was
    old = {k: v for k, v in meta.items() if k not in ("commit", "dtype")}
    meta_file.write_text(json.dumps({**old, "revision": None}))
    with pytest.raises(CodeParrotError, match=r"revision: None there, 'main' now"):
        run(_config(**{**base, "revision": "main"}))
    run(_config(**base))
    assert json.loads(meta_file.read_text())["commit"] == later and len(read_samples(samples)) == 1


def test_resume_with_other_settings_is_refused(tmp_path, tiny_model):
    from codeparrot.humaneval.scoring import run

    samples = tmp_path / "s.jsonl"
    samples.write_text("")
    (tmp_path / "s.jsonl.meta.json").write_text(json.dumps({"model": str(tiny_model), "top_p": 0.5}))
    options = _config(problems=None, num_tasks=2, timeout=3.0, memory_mb=1024, completions=None,
                      canonical=False, model=str(tiny_model), revision=None, n_samples=1, batch_size=1,
                      temperature=[0.2], top_p=0.95, max_new_tokens=8, seed=0, no_strip=False,
                      samples_file=str(samples), output=str(tmp_path / "r.json"), k=[1],
                      allow_code_execution=False, num_workers=1, execute_duplicates=False,
                      no_progress=True, allow_missing_tasks=False)
    with pytest.raises(CodeParrotError, match=r"top_p: 0.5 there, 0.95 now"):
        run(options)


def test_resume_names_each_differing_setting(tmp_path, problems):
    """The samples' meta records every setting the samples depend on; a rerun differing in any one is refused
    with a one-line error naming it, before any model is loaded. Samples without meta are refused too."""
    from codeparrot.humaneval.generation import SamplingConfig, _meta
    from codeparrot.humaneval.scoring import run

    samples = tmp_path / "s.jsonl"
    samples.write_text(json.dumps({"task_id": "HumanEval/0", "completion": "x", "temperature": 0.2}) + "\n")
    base = dict(problems=None, num_tasks=2, timeout=3.0, memory_mb=1024, completions=None, canonical=False,
                model="not-loaded/model", revision=None, n_samples=4, batch_size=2, temperature=[0.2], top_p=0.95,
                max_new_tokens=8, seed=0, no_strip=False, samples_file=str(samples), output=str(tmp_path / "r.json"),
                k=[1], allow_code_execution=False, num_workers=1, execute_duplicates=False, no_progress=True,
                allow_missing_tasks=False)
    with pytest.raises(CodeParrotError, match=r"holds samples but no s.jsonl.meta.json"):
        run(_config(**base))
    cfg = SamplingConfig(n_samples=4, batch_size=2, temperatures=[0.2], top_p=0.95, max_new_tokens=8, seed=0)
    assert _config(**base).sampling == cfg
    meta = _meta(_config(**base), problems[:2], world=1)
    (tmp_path / "s.jsonl.meta.json").write_text(json.dumps(meta))
    for flag, value, key in (("seed", 1, "seed"), ("n_samples", 5, "n_samples"), ("batch_size", 4, "batch_size"),
                             ("top_p", 0.9, "top_p"), ("max_new_tokens", 16, "max_new_tokens"),
                             ("no_strip", True, "strip_prompt"), ("num_tasks", 3, "prompts_sha256")):
        with pytest.raises(CodeParrotError, match=rf"other settings \({key}: [^;]*\);") as err:
            run(_config(**{**base, flag: value}))
        assert "\n" not in str(err.value)
        # names the real files: the samples and s.jsonl.meta.json (not a made-up "s.jsonl.meta")
        assert str(err.value).startswith(f"{samples} holds samples")
        assert f"recorded in {tmp_path / 's.jsonl.meta.json'};" in str(err.value)

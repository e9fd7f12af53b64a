"""Two CPU processes through `accelerate launch --multi_gpu` (gloo): disjoint data per rank, the same weights as
one process accumulating the same global batch, and a validation loss that counts every sequence once even
when the ranks' shards differ in length (the has-data protocol, no hang)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
import yaml

from codeparrot.config import to_dict
from codeparrot.errors import CodeParrotError
from codeparrot.tools.toy_run import build_toy_run, write_shards

from .in_process import train_here

pytestmark = pytest.mark.slow(50)  # 2-process launches: first in `make test`'s order


@pytest.fixture(scope="module")
def setup(tmp_path_factory, stdlib_texts):
    """A toy run with pretokenized train/valid data; seq_length chosen so the valid split has 4k + 1 sequences:
    rank 0 then holds 2k + 1 and rank 1 2k, one more batch of 2 (eval.micro_batch_size), so rank 1 forwards a
    dummy batch while rank 0 still has data. The valid split is the first 3 of the toy's 6 validation files
    (~6,800 tokens, ~200 sequences, not the ~900 of all 6): both runs below evaluate every sequence of it."""
    from codeparrot.tokenizer import load_tokenizer
    from codeparrot.training.datasets.pretokenize import pretokenize
    from codeparrot.training.datasets.pretokenized import read_index

    toy = build_toy_run(tmp_path_factory.mktemp("dist"), stdlib_texts[:60], vocab_size=400)
    tokenizer = load_tokenizer(str(toy.tokenizer_dir))
    train_tokens = toy.root / "tokens" / "train"
    valid_tokens = toy.root / "tokens" / "valid"
    pretokenize(str(toy.train_data), tokenizer, train_tokens, progress=False)
    valid_texts = write_shards(stdlib_texts[:3], toy.root / "data" / "valid-3")  # the toy's valid files 1-3
    pretokenize(str(valid_texts), tokenizer, valid_tokens, progress=False)
    n_valid = read_index(valid_tokens)["n_tokens"]
    seq_length = next(L for L in range(32, 128) if (n_valid // L) % 4 == 1)
    return toy, str(train_tokens), str(valid_tokens), seq_length, n_valid // seq_length


def _config(setup, tmp_path, name: str, **overrides):
    toy, train, valid, seq_length, _ = setup
    cfg = toy.config(run_name=name, max_steps=3, **{
        "output_dir": str(tmp_path / name), "data.train": train, "data.valid": valid, "data.seq_length": seq_length,
        "batch.micro_batch_size": 1, "eval.micro_batch_size": 2, "eval.max_eval_steps": -1, "logging.log_steps": 1,
        "checkpoint.push": False, **overrides})
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(to_dict(cfg)))
    return cfg, str(path)


def _weights(folder):
    from safetensors.torch import load_file

    return load_file(str(folder / "model.safetensors"))


def _evals(run_dir) -> list[dict]:
    return [e for e in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines()) if "val_loss" in e]


def test_ranks_read_disjoint_parts(setup):
    from codeparrot.tokenizer import load_tokenizer
    from codeparrot.training.run_data import build_datasets

    toy, train, valid, seq_length, _ = setup
    cfg = toy.config(**{"data.train": train, "data.valid": valid, "data.seq_length": seq_length})
    tokenizer = load_tokenizer(str(toy.tokenizer_dir))
    per_rank = [[tuple(x.tolist()) for x in build_datasets(cfg, tokenizer, rank, 2)[1]] for rank in (0, 1)]
    everything = [tuple(x.tolist()) for x in build_datasets(cfg, tokenizer, 0, 1)[1]]
    assert not set(per_rank[0]) & set(per_rank[1])
    assert sorted(per_rank[0] + per_rank[1]) == sorted(everything)
    # the case the evaluation protocol exists for: one rank has a batch (of eval.micro_batch_size 2) the other lacks
    assert [len(sequences) for sequences in per_rank] == [len(everything) // 2 + 1, len(everything) // 2]
    assert len(per_rank[0]) % 2 == 1


def test_two_processes_equal_one_process_accumulating(setup, tmp_path, repo_root, scripts_env, launch_port):
    _, _, _, seq_length, n_valid_sequences = setup
    env = {**scripts_env, "OMP_NUM_THREADS": "1", "ACCELERATE_USE_CPU": "1"}
    two_cfg, two_path = _config(setup, tmp_path, "two", **{"batch.gradient_accumulation_steps": 1})
    one_cfg, _ = _config(setup, tmp_path, "one", **{"batch.gradient_accumulation_steps": 2})
    launch = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
              "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
              "--main_process_port", str(launch_port()), str(repo_root / "scripts" / "train.py"), "--config", two_path]
    two = subprocess.Popen(launch, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    train_here(one_cfg)  # the one-process run here, while the launch runs: no third interpreter importing torch
    out, _ = two.communicate(timeout=300)
    assert two.returncode == 0, out
    assert "2 sequences/step = 1/process × 1 accumulation × 2 processes" in out, out

    two_dir, one_dir = two_cfg.run_dir(), one_cfg.run_dir()
    w2, w1 = _weights(two_dir / "final"), _weights(one_dir / "final")
    for key in w1:
        torch.testing.assert_close(w2[key], w1[key], rtol=1e-5, atol=1e-6)
    ckpt = two_dir / "checkpoints" / "step-3" / "training_state"
    assert (ckpt / "data_rank0.pt").is_file() and (ckpt / "data_rank1.pt").is_file()
    assert (ckpt / "random_states_0.pkl").is_file() and (ckpt / "random_states_1.pkl").is_file()

    # validation over shards of unequal length: every sequence exactly once, same loss as one process
    (e2,), (e1,) = _evals(two_dir), _evals(one_dir)
    assert e2["val_tokens"] == e1["val_tokens"] == n_valid_sequences * (seq_length - 1)
    assert e2["val_loss"] == pytest.approx(e1["val_loss"], rel=1e-5)
    train2 = [e for e in map(json.loads, (two_dir / "metrics.jsonl").read_text().splitlines()) if "loss" in e]
    assert [e["tokens_seen"] for e in train2] == [2 * seq_length * s for s in (1, 2, 3)]

    # a checkpoint written by 2 processes cannot be resumed by 1 (each rank had its own data position)
    with pytest.raises(CodeParrotError, match="written by 2 processes"):
        train_here(two_cfg, resume=str(two_dir / "checkpoints" / "step-3"))

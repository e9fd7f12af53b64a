"""FSDP2 on 2 CPU processes (gloo), launched the way users launch it:

    ACCELERATE_USE_CPU=1 accelerate launch --config_file configs/accelerate/fsdp.yaml --num_processes 2 ...

Accelerate alone runs plain data parallel there; codeparrot/training/sharding.py switches it to its FSDP2 path.
Checked: the parameters really are sharded (each process holds half; the checkpoint's model and optimizer are
stored as one shard per process), the losses and weights match one process accumulating the same global batch
(which tests/training/test_distributed.py shows is what 2-process data parallel computes; both with the fused
LM-head loss), `--resume auto` from a sharded checkpoint continues exactly, and the pushed branch holds a full
(unsharded) model that transformers loads. Also: a non-main rank's `error:` line lands in its
<run>/logs/rank-N.log.

The references run in this test process (`train()` on one process): a launch costs three interpreters that each
import torch and transformers, about 17 s of CPU on the 2-core test machine. The three launches that follow the
first (the resume, the bf16 run, the failing resume) run one after another in one case driver
(tests/script_cases.py): each is its own `accelerate launch` command line and starts its own 2 processes, but the
launcher's interpreter (its torch import, ~2.7 s of CPU) is paid once, not three times."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from codeparrot.config import to_dict
from codeparrot.tools.toy_run import build_toy_run

from ..script_cases import accelerate_launch_script, run_cases
from .in_process import train_here

pytestmark = pytest.mark.slow(150)  # 2-process FSDP and DDP launches: first in `make test`'s order

STEPS = 4  # checkpoints at 2 and 4
# The 1.5B preset's shape in miniature: gradient checkpointing and accumulation (FSDP skips the reduce-scatter on
# the first micro-step). Recomputing activations is the same arithmetic, so the reference without it gives the
# same losses.
FSDP = {"gradient_checkpointing": True}
# The same global batch of 4 sequences on one process: 4 micro-steps of the one stream hold what the two ranks'
# 2 micro-steps each hold (pretokenized data deals the sequences to the ranks in turn).
ONE_PROCESS = {"batch.gradient_accumulation_steps": 4}


def _write_config(toy, folder, name: str, **overrides) -> tuple[object, str]:
    cfg = toy.config(run_name=name, max_steps=STEPS, **{
        "output_dir": str(folder / name), "data.train": str(toy.root / "tokens" / "train"),
        "data.valid": str(toy.root / "tokens" / "valid"), "data.seq_length": 64, "batch.micro_batch_size": 1,
        "batch.gradient_accumulation_steps": 2,
        "logging.log_steps": 1, "checkpoint.save_steps": 2, "checkpoint.keep_last": 5, "checkpoint.push": False,
        "eval.max_eval_steps": 2, **overrides})
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(to_dict(cfg)))
    return cfg, str(path)


def _launch_argv(repo_root, config: str, *extra: str, port: int, precision: str = "no") -> list[str]:
    """`accelerate launch`'s arguments for a 2-process FSDP training with `config`."""
    return ["--config_file", str(repo_root / "configs" / "accelerate" / "fsdp.yaml"), "--num_processes", "2",
            "--mixed_precision", precision, "--main_process_port", str(port),
            str(repo_root / "scripts" / "train.py"), "--config", config, *extra]


def _launch(repo_root, env, config: str, *extra: str, port: int) -> subprocess.Popen:
    command = [sys.executable, "-m", "accelerate.commands.launch", *_launch_argv(repo_root, config, *extra, port=port)]
    return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _finish(process: subprocess.Popen) -> str:
    out, _ = process.communicate(timeout=300)
    assert process.returncode == 0, out
    return out


def _succeeded(done: subprocess.CompletedProcess) -> str:
    """The output of a launch the case driver ran, which must have succeeded."""
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    return out


def _losses(run_dir) -> dict[int, float]:
    entries = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {e["step"]: e["loss"] for e in entries if "loss" in e}


def _weights(folder):
    from safetensors.torch import load_file

    return load_file(str(folder / "model.safetensors"))


@pytest.fixture(scope="module")
def runs(tmp_path_factory, stdlib_texts, repo_root, launch_port):
    """The same 4-step training as FSDP (pushing to the run branch), launched, and as one process accumulating
    the same global batch, here, while the launch runs; so is the bf16 reference (`later`)."""
    import os

    from codeparrot.tokenizer import load_tokenizer
    from codeparrot.training.datasets.pretokenize import pretokenize

    root = tmp_path_factory.mktemp("fsdp")
    toy = build_toy_run(root, stdlib_texts[:60], vocab_size=400)
    tokenizer = load_tokenizer(str(toy.tokenizer_dir))
    for split, data in (("train", toy.train_data), ("valid", toy.valid_data)):
        pretokenize(str(data), tokenizer, root / "tokens" / split, progress=False)
    env = {**os.environ, "PYTHONPATH": str(repo_root), "OMP_NUM_THREADS": "1", "ACCELERATE_USE_CPU": "1"}
    fsdp_cfg, fsdp_path = _write_config(toy, root, "fsdp", **FSDP, **{"checkpoint.push": True})
    one_cfg, _ = _write_config(toy, root, "one", **ONE_PROCESS)
    one_bf16_cfg, _ = _write_config(toy, root, "one-bf16", mixed_precision="bf16", **ONE_PROCESS)
    fsdp = _launch(repo_root, env, fsdp_path, port=launch_port())
    train_here(one_cfg)
    train_here(one_bf16_cfg)
    return {"toy": toy, "root": root, "env": env, "fsdp": (fsdp_cfg, _finish(fsdp)), "one": one_cfg,
            "one-bf16": one_bf16_cfg}


def _fresh_run_holding_step_2(runs, folder: Path):
    """The FSDP run's config in a fresh run folder (same run name, no push) that holds only its step-2 checkpoint;
    (config, its YAML path, the checkpoint there)."""
    fsdp_cfg, _ = runs["fsdp"]
    folder.mkdir()
    cfg, path = _write_config(runs["toy"], folder, "fsdp", **FSDP)
    checkpoint = cfg.run_dir() / "checkpoints" / "step-2"
    shutil.copytree(fsdp_cfg.run_dir() / "checkpoints" / "step-2", checkpoint)
    return cfg, path, checkpoint


@pytest.fixture(scope="module")
def later(runs, tmp_path_factory, repo_root, launch_port):
    """The launches that start once `runs`' launch has finished, each its own `accelerate launch` command line, run
    in this order by one case driver: "resume" (a fresh run folder holding only the sharded step-2 checkpoint,
    `--resume auto`), "bf16" (the 4-step training in bf16, fresh) and "rank1-fails" (like "resume", but rank 1's
    saved data position is not a loader state: it alone fails, last, so that no launch follows a failed one).
    `{name: (config, CompletedProcess)}`."""
    from codeparrot.training.checkpointing import write_manifest

    root = tmp_path_factory.mktemp("fsdp-later")
    resume_cfg, resume_path, _ = _fresh_run_holding_step_2(runs, root / "resume")
    bf16_cfg, bf16_path = _write_config(runs["toy"], root, "fsdp-bf16")
    failing_cfg, failing_path, checkpoint = _fresh_run_holding_step_2(runs, root / "rank1-fails")
    torch.save(["not", "a", "loader", "state"], checkpoint / "training_state" / "data_rank1.pt")
    (checkpoint / "manifest.json").unlink()
    write_manifest(checkpoint)  # consistent on disk: only rank 1's content is wrong
    launches = {"resume": (resume_cfg, _launch_argv(repo_root, resume_path, "--resume", "auto", port=launch_port())),
                "bf16": (bf16_cfg, _launch_argv(repo_root, bf16_path, precision="bf16", port=launch_port())),
                "rank1-fails": (failing_cfg, _launch_argv(repo_root, failing_path, "--resume", "auto",
                                                          port=launch_port()))}
    shim = accelerate_launch_script(root)
    done = run_cases(sys.executable, runs["env"], [(shim, argv) for _, argv in launches.values()], timeout=900)
    return {name: (cfg, result) for (name, (cfg, _)), result in zip(launches.items(), done)}


def test_fsdp_shards_and_matches_one_process(runs):
    from torch.distributed.checkpoint import FileSystemReader

    (fsdp_cfg, out), one_cfg = runs["fsdp"], runs["one"]
    assert "FSDP2 over 2 process(es), gloo backend: each holds 50.0% of the parameters" in out, out
    assert "loss: fused LM head + cross-entropy" in out
    assert "4 sequences/step = 1/process × 2 accumulation × 2 processes" in out, out

    fsdp_losses, ddp_losses = _losses(fsdp_cfg.run_dir()), _losses(one_cfg.run_dir())
    assert sorted(fsdp_losses) == list(range(1, STEPS + 1))
    for step, loss in ddp_losses.items():
        assert fsdp_losses[step] == pytest.approx(loss, rel=1e-5), step
    w_fsdp, w_ddp = _weights(fsdp_cfg.run_dir() / "final"), _weights(one_cfg.run_dir() / "final")
    assert w_fsdp.keys() == w_ddp.keys()
    for key in w_ddp:
        torch.testing.assert_close(w_fsdp[key], w_ddp[key], rtol=1e-4, atol=1e-5)

    # the checkpoint stores model and optimizer sharded: each process wrote its half of the embedding rows
    state = fsdp_cfg.run_dir() / "checkpoints" / "step-2" / "training_state"
    for folder in ("pytorch_model_fsdp_0", "optimizer_0"):
        assert sorted(p.name for p in (state / folder).glob("*.distcp")) == ["__0_0.distcp", "__1_0.distcp"]
    metadata = FileSystemReader(str(state / "pytorch_model_fsdp_0")).read_metadata().state_dict_metadata
    wte = next(v for k, v in metadata.items() if k.endswith("wte.weight"))
    assert list(wte.size) == [400, 64]
    assert sorted(tuple(chunk.sizes) for chunk in wte.chunks) == [(200, 64), (200, 64)]


def test_fsdp_resume_auto_continues_exactly(runs, later):
    """A fresh run folder holding only the sharded step-2 checkpoint resumes to step 4 with the losses and the
    final weights of the uninterrupted run."""
    fsdp_cfg, _ = runs["fsdp"]
    cfg, done = later["resume"]
    out = _succeeded(done)
    assert "resumed from" in out and "step 2" in out, out
    resumed, uninterrupted = _losses(cfg.run_dir()), _losses(fsdp_cfg.run_dir())
    assert sorted(resumed) == [3, 4]
    assert [resumed[s] for s in (3, 4)] == [uninterrupted[s] for s in (3, 4)]
    w_resumed, w_full = _weights(cfg.run_dir() / "final"), _weights(fsdp_cfg.run_dir() / "final")
    for key in w_full:
        assert torch.equal(w_resumed[key], w_full[key]), key


def test_fsdp_push_is_a_full_model(runs):
    from transformers import AutoModelForCausalLM

    from codeparrot.repository.refs import resolve_model_dir

    fsdp_cfg, _ = runs["fsdp"]
    folder = resolve_model_dir(str(runs["toy"].repo), "fsdp")  # the run branch of the local repository
    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32)
    final = _weights(fsdp_cfg.run_dir() / "final")
    state = model.state_dict()
    assert tuple(state["transformer.wte.weight"].shape) == (400, 64)
    for key, value in final.items():
        assert torch.equal(state[key], value), key


def test_non_main_rank_error_goes_to_its_rank_log(later):
    """Rank 1 alone fails (its saved data position is not a loader state): the `error:` line, printed by the
    main process only, is in logs/rank-1.log."""
    cfg, done = later["rank1-fails"]
    out = done.stdout + done.stderr
    assert done.returncode != 0, out
    rank1 = (cfg.run_dir() / "logs" / "rank-1.log").read_text()
    assert "ERROR codeparrot: error: data loader state is a list, not a dict" in rank1, rank1
    assert "data loader state is a list" not in (cfg.run_dir() / "logs" / "rank-0.log").read_text()


def test_fsdp_bf16_reduces_gradients_in_fp32_and_matches_one_process(runs, later):
    """bf16 compute: FSDP reduce-scatters the gradients in fp32 (read from the sharded modules' own policy;
    Accelerate's default would reduce in bf16), matching one process that accumulates the global batch in fp32.
    The losses agree to ~1e-4, not to the fp32 runs' 1e-5: FSDP computes with bf16 copies of every parameter
    (LayerNorm gains and embeddings included) where autocast keeps those in fp32, a difference already in step
    1's loss, before any reduction (measured against 2-process DDP: step 1 5.974811 vs 5.974766, step 4 5.753747
    vs 5.753317)."""
    cfg, done = later["bf16"]
    out = _succeeded(done)
    assert "each holds 50.0% of the parameters (DTensor shards); gradients reduced in float32" in out, out
    fsdp_losses, one_losses = _losses(cfg.run_dir()), _losses(runs["one-bf16"].run_dir())
    assert sorted(fsdp_losses) == sorted(one_losses) == list(range(1, STEPS + 1))
    for step, loss in one_losses.items():
        assert fsdp_losses[step] == pytest.approx(loss, rel=2e-4), step

"""The training loop on a tiny GPT-2 (2 layers, 64 wide, 512-token BPE) trained on real stdlib code, in-process.

Kill-and-resume is in test_resume.py, the 2-process run in test_distributed.py."""

from __future__ import annotations

import json
import math
import re
import subprocess
import warnings

import pytest
import torch

from codeparrot.errors import CodeParrotError
from codeparrot.tools.toy_run import build_toy_run
from codeparrot.training.checkpointing import list_checkpoints, resolve_resume
from codeparrot.training.optim import lr_factor

from .in_process import train_here


@pytest.fixture(scope="module")
def toy(tmp_path_factory, stdlib_texts):
    return build_toy_run(tmp_path_factory.mktemp("toy"), stdlib_texts[:80], vocab_size=512)


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny matmuls gain nothing from a second thread, and on a shared 2-core machine OpenMP threads that spin
    while another process holds the other core make each step several times slower."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _weights(folder) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(folder / "model.safetensors"))


def _metrics(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("chunk_rows", [7, 64, 1000])
def test_fused_linear_cross_entropy_matches_the_reference(chunk_rows):
    """Loss and both gradients equal F.cross_entropy(h @ Wᵀ) (chunks that do not divide the rows, ignored rows)."""
    from codeparrot.training.loss import IGNORE_INDEX, linear_cross_entropy_sum

    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(50, 16, generator=g, requires_grad=True)
    weight = torch.randn(300, 16, generator=g, requires_grad=True)
    targets = torch.randint(0, 300, (50,), generator=g)
    targets[[3, 17, 49]] = IGNORE_INDEX
    loss_sum, count = linear_cross_entropy_sum(hidden, weight, targets, chunk_rows)
    (loss_sum / count * 0.7).backward()
    ref_h, ref_w = hidden.detach().clone().requires_grad_(), weight.detach().clone().requires_grad_()
    ref = torch.nn.functional.cross_entropy(ref_h @ ref_w.t(), targets, ignore_index=IGNORE_INDEX)
    (ref * 0.7).backward()
    assert count.item() == 47
    torch.testing.assert_close(loss_sum / count, ref)
    torch.testing.assert_close(hidden.grad, ref_h.grad)
    torch.testing.assert_close(weight.grad, ref_w.grad)
    with torch.no_grad():  # evaluation: loss only
        torch.testing.assert_close(linear_cross_entropy_sum(hidden, weight, targets, chunk_rows)[0], loss_sum.detach())


def test_fused_loss_through_the_model_matches_hugging_face(toy):
    """On the real GPT-2 (tied LM head): the same loss and the same gradient for every parameter."""
    from codeparrot.repository.model import load_pretrained_model
    from codeparrot.training.loss import causal_lm_loss

    model = load_pretrained_model(str(toy.repo), revision="main")
    model.loss_type = "ForCausalLM"
    batch = torch.randint(0, toy.vocab_size, (3, 40), generator=torch.Generator().manual_seed(1))
    ref = model(input_ids=batch, labels=batch).loss
    ref.backward()
    ref_grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    loss_sum, count = causal_lm_loss(model, model.lm_head.weight, batch, chunk_rows=32)
    (loss_sum / count).backward()
    assert count.item() == 3 * 39
    torch.testing.assert_close(loss_sum / count, ref)
    for name, param in model.named_parameters():
        torch.testing.assert_close(param.grad, ref_grads[name], rtol=1e-4, atol=1e-6, msg=name)
    with torch.autocast("cpu", dtype=torch.bfloat16):  # mixed precision: close to the fp32 loss
        bf16_sum, _ = causal_lm_loss(model, model.lm_head.weight, batch)
    assert (bf16_sum / count).item() == pytest.approx(ref.item(), rel=2e-2)


def test_single_batch_overfit(toy, fresh_accelerate_state):
    """One fixed batch, repeated: the loss starts near ln(vocab) (a fresh GPT-2 predicts ~uniformly) and the
    optimizer (our param groups and schedule, Accelerate's backward) drives it to ~0."""
    from accelerate import Accelerator

    from codeparrot.repository.model import load_pretrained_model
    from codeparrot.tokenizer import load_tokenizer
    from codeparrot.training.config import OptimConfig, ScheduleConfig
    from codeparrot.training.datasets.loader import build_dataloader, build_dataset
    from codeparrot.training.optim import build_optimizer, build_scheduler

    tokenizer = load_tokenizer(str(toy.tokenizer_dir))
    batch = next(iter(build_dataloader(build_dataset(str(toy.train_data), tokenizer, 32, shuffle=False), 4)))
    accelerator = Accelerator(cpu=True)
    model = load_pretrained_model(str(toy.repo), revision="main")
    model.loss_type = "ForCausalLM"
    optimizer = build_optimizer(model, OptimConfig(lr=3e-3, weight_decay=0.0), accelerator.device)
    scheduler = build_scheduler(optimizer, 200, ScheduleConfig(name="constant", warmup_steps=5))
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    losses = []
    for _ in range(120):
        loss = model(input_ids=batch, labels=batch).loss
        accelerator.backward(loss)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    assert losses[0] == pytest.approx(math.log(toy.vocab_size), abs=0.3)
    assert losses[-1] < 0.05, losses[::10]


@pytest.fixture(scope="module")
def full_run(toy):
    """12 steps with everything on: logging, eval on the whole valid split, checkpoints (keep 2), pushes,
    TensorBoard + W&B (offline), a profiled window."""
    cfg = toy.config(run_name="full", max_steps=12, **{
        "output_dir": str(toy.root / "runs" / "full"), "logging.log_steps": 3, "logging.trackers": ["tensorboard", "wandb"],
        "checkpoint.save_steps": 4, "checkpoint.keep_last": 2, "eval.eval_steps": 6, "eval.max_eval_steps": -1})
    result = train_here(cfg, profile_steps=(2, 3))
    return cfg, result


def test_metrics_log(full_run):
    cfg, result = full_run
    entries = _metrics(result.run_dir)
    train = [e for e in entries if "loss" in e]
    evals = [e for e in entries if "val_loss" in e]
    assert [e["step"] for e in train] == [3, 6, 9, 12] and [e["step"] for e in evals] == [6, 12]
    for e in train:
        assert set(e) >= {"step", "tokens_seen", "loss", "lr", "grad_norm", "tokens_per_s", "mfu", "ms_per_step"}
        assert e["tokens_seen"] == e["step"] * 4 * 64  # 4 sequences of 64 tokens per step
        # the lr logged is the one the step used: peak × factor(step index)
        assert e["lr"] == pytest.approx(cfg.optim.lr * lr_factor(e["step"] - 1, cfg.max_steps, cfg.schedule))
        assert e["tokens_per_s"] > 0 and 0 < e["mfu"] < 1 and e["grad_norm"] > 0
    assert train[-1]["loss"] < train[0]["loss"] < math.log(512) + 0.3
    for e in evals:
        assert e["perplexity"] == pytest.approx(math.exp(e["val_loss"]))
    assert evals[-1]["val_loss"] < evals[0]["val_loss"]
    assert result.step == 12 and result.tokens_seen == 12 * 4 * 64


def test_the_warm_up_window_is_marked_and_left_out_of_the_run_summary(full_run):
    """The first log window holds the loader start-up (and, compiled, the compile): flagged in metrics.jsonl and
    excluded from the run's summary, which is the median over the other windows, MFU convention named."""
    import statistics

    from codeparrot.training.reporting import console_line

    _, result = full_run
    train = [e for e in _metrics(result.run_dir) if "loss" in e]
    assert [e["warmup"] for e in train] == [True, False, False, False]
    summary = json.loads((result.run_dir / "throughput.json").read_text())
    assert summary["windows"] == 3 and summary["warmup_windows_excluded"] == 1
    assert summary["median_tokens_per_s"] == statistics.median(e["tokens_per_s"] for e in train[1:])
    assert summary["median_mfu"] == statistics.median(e["mfu"] for e in train[1:])
    assert "6N + 12LHQT" in summary["mfu_convention"] and "PaLM" in summary["mfu_convention"]
    assert console_line(train[0], 12).endswith("| warm-up") and not console_line(train[1], 12).endswith("warm-up")


def test_a_run_with_only_the_warm_up_window_says_so(tmp_path):
    from codeparrot.training.reporting import ThroughputWindows

    windows = ThroughputWindows()
    windows.add({"tokens_per_s": 1000.0, "mfu": 0.5, "memory_gib": 1.0})
    line = windows.write(tmp_path, None, "unknown")
    assert line.startswith("throughput: n/a, only the warm-up window was logged")
    assert json.loads((tmp_path / "throughput.json").read_text())["median_tokens_per_s"] is None


def test_eval_is_token_weighted_over_the_whole_split(full_run, toy):
    """The final validation loss equals a plain recomputation over every validation sequence."""
    from transformers import GPT2LMHeadModel

    from codeparrot.tokenizer import load_tokenizer
    from codeparrot.training.datasets.loader import build_dataset

    _, result = full_run
    tokenizer = load_tokenizer(str(toy.tokenizer_dir))
    sequences = torch.stack(list(build_dataset(str(toy.valid_data), tokenizer, 64, shuffle=False)))  # [N, 64]
    model = GPT2LMHeadModel.from_pretrained(str(result.run_dir / "final")).eval()
    with torch.no_grad():
        logits = model(input_ids=sequences).logits
    losses = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.size(-1)), sequences[:, 1:].reshape(-1))
    assert result.final_eval.tokens == sequences.shape[0] * 63
    assert result.final_eval.loss == pytest.approx(losses.item(), rel=1e-5)


def test_checkpoints_keep_last_k_and_load(full_run):
    _, result = full_run
    found = list_checkpoints(result.run_dir)
    assert [step for step, _ in found] == [8, 12]  # step-4 pruned
    last = found[-1][1]
    state = json.loads((last / "trainer_state.json").read_text())
    assert state["step"] == 12 and state["tokens_seen"] == 12 * 256 and state["world_size"] == 1
    assert {"optimizer.bin", "scheduler.bin", "random_states_0.pkl", "data_rank0.pt"} <= {
        p.name for p in (last / "training_state").iterdir()}
    assert not (last / "training_state" / "model.safetensors").exists()  # the weights are stored once
    final = _weights(result.run_dir / "final")
    assert all(torch.equal(final[k], v) for k, v in _weights(last).items())
    assert resolve_resume("auto", result.run_dir) == last
    assert not list(result.run_dir.joinpath("checkpoints").glob(".*partial"))


def test_checkpoints_are_pushed_to_the_run_branch(full_run, toy):
    from codeparrot.repository.refs import open_repository

    cfg, result = full_run
    assert result.push_errors == []
    repo = open_repository(str(toy.repo))
    assert [c.message for c in repo.list_commits(cfg.run_name)][:3] == ["step 12", "step 8", "step 4"]
    folder = repo.download(cfg.run_name, toy.root / "downloaded")
    files = {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "train_config.yaml"} <= files
    assert not any(f.startswith("training_state") for f in files)  # no optimizer state by default
    pushed = _weights(folder)
    assert all(torch.equal(pushed[k], v) for k, v in _weights(result.run_dir / "final").items())


def test_pushed_checkpoints_carry_their_validation_loss(full_run, toy):
    """Each "step N" commit of a real run carries metrics.json: the run's latest eval at or before N (read from
    <run>/metrics.jsonl while checkpoints live in <run>/checkpoints/step-N), which `checkpoints.py plot` and
    `promote` rely on."""
    from codeparrot.repository.metrics import read_pushed_metrics
    from codeparrot.repository.refs import open_repository

    cfg, result = full_run
    evals = {e["step"]: e["val_loss"] for e in _metrics(result.run_dir) if "val_loss" in e}  # steps 6 and 12
    repo = open_repository(str(toy.repo))
    pushed = {c.step: read_pushed_metrics(repo, c.commit_id) for c in repo.list_commits(cfg.run_name) if c.step}
    assert pushed[4] is None  # no evaluation yet at step 4
    assert pushed[8]["step"] == 6 and pushed[8]["val_loss"] == pytest.approx(evals[6])
    assert pushed[12]["step"] == 12 and pushed[12]["val_loss"] == pytest.approx(evals[12])
    assert pushed[12]["val_seq_length"] == 64 and pushed[12]["val_sequences"] > 0


def test_trackers_and_profile_written(full_run):
    _, result = full_run
    assert list((result.run_dir / "tensorboard").rglob("events.out.tfevents.*"))
    assert list((result.run_dir / "tensorboard" / "profile").glob("*.pt.trace.json*"))
    assert list((result.run_dir / "wandb").glob("offline-run-*"))


def test_gradient_accumulation_is_equivalent(toy):
    """4 sequences per step as 1 × 4, 2 × 2 and 4 × 1 micro-batches, with activation checkpointing, and with
    the Hugging Face loss instead of the fused one: the same weights (fp32 tolerance)."""
    weights = []
    variants = ((4, 1, {}), (2, 2, {}), (1, 4, {}), (4, 1, {"gradient_checkpointing": True}),
                (2, 2, {"fused_loss": False}))  # the last: Hugging Face's own loss instead of the fused one
    for micro, accum, extra in variants:
        name = f"acc{micro}x{accum}{'-' + next(iter(extra)) if extra else ''}"
        cfg = toy.config(run_name=name, max_steps=3, **{
            "output_dir": str(toy.root / "runs" / name), "data.valid": "", "checkpoint.push": False,
            "batch.micro_batch_size": micro, "batch.gradient_accumulation_steps": accum, "logging.log_steps": 3,
            **extra})
        result = train_here(cfg)
        weights.append(_weights(result.last_checkpoint))
    # fp32 summation order differs between the variants; AdamW turns that into differences far below one
    # step's size (lr 1e-3): 1e-5 absolute is 1% of a step
    for other in weights[1:]:
        for key, value in weights[0].items():
            torch.testing.assert_close(other[key], value, rtol=1e-4, atol=1e-5)
    from codeparrot.repository.refs import resolve_model_dir

    initial = _weights(resolve_model_dir(str(toy.repo), "main"))
    assert not torch.allclose(initial["transformer.h.0.mlp.c_fc.weight"], weights[0]["transformer.h.0.mlp.c_fc.weight"])


def test_steps_between_log_lines_read_nothing_on_the_host(toy):
    """A run of 8 steps reads exactly as many values on the host as a run of 4 (set-up, the one log line, the
    summary): the steps themselves (micro-steps with accumulation, clipping, the non-finite guard, fused AdamW as
    on CUDA, the schedule) read none. On a GPU each read is a sync that empties the queue the CPU keeps ahead of
    the GPU; this holds the loop to none between log steps."""
    from ..host_reads import HostReads

    counts = []
    for steps in (4, 8):
        cfg = toy.config(run_name=f"reads{steps}", max_steps=steps, **{
            "output_dir": str(toy.root / "runs" / f"reads{steps}"), "data.valid": "", "checkpoint.push": False,
            "checkpoint.save_steps": 0, "batch.micro_batch_size": 2, "batch.gradient_accumulation_steps": 2,
            "logging.log_steps": steps, "optim.fused": True})
        with HostReads() as reads:
            train_here(cfg)
        counts.append(reads.count)
    assert counts[0] == counts[1] > 0


def test_inspect_batches_shows_real_text_with_boundaries(toy, capsys, stdlib_texts, tmp_path):
    from codeparrot.tools.toy_run import write_shards

    snippets = [text[:120] for text in stdlib_texts[:80]]  # short files: several boundaries per 64-token row
    data = write_shards(snippets, tmp_path / "short")
    cfg = toy.config(run_name="inspect", **{"output_dir": str(toy.root / "runs" / "inspect"), "data.train": str(data)})
    assert train_here(cfg, inspect_batches=2) is None
    out = capsys.readouterr().out
    assert out.count("batch 0 row") == 4 and out.count("batch 1 row") == 4 and "batch 2 row" not in out
    marker = "─" * 20 + " <|endoftext|> " + "─" * 20
    assert out.count(marker) >= 4  # file boundaries are visible
    # every decoded piece between boundaries is real source text (rows start/end mid-file)
    corpus = "\n".join(snippets)
    pieces = [p for block in out.split("=" * 30) if "tokens," not in block for p in block.split(marker)]
    pieces = [p.strip("\n") for p in pieces if len(p.strip()) > 10]
    assert len(pieces) >= 8 and all(p in corpus for p in pieces), pieces
    assert not (toy.root / "runs" / "inspect" / "checkpoints").exists()  # nothing trained


def test_bad_inputs_fail_before_any_compute(toy, tmp_path, stdlib_texts):
    from codeparrot.tokenizer import save_tokenizer, train_tokenizer

    other_tok = save_tokenizer(train_tokenizer(stdlib_texts[:20], vocab_size=300, show_progress=False), tmp_path / "tok300")
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "file-000000000001.json").write_text("")
    not_ckpt = tmp_path / "not-a-checkpoint"
    not_ckpt.mkdir()
    cases = [
        ({"data.tokenizer": str(other_tok)}, {}, "vocabulary mismatch"),
        ({"data.seq_length": 256}, {}, "larger than the model's context (n_positions 128)"),
        ({"data.train": str(empty)}, {}, "no records"),
        ({"data.train": str(tmp_path / "missing")}, {}, "does not exist"),
        ({}, {"resume": str(not_ckpt)}, "is not a training checkpoint"),
        ({"model": str(tmp_path / "no-repo")}, {}, "not found"),
    ]
    for overrides, kwargs, message in cases:
        run_dir = tmp_path / "run"
        cfg = toy.config(run_name="bad", **{"output_dir": str(run_dir), **overrides})
        with pytest.raises(CodeParrotError, match=re.escape(message)):
            train_here(cfg, **kwargs)
        assert not run_dir.exists(), overrides  # failed before creating anything


def test_cli_errors_are_one_line(toy, tmp_path, python, repo_root, scripts_env):
    config = tmp_path / "c.yaml"
    config.write_text(f"model: {toy.repo}\nbatch:\n  micro_batch_size: 3\n  global_batch_size: 8\n")
    proc = subprocess.run([python, str(repo_root / "scripts" / "train.py"), "--config", str(config)],
                          capture_output=True, text=True, env=scripts_env, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"error: {config}: batch.global_batch_size 8 does not divide into micro_batch_size 3 × 1 processes = 3 "
        "sequences per micro-step (remainder 2)"]
    proc = subprocess.run([python, str(repo_root / "scripts" / "train.py"), "--help"], capture_output=True, text=True,
                          env=scripts_env, timeout=120)
    assert proc.returncode == 0 and "--resume" in proc.stdout and "--optim.lr" in proc.stdout
    assert "--inspect-batches" in proc.stdout and "--profile-steps" in proc.stdout


def test_a_failing_tracker_only_warns(toy, monkeypatch):
    from accelerate.tracking import TensorBoardTracker

    def broken(self):
        raise RuntimeError("no space left for event files")

    monkeypatch.setattr(TensorBoardTracker, "start", broken)
    cfg = toy.config(run_name="tracker", max_steps=2, **{
        "output_dir": str(toy.root / "runs" / "tracker"), "logging.trackers": ["tensorboard"], "data.valid": "",
        "checkpoint.push": False, "logging.log_steps": 1})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = train_here(cfg)
    assert result.step == 2
    assert any("tracker tensorboard could not start" in str(w.message) for w in caught)


def test_pushes_to_a_folder_that_is_no_repository_are_refused_before_training(toy):
    """They used to fail at the first checkpoint, after that much training, as warnings and retries."""
    from codeparrot.repository.refs import resolve_model_dir

    plain = resolve_model_dir(str(toy.repo), "main")  # the model's files, in a folder that is not a repository
    run_dir = toy.root / "runs" / "plain"
    cfg = toy.config(run_name="plain", model=str(plain), revision=None, max_steps=2,
                     **{"output_dir": str(run_dir), "data.valid": "", "checkpoint.push": True})
    with pytest.raises(CodeParrotError, match=r"checkpoints cannot be pushed to .*: .*not a git repository; train "
                                              r"from a checkpoint repository, or without pushing "
                                              r"\(--checkpoint\.push false\)$"):
        train_here(cfg)
    assert not run_dir.exists()  # refused before anything was written


def test_a_failed_run_finishes_its_queued_pushes_before_it_reports(toy, monkeypatch):
    """The pusher's thread is a daemon: without waiting, the error's exit would drop the checkpoint queued last.
    Here its push is slow and the run fails right after it; the branch still gets it."""
    import time

    from codeparrot.repository.pusher import CheckpointPusher
    from codeparrot.repository.refs import open_repository
    from codeparrot.training import train as train_module

    push = CheckpointPusher._push_with_retries

    def slow_push(self, staged, message):
        time.sleep(2)
        push(self, staged, message)

    def broken_eval(*args, **kwargs):
        raise RuntimeError("evaluation crashed")

    monkeypatch.setattr(CheckpointPusher, "_push_with_retries", slow_push)
    monkeypatch.setattr(train_module, "run_eval", broken_eval)  # runs after the step-2 checkpoint was queued
    cfg = toy.config(run_name="failed-push", max_steps=4, **{
        "output_dir": str(toy.root / "runs" / "failed-push"), "checkpoint.save_steps": 2, "checkpoint.push": True,
        "eval.eval_steps": 3, "logging.log_steps": 2})
    with pytest.raises(RuntimeError, match="evaluation crashed"):
        train_here(cfg)
    steps = [c.step for c in open_repository(str(toy.repo)).list_commits("failed-push") if c.step]
    assert steps == [2]


def test_interrupted_save_never_breaks_latest(toy, monkeypatch):
    """A save that dies half-way (here: the data position cannot be written) leaves the previous checkpoints
    and `--resume auto` untouched; the next save clears the leftover."""
    from codeparrot.training import checkpointing

    run_dir = toy.root / "runs" / "atomic"
    base = dict(run_name="atomic", **{"output_dir": str(run_dir), "data.valid": "", "checkpoint.push": False,
                                      "checkpoint.save_steps": 2, "logging.log_steps": 2})
    train_here(toy.config(max_steps=2, **base))

    def disk_full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(checkpointing.torch, "save", disk_full)
    with pytest.raises(OSError):
        train_here(toy.config(max_steps=4, **base), resume="auto")
    assert [s for s, _ in list_checkpoints(run_dir)] == [2]
    assert resolve_resume("auto", run_dir).name == "step-2"
    assert (run_dir / "checkpoints" / ".step-4.partial").is_dir()  # the torn save, ignored
    monkeypatch.undo()
    result = train_here(toy.config(max_steps=4, **base), resume="auto")
    assert [s for s, _ in list_checkpoints(run_dir)] == [2, 4] and result.step == 4
    assert not (run_dir / "checkpoints" / ".step-4.partial").exists()


def test_validation_loss_of_a_pushed_checkpoint(full_run, toy, tmp_path, python, repo_root, scripts_env):
    """scripts/validation_loss.py on the run's branch reproduces the run's final evaluation (the multi-process
    path is the same `evaluate`, exercised with 2 processes in test_distributed.py)."""
    cfg, result = full_run
    output = tmp_path / "validation.json"
    proc = subprocess.run([python, str(repo_root / "scripts" / "validation_loss.py"), "--model", str(toy.repo),
                           "--revision", cfg.run_name, "--dataset", str(toy.valid_data), "--seq-length", "64",
                           "--batch-size", "3", "--output", str(output)],
                          capture_output=True, text=True, env={**scripts_env, "OMP_NUM_THREADS": "1"}, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = json.loads(output.read_text())
    assert summary["tokens"] == result.final_eval.tokens and summary["processes"] == 1
    assert summary["loss"] == pytest.approx(result.final_eval.loss, rel=1e-5)
    assert summary["perplexity"] == pytest.approx(math.exp(summary["loss"]))
    assert f"validation loss {summary['loss']:.4f}" in proc.stdout

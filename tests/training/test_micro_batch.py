"""`batch.micro_batch_size: auto` (training/micro_batch.py): what it may choose, the search under a simulated memory
budget, the real-step probe catching an out-of-memory error on a real model, the data each optimizer step sees,
two processes agreeing, and in-process training runs: auto and an explicit value give identical losses, and a
resumed auto run reuses the recorded value without measuring again."""

from __future__ import annotations

import contextlib
import json
import math
import multiprocessing
import os
import re
import socket
import weakref
from types import SimpleNamespace

import pytest
import torch
import yaml

from codeparrot.config import load_config
from codeparrot.errors import CodeParrotError
from codeparrot.tools.toy_run import build_toy_run
from codeparrot.training import micro_batch
from codeparrot.training.config import TrainConfig
from codeparrot.training.micro_batch import MemoryTest, StepProbe, Trial, largest_that_fits

from .in_process import train_here


def _auto(*extra: str) -> TrainConfig:
    return load_config(TrainConfig, None, ["--batch.micro_batch_size", "auto", "--batch.global_batch_size", "192",
                                           "--data.num_workers", "2", *extra])


# ---- what auto may choose ----
def test_auto_parses_from_yaml_and_cli_and_integers_stay_integers(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("batch:\n  micro_batch_size: auto\n  global_batch_size: 192\n  num_processes: 16\n"
                    "data:\n  num_workers: 2\n")
    assert load_config(TrainConfig, path).batch.micro_batch_size == "auto"
    assert _auto().batch.micro_batch_size == "auto"
    explicit = load_config(TrainConfig, path, ["--batch.micro_batch_size", "12"])
    assert explicit.batch.micro_batch_size == 12 and explicit.accumulation_steps(16) == 1


def test_candidates_split_each_process_batch_into_rounds_of_every_worker(repo_root):
    cfg = _auto()
    assert cfg.auto_candidates(1) == [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 96]  # 192 / 2 workers = 96 per worker
    assert cfg.auto_candidates(16) == [1, 2, 3, 6]  # 12 per process: 6 per worker (12 × 1 would alternate workers)
    assert _auto("--data.num_workers", "0").auto_candidates(1)[-1] == 192  # one reader: any divisor
    assert all(192 // n % 2 == 0 for n in cfg.auto_candidates(1))  # the accumulation is a multiple of the workers
    assert cfg.sequences_per_step(1) == 192 and cfg.tokens_per_step(4) == 192 * 1024
    assert "192 sequences/step = auto/process × derived accumulation × 1 process" in cfg.budget_summary(1)
    assert micro_batch.provisional_accumulation(cfg, 1) == 2 and micro_batch.inspect_batch_size(cfg, 1) == 8
    assert cfg.accumulation_steps(1) is None  # derived once the run has measured the micro-batch
    for name in ("codeparrot-small", "codeparrot"):  # the GPU presets: auto, the global batch unchanged
        preset = load_config(TrainConfig, repo_root / "configs" / "train" / f"{name}.yaml")
        assert preset.batch.micro_batch_size == "auto" and preset.batch.gradient_accumulation_steps is None
        assert preset.accumulation_steps(preset.batch.num_processes) is None
        resolved = micro_batch.with_micro_batch(preset, preset.auto_candidates(1)[-1], 1)  # one GPU
        assert resolved.sequences_per_step(1) == preset.batch.global_batch_size == {"codeparrot-small": 192,
                                                                                    "codeparrot": 512}[name]


@pytest.mark.parametrize("overrides, message", [
    (["--batch.global_batch_size", "null"], "auto needs batch.global_batch_size"),
    (["--batch.gradient_accumulation_steps", "4"], "set batch.gradient_accumulation_steps to null, not 4"),
    (["--batch.num_processes", "5"], "global_batch_size 192 does not divide among 5 processes (remainder 2)"),
    (["--batch.global_batch_size", "9", "--batch.num_processes", "1"],
     "per-process batch 9 (global_batch_size 9 / 1 process) is not a multiple of data.num_workers 2"),
    (["--batch.micro_batch_size", "big"], "batch.micro_batch_size: expected int | one of 'auto', got 'big'"),
], ids=["no-global-batch", "accumulation-given", "processes", "workers", "not-auto"])
def test_auto_config_errors_are_one_line(overrides, message):
    with pytest.raises(CodeParrotError, match=re.escape(message)) as err:
        _auto(*overrides)
    assert "\n" not in str(err.value)


# ---- the search ----
def test_search_picks_the_largest_candidate_that_fits_in_few_trials():
    candidates = _auto().auto_candidates(1)  # 12 candidates: at most 4 trials
    for budget in range(0, 200):
        tried = []

        def fits(b: int) -> Trial:
            tried.append(b)
            return Trial(b, b <= budget, "simulated")

        search = largest_that_fits(candidates, fits)
        assert search.chosen == max([n for n in candidates if n <= budget], default=0), budget
        assert len(tried) <= math.ceil(math.log2(len(candidates) + 1)) and len(set(tried)) == len(tried)


def test_search_stops_exploring_upward_when_out_of_time():
    now = [0.0]

    def clock() -> float:
        return now[0]

    def slow_fits(b: int) -> Trial:
        now[0] += 100.0  # every trial takes 100 s
        return Trial(b, b <= 40, "simulated")

    search = largest_that_fits([1, 2, 4, 8, 16, 32, 64], slow_fits, max_seconds=150, clock=clock)
    assert search.out_of_time and [t.micro_batch_size for t in search.trials] == [8, 32]
    assert search.chosen == 32 and all(t.seconds == 100.0 for t in search.trials)
    nothing_fits = largest_that_fits([1, 2, 4], lambda b: Trial(b, False, "x"), max_seconds=0, clock=clock)
    assert nothing_fits.chosen == 0 and len(nothing_fits.trials) == 2  # out of time, but keeps looking downward


@pytest.fixture(scope="module")
def tiny_gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(vocab_size=96, n_positions=32, n_embd=32, n_layer=2, n_head=2, bos_token_id=0, eos_token_id=0)
    return GPT2LMHeadModel(config)


def test_step_probe_catches_out_of_memory_and_frees_the_step(tiny_gpt2):
    """The real-step probe (what runs on CUDA) on a real model on CPU: block 0 raises torch's OutOfMemoryError
    above 6 sequences, after the embeddings and its own activations exist; memory readings are simulated."""
    from codeparrot.training.loss import FinalNormOutput, FusedHead
    from codeparrot.training.optim import build_optimizer
    from codeparrot.config import from_dict
    from codeparrot.training.config import OptimConfig

    model = tiny_gpt2
    optimizer = build_optimizer(model, from_dict(OptimConfig, {}), torch.device("cpu"))
    head = FusedHead(model.lm_head.weight, torch.float32, final_norm=FinalNormOutput(model))
    seen = []

    def fake_oom(module, args, output):
        hidden = output[0] if isinstance(output, tuple) else output  # [b, T, D]
        seen.append(weakref.ref(hidden))
        if hidden.shape[0] > 6:
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")

    handle = model.transformer.h[0].register_forward_hook(fake_oom)
    peak = [0]
    try:
        probe = StepProbe(model, optimizer, head, 32, contextlib.nullcontext, 1e9,
                          (lambda: None, lambda: peak[0]))
        assert all(len(optimizer.state[p]) for p in model.parameters())  # AdamW moments allocated up front
        oom = probe(8)
        assert not oom.fits and oom.detail == "out of memory"
        assert all(ref() is None for ref in seen) and head.final_norm.value is None  # the step's tensors are gone
        assert all(p.grad is None for p in model.parameters())
        search = largest_that_fits([1, 2, 3, 4, 6, 12], probe)
        assert search.chosen == 6 and any(t.detail == "out of memory" for t in search.trials)
        probe.limit = 3.5e6  # and a peak above the limit does not fit either
        peak[0] = 4_000_000
        assert not probe(1).fits
        peak[0] = 3 * 2**20
        assert probe(1).fits and probe(1).detail == "3.0 MiB peak"
        def broken(b: int) -> None:
            raise RuntimeError("a real bug")

        probe.step = broken  # any other error propagates
        with pytest.raises(RuntimeError, match="a real bug"):
            probe(1)
        probe.release()  # what the run does after the search: nothing of the copy stays referenced
        assert probe.model is None and probe.optimizer is None and probe.head is None
    finally:
        handle.remove()
        head.final_norm.handle.remove()


# ---- the data each step sees ----
def test_every_candidate_trains_each_step_on_the_same_sequences(toy):
    """2 DataLoader workers, 8 sequences per process per step: micro-batches 1, 2 and 4 (accumulation 8, 4, 2:
    multiples of the workers) give every step the same sequences; 8 × 1, which auto never picks, does not."""
    from codeparrot.tokenizer import load_tokenizer
    from codeparrot.training.datasets.loader import build_dataloader, build_dataset

    tokenizer = load_tokenizer(str(toy.tokenizer_dir))

    def steps(b: int, n_steps: int = 3) -> list[list[tuple]]:
        dataset = build_dataset(str(toy.train_data), tokenizer, 32, infinite=True, seed=3, shuffle=True,
                                shuffle_buffer=8, sequence_shuffle_buffer=8, num_of_sequences=16)
        it = iter(build_dataloader(dataset, batch_size=b, num_workers=2))
        return [sorted(tuple(row) for _ in range(8 // b) for row in next(it).tolist()) for _ in range(n_steps)]

    reference = steps(4)
    assert _auto("--batch.global_batch_size", "8").auto_candidates(1) == [1, 2, 4]
    assert steps(2) == reference and steps(1) == reference
    assert steps(8) != reference


# ---- processes agree ----
def _agree_rank(rank: int, port: int, budgets: list[int], run_dir: str, results) -> None:
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", LOCAL_WORLD_SIZE="2",
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), ACCELERATE_USE_CPU="1")
    try:
        from accelerate import PartialState
        from accelerate.utils import gather

        PartialState._reset_state()  # forked from a process whose state says one process
        state = PartialState(cpu=True)
        accelerator = SimpleNamespace(num_processes=2, device=torch.device("cpu"), is_main_process=rank == 0,
                                      gather=gather)
        micro_batch.memory_test_for = lambda cfg, acc, model_dir: MemoryTest(
            lambda b: Trial(b, b <= budgets[rank], "simulated"), f"simulated budget of {budgets[rank]}")
        cfg, line = micro_batch.resolve_micro_batch(_auto("--batch.num_processes", "2"), accelerator, None, run_dir)
        results.put((rank, cfg.batch.micro_batch_size, cfg.accumulation_steps(2), line))
        state.wait_for_everyone()
        torch.distributed.destroy_process_group()
    except BaseException as err:  # noqa: BLE001 - reported to the test
        results.put((rank, None, None, repr(err)))


def test_processes_agree_on_the_smallest_choice(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = multiprocessing.get_context("fork")
    results = ctx.Queue()
    procs = [ctx.Process(target=_agree_rank, args=(rank, port, [40, 20], str(tmp_path), results)) for rank in (0, 1)]
    for p in procs:
        p.start()
    try:
        got = sorted(results.get(timeout=60) for _ in procs)
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():  # a hung collective: never leave it behind
                p.kill()
    # 96 sequences per process, 48 per worker: budget 40 picks 24, budget 20 picks 16; both run 16 × 6
    assert [(rank, b, accum) for rank, b, accum, _ in got] == [(0, 16, 6), (1, 16, 6)], got
    assert "processes chose 24, 16, all take the minimum" in got[0][3]
    record = json.loads((tmp_path / "micro_batch.json").read_text())
    assert record["micro_batch_size"] == 16 and record["per_process"] == [24, 16]


# ---- in-process training runs ----
@pytest.fixture(scope="module")
def toy(tmp_path_factory, stdlib_texts):
    return build_toy_run(tmp_path_factory.mktemp("auto"), stdlib_texts[:40], vocab_size=400)


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matmuls; and the same float sums in every run
    yield
    torch.set_num_threads(threads)


@pytest.fixture(autouse=True)
def no_peak_measurement(monkeypatch, fresh_accelerate_state):
    monkeypatch.setenv("CODEPARROT_PEAK_TFLOPS", "1")  # MFU's CPU peak is not what these runs test (seconds each)


def _run(toy, name, micro, max_steps=4, resume=None):
    """A toy run with 8 sequences per step and a constant learning rate (so a 2-step run resumed to 4 steps is
    the 4-step run); returns (result, {step: loss})."""
    cfg = toy.config(run_name=name, max_steps=max_steps, **{
        "output_dir": str(toy.root / "runs" / name), "data.valid": "", "checkpoint.push": False,
        "batch.micro_batch_size": micro, "batch.global_batch_size": 8, "schedule.name": "constant",
        "schedule.warmup_steps": 0, "checkpoint.save_steps": 2, "logging.log_steps": 1, "data.seq_length": 32})
    result = train_here(cfg, resume=resume)
    lines = (result.run_dir / "metrics.jsonl").read_text().splitlines()
    return result, {e["step"]: e["loss"] for e in map(json.loads, lines) if "loss" in e}


def _simulated(budget: int, calls: list | None = None):
    def measure(cfg, accelerator, model_dir):
        if calls is not None:
            calls.append(budget)
        return MemoryTest(lambda b: Trial(b, b <= budget, "simulated"), f"a simulated budget of {budget} sequences")
    return measure


@pytest.fixture(scope="module")
def explicit_run(toy):
    return _run(toy, "explicit-8", 8)


def test_auto_and_an_explicit_value_give_identical_losses(toy, explicit_run, monkeypatch, capsys):
    """auto on CPU (the RAM rule) picks 8 for the toy: bitwise the explicit run. A simulated budget of 5 picks 4
    (accumulation 2): the same sequences every step, so the same losses up to float summation order."""
    _, explicit = explicit_run
    result, auto = _run(toy, "auto-ram", "auto")
    out = capsys.readouterr().out
    assert "micro-batch auto: 8 (accumulation 1), the largest of 1, 2, 4, 8" in out and "available RAM" in out
    assert auto == explicit
    saved = yaml.safe_load((result.last_checkpoint / "train_config.yaml").read_text())
    assert saved["batch"]["micro_batch_size"] == 8  # the resolved value, what a resume reads
    assert json.loads((result.run_dir / "micro_batch.json").read_text())["micro_batch_size"] == 8

    monkeypatch.setattr(micro_batch, "memory_test_for", _simulated(5))
    result, split = _run(toy, "auto-5", "auto")
    assert "micro-batch auto: 4 (accumulation 2)" in capsys.readouterr().out
    record = json.loads((result.run_dir / "micro_batch.json").read_text())
    assert [(t["micro_batch_size"], t["fits"]) for t in record["trials"]] == [(4, True), (8, False)]
    assert split.keys() == explicit.keys()
    for step, loss in explicit.items():
        assert split[step] == pytest.approx(loss, rel=1e-5, abs=1e-6), step


def test_a_resumed_auto_run_reuses_the_recorded_value(toy, monkeypatch, capsys):
    """Measured 4 (budget 5), stopped at checkpoint 2, resumed to step 4 where the budget would now allow 8: the
    run takes 4 from the checkpoint, measures nothing, and its losses are the uninterrupted run's."""
    calls: list[int] = []
    monkeypatch.setattr(micro_batch, "memory_test_for", _simulated(5, calls))
    _, uninterrupted = _run(toy, "auto-full", "auto")
    first, _ = _run(toy, "auto-resumed", "auto", max_steps=2)
    assert calls == [5, 5]
    monkeypatch.setattr(micro_batch, "memory_test_for", _simulated(8, calls))
    result, resumed = _run(toy, "auto-resumed", "auto", resume="auto")
    assert calls == [5, 5]  # not measured again
    assert "micro-batch auto: 4 (accumulation 2), as recorded in" in capsys.readouterr().out
    assert resumed == uninterrupted  # bitwise: metrics.jsonl holds steps 1-2 of the first run, 3-4 resumed
    saved = yaml.safe_load((result.last_checkpoint / "train_config.yaml").read_text())
    assert saved["batch"]["micro_batch_size"] == 4


def test_a_checkpoint_without_a_usable_value_is_a_one_line_error(tmp_path):
    (tmp_path / "train_config.yaml").write_text("batch:\n  micro_batch_size: auto\n")
    with pytest.raises(CodeParrotError, match="batch.micro_batch_size is 'auto', not a positive integer"):
        micro_batch.recorded_micro_batch(tmp_path)
    (tmp_path / "train_config.yaml").write_text("seed: 1\n")
    with pytest.raises(CodeParrotError, match="no batch.micro_batch_size to resume micro_batch_size auto with"):
        micro_batch.recorded_micro_batch(tmp_path)

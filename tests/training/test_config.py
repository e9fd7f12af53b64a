"""Training config: the shipped configs and their token budgets, config errors, optimizer groups, the schedule,
and secret redaction. No training here (see test_train.py)."""

from __future__ import annotations

import math

import pytest
import torch
import yaml

from codeparrot.config import load_config, to_dict
from codeparrot.errors import CodeParrotError
from codeparrot.training.config import ScheduleConfig, TrainConfig
from codeparrot.training.optim import build_optimizer, build_scheduler, lr_factor, split_decay
from codeparrot.training.reporting import flatten, redact


def _shipped(repo_root, name: str, *overrides: str) -> TrainConfig:
    return load_config(TrainConfig, repo_root / "configs" / "train" / f"{name}.yaml", list(overrides))


def test_every_shipped_config_validates(repo_root):
    names = sorted(p.stem for p in (repo_root / "configs" / "train").glob("*.yaml"))
    assert {"tiny", "codeparrot-small", "codeparrot"} <= set(names)
    for name in names:
        cfg = _shipped(repo_root, name)
        cfg.accumulation_steps(cfg.batch.num_processes)  # the budget divides for the processes it is written for


def test_codeparrot_small_matches_the_published_run(repo_root):
    assert _shipped(repo_root, "codeparrot-small").batch.micro_batch_size == "auto"  # measured at start on CUDA
    cfg = _shipped(repo_root, "codeparrot-small", "--batch.micro_batch_size", "12")  # the published micro-batch
    assert cfg.accumulation_steps(16) == 1
    assert cfg.sequences_per_step(16) == 192 == 12 * 16
    assert cfg.tokens_per_step(16) == 196_608
    assert cfg.tokens_per_step(16) * cfg.max_steps == pytest.approx(29.5e9, rel=0.01)
    assert (cfg.optim.lr, cfg.schedule.warmup_steps, cfg.max_steps) == (5e-4, 2000, 150_000)
    assert (cfg.optim.weight_decay, cfg.optim.betas, cfg.optim.eps, cfg.optim.max_grad_norm) == (0.1, [0.9, 0.999], 1e-8, 1.0)
    assert cfg.schedule.name == "cosine" and not cfg.gradient_checkpointing
    assert cfg.accumulation_steps(8) == 2  # same global batch on 8 GPUs
    assert "29.49B tokens" in cfg.budget_summary(16)


def test_codeparrot_1p5b_matches_the_published_run(repo_root):
    assert _shipped(repo_root, "codeparrot").batch.micro_batch_size == "auto"  # measured at start on CUDA
    cfg = _shipped(repo_root, "codeparrot", "--batch.micro_batch_size", "2")  # the published micro-batch
    assert cfg.accumulation_steps(16) == 16
    assert cfg.sequences_per_step(16) == 512 == 2 * 16 * 16
    assert cfg.tokens_per_step(16) * cfg.max_steps == pytest.approx(26.2e9, rel=0.01)
    assert (cfg.optim.lr, cfg.schedule.warmup_steps, cfg.max_steps) == (2e-4, 750, 50_000)
    assert cfg.gradient_checkpointing and cfg.optim.weight_decay == 0.1
    assert cfg.accumulation_steps(8) == 32 and cfg.sequences_per_step(8) == 512
    with pytest.raises(CodeParrotError, match="does not divide"):
        cfg.accumulation_steps(3)  # 512 sequences over 2 × 3 per micro-step


def test_tiny_config_is_the_cpu_shape(repo_root):
    cfg = _shipped(repo_root, "tiny")
    assert cfg.tokens_per_step(1) == 8 * 256  # the original loop's benchmark shape: batch 8 × 256
    assert cfg.tokens_per_step(1) * cfg.max_steps < 5e6  # minutes on a CPU


def test_accelerate_config_is_one_node_multi_gpu_bf16(repo_root):
    acc = yaml.safe_load((repo_root / "accelerate_config.yaml").read_text())
    assert acc["distributed_type"] == "MULTI_GPU" and acc["num_machines"] == 1
    assert acc["mixed_precision"] == "bf16" and acc["num_processes"] > 1 and not acc["use_cpu"]


@pytest.mark.parametrize("overrides, message", [
    (["--batch.micro_batch_size", "5", "--batch.global_batch_size", "192", "--batch.num_processes", "16"],
     "global_batch_size 192 does not divide into micro_batch_size 5 × 16 processes = 80"),
    (["--batch.micro_batch_size", "2", "--batch.gradient_accumulation_steps", "8", "--batch.global_batch_size", "512",
      "--batch.num_processes", "16"], "512 != micro_batch_size 2 × gradient_accumulation_steps 8 × 16 processes = 256"),
    (["--optim.lrr", "1e-3"], "unknown config key optim.lrr (did you mean optim.lr?)"),
    (["--max_steps", "ten"], "max_steps: expected an integer, got 'ten'"),
    (["--max_steps", "100", "--schedule.warmup_steps", "200"], "warmup_steps (200) is larger than max_steps (100)"),
    (["--logging.trackers", "tensorboard,mlflow"], "unknown tracker 'mlflow'"),
    (["--eval.max_eval_steps", "0"], "eval.max_eval_steps must be -1"),
    (["--run_name", "a b"], "run_name 'a b'"),
    (["--optim.betas", "[0.9, 1.5]"], "optim.betas"),
    # NaN passes every `< 0` check and inf every `> 0` one: refused as values, never reaching torch or a timer
    (["--optim.lr", "nan"], "optim.lr: expected a finite number, got nan"),
    (["--max_minutes", "nan"], "max_minutes: expected a finite number, got nan"),
    (["--stall_minutes", "inf"], "stall_minutes: expected a finite number, got inf"),
    (["--optim.betas", "[0.9, .nan]"], "optim.betas[1]: expected a finite number"),
    (["--stall_minutes", "1e9"], "stall_minutes must be at most 10080"),  # past what faulthandler's timer takes
])
def test_bad_configs_are_one_line_errors(repo_root, overrides, message):
    with pytest.raises(CodeParrotError) as err:
        load_config(TrainConfig, repo_root / "configs/train/tiny.yaml", overrides)
    assert message in str(err.value) and "\n" not in str(err.value)
    # every one of these values was typed on the command line: the error says so, not "tiny.yaml"
    assert str(err.value).startswith("command line: ") and "tiny.yaml" not in str(err.value)


def test_config_errors_name_the_yaml_file_when_the_file_is_wrong(repo_root, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text((repo_root / "configs/train/tiny.yaml").read_text().replace("optim:\n", "optim:\n  lrr: 2\n"))
    with pytest.raises(CodeParrotError, match=r"^.*bad.yaml: unknown config key optim.lrr"):
        load_config(TrainConfig, bad, ["--seed", "3"])  # a valid override does not take the blame
    with pytest.raises(CodeParrotError, match=r"^command line: max_steps: expected an integer"):
        load_config(TrainConfig, repo_root / "configs/train/tiny.yaml", ["--max_steps", "ten"])


def test_a_section_given_twice_in_the_yaml_file_is_refused(repo_root, tmp_path):
    # plain YAML keeps the last `optim:` and so silently drops the file's lr 1e-3 for the default 5e-4
    twice = tmp_path / "twice.yaml"
    twice.write_text((repo_root / "configs/train/tiny.yaml").read_text() + "optim:\n  weight_decay: 0.2\n")
    lines = twice.read_text().splitlines()
    first, second = lines.index("optim:") + 1, len(lines) - 1
    with pytest.raises(CodeParrotError, match=rf"^.*twice.yaml:{second}: .*duplicate key 'optim' \(first on line "
                                              rf"{first}\)$"):
        load_config(TrainConfig, twice)


def test_run_dir_defaults_to_runs_slash_name():
    assert str(TrainConfig(run_name="exp1").run_dir()) == "runs/exp1"
    assert str(TrainConfig(run_name="exp1", output_dir="/tmp/x").run_dir()) == "/tmp/x"


# ---- optimizer groups ----
def _tiny_gpt2():
    from codeparrot.repository.model import ModelConfig, build_model, gpt2_config

    return build_model(gpt2_config(ModelConfig(n_layer=2, n_embd=64, n_head=4, n_positions=64), 300, 0, 0), seed=0)


def test_weight_decay_groups():
    model = _tiny_gpt2()
    decay, no_decay = split_decay(model)
    # every bias and every LayerNorm parameter, and nothing else, goes without decay
    assert set(no_decay) == {n for n, _ in model.named_parameters() if n.endswith(".bias") or ".ln_" in n or "ln_f." in n}
    assert {"transformer.wte.weight", "transformer.wpe.weight", "transformer.h.0.attn.c_attn.weight",
            "transformer.h.0.attn.c_proj.weight", "transformer.h.1.mlp.c_fc.weight", "transformer.h.1.mlp.c_proj.weight"} <= set(decay)
    assert not any(".ln_" in n or n.endswith(".bias") for n in decay)
    # the tied LM head is the token embedding: counted once, every parameter exactly once
    assert "lm_head.weight" not in decay + no_decay
    assert len(decay) + len(no_decay) == len(list(model.parameters()))

    from codeparrot.training.config import OptimConfig

    opt = build_optimizer(model, OptimConfig(weight_decay=0.1), torch.device("cpu"))
    assert [g["weight_decay"] for g in opt.param_groups] == [0.1, 0.0]
    assert opt.defaults["betas"] == (0.9, 0.999) and opt.defaults["eps"] == 1e-8
    assert not opt.defaults.get("fused")  # the fused kernel is a CUDA kernel
    # a decayed step shrinks a weight whose gradient is zero; a no-decay parameter stays put
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    ln_before = model.transformer.ln_f.weight.detach().clone()
    wte_before = model.transformer.wte.weight.detach().clone()
    opt.step()
    assert torch.equal(model.transformer.ln_f.weight, ln_before)
    assert torch.allclose(model.transformer.wte.weight, wte_before * (1 - 5e-4 * 0.1))


# ---- schedule ----
def test_warmup_is_linear_then_cosine_to_the_floor():
    s = ScheduleConfig(name="cosine", warmup_steps=10, min_lr_ratio=0.0)
    assert [lr_factor(i, 110, s) for i in range(10)] == pytest.approx([(i + 1) / 10 for i in range(10)])
    assert lr_factor(10, 110, s) == pytest.approx(1.0)  # peak right after warmup
    assert lr_factor(60, 110, s) == pytest.approx(0.5)  # half way through the decay
    assert lr_factor(109, 110, s) == pytest.approx(0.5 * (1 + math.cos(math.pi * 99 / 100)))
    assert lr_factor(110, 110, s) == pytest.approx(0.0)
    values = [lr_factor(i, 110, s) for i in range(10, 111)]
    assert all(a >= b for a, b in zip(values, values[1:]))  # monotone decay
    floor = ScheduleConfig(name="cosine", warmup_steps=0, min_lr_ratio=0.1)
    assert lr_factor(0, 100, floor) == pytest.approx(1.0) and lr_factor(100, 100, floor) == pytest.approx(0.1)
    linear = ScheduleConfig(name="linear", warmup_steps=0)
    assert lr_factor(25, 100, linear) == pytest.approx(0.75)
    assert lr_factor(500, 100, ScheduleConfig(name="constant", warmup_steps=5)) == 1.0


def test_scheduler_drives_the_optimizer_lr():
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=2e-4)
    sched = build_scheduler(opt, 100, ScheduleConfig(warmup_steps=4))
    seen = []
    for _ in range(6):
        seen.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert seen == pytest.approx([2e-4 * f for f in (0.25, 0.5, 0.75, 1.0, lr_factor(4, 100, ScheduleConfig(warmup_steps=4)),
                                                     lr_factor(5, 100, ScheduleConfig(warmup_steps=4)))])


# ---- secrets ----
def test_secrets_never_reach_logged_configs():
    token = "hf_" + "a1B2" * 9
    cfg = {"model": f"https://user:{token}@huggingface.co/org/model", "revision": "0123456789abcdef0123456789abcdef01234567",
           "logging": {"wandb_api_key": "0123456789" * 4, "project": "codeparrot"},
           "data": {"train": f"/data/{token}/tokens", "hub_token": token}}
    clean = redact(cfg)
    text = yaml.safe_dump(clean) + str(flatten(clean))
    assert token not in text and "0123456789" * 4 not in text
    assert clean["revision"] == cfg["revision"]  # a commit id is not a secret
    assert clean["logging"]["project"] == "codeparrot"
    assert clean["model"] == "https://***@huggingface.co/org/model"
    assert clean["data"]["hub_token"] == "***"


def test_redacted_config_round_trips_through_load_config(tmp_path):
    """What a checkpoint saves as train_config.yaml loads back: keys that merely contain "token"
    (`tokenizer`, `chars_per_token`) are settings, not secrets."""
    cfg = load_config(TrainConfig, None, ["--data.tokenizer", "tok/dir", "--data.chars_per_token", "3.2"])
    path = tmp_path / "train_config.yaml"
    path.write_text(yaml.safe_dump(redact(to_dict(cfg))))
    again = load_config(TrainConfig, path)
    assert again.data.tokenizer == "tok/dir" and again.data.chars_per_token == pytest.approx(3.2)
    assert to_dict(again) == to_dict(cfg)

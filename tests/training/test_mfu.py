"""MFU: the PaLM FLOPs/token formula against published figures and against FLOPs counted by torch, the peak table,
and the measured-and-cached CPU matmul peak."""

from __future__ import annotations

import json

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from codeparrot.repository.model import ModelConfig, gpt2_config, matmul_parameters
from codeparrot.training import mfu as mfu_mod
from codeparrot.training.mfu import flops_per_token, matmul_params, mfu, model_flops_per_token, peak_flops


def _meta_gpt2(n_layer: int, n_embd: int, n_head: int, vocab: int = 32768, n_positions: int = 1024):
    from transformers import GPT2LMHeadModel

    cfg = gpt2_config(ModelConfig(n_layer=n_layer, n_embd=n_embd, n_head=n_head, n_positions=n_positions), vocab, 0, 0)
    with torch.device("meta"):
        return GPT2LMHeadModel(cfg)


@pytest.mark.parametrize("shape, gflop, digits", [((12, 768, 12), 0.775, 3), ((48, 1600, 25), 10.11, 2)])
def test_published_flops_per_token(shape, gflop, digits):
    """reference.md: 0.775 GFLOP/token for codeparrot-small at T=1024, 10.11 for the 1.5B (as rounded there)."""
    model = _meta_gpt2(*shape)
    assert round(model_flops_per_token(model, 1024) / 1e9, digits) == gflop
    # N = every parameter but the position embeddings; the model engineer's independent count agrees.
    assert matmul_params(model) == matmul_parameters(model.config)
    assert matmul_params(model) == sum(p.numel() for p in model.parameters()) - 1024 * shape[1]


def test_formula_matches_flops_counted_by_torch():
    """Count the FLOPs of a real forward+backward (eager attention, so the attention matmuls are visible to
    the counter): they equal 6·(matmul weights) + 12·L·H·Q·T per token exactly. The formula's N also counts
    biases and LayerNorm gains (no matmul), which is the only difference."""
    from transformers import GPT2LMHeadModel

    cfg = gpt2_config(ModelConfig(n_layer=2, n_embd=64, n_head=4, n_positions=128, resid_pdrop=0.0,
                                  embd_pdrop=0.0, attn_pdrop=0.0), 512, 0, 0)
    model = GPT2LMHeadModel(cfg)
    model.loss_type = "ForCausalLM"
    model.set_attn_implementation("eager")
    x = torch.randint(0, 512, (2, 128))
    with FlopCounterMode(display=False) as counter:
        model(input_ids=x, labels=x).loss.backward()
    counted_per_token = counter.get_total_flops() / x.numel()
    not_matmul = sum(p.numel() for n, p in model.named_parameters() if n.endswith(".bias") or ".ln_" in n or "ln_f." in n)
    assert counted_per_token == pytest.approx(model_flops_per_token(model, 128) - 6 * not_matmul, rel=1e-9)
    assert flops_per_token(100, 2, 4, 16, 128) == 600 + 12 * 2 * 4 * 16 * 128


@pytest.mark.parametrize("name, dtype, expected", [
    ("NVIDIA A100-SXM4-40GB", torch.bfloat16, 312e12),
    ("NVIDIA H100 80GB HBM3", torch.bfloat16, 989e12),
    ("NVIDIA H100 PCIe", torch.bfloat16, 756e12),
    ("NVIDIA H200", torch.bfloat16, 989e12),
    ("NVIDIA H100 NVL", torch.bfloat16, 835e12),  # not the SXM figure although the name contains "H100"
    ("NVIDIA A100-SXM4-80GB", torch.float32, 19.5e12),
    ("Some Future GPU", torch.bfloat16, None),
])
def test_gpu_peak_table(monkeypatch, name, dtype, expected):
    monkeypatch.delenv("CODEPARROT_PEAK_TFLOPS", raising=False)
    monkeypatch.setattr("codeparrot.training.mfu._tf32_enabled", lambda: False)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    peak, source = peak_flops(torch.device("cuda", 0), dtype)
    assert peak == expected
    if expected is None:
        assert "CODEPARROT_PEAK_TFLOPS" in source  # tells the user how to supply the figure
    monkeypatch.setenv("CODEPARROT_PEAK_TFLOPS", "100")
    assert peak_flops(torch.device("cuda", 0), dtype)[0] == 100e12


def test_fp32_with_tf32_uses_the_tensor_core_peak(monkeypatch):
    """Training turns TF32 on; an fp32 MFU against the plain fp32 peak would read far above the truth."""
    monkeypatch.delenv("CODEPARROT_PEAK_TFLOPS", raising=False)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100 80GB HBM3")
    monkeypatch.setattr("codeparrot.training.mfu._tf32_enabled", lambda: True)
    assert peak_flops(torch.device("cuda", 0), torch.float32) == (494.5e12, "NVIDIA H100 80GB HBM3 TF32 data sheet")
    monkeypatch.setattr("codeparrot.training.mfu._tf32_enabled", lambda: False)
    assert peak_flops(torch.device("cuda", 0), torch.float32)[0] == 67e12


def test_mfu_arithmetic():
    # 2,400 tokens/s × 31 MFLOP/token on a 150 GFLOP/s peak is ~50% (the original loop on this CPU class)
    assert mfu(2400, 31e6, 150e9) == pytest.approx(0.496)
    assert mfu(2400, 31e6, 150e9, num_devices=2) == pytest.approx(0.248)
    assert mfu(2400, 31e6, None) is None


def test_cpu_peak_is_measured_once_and_cached(tmp_path, monkeypatch):
    cache = tmp_path / "cpu_peak.json"
    monkeypatch.setattr(mfu_mod, "CACHE", cache)
    calls = []
    real = mfu_mod._measure_matmul

    def counting(dtype, size, seconds):
        calls.append(size)
        return real(dtype, size, seconds=0.05)

    monkeypatch.setattr(mfu_mod, "_measure_matmul", counting)
    first = mfu_mod.cpu_matmul_peak("float32")
    # a plausible rate for a matmul on any CPU of the last decade: 1 GFLOP/s .. 100 TFLOP/s
    assert 1e9 < first < 1e14
    assert len(calls) == 2 and cache.is_file()
    assert mfu_mod.cpu_matmul_peak("float32") == first and len(calls) == 2  # cached: not measured again
    (key,) = json.loads(cache.read_text())
    assert "float32" in key and f"threads={torch.get_num_threads()}" in key
    # a busy machine measuring lower never lowers the cached peak
    monkeypatch.setattr(mfu_mod, "_measure_matmul", lambda dtype, size, seconds: first / 10)
    assert mfu_mod.cpu_matmul_peak("float32", refresh=True) == first
    assert peak_flops(torch.device("cpu"), torch.float32) == (first, "measured float32 matmul peak of this CPU")


@pytest.mark.parametrize("bf16, expected", [(50e9, 100e9), (400e9, 400e9)])
def test_cpu_bf16_peak_is_the_faster_unit(monkeypatch, bf16, expected):
    """On a CPU that emulates bf16 (slower than fp32) a bf16 run is measured against the fp32 units it leaves
    idle; on one with native bf16 (AMX) against the bf16 units."""
    monkeypatch.setattr(mfu_mod, "cpu_matmul_peak", lambda dtype="float32", refresh=False: {
        "float32": 100e9, "bfloat16": bf16}[dtype])
    assert peak_flops(torch.device("cpu"), torch.bfloat16)[0] == expected
    assert peak_flops(torch.device("cpu"), torch.float32)[0] == 100e9

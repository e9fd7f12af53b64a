"""MFU: the PaLM FLOPs/token formula against published figures and against FLOPs counted by torch, the peak table,
and the measured-and-cached CPU matmul peak."""

from __future__ import annotations

import json
import time

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from codeparrot.repository.model import ModelConfig, gpt2_config, matmul_parameters
from codeparrot.training import mfu as mfu_mod
from codeparrot.training.mfu import flops_per_token, matmul_params, mfu, model_flops_per_token, peak_flops


@pytest.fixture(autouse=True)
def _measured_peak(monkeypatch):
    """The tests of this module read the peak as a user's run does: measured, or the GPU table (tests/conftest.py
    gives every other test a fixed CODEPARROT_PEAK_TFLOPS)."""
    monkeypatch.delenv("CODEPARROT_PEAK_TFLOPS", raising=False)


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


# Device names exactly as `torch.cuda.get_device_name` reports them, with the dense bf16 data-sheet peak (TFLOP/s)
# each must get. "L4" must not match inside "L40S"/"L40" (MFU 1.5-3x too high), "H100"/"H200" not inside their
# NVL/PCIe variants, "A10" not inside "A10G"; unlisted devices and MIG slices get no peak (MFU n/a).
REAL_DEVICE_NAMES = [
    ("NVIDIA H100 80GB HBM3", 989), ("NVIDIA H100 PCIe", 756), ("NVIDIA H100 NVL", 835), ("NVIDIA H200", 989),
    ("NVIDIA H200 NVL", 835), ("NVIDIA L40S", 362), ("NVIDIA L40", 181), ("NVIDIA L4", 121),
    ("NVIDIA A100-SXM4-80GB", 312), ("NVIDIA A100-SXM4-40GB", 312), ("NVIDIA A100-PCIE-40GB", 312),
    ("NVIDIA A100 80GB PCIe", 312), ("NVIDIA A10", 125), ("Tesla V100-SXM2-16GB", 125),
    ("NVIDIA A10G", None), ("NVIDIA H100 80GB HBM3 MIG 1g.10gb", None), ("NVIDIA GeForce RTX 4090", None),
    ("NVIDIA L40S-48Q", None), ("Some Future GPU", None),
]


@pytest.mark.parametrize("name, tflops", REAL_DEVICE_NAMES)
def test_gpu_peak_table_matches_whole_device_names(monkeypatch, name, tflops):
    monkeypatch.delenv("CODEPARROT_PEAK_TFLOPS", raising=False)
    monkeypatch.setattr("codeparrot.training.mfu._tf32_enabled", lambda: False)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    peak, source = peak_flops(torch.device("cuda", 0), torch.bfloat16)
    assert peak == (None if tflops is None else tflops * 1e12), source
    if tflops is None:
        assert "n/a" in source and "CODEPARROT_PEAK_TFLOPS" in source  # tells the user how to supply the figure
    else:
        assert name in source and "data sheet" in source
    monkeypatch.setenv("CODEPARROT_PEAK_TFLOPS", "100")
    assert peak_flops(torch.device("cuda", 0), torch.bfloat16) == (100e12, "CODEPARROT_PEAK_TFLOPS")


def test_gpu_peak_table_fp32_without_tf32(monkeypatch):
    monkeypatch.delenv("CODEPARROT_PEAK_TFLOPS", raising=False)
    monkeypatch.setattr("codeparrot.training.mfu._tf32_enabled", lambda: False)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA A100-SXM4-80GB")
    assert peak_flops(torch.device("cuda", 0), torch.float32)[0] == 19.5e12


def test_fp32_with_tf32_uses_the_tensor_core_peak(monkeypatch):
    """Training turns TF32 on; an fp32 MFU against the plain fp32 peak would read far above the truth."""
    monkeypatch.delenv("CODEPARROT_PEAK_TFLOPS", raising=False)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100 80GB HBM3")
    monkeypatch.setattr("codeparrot.training.mfu._tf32_enabled", lambda: True)
    assert peak_flops(torch.device("cuda", 0), torch.float32) == (
        494.5e12, "NVIDIA H100 80GB HBM3: H100 SXM data sheet, dense TF32")
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
    monkeypatch.setattr(mfu_mod, "machine_busy", lambda share: None)  # this shared test machine may be busy
    calls = []
    real = mfu_mod._measure_matmul

    def counting(dtype, size, seconds):
        calls.append(size)
        return real(dtype, size, seconds=0.05)

    monkeypatch.setattr(mfu_mod, "_measure_matmul", counting)
    first = mfu_mod.cpu_matmul_peak("float32")
    # a plausible rate for a matmul on any CPU of the last decade: 1 GFLOP/s .. 100 TFLOP/s
    assert 1e9 < first < 1e14
    measured = len(calls)
    assert 1 <= measured <= 3 and cache.is_file()
    assert mfu_mod.cpu_matmul_peak("float32") == first and len(calls) == measured  # cached: not measured again
    (key,) = json.loads(cache.read_text())
    assert "float32" in key and f"threads={torch.get_num_threads()}" in key
    # a busy machine measuring lower never lowers the cached peak
    monkeypatch.setattr(mfu_mod, "_measure_matmul", lambda dtype, size, seconds: (first / 10, 1.0))
    assert mfu_mod.cpu_matmul_peak("float32", refresh=True) == first
    value, source = peak_flops(torch.device("cpu"), torch.float32)
    assert value == first and source.startswith("measured float32 matmul peak of this CPU")


def test_peak_sizes_shrink_for_a_dtype_the_cpu_emulates_slowly():
    """A CPU without native bf16 ran one 2048² bf16 matmul for seconds (the smoke check spent 9 minutes on its
    peak): sizes whose one matmul would exceed the budget at the probed rate are left out."""
    assert mfu_mod._matmul_sizes(torch.float32, budget=1e6) == [512, 1024, 2048]
    assert mfu_mod._matmul_sizes(torch.float32, budget=1e-9) == [512]
    start = time.perf_counter()
    sizes = mfu_mod._matmul_sizes(torch.bfloat16)
    assert set(sizes) <= {512, 1024, 2048} and time.perf_counter() - start < 30


@pytest.fixture
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_peak_is_measured_at_the_training_thread_count_and_cached_per_count(tmp_path, monkeypatch, one_thread):
    """A run launched with fewer threads (here 1) gets a peak measured at that count, never the figure of another
    count from the cache; and a real workload at that count stays at or below the peak (MFU ≤ 100%)."""
    monkeypatch.setattr(mfu_mod, "CACHE", tmp_path / "cpu_peak.json")
    monkeypatch.setattr(mfu_mod, "machine_busy", lambda share: None)
    # a cached figure for another thread count (what a 2-thread bench left behind) must not be used at 1 thread
    other = f"{mfu_mod._cpu_name()} | threads=64 | torch={torch.__version__} | float32"
    (tmp_path / "cpu_peak.json").write_text(json.dumps({other: 1e15}))
    one = mfu_mod.measure_cpu_peak("float32")
    assert one.threads == 1 and not one.cached and one.flops < 1e15
    keys = json.loads((tmp_path / "cpu_peak.json").read_text())
    assert keys[other] == 1e15 and keys[f"{mfu_mod._cpu_name()} | threads=1 | torch={torch.__version__} | float32"]
    assert "1 thread(s)" in peak_flops(torch.device("cpu"), torch.float32)[1]
    # the work a training step does (a GPT-2 MLP-sized matmul chain), timed at the same thread count
    x, w1, w2 = torch.randn(512, 256), torch.randn(256, 1024), torch.randn(1024, 256)
    best = 0.0
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(10):
            (x @ w1).relu() @ w2
        best = max(best, 10 * 2 * 2 * 512 * 256 * 1024 / (time.perf_counter() - start))
    assert best / one.flops <= 1.05  # best-of-rounds large-matrix peak bounds a smaller workload's rate


def test_busy_machine_peak_is_used_but_not_cached(tmp_path, monkeypatch):
    monkeypatch.setattr(mfu_mod, "CACHE", tmp_path / "cpu_peak.json")
    monkeypatch.setattr(mfu_mod, "_measure_matmul", lambda dtype, size, seconds: (50e9, 0.45))
    peak = mfu_mod.measure_cpu_peak("float32")
    assert peak.flops == 50e9 and "45%" in peak.busy and not (tmp_path / "cpu_peak.json").exists()
    assert "busy" in peak_flops(torch.device("cpu"), torch.float32)[1]
    monkeypatch.setattr(mfu_mod.os, "getloadavg", lambda: (64.0, 64.0, 64.0))
    assert "load average 64.0" in mfu_mod.machine_busy(1.0)
    monkeypatch.setattr(mfu_mod.os, "getloadavg", lambda: (0.0, 0.0, 0.0))
    assert mfu_mod.machine_busy(0.95) is None


def test_mfu_above_100_percent_warns_that_the_peak_is_wrong(monkeypatch):
    monkeypatch.setattr(mfu_mod, "_warned_above_100", False)
    with pytest.warns(UserWarning, match=r"MFU 112% is above 100%: the peak .* is too low"):
        assert mfu(1120, 1e8, 1e11) == pytest.approx(1.12)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert mfu(500, 1e8, 1e11) == pytest.approx(0.5)  # a possible figure: no warning


@pytest.mark.parametrize("bf16, expected", [(50e9, 100e9), (400e9, 400e9)])
def test_cpu_bf16_peak_is_the_faster_unit(monkeypatch, bf16, expected):
    """On a CPU that emulates bf16 (slower than fp32) a bf16 run is measured against the fp32 units it leaves
    idle; on one with native bf16 (AMX) against the bf16 units."""
    monkeypatch.setattr(mfu_mod, "measure_cpu_peak", lambda dtype="float32", refresh=False: mfu_mod.CpuPeak(
        {"float32": 100e9, "bfloat16": bf16}[dtype], 2, cached=True))
    assert peak_flops(torch.device("cpu"), torch.bfloat16)[0] == expected
    assert peak_flops(torch.device("cpu"), torch.float32)[0] == 100e9


def test_measuring_the_peak_leaves_the_global_rng_alone(tmp_path, monkeypatch):
    """The peak is measured after a resume restored the RNG states (and, on a busy machine, in every run): it
    must not shift the dropout stream, or a resumed run diverges from an uninterrupted one."""
    monkeypatch.setattr(mfu_mod, "CACHE", tmp_path / "cpu_peak.json")
    torch.manual_seed(5)
    expected = torch.rand(4)
    torch.manual_seed(5)
    mfu_mod._measure_matmul(torch.float32, 64, seconds=0.01)
    assert torch.equal(torch.rand(4), expected)

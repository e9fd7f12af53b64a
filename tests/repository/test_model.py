"""Model presets: parameter counts on the meta device, config validation, tokenizer-driven ids, attention."""

from __future__ import annotations

import math

import pytest
import torch

from codeparrot.errors import CodeParrotError
from codeparrot.repository.model import (
    ModelConfig,
    build_model,
    count_parameters,
    gpt2_config,
    load_model_config,
    load_pretrained_model,
    matmul_parameters,
    to_gpt2_config,
)

VOCAB = 32768


def _preset(repo_root, name):
    return load_model_config(str(repo_root / "configs" / "model" / f"{name}.yaml"))


def _palm_flops_per_token(config, seq_len):
    """6N + 12*L*H*Q*T, PaLM appendix B, N = matmul parameters."""
    head = config.n_embd // config.n_head
    return 6 * matmul_parameters(config) + 12 * config.n_layer * config.n_head * head * seq_len


def test_preset_parameter_counts_on_meta_device(repo_root):
    small = gpt2_config(_preset(repo_root, "codeparrot-small"), VOCAB, 0, 0)
    large = gpt2_config(_preset(repo_root, "codeparrot"), VOCAB, 0, 0)
    n_small, n_large = count_parameters(small), count_parameters(large)
    assert round(n_small / 1e6, 1) == 111.0 and round(n_large / 1e6, 1) == 1529.6
    # GPT-2 small/XL with the 50,257 vocabulary are the well-known 124.4M / 1,557.6M: only the embedding differs.
    assert n_small + (50257 - VOCAB) * 768 == 124_439_808
    assert n_large + (50257 - VOCAB) * 1600 == 1_557_611_200
    # The reference's FLOPs per token at T = 1024 (0.775 and 10.11 GFLOP) follow from matmul_parameters.
    assert _palm_flops_per_token(small, 1024) / 1e9 == pytest.approx(0.775, abs=5e-4)
    assert _palm_flops_per_token(large, 1024) / 1e9 == pytest.approx(10.11, abs=5e-3)
    assert count_parameters(small) - matmul_parameters(small) == 1024 * 768  # the position embeddings


def test_presets_match_codeparrot(repo_root):
    for name, (layers, width, heads) in {"codeparrot-small": (12, 768, 12), "codeparrot": (48, 1600, 25)}.items():
        cfg = _preset(repo_root, name)
        assert (cfg.n_layer, cfg.n_embd, cfg.n_head, cfg.n_positions) == (layers, width, heads, 1024)
        assert cfg.scale_attn_by_inverse_layer_idx and cfg.reorder_and_upcast_attn
        assert cfg.attn_implementation == "sdpa"
    tiny = _preset(repo_root, "tiny")
    n_tiny = count_parameters(gpt2_config(tiny, VOCAB, 0, 0))
    assert 1e6 < n_tiny < 10e6 and tiny.n_positions >= 1024  # CPU-sized, but HumanEval prompts still fit


def test_vocab_and_special_ids_come_from_the_tokenizer(code_tokenizer, repo_root):
    config = to_gpt2_config(_preset(repo_root, "tiny"), code_tokenizer)
    eos = code_tokenizer.eos_token_id
    assert config.vocab_size == len(code_tokenizer) == 1000
    assert config.bos_token_id == config.eos_token_id == config.pad_token_id == eos != 50256
    assert config.scale_attn_by_inverse_layer_idx and config.reorder_and_upcast_attn
    model = build_model(config, seed=0)
    assert model.get_input_embeddings().weight.shape == (len(code_tokenizer), 128)
    assert model.generation_config.eos_token_id == eos and model.generation_config.pad_token_id == eos


def test_bad_model_configs(tmp_path, repo_root):
    bad_key = tmp_path / "bad_key.yaml"
    bad_key.write_text("n_layer: 2\nn_embed: 64\n")
    with pytest.raises(CodeParrotError, match=r"bad_key.yaml.*n_embed.*did you mean n_embd"):
        load_model_config(str(bad_key))
    with pytest.raises(CodeParrotError, match=r"n_embd \(100\) must be divisible by n_head \(3\)"):
        load_model_config(str(repo_root / "configs" / "model" / "tiny.yaml"), ["--n_embd", "100", "--n_head", "3"])
    with pytest.raises(CodeParrotError, match="attn_implementation"):
        load_model_config(str(repo_root / "configs" / "model" / "tiny.yaml"), ["--attn_implementation", "flash"])
    with pytest.raises(CodeParrotError, match="n_layer must be positive"):
        ModelConfig(n_layer=0).validate()
    with pytest.raises(CodeParrotError, match="outside the vocabulary"):
        gpt2_config(ModelConfig(), 300, 0, 300)


def test_initialization_is_seeded_and_gpt2_scaled():
    cfg = ModelConfig(n_layer=4, n_embd=128, n_head=4, n_positions=64)
    config = gpt2_config(cfg, 500, 0, 0)
    a, b, c = build_model(config, seed=1), build_model(config, seed=1), build_model(config, seed=2)
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    assert not torch.equal(a.transformer.wte.weight, c.transformer.wte.weight)
    assert a.lm_head.weight.data_ptr() == a.transformer.wte.weight.data_ptr()  # tied
    std = cfg.initializer_range
    assert a.transformer.h[0].mlp.c_fc.weight.std().item() == pytest.approx(std, rel=0.05)
    # Residual projections: std / sqrt(2 * n_layer), GPT-2's depth scaling.
    assert a.transformer.h[0].attn.c_proj.weight.std().item() == pytest.approx(std / math.sqrt(8), rel=0.05)
    assert torch.count_nonzero(a.transformer.h[0].attn.c_attn.bias) == 0


def _tiny_pair(attn_a, attn_b):
    cfg = ModelConfig(n_layer=3, n_embd=64, n_head=4, n_positions=64, resid_pdrop=0, embd_pdrop=0, attn_pdrop=0)
    models = []
    for attn in (attn_a, attn_b):
        cfg.attn_implementation = attn
        models.append(build_model(gpt2_config(cfg, 300, 0, 0), seed=0).eval())
    return models


def test_sdpa_default_matches_eager_upcast_attention(monkeypatch):
    """The project's choice: SDPA by default (no upcast path), eager honours reorder_and_upcast_attn; in fp32
    both compute the same function, and under bf16 autocast SDPA stays as close to fp32 as the upcast path."""
    from transformers.models.gpt2 import modeling_gpt2

    calls = []
    original = modeling_gpt2.GPT2Attention._upcast_and_reordered_attn
    monkeypatch.setattr(modeling_gpt2.GPT2Attention, "_upcast_and_reordered_attn",
                        lambda self, *a, **k: calls.append(1) or original(self, *a, **k))
    sdpa, eager = _tiny_pair("sdpa", "eager")
    ids = torch.randint(0, 300, (2, 48), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = sdpa(ids).logits
        assert not calls  # SDPA never takes the upcast path
        out = eager(ids).logits
        assert len(calls) == 3  # eager takes it in every layer
        torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            sdpa_bf16, eager_bf16 = sdpa(ids).logits.float(), eager(ids).logits.float()
    scale = ref.abs().max()
    err_sdpa, err_eager = (sdpa_bf16 - ref).abs().max() / scale, (eager_bf16 - ref).abs().max() / scale
    assert err_sdpa < 0.05 and err_eager < 0.05
    assert err_sdpa < 2 * err_eager + 1e-3


def test_saved_model_keeps_its_attention_implementation(tmp_path, code_tokenizer):
    cfg = ModelConfig(n_layer=2, n_embd=32, n_head=2, n_positions=32, attn_implementation="eager")
    model = build_model(to_gpt2_config(cfg, code_tokenizer), seed=0)
    model.save_pretrained(tmp_path / "m")
    loaded = load_pretrained_model(str(tmp_path / "m"))
    assert loaded.config._attn_implementation == "eager"
    assert all(torch.equal(x, y) for x, y in zip(model.state_dict().values(), loaded.state_dict().values()))
    with pytest.raises(CodeParrotError, match="no config.json"):
        (tmp_path / "empty").mkdir()
        load_pretrained_model(str(tmp_path / "empty"))

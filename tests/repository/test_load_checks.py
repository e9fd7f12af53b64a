"""What loading a model refuses: weights that do not fill the model config.json describes (missing tensors, tensors
of another shape or of another model), impossible presets (non-finite floats, an activation transformers does not
know), and a revision cache that cannot be written. Each is one line naming what to fix."""

from __future__ import annotations

import errno
import json
import logging
import math

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import GPT2Config, GPT2LMHeadModel

from codeparrot.errors import CodeParrotError
from codeparrot.repository.local import LocalGitRepository
from codeparrot.repository.model import ModelConfig, load_pretrained_model
from codeparrot.repository.refs import cache_root, resolve_model_dir


def tiny_folder(path, n_embd: int = 16, n_layer: int = 2, **config):
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=32, n_positions=16, n_embd=n_embd, n_layer=n_layer, n_head=2,
                                       **config))
    model.save_pretrained(path)
    return path


def test_missing_tensors_are_refused_not_initialized(tmp_path, caplog):
    """A weights file lacking a layer loaded with that layer randomly initialized, a "LOAD REPORT" table and exit 0
    (validation_loss, generate, human_eval, serve); now one line naming the folder, the count and the first keys,
    with no table before it. A tied LM head absent from the file (as GPT-2 saves it) is no missing tensor."""
    folder = tiny_folder(tmp_path / "m")
    weights = load_file(folder / "model.safetensors")
    assert "lm_head.weight" not in weights  # tied to the token embedding: legitimately absent
    load_pretrained_model(str(folder))
    save_file({k: v for k, v in weights.items() if not k.startswith("transformer.h.1.")}, folder / "model.safetensors",
              metadata={"format": "pt"})
    with caplog.at_level(logging.WARNING), pytest.raises(CodeParrotError) as err:
        load_pretrained_model(str(folder))
    message = str(err.value)
    assert message.startswith(f"cannot load the model in {folder}: ") and "\n" not in message
    assert "12 tensor(s) missing from the weights (transformer.h.1.ln_1.weight, transformer.h.1.ln_1.bias, " in message
    assert "LOAD REPORT" not in caplog.text


def test_an_untied_head_must_be_in_the_file(tmp_path):
    folder = tiny_folder(tmp_path / "m", tie_word_embeddings=False)
    load_pretrained_model(str(folder))
    weights = load_file(folder / "model.safetensors")
    save_file({k: v for k, v in weights.items() if k != "lm_head.weight"}, folder / "model.safetensors",
              metadata={"format": "pt"})
    with pytest.raises(CodeParrotError, match=r"1 tensor\(s\) missing from the weights \(lm_head.weight\)"):
        load_pretrained_model(str(folder))


def test_weights_of_another_model_are_refused(tmp_path, caplog):
    """Another config's model.safetensors in a model folder was a RuntimeError traceback pointing at a report; now one
    line naming the first tensor of the wrong shape with both shapes, and the tensors the model has no place for."""
    folder = tiny_folder(tmp_path / "m")
    other = tiny_folder(tmp_path / "other", n_embd=8, n_layer=3)
    (folder / "model.safetensors").write_bytes((other / "model.safetensors").read_bytes())
    with caplog.at_level(logging.WARNING), pytest.raises(CodeParrotError) as err:
        load_pretrained_model(str(folder))
    message = str(err.value)
    assert message.startswith(f"cannot load the model in {folder}: ") and "\n" not in message
    assert "tensor(s) of the wrong shape (first: transformer.wte.weight is [32, 8] in the weights, [32, 16] by " \
           "config.json)" in message
    # 11 of layer 2's 12: transformers' ignore pattern "attn.bias" (old mask buffers) also matches c_attn.bias
    assert "11 tensor(s) the model has no place for (transformer.h.2." in message
    assert "LOAD REPORT" not in caplog.text


@pytest.mark.parametrize("field, value", [("initializer_range", math.nan), ("initializer_range", math.inf),
                                          ("layer_norm_epsilon", math.inf), ("layer_norm_epsilon", math.nan),
                                          ("layer_norm_epsilon", 0.0), ("initializer_range", -0.02)])
def test_non_finite_or_non_positive_floats_are_refused(field, value):
    """nan reached torch's init (`normal expects std >= 0.0`), inf was accepted; now one line naming the key."""
    with pytest.raises(CodeParrotError, match=rf"^{field} must be a positive finite number, got {value}$"):
        ModelConfig(**{field: value}).validate()


def test_an_unknown_activation_is_refused_with_the_known_ones():
    """Was a KeyError from transformers/activations.py while building the model."""
    with pytest.raises(CodeParrotError, match=r"activation_function 'bogus' is not one transformers knows; use one "
                                              r"of: .*gelu_new, .*gelu_pytorch_tanh, .*relu"):
        ModelConfig(activation_function="bogus").validate()
    ModelConfig(activation_function="gelu_new").validate()


@pytest.fixture()
def repo(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    local = LocalGitRepository(tmp_path / "repo.git", create=True, use_lfs=False)
    local.commit_folder(model, "main", "initial model")
    return local


def test_a_cache_under_a_file_is_a_one_line_error(repo, tmp_path, monkeypatch):
    """CODEPARROT_CACHE below a regular file was a NotADirectoryError traceback in every CLI loading a revision."""
    (tmp_path / "afile").write_text("")
    monkeypatch.setenv("CODEPARROT_CACHE", str(tmp_path / "afile" / "x"))
    with pytest.raises(CodeParrotError) as err:
        resolve_model_dir(str(repo.path), "main")
    message = str(err.value)
    assert f"into the revision cache {tmp_path / 'afile' / 'x' / 'revisions'}: {tmp_path / 'afile'} is a file" \
           in message and message.endswith("set CODEPARROT_CACHE to a folder you can write to")


def test_a_cache_write_failure_is_a_one_line_error(repo, tmp_path, monkeypatch):
    """A read-only or over-quota cache failing while the revision is written (a PermissionError traceback before);
    nothing half-written is left under the commit's name, and a writable cache then works."""
    monkeypatch.setenv("CODEPARROT_CACHE", str(tmp_path / "cache"))

    def full(self, commit, dest):
        raise OSError(errno.EDQUOT, "Disk quota exceeded", str(dest / "model.safetensors"))

    monkeypatch.setattr(LocalGitRepository, "checkout_into", full)
    with pytest.raises(CodeParrotError, match=r"into the revision cache .*/cache/revisions: Disk quota exceeded; "
                                              r"set CODEPARROT_CACHE to a folder you can write to$"):
        resolve_model_dir(str(repo.path), "main")
    assert not any(cache_root().iterdir())
    monkeypatch.undo()
    monkeypatch.setenv("CODEPARROT_CACHE", str(tmp_path / "cache"))
    assert (resolve_model_dir(str(repo.path), "main") / "config.json").is_file()

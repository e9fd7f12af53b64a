"""GPT-2 model presets (typed YAML configs) and model construction.

A preset (`configs/model/*.yaml`) fixes the architecture; the vocabulary and the BOS/EOS/PAD ids always
come from the tokenizer (`to_gpt2_config`), never from GPT-2's 50257/50256.

Attention: CodeParrot trained with `scale_attn_by_inverse_layer_idx=True` and `reorder_and_upcast_attn=True`.
In transformers 5 the inverse-layer scaling is folded into the softmax scale of every attention
implementation, while `reorder_and_upcast_attn` (compute QK^T and softmax in fp32 under autocast) is only
honoured by the "eager" implementation. The project keeps both flags in the config for fidelity and defaults
to "sdpa": fused SDPA kernels already accumulate QK^T and the softmax in fp32 even for bf16/fp16 inputs, which
is what the upcast protected against, and they are much faster. `attn_implementation: eager` gives the
original numerics exactly. In fp32 both paths compute the same function (tested).
"""

from __future__ import annotations

import json
import logging
import math
import os
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch
import transformers
from safetensors import SafetensorError
from transformers import GPT2Config, GPT2LMHeadModel
from transformers.activations import ACT2FN

from codeparrot.atomic_io import process_umask
from codeparrot.config import doc, load_config
from codeparrot.errors import CodeParrotError, first_line
from codeparrot.repository.local import lfs_pointers
from codeparrot.repository.refs import resolve_model_dir
from codeparrot.tokenizer import load_tokenizer


@dataclass
class ModelConfig:
    """The architecture of a GPT-2 model; the vocabulary comes from the tokenizer."""

    n_layer: int = doc(12, "Number of transformer blocks.")
    n_embd: int = doc(768, "Hidden size (width of the residual stream); must be divisible by n_head.")
    n_head: int = doc(12, "Attention heads per block; head size = n_embd / n_head.")
    n_positions: int = doc(1024, "Context length: the longest sequence the model accepts (learned positions).")
    n_inner: int | None = doc(None, "MLP hidden size; null means 4 * n_embd (GPT-2).")
    activation_function: str = doc("gelu_pytorch_tanh", "MLP activation. gelu_pytorch_tanh: GPT-2's gelu_new (the tanh "
                                   "approximation) as one fused kernel; gelu_new: the same function as a chain "
                                   "of elementwise ops (older checkpoints).")
    resid_pdrop: float = doc(0.1, "Dropout on the residual branches (attention and MLP outputs).")
    embd_pdrop: float = doc(0.1, "Dropout on the token + position embeddings.")
    attn_pdrop: float = doc(0.1, "Dropout on the attention probabilities.")
    layer_norm_epsilon: float = doc(1e-5, "LayerNorm epsilon.")
    initializer_range: float = doc(
        0.02, "Std of the normal init of weights; residual projections use std / sqrt(2 * n_layer) (GPT-2).")
    scale_attn_by_inverse_layer_idx: bool = doc(
        True, "Divide attention scores of layer i (0-based) by i + 1 as well (CodeParrot: true).")
    reorder_and_upcast_attn: bool = doc(
        True, "Compute QK^T and softmax in fp32 under mixed precision (CodeParrot: true). transformers 5 honours "
              "it only with attn_implementation=eager; sdpa kernels accumulate in fp32 anyway.")
    attn_implementation: Literal["sdpa", "eager"] = doc(
        "sdpa", "Attention kernel: sdpa (fused, fast, default) or eager (the original numerics, slower).")
    tie_word_embeddings: bool = doc(True, "Share the token embedding with the LM head (GPT-2).")

    def validate(self) -> None:
        """Reject impossible shapes with a one-line error naming the field."""
        for name in ("n_layer", "n_embd", "n_head", "n_positions"):
            if getattr(self, name) <= 0:
                raise CodeParrotError(f"{name} must be positive, got {getattr(self, name)}")
        if self.n_embd % self.n_head:
            raise CodeParrotError(
                f"n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head}): "
                f"{self.n_embd} / {self.n_head} = {self.n_embd / self.n_head:.3g} is not a whole head size")
        if self.n_inner is not None and self.n_inner <= 0:
            raise CodeParrotError(f"n_inner must be positive or null, got {self.n_inner}")
        for name in ("resid_pdrop", "embd_pdrop", "attn_pdrop"):
            if not 0.0 <= getattr(self, name) < 1.0:  # also false for nan
                raise CodeParrotError(f"{name} must be in [0, 1), got {getattr(self, name)}")
        for name in ("initializer_range", "layer_norm_epsilon"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):  # nan and inf would reach torch's init or every LayerNorm
                raise CodeParrotError(f"{name} must be a positive finite number, got {value}")
        if self.activation_function not in ACT2FN:  # transformers would fail with a KeyError building the MLPs
            raise CodeParrotError(f"activation_function {self.activation_function!r} is not one transformers knows; "
                                  f"use one of: {', '.join(sorted(ACT2FN))}")


def load_model_config(path: str, overrides: list[str] | None = None) -> ModelConfig:
    """A preset from YAML with dotted CLI overrides; unknown keys and bad shapes are one-line errors."""
    return load_config(ModelConfig, path, overrides)


def gpt2_config(cfg: ModelConfig, vocab_size: int, bos_token_id: int, eos_token_id: int,
                pad_token_id: int | None = None):
    """The `transformers.GPT2Config` for `cfg` with an explicit vocabulary (what `to_gpt2_config` calls)."""

    cfg.validate()
    if vocab_size <= 0:
        raise CodeParrotError(f"vocab_size must be positive, got {vocab_size}")
    for name, value in (("bos_token_id", bos_token_id), ("eos_token_id", eos_token_id), ("pad_token_id", pad_token_id)):
        if value is not None and not 0 <= value < vocab_size:
            raise CodeParrotError(f"{name} {value} is outside the vocabulary of {vocab_size}")
    config = GPT2Config(
        vocab_size=vocab_size,
        n_positions=cfg.n_positions,
        n_embd=cfg.n_embd,
        n_layer=cfg.n_layer,
        n_head=cfg.n_head,
        n_inner=cfg.n_inner,
        activation_function=cfg.activation_function,
        resid_pdrop=cfg.resid_pdrop,
        embd_pdrop=cfg.embd_pdrop,
        attn_pdrop=cfg.attn_pdrop,
        layer_norm_epsilon=cfg.layer_norm_epsilon,
        initializer_range=cfg.initializer_range,
        scale_attn_by_inverse_layer_idx=cfg.scale_attn_by_inverse_layer_idx,
        reorder_and_upcast_attn=cfg.reorder_and_upcast_attn,
        tie_word_embeddings=cfg.tie_word_embeddings,
        bos_token_id=bos_token_id,
        eos_token_id=eos_token_id,
        pad_token_id=eos_token_id if pad_token_id is None else pad_token_id,
        # A fixed loss type: without it transformers guesses on every forward, which breaks torch.compile graphs.
        loss_type="ForCausalLM",
        attn_implementation=cfg.attn_implementation,
        # transformers does not save the attention implementation in config.json; this key does, and
        # `load_pretrained_model` passes it back to `from_pretrained`.
        codeparrot_attn_implementation=cfg.attn_implementation,
    )
    return config


def to_gpt2_config(cfg: ModelConfig, tokenizer):
    """`cfg` with the tokenizer's vocabulary size and BOS/EOS/PAD ids (PAD = EOS when the tokenizer has none)."""
    eos = tokenizer.eos_token_id
    if eos is None:
        raise CodeParrotError("the tokenizer has no EOS token")
    bos = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else eos
    return gpt2_config(cfg, len(tokenizer), bos, eos, tokenizer.pad_token_id)


def _meta_model(config):
    """The model built on the meta device: shapes only, no memory, no initialization cost."""

    with torch.device("meta"):
        return GPT2LMHeadModel(config)


def count_parameters(config) -> int:
    """Number of distinct parameters (a tied LM head counted once), computed without allocating weights."""
    return sum(p.numel() for p in _meta_model(config).parameters())


def matmul_parameters(config) -> int:
    """Parameters that take part in a matmul, the N of the MFU formula 6N + 12*L*H*Q*T (PaLM appendix B):
    everything except the position embeddings. The token embedding counts once (it is the tied LM head)."""
    model = _meta_model(config)
    total = sum(p.numel() for p in model.parameters())
    return total - model.transformer.wpe.weight.numel()


def build_model(config, seed: int | None = None):
    """A freshly initialized fp32 `GPT2LMHeadModel` (GPT-2 init: N(0, initializer_range), residual projections
    scaled by 1/sqrt(2 * n_layer)). `seed` makes the initialization reproducible."""

    if seed is not None:
        torch.manual_seed(seed)
    model = GPT2LMHeadModel(config)
    if model.config.tie_word_embeddings:
        assert model.lm_head.weight.data_ptr() == model.transformer.wte.weight.data_ptr(), "LM head is not tied"
    return model


def read_model_config(folder: Path) -> dict:
    """The model folder's config.json as a dict (before any weights load), or a one-line error naming it."""
    config_file = folder / "config.json"
    if not config_file.is_file():
        raise CodeParrotError(f"{folder} holds no model (no config.json)")
    try:
        saved = json.loads(config_file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise CodeParrotError(f"{config_file}: unreadable model config: {err}") from None
    if not isinstance(saved, dict):
        raise CodeParrotError(f"{config_file}: not a JSON object")
    return saved


def load_pretrained_model(ref: str, revision: str | None = None, **kwargs):
    """`GPT2LMHeadModel.from_pretrained` on a model folder, a local checkpoint repository or a Hub id, with the
    attention implementation the preset chose (saved as `codeparrot_attn_implementation` in config.json).
    Extra keyword arguments (e.g. `dtype`) go to `from_pretrained`."""
    folder = resolve_model_dir(ref, revision)
    saved = read_model_config(folder)
    kwargs.setdefault("attn_implementation", saved.get("codeparrot_attn_implementation", "sdpa"))
    try:
        # ignore_mismatched_sizes: a wrong shape is then reported in `info` (and refused by `check_loaded_weights`)
        # instead of raised as a RuntimeError pointing at the load report.
        with quiet_transformers_bars(), held_load_report():
            model, info = GPT2LMHeadModel.from_pretrained(str(folder), output_loading_info=True,
                                                          ignore_mismatched_sizes=True, **kwargs)
    except (OSError, ValueError) as err:
        raise CodeParrotError(f"cannot load the model in {folder}: {first_line(err)}") from None
    except SafetensorError as err:  # not an OSError: a truncated file, or a git-lfs pointer in place of the weights
        pointers = [p for p in lfs_pointers(folder) if p.suffix == ".safetensors"]
        if pointers:
            raise CodeParrotError(f"cannot load the weights {pointers[0]}: it is a git-lfs pointer, not the weights "
                                  "(install git-lfs and run `git lfs pull`)") from None
        files = sorted(folder.glob("*.safetensors"))
        where = files[0] if len(files) == 1 else folder / "*.safetensors"
        raise CodeParrotError(f"cannot load the weights {where}: {first_line(err)}") from None
    check_loaded_weights(model, info, folder)
    skip_padding_check(model)
    return model


def check_loaded_weights(model, info: dict, folder: Path) -> None:
    """A one-line error when the weights file did not fill the model config.json describes: transformers would
    go on with randomly initialized tensors in place of missing or wrongly shaped ones (and drop tensors the model
    has no place for). `info`: `from_pretrained`'s loading info, after its own rules (a tied LM head absent from
    the file, attention-mask buffers of old checkpoints) have taken out what is legitimately absent or extra."""
    order = {name: i for i, name in enumerate(model.state_dict())}  # report tensors in the model's own order
    problems = []
    mismatched = sorted(info.get("mismatched_keys") or (), key=lambda m: order.get(m[0], len(order)))
    if mismatched:
        name, in_file, in_model = mismatched[0]
        problems.append(f"{len(mismatched)} tensor(s) of the wrong shape (first: {name} is {list(in_file)} in the "
                        f"weights, {list(in_model)} by config.json)")
    missing = sorted(info.get("missing_keys") or (), key=lambda k: order.get(k, len(order)))
    if missing:
        problems.append(f"{len(missing)} tensor(s) missing from the weights ({_first_few(missing)})")
    unexpected = sorted(info.get("unexpected_keys") or ())
    if unexpected:
        problems.append(f"{len(unexpected)} tensor(s) the model has no place for ({_first_few(unexpected)})")
    if problems:
        raise CodeParrotError(f"cannot load the model in {folder}: its weights do not fit its config.json: "
                              f"{'; '.join(problems)}; the folder mixes two models or its weights file is damaged: "
                              "save the model again or restore its weights")


def _first_few(names: list[str], shown: int = 3) -> str:
    return ", ".join(names[:shown]) + (", ..." if len(names) > shown else "")


@contextmanager
def held_load_report():
    """Hold back transformers' LOAD REPORT table (a warning of `transformers.modeling_utils`) inside: every entry
    it lists (missing, unexpected, mismatched tensors) is refused afterwards in one line by `check_loaded_weights`,
    so the table would only precede that line. Should loading fail otherwise, the table is logged after all: its
    RuntimeError then points at it."""
    logger = logging.getLogger("transformers.modeling_utils")
    held: list[logging.LogRecord] = []

    def hold(record: logging.LogRecord) -> bool:
        if "LOAD REPORT" in str(record.msg):
            held.append(record)
            return False
        return True

    logger.addFilter(hold)
    try:
        yield
    except BaseException:
        logger.removeFilter(hold)
        for record in held:
            logger.handle(record)
        raise
    finally:
        logger.removeFilter(hold)


def skip_padding_check(model) -> None:
    """Turn off transformers' "input looks padded" warning check on `model` (in place).

    It runs `pad_token_id in input_ids[:, [-1, 0]]` on every forward without an attention mask: a device->host
    sync per micro-step on a GPU, for a warning that never applies here (training sequences are packed, never
    padded, and EOS, which starts or ends many of them, doubles as PAD; generation drops an all-ones mask at
    prefill and would warn in the middle of a streamed completion, while a padded batch keeps its mask)."""
    base = getattr(model, "base_model", model)
    base.warn_if_padding_and_no_attention_mask = lambda input_ids, attention_mask: None


def check_model_tokenizer(config, tokenizer, where: str, seq_length: int | None = None) -> None:
    """One check for every stage that pairs a model with a tokenizer (training, validation, generation,
    highlighting): the same vocabulary size and EOS id, and a sequence length within the model's context.
    `config` is the model's config (a `PretrainedConfig` or the dict of its config.json); `where` names the
    model in the one-line error."""
    cfg = config if isinstance(config, dict) else config.to_dict()
    vocab = cfg.get("vocab_size")
    if vocab != len(tokenizer):
        raise CodeParrotError(f"tokenizer/model vocabulary mismatch: the tokenizer has {len(tokenizer):,} tokens, "
                              f"the model's vocab_size is {vocab:,} ({where}); they do not belong together")
    eos = cfg.get("eos_token_id")
    if eos is not None and eos != tokenizer.eos_token_id:
        raise CodeParrotError(f"tokenizer/model EOS mismatch: tokenizer EOS id {tokenizer.eos_token_id}, model {eos} "
                              f"({where})")
    n_positions = cfg.get("n_positions", cfg.get("max_position_embeddings"))
    if seq_length is not None and n_positions is not None and seq_length > n_positions:
        raise CodeParrotError(f"seq length {seq_length} is larger than the model's context (n_positions "
                              f"{n_positions})")


# ---------------------------------------------------------------------------------------------- loading
def resolve_device(device: str = "auto") -> torch.device:
    """`auto` picks CUDA when available; an unavailable explicit device is a one-line error."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except RuntimeError as err:
        raise CodeParrotError(f"--device {device!r} is not a device name ({err})") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise CodeParrotError(f"--device {device}: CUDA is not available on this machine")
    return dev


def load_model_and_tokenizer(ref: str, revision: str | None = None, device: str = "auto"):
    """Load (model in eval mode on `device`, tokenizer) for a repository reference and revision.

    A missing repository, an unknown revision or a folder without weights is a `CodeParrotError`.
    Weights load in float32 on CPU (bf16 matmuls on CPU are slow and lossy for scoring) and in the saved
    dtype on GPU; the attention implementation is the one the model preset chose.
    """
    dev = resolve_device(device)
    folder = resolve_model_dir(ref, revision)
    where = f"{ref}" + (f" at revision {revision}" if revision else "")
    if not (folder / "config.json").is_file():
        raise CodeParrotError(f"{where}: no config.json in {folder}; not a model folder")
    tokenizer = load_tokenizer(str(folder))
    model = load_pretrained_model(str(folder), dtype=torch.float32 if dev.type == "cpu" else "auto")
    check_model_tokenizer(model.config, tokenizer, where)
    return model.to(dev).eval(), tokenizer


def model_context(model) -> int:
    """Maximum sequence length the model's position embeddings support."""
    cfg = model.config
    for name in ("n_positions", "max_position_embeddings", "n_ctx"):
        value = getattr(cfg, name, None)
        if isinstance(value, int) and value > 0:
            return value
    raise CodeParrotError(f"cannot tell the context length of a {type(model).__name__} model")


@contextmanager
def quiet_transformers_bars():
    """No transformers progress bar ("Loading weights", "Writing model shards") inside: one appears at every
    save and load, in the middle of our own progress lines and in every log file."""
    was_enabled = transformers.utils.logging.is_progress_bar_enabled()
    transformers.utils.logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            transformers.utils.logging.enable_progress_bar()


def save_model_folder(model, folder, tokenizer=None, state_dict: dict | None = None) -> None:
    """`folder` gets what `from_pretrained` loads: config.json and model.safetensors (from `state_dict` when
    given, e.g. weights gathered from shards), plus the tokenizer's files when one is given. The weights get the
    mode of any new file, as the files beside them: the safetensors writer makes them 0600, unreadable to the
    run's group (a shared checkpoint folder, a team's model repository)."""
    with quiet_transformers_bars():
        model.save_pretrained(folder, state_dict=state_dict, safe_serialization=True)
        if tokenizer is not None:
            tokenizer.save_pretrained(folder)
    mode = 0o666 & ~process_umask()
    for weights in Path(folder).glob("*.safetensors"):
        os.chmod(weights, mode)

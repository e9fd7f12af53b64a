"""gpu_check's JAX peer (codeparrot/tools/gpu_check/jax_step.py) trains the same model as this project: given the
same weights and batch it computes the same losses and takes the same clipped AdamW steps as the recipe's torch
model and optimizer (fp32, dropout off: the masks of two frameworks' random generators cannot be compared, the
rate is the preset's). Its tokens/s ratio is only a fair comparison if that holds.

JAX is not a dependency of the project: these tests run where jax is importable (the GPU image has it; locally,
a venv with jax) and are skipped elsewhere."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

jax = pytest.importorskip("jax")

from transformers import GPT2LMHeadModel  # noqa: E402

from codeparrot.repository.model import gpt2_config, load_model_config  # noqa: E402
from codeparrot.tools.gpu_check.jax_step import decays, make_step  # noqa: E402
from codeparrot.training.config import OptimConfig  # noqa: E402
from codeparrot.training.optim import build_optimizer  # noqa: E402

PRESET = Path(__file__).resolve().parents[2] / "configs" / "model" / "codeparrot-small.yaml"
VOCAB, LAYERS, WIDTH, HEADS, SEQ, BATCH = 96, 3, 64, 4, 16, 2


@pytest.fixture(autouse=True)
def jax_on_cpu_in_full_precision():
    """The comparison is of mathematics: JAX on the CPU (also where it sees a GPU, whose fp32 matmuls may run in
    TF32) with full-precision matmuls, as the torch side."""
    with jax.default_device(jax.devices("cpu")[0]), jax.default_matmul_precision("highest"):
        yield


def torch_model() -> GPT2LMHeadModel:
    """The codeparrot-small preset (inverse-layer attention scale, GELU, tied head) at a test size, no dropout."""
    sizes = {"n_layer": LAYERS, "n_embd": WIDTH, "n_head": HEADS, "n_positions": SEQ, "resid_pdrop": 0.0,
             "embd_pdrop": 0.0, "attn_pdrop": 0.0}
    cfg = load_model_config(str(PRESET), [f"--{key}={value}" for key, value in sizes.items()])
    torch.manual_seed(0)
    model = GPT2LMHeadModel(gpt2_config(cfg, VOCAB, 0, 0)).float()
    with torch.no_grad():  # every weight, bias and gain non-zero and large enough that weight decay on it shows
        for param in model.parameters():
            param.normal_(0.0, 0.3)
    return model


def jax_params(model: GPT2LMHeadModel) -> dict:
    """The torch weights in the peer's layout (GPT-2's Conv1D kernels are already [in, out])."""
    jnp = jax.numpy
    t = model.transformer
    a = lambda tensor: jnp.asarray(tensor.detach().numpy())  # noqa: E731
    stack = lambda get: jnp.stack([a(get(block)) for block in t.h])  # noqa: E731
    blocks = {"ln1_g": stack(lambda b: b.ln_1.weight), "ln1_b": stack(lambda b: b.ln_1.bias),
              "attn_w": stack(lambda b: b.attn.c_attn.weight), "attn_b": stack(lambda b: b.attn.c_attn.bias),
              "proj_w": stack(lambda b: b.attn.c_proj.weight), "proj_b": stack(lambda b: b.attn.c_proj.bias),
              "ln2_g": stack(lambda b: b.ln_2.weight), "ln2_b": stack(lambda b: b.ln_2.bias),
              "fc_w": stack(lambda b: b.mlp.c_fc.weight), "fc_b": stack(lambda b: b.mlp.c_fc.bias),
              "out_w": stack(lambda b: b.mlp.c_proj.weight), "out_b": stack(lambda b: b.mlp.c_proj.bias)}
    return {"wte": a(t.wte.weight), "wpe": a(t.wpe.weight), "ln_f_g": a(t.ln_f.weight), "ln_f_b": a(t.ln_f.bias),
            "blocks": blocks}


def _with_grads_as_weights(model: GPT2LMHeadModel) -> GPT2LMHeadModel:
    """A copy of `model` whose weights are its gradients (so `jax_params` lays the gradients out)."""
    grads = GPT2LMHeadModel(model.config)
    with torch.no_grad():
        for ours, copy in zip(model.parameters(), grads.parameters()):
            copy.copy_(ours.grad)
    return grads


@pytest.mark.parametrize("attention", ["softmax", "fused"])
def test_the_jax_peer_computes_the_recipe_s_losses_and_adamw_steps(attention):
    model = torch_model()
    assert model.config.scale_attn_by_inverse_layer_idx and model.config.tie_word_embeddings  # the recipe's model
    tokens = torch.randint(0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(1))
    params = jax_params(model)
    spec = {"n_layer": LAYERS, "n_head": HEADS, "dropout": 0.0, "dtype": "float32"}

    # torch, two steps on one batch: the model's own loss (mean next-token cross-entropy), the global gradient
    # norm clipped to 1.0, the recipe's AdamW. Two, because AdamW's first update lr·g/(|g| + eps) does not depend
    # on the gradient's scale (nor on the clipping); the second does.
    optim = OptimConfig()
    optimizer = build_optimizer(model, optim, torch.device("cpu"))
    losses, norms, small = [], [], None
    for _ in range(2):
        loss = model(input_ids=tokens, labels=tokens).loss
        loss.backward()
        norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), optim.max_grad_norm)))
        grads = jax_params(_with_grads_as_weights(model))  # the clipped gradients, in the peer's layout
        tiny = jax.tree_util.tree_map(lambda g: np.abs(np.asarray(g)) <= 1e-6, grads)
        small = tiny if small is None else jax.tree_util.tree_map(np.logical_or, small, tiny)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    assert min(norms) > 1.2 * optim.max_grad_norm  # the clipping is in play at both steps

    opt = {"m": jax.tree_util.tree_map(jax.numpy.zeros_like, params),
           "v": jax.tree_util.tree_map(jax.numpy.zeros_like, params), "t": jax.numpy.zeros((), "float32")}
    step = make_step(jax, spec, attention, decays(params))
    batch, jax_losses = jax.numpy.asarray(tokens.numpy()), []
    for i in range(2):
        params, opt, jax_loss = step(params, opt, batch, jax.random.key(i))
        jax_losses.append(float(jax_loss))

    assert jax_losses == pytest.approx(losses, rel=1e-5)
    assert losses[0] > math.log(VOCAB) / 2 and losses[1] < losses[0]  # a real loss, and the step trains
    leaves = zip(jax.tree_util.tree_leaves_with_path(jax_params(model)), jax.tree_util.tree_leaves(params),
                 jax.tree_util.tree_leaves(small))
    for (path, ours, theirs, skip) in ((p, o, t, s) for (p, o), t, s in leaves):
        # Each AdamW step moves a weight by about ±lr = 5e-4, plus its decay lr·0.1·w ≈ 1.5e-5: a wrong clip, decay
        # split or bias correction shows far above 1e-6. Where |g| is within rounding of eps (the key bias, whose
        # gradient is 0 in exact arithmetic: softmax ignores a per-row constant) the update is rounding noise in
        # both implementations, so those elements are not compared.
        name = jax.tree_util.keystr(path)
        skip = np.asarray(skip)
        assert skip.mean() < 0.5 or name.endswith("['attn_b']"), f"{name}: too few gradients to compare"
        diff = np.abs(np.asarray(theirs) - np.asarray(ours))[~skip]
        assert diff.size == 0 or diff.max() < 1e-6, f"{name}: a weight differs by {diff.max():.2e} after two steps"


def test_a_refused_fused_kernel_falls_back_to_jax_s_default_and_says_so(monkeypatch):
    from codeparrot.tools.gpu_check import jax_step

    # On a GPU the fused variant asks for cuDNN first; on this CPU cuDNN is refused, which is the path to check
    monkeypatch.setattr(jax_step, "implementations", lambda jax, attention: ["cudnn", None])
    spec = {"vocab_size": VOCAB, "n_positions": SEQ, "seq_length": SEQ, "n_layer": 2, "n_embd": 32, "n_head": 2,
            "dropout": 0.1, "micro_batch": 2, "steps": 2, "warmup_steps": 1, "dtype": "float32", "seed": 0}
    row = jax_step.run_variant(jax, spec, "fused")
    assert row["attention_implementation"] == "jax default" and row["variant"] == "jax, fused attention"
    assert len(row["attention_refused"]) == 1 and row["attention_refused"][0].startswith("cudnn: ")
    assert row["tokens_per_s"] > 0 and row["last_loss"] < row["first_loss"]

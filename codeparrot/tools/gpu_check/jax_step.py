"""The `jax` stage's peer: the same GPT-2 training step in plain JAX, run in its own process.

    python -m codeparrot.tools.gpu_check.jax_step SPEC_JSON

Imports nothing but jax and the standard library (no flax, no optax, no torch, nothing of this project), so it
runs under any Python that has jax, and JAX never becomes a dependency of the project. Its own process because
JAX and torch each keep their own GPU memory pool, and so that the caller can kill it at its time budget.

The model is the preset's GPT-2 (SPEC: vocabulary, width, heads, layers, dropout), written in jax.numpy:
fp32 master weights, matmuls in SPEC["dtype"] (bf16 on a GPU) with the residual stream, LayerNorm, softmax and
loss in fp32 (what torch's autocast does), GELU's tanh form, causal attention with GPT-2's inverse-layer scale,
dropout on the embeddings, attention probabilities and both residual branches, the tied LM head, mean
next-token cross-entropy; the blocks' weights stacked and run by `lax.scan` (one compiled block for all, as the
recipe compiles one graph per block). AdamW written out (betas 0.9/0.999, eps 1e-8, decoupled weight decay 0.1
on weights and embeddings only, lr 5e-4) after clipping the global gradient norm to 1.0, as the recipe does.
Dropout masks come from XLA's RngBitGenerator (jax's "rbg" PRNG, Philox on a GPU, as torch's dropout), not
jax's default threefry, which is several times slower for masks this size.

Attention variants (SPEC["attention"]): "softmax" materializes softmax(QKᵀ) with dropout on it (GPT-2 exactly;
the scores in the matmul dtype, then fp32); "fused" is jax.nn.dot_product_attention(is_causal=True), asked for
cuDNN's fused kernel on a GPU (jax's default there is XLA's unfused one) and falling back to jax's default where
cuDNN refuses (the row says which ran, and why the other was refused); it has no dropout on the probabilities
(the other dropouts stay).

Prints one line per result, `GPU_CHECK_JAX {json}`: {"info": ...} first, then {"row": ...} per variant, or one
{"skipped": reason} when jax cannot run here.
"""

from __future__ import annotations

import json
import math
import sys
import time
from statistics import median

MARK = "GPU_CHECK_JAX "
LR, BETAS, EPS, WEIGHT_DECAY, MAX_GRAD_NORM = 5e-4, (0.9, 0.999), 1e-8, 0.1, 1.0


def emit(entry: dict) -> None:
    print(MARK + json.dumps(entry), flush=True)


def one_line(err: BaseException, width: int) -> str:
    """`Type: first line of the message`, the message cut to `width` characters (jax's errors span pages)."""
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0][:width] if text else ''}"


def init_params(jax, spec: dict, key) -> dict:
    """GPT-2's init: N(0, 0.02), the residual projections N(0, 0.02 / sqrt(2 L)), zero biases, unit gains."""
    jnp = jax.numpy
    V, P, D, L = spec["vocab_size"], spec["n_positions"], spec["n_embd"], spec["n_layer"]
    k = iter(jax.random.split(key, 6))
    normal = lambda shape, std: std * jax.random.normal(next(k), shape, jnp.float32)  # noqa: E731
    proj = 0.02 / math.sqrt(2 * L)
    blocks = {"ln1_g": jnp.ones((L, D)), "ln1_b": jnp.zeros((L, D)), "attn_w": normal((L, D, 3 * D), 0.02),
              "attn_b": jnp.zeros((L, 3 * D)), "proj_w": normal((L, D, D), proj), "proj_b": jnp.zeros((L, D)),
              "ln2_g": jnp.ones((L, D)), "ln2_b": jnp.zeros((L, D)), "fc_w": normal((L, D, 4 * D), 0.02),
              "fc_b": jnp.zeros((L, 4 * D)), "out_w": normal((L, 4 * D, D), proj), "out_b": jnp.zeros((L, D))}
    return {"wte": normal((V, D), 0.02), "wpe": normal((P, D), 0.02), "ln_f_g": jnp.ones(D),
            "ln_f_b": jnp.zeros(D), "blocks": blocks}


def decays(params: dict) -> dict:
    """Weight decay on matmul weights and embeddings, not on biases and LayerNorm (the recipe's split)."""
    return {name: decays(value) if isinstance(value, dict) else (name.endswith("_w") or name in ("wte", "wpe"))
            for name, value in params.items()}


def make_step(jax, spec: dict, attention: str, mask: dict, implementation: str | None = None):
    """The jitted `step(params, opt, tokens, key) -> (params, opt, loss)`; `mask`: `decays(params)`;
    `implementation`: jax.nn.dot_product_attention's, for the "fused" attention (None: jax's default)."""
    jnp, lax = jax.numpy, jax.lax
    dt = jnp.dtype(spec["dtype"])
    rate, H = spec["dropout"], spec["n_head"]

    def dropout(x, key):
        if rate == 0.0:
            return x
        return jnp.where(jax.random.bernoulli(key, 1.0 - rate, x.shape), x / (1.0 - rate), 0).astype(x.dtype)

    def layer_norm(x, g, b):  # fp32, eps as GPT-2
        mean = x.mean(-1, keepdims=True)
        var = jnp.square(x - mean).mean(-1, keepdims=True)
        return (x - mean) * lax.rsqrt(var + 1e-5) * g + b

    def dense(x, w, b):
        return jnp.einsum("btd,df->btf", x.astype(dt), w.astype(dt)) + b.astype(dt)

    def attend(q, k, v, key):  # [B, T, H, Q] each; q already carries 1/(layer + 1)
        base = q.shape[-1] ** -0.5
        if attention == "fused":
            return jax.nn.dot_product_attention(q, k, v, scale=base, is_causal=True, implementation=implementation)
        # QKᵀ in the matmul dtype, then fp32 for the softmax, as torch's math attention under autocast: asking the
        # einsum for an fp32 result instead would run the two score-gradient matmuls of the backward pass on fp32
        # operands (TF32 on a GPU, half the bf16 rate) and make the peer slower than it needs to be.
        s = jnp.einsum("bqhd,bkhd->bhqk", q, k).astype(jnp.float32) * base
        T = s.shape[-1]
        s = jnp.where(jnp.tril(jnp.ones((T, T), bool)), s, jnp.finfo(jnp.float32).min)
        p = dropout(jax.nn.softmax(s, axis=-1), key)
        return jnp.einsum("bhqk,bkhd->bqhd", p.astype(dt), v)

    def block(x, layer):
        p, scale, key = layer
        k_att, k_res1, k_res2 = jax.random.split(key, 3)
        B, T, D = x.shape
        q, k, v = jnp.split(dense(layer_norm(x, p["ln1_g"], p["ln1_b"]), p["attn_w"], p["attn_b"]), 3, axis=-1)
        heads = lambda t: t.reshape(B, T, H, D // H)  # noqa: E731
        a = attend(heads(q) * scale.astype(dt), heads(k), heads(v), k_att).reshape(B, T, D)
        x = x + dropout(dense(a, p["proj_w"], p["proj_b"]), k_res1).astype(jnp.float32)
        h = jax.nn.gelu(dense(layer_norm(x, p["ln2_g"], p["ln2_b"]), p["fc_w"], p["fc_b"]), approximate=True)
        return x + dropout(dense(h, p["out_w"], p["out_b"]), k_res2).astype(jnp.float32), None

    def loss_fn(params, tokens, key):
        L, T = spec["n_layer"], tokens.shape[1]
        keys = jax.random.split(key, L + 1)
        x = dropout(params["wte"][tokens] + params["wpe"][:T], keys[0])
        scales = 1.0 / jnp.arange(1, L + 1, dtype=jnp.float32)  # scale_attn_by_inverse_layer_idx
        x, _ = lax.scan(block, x, (params["blocks"], scales, keys[1:]))
        h = layer_norm(x, params["ln_f_g"], params["ln_f_b"])[:, :-1]  # position t predicts token t + 1
        logits = jnp.einsum("btd,vd->btv", h.astype(dt), params["wte"].astype(dt)).astype(jnp.float32)
        target = jnp.take_along_axis(logits, tokens[:, 1:, None], axis=-1)[..., 0]
        return (jax.nn.logsumexp(logits, axis=-1) - target).mean()

    def step(params, opt, tokens, key):
        loss, grads = jax.value_and_grad(loss_fn)(params, tokens, key)
        leaves = jax.tree_util.tree_leaves(grads)
        norm = jnp.sqrt(sum(jnp.sum(jnp.square(g)) for g in leaves))
        clip = jnp.minimum(1.0, MAX_GRAD_NORM / (norm + 1e-6))
        t = opt["t"] + 1
        m = jax.tree_util.tree_map(lambda m, g: BETAS[0] * m + (1 - BETAS[0]) * g * clip, opt["m"], grads)
        v = jax.tree_util.tree_map(lambda v, g: BETAS[1] * v + (1 - BETAS[1]) * jnp.square(g * clip), opt["v"], grads)
        c1, c2 = 1 - BETAS[0] ** t, 1 - BETAS[1] ** t

        def update(p, m, v, decay):
            p = p * (1 - LR * WEIGHT_DECAY) if decay else p
            return p - LR * (m / c1) / (jnp.sqrt(v / c2) + EPS)

        params = jax.tree_util.tree_map(update, params, m, v, mask)
        return params, {"m": m, "v": v, "t": t}, loss

    donate = (0, 1) if jax.default_backend() == "gpu" else ()  # the CPU backend cannot donate (it warns)
    return jax.jit(step, donate_argnums=donate)


def fresh_state(jax, spec: dict, key) -> tuple[dict, dict]:
    """(params, AdamW state) at initialization."""
    jnp = jax.numpy
    params = init_params(jax, spec, key)
    opt = {"m": jax.tree_util.tree_map(jnp.zeros_like, params), "v": jax.tree_util.tree_map(jnp.zeros_like, params),
           "t": jnp.zeros((), jnp.float32)}
    return params, opt


def implementations(jax, attention: str) -> list[str | None]:
    """The attention implementations to try, best first: for "fused" on a GPU cuDNN's fused kernel (jax's default
    is XLA's, which materializes the [T, T] scores like the softmax variant), else jax's default."""
    return ["cudnn", None] if attention == "fused" and jax.default_backend() == "gpu" else [None]


def run_variant(jax, spec: dict, attention: str) -> dict:
    key = jax.random.key(spec.get("seed", 0))
    L, H, D, T = spec["n_layer"], spec["n_head"], spec["n_embd"], spec["seq_length"]
    # One fixed batch, as the torch side: a step's speed does not depend on the ids, and the loss falls as the
    # model memorizes it (the check that the step trains)
    tokens = jax.random.randint(jax.random.fold_in(key, 1), (spec["micro_batch"], T), 0, spec["vocab_size"])
    peak_before = (jax.devices()[0].memory_stats() or {}).get("peak_bytes_in_use")
    refused = []
    for implementation in implementations(jax, attention):
        params, opt = fresh_state(jax, spec, key)  # again after a refusal: a failed first call may have donated them
        step = make_step(jax, spec, attention, decays(params), implementation)
        start = time.perf_counter()
        try:
            params, opt, loss = step(params, opt, tokens, jax.random.fold_in(key, 100))  # compiles
            first_loss = float(loss)  # waits for the step
            break
        except Exception as err:  # noqa: BLE001 - e.g. cuDNN refusing this shape or dtype: jax's default next
            if implementation is None:
                raise
            refused.append(f"{implementation}: {one_line(err, 160)}")
    compile_s = time.perf_counter() - start
    n_params = sum(x.size for x in jax.tree_util.tree_leaves(params))
    n_matmul = n_params - params["wpe"].size  # the MFU convention: all but the position embeddings
    losses, times = [first_loss], []
    for i in range(1, max(spec["warmup_steps"], 1) + spec["steps"]):
        t0 = time.perf_counter()
        params, opt, loss = step(params, opt, tokens, jax.random.fold_in(key, 100 + i))
        losses.append(float(loss))  # waits for the step
        if i >= max(spec["warmup_steps"], 1):
            times.append(time.perf_counter() - t0)
    step_s = median(times)
    # The allocator's peak is the process's, never reset: it is this variant's only if it rose during it
    peak = (jax.devices()[0].memory_stats() or {}).get("peak_bytes_in_use")
    own_peak = peak is not None and (peak_before is None or peak > peak_before)
    return {"variant": f"jax, {attention} attention" + (f" ({implementation})" if implementation else ""),
            "attention": attention, "attention_implementation": implementation or "jax default",
            **({"attention_refused": refused} if refused else {}),
            "attention_dropout": spec["dropout"] if attention == "softmax" else 0.0, "dtype": spec["dtype"],
            "micro_batch": spec["micro_batch"], "seq_length": T, "parameters": int(n_params),
            "flops_per_token": 6.0 * n_matmul + 12.0 * L * H * (D // H) * T, "compile_s": compile_s,
            "ms_per_step": 1000 * step_s, "tokens_per_s": spec["micro_batch"] * T / step_s,
            "first_loss": losses[0], "last_loss": losses[-1],
            "peak_memory_gib": peak / 2**30 if own_peak else None}


def main(argv: list[str]) -> int:
    spec = json.loads(argv[1])
    try:
        import jax
    except ImportError as err:
        emit({"skipped": f"skipped: jax is not importable by {sys.executable} ({err})"})
        return 0
    try:
        jax.config.update("jax_default_prng_impl", "rbg")
        prng = "rbg"
    except Exception:  # noqa: BLE001 - a jax without it: its default generator, named in the info line
        prng = "jax default"
    backend = jax.default_backend()
    if spec["need_gpu"] and backend != "gpu":
        emit({"skipped": f"skipped: jax {jax.__version__} sees no GPU (its backend is {backend}): not the device "
                         "torch measured"})
        return 0
    emit({"info": {"jax": jax.__version__, "backend": backend, "device": jax.devices()[0].device_kind, "prng": prng}})
    for attention in spec["attention"]:
        try:
            emit({"row": run_variant(jax, spec, attention)})
        except Exception as err:  # noqa: BLE001 - e.g. out of memory in one variant: the next still runs
            emit({"row": {"variant": f"jax, {attention} attention", "attention": attention,
                          "error": one_line(err, 200)}})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

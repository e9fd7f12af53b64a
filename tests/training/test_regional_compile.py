"""Per-block compilation: one graph for every block despite GPT-2's per-layer attention scale, the same numbers as
eager mode and as transformers' own attention, checkpoints unchanged, and DDP/FSDP2 wrapping the compiled blocks.

The mask-free causal attention and the 10-step inductor run are in test_fast_path.py. Here the blocks compile with
the `eager` or `aot_eager` backend: dynamo's guards, hence its recompiles, do not depend on the backend, and
those backends cost about a second where inductor costs tens of seconds on the 2-core machine."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
from torch._dynamo.utils import counters
from torch.distributed.tensor import DTensor
from transformers import GPT2Config, GPT2LMHeadModel

from codeparrot.errors import CodeParrotError
from codeparrot.training.attention_scale import LAYER_SCALE, fold_layer_scale, install_layer_scales
from codeparrot.training.causal_attention import CAUSAL_SDPA, register_causal_attention
from codeparrot.training.regional_compile import compile_blocks
from codeparrot.training.validation import evaluate

pytestmark = pytest.mark.usefixtures("one_torch_thread")

# Any recompile is an error: dynamo raises instead of warning and falling back to eager.
ONE_GRAPH = dict(recompile_limit=1, fail_on_recompile_limit_hit=True)


def gpt2(attn: str = CAUSAL_SDPA, n_layer: int = 12, seed: int = 0) -> GPT2LMHeadModel:
    """`n_layer` blocks, 64 wide (4 heads of 16), no dropout, CodeParrot's attention flags."""
    register_causal_attention()
    torch.manual_seed(seed)
    config = GPT2Config(n_layer=n_layer, n_embd=64, n_head=4, n_positions=64, vocab_size=300, resid_pdrop=0.0,
                        embd_pdrop=0.0, attn_pdrop=0.0, activation_function="gelu_pytorch_tanh",
                        scale_attn_by_inverse_layer_idx=True, reorder_and_upcast_attn=True)
    model = GPT2LMHeadModel(config)
    model.set_attn_implementation(attn)
    model.loss_type = "ForCausalLM"
    return model


def copy_of(source: GPT2LMHeadModel, attn: str = CAUSAL_SDPA) -> GPT2LMHeadModel:
    model = gpt2(attn, n_layer=source.config.n_layer)
    model.load_state_dict(source.state_dict())
    return model


BATCH = torch.randint(0, 300, (3, 40), generator=torch.Generator().manual_seed(1))  # [B, T]


def loss_and_grads(model: torch.nn.Module) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """One forward + backward on BATCH: the loss and every parameter's gradient (full tensors under FSDP2)."""
    model.zero_grad()
    loss = model(input_ids=BATCH, labels=BATCH, use_cache=False).loss
    loss.backward()
    grads = {name: p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad
             for name, p in model.named_parameters()}
    return loss.detach(), grads


def assert_same_training_math(actual, expected, rtol: float = 1e-5, atol: float = 1e-7) -> None:
    """fp32: equal up to rounding (the layer scale multiplies the query where transformers scales q·k)."""
    torch.testing.assert_close(actual[0], expected[0], rtol=rtol, atol=atol)
    assert list(actual[1]) == list(expected[1])
    for name, grad in actual[1].items():
        torch.testing.assert_close(grad, expected[1][name], rtol=rtol, atol=atol, msg=name)


def compiled_step(model: torch.nn.Module):
    """One step through `model`'s compiled blocks, any recompile an error; (loss, grads, graphs compiled)."""
    torch._dynamo.reset()
    counters.clear()
    try:
        with torch._dynamo.config.patch(**ONE_GRAPH):
            loss, grads = loss_and_grads(model)
        return loss, grads, counters["stats"]["unique_graphs"]
    finally:
        torch._dynamo.reset()


# ------------------------------------------------------------------------------------------- one graph
@pytest.mark.parametrize(("n_layer", "checkpointed"), [(12, False), (48, True)],
                         ids=["12-blocks", "48-blocks-checkpointed"])
def test_one_graph_serves_every_block(n_layer, checkpointed):
    """codeparrot-small's 12 blocks, codeparrot's 48 (with gradient checkpointing, as its preset allows): each
    block's `scaling` float used to be a guard, so block 2 recompiled and the limit was hit after 8 blocks."""
    model = gpt2(n_layer=n_layer)
    reference = copy_of(model)
    if checkpointed:  # as load_model does it, in transformers before and after the rename
        if hasattr(model, "activation_checkpointing_enable"):
            model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    assert compile_blocks(model, backend="eager") == n_layer
    loss, grads, graphs = compiled_step(model)
    assert graphs == 1
    assert_same_training_math((loss, grads), loss_and_grads(reference))


def test_compiled_blocks_compute_what_eager_blocks_compute():
    """aot_eager: the joint forward/backward graph AOTAutograd hands to inductor, run as is. The eager reference
    has no layer scales installed (an eager training run), so it scales through transformers' float."""
    model = gpt2()
    reference = copy_of(model)
    compile_blocks(model, backend="aot_eager")
    loss, grads, graphs = compiled_step(model)
    assert graphs == 1
    assert_same_training_math((loss, grads), loss_and_grads(reference))


def test_evaluation_between_training_steps_is_never_a_recompile():
    """Train, evaluate a split whose last batch is short, train again: two graphs (training; evaluation under
    no_grad), each compiled once for all 12 blocks. The evaluation used to fail the training graph's grad-mode
    guard (a recompile) and its short last batch failed the shape guard (another, a dynamic-shape graph): the run
    logged two recompiles. Every evaluation forward has the full batch's shape, and the loss is the plain mean
    over all the split's tokens."""
    model = gpt2()
    reference = copy_of(model)
    compile_blocks(model, backend="eager")
    split = [BATCH, BATCH[:1]]  # 3 sequences, then 1
    shapes = []
    model.register_forward_pre_hook(lambda module, args, kwargs: shapes.append(
        tuple(kwargs["input_ids"].shape)), with_kwargs=True)
    cpu = SimpleNamespace(device=torch.device("cpu"), num_processes=1)
    torch._dynamo.reset()
    counters.clear()
    try:
        with torch._dynamo.config.patch(**ONE_GRAPH):
            first = loss_and_grads(model)
            result = evaluate(model, split, cpu)
            second = loss_and_grads(model)
        graphs = counters["stats"]["unique_graphs"]
    finally:
        torch._dynamo.reset()
    assert graphs == 2
    assert shapes == [(3, 40), (3, 40), (3, 40), (3, 40)] and model.training  # train, eval ×2 (padded), train
    everything = torch.cat(split)
    with torch.no_grad():
        expected = reference(input_ids=everything, labels=everything, use_cache=False).loss  # mean over 4 × 39
    assert (result.sequences, result.tokens, result.batches) == (4, 4 * 39, 2)
    assert result.loss == pytest.approx(expected.item(), rel=1e-5)
    assert_same_training_math(second, first)  # the same step again: evaluation changed nothing


@pytest.mark.parametrize("stock", ["sdpa", "eager"])
def test_the_training_attention_is_transformers_attention(stock):
    """The same weights under transformers' sdpa, and eager attention (reorder_and_upcast_attn: baddbmm with
    alpha = the per-layer scaling): the causal attention gives the same loss and gradients, with the layer scale
    folded into the query (compiled blocks) and with transformers' float (eager training)."""
    expected = loss_and_grads(gpt2(stock))
    for install in (True, False):
        model = gpt2()
        if install:
            assert install_layer_scales(model) == 12
        assert_same_training_math(loss_and_grads(model), expected)


# ------------------------------------------------------------------------------------------- the model stays stock
def test_layer_scales_stay_out_of_checkpoints(tmp_path):
    model = gpt2()
    keys = list(model.state_dict())
    compile_blocks(model, backend="eager")
    scales = [block.attn.get_buffer(LAYER_SCALE) for block in model.transformer.h]
    assert [s.item() for s in scales] == pytest.approx([1 / (layer + 1) for layer in range(12)], rel=1e-7)
    assert list(model.state_dict()) == keys
    model.save_pretrained(tmp_path)
    loaded, info = GPT2LMHeadModel.from_pretrained(tmp_path, attn_implementation="sdpa", output_loading_info=True)
    assert not any(info.values()), info  # no missing, unexpected or mismatched keys
    torch.testing.assert_close(loaded(input_ids=BATCH).logits, gpt2("sdpa").eval()(input_ids=BATCH).logits)


def test_a_changed_scaling_formula_is_refused():
    model = gpt2(n_layer=2)
    model.transformer.h[1].attn.scaling = 0.3  # not 1/sqrt(16) / 2
    with pytest.raises(CodeParrotError, match=r"transformer\.h\.1\.attn: attention scaling 0\.3 is not 0\.25 / 2"):
        install_layer_scales(model)


@pytest.mark.parametrize("wrapper", ["ddp", "fsdp2"])
def test_ddp_and_fsdp2_wrap_the_one_graph(wrapper, tmp_path):
    """Compiled in place, then wrapped as `accelerator.prepare` does (one gloo process): still one graph, the
    eager gradients; DDP has no buffer to broadcast before each forward (the scales are on its ignore list), and
    FSDP2's sharded state dict has the stock keys."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.nn.parallel import DistributedDataParallel

    model = gpt2()
    reference = copy_of(model)
    compile_blocks(model, backend="eager")
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        if wrapper == "ddp":
            wrapped = DistributedDataParallel(model)
            assert wrapped.modules_buffers == [] and not wrapped.will_sync_module_buffers()
        else:
            mesh = init_device_mesh("cpu", (1,))
            for block in model.transformer.h:
                fully_shard(block, mesh=mesh)
            wrapped = fully_shard(model, mesh=mesh)
            assert not any(isinstance(b, DTensor) for b in model.buffers())  # moved, not sharded
            assert list(get_model_state_dict(model)) == list(reference.state_dict())  # what sharded checkpoints hold
        loss, grads, graphs = compiled_step(wrapped)
    finally:
        dist.destroy_process_group()
    assert graphs == 1
    grads = {name.removeprefix("module."): grad for name, grad in grads.items()}
    assert_same_training_math((loss, grads), loss_and_grads(reference))


def test_a_bf16_query_is_scaled_by_the_exact_factor():
    """Under autocast the query is bf16: the product with 1/3 is rounded once, the factor itself never is."""
    model = gpt2(n_layer=3)
    install_layer_scales(model)
    query = torch.randn(2, 4, 8, 16, generator=torch.Generator().manual_seed(0)).bfloat16()  # [B, H, T, Q]
    scaled, scale = fold_layer_scale(model.transformer.h[2].attn, query, scaling=None)
    assert scaled.dtype == torch.bfloat16 and scale == 0.25  # 1/sqrt(16), the same in every block
    assert torch.equal(scaled, (query.double() * (1 / 3)).bfloat16())  # the exact product, rounded once

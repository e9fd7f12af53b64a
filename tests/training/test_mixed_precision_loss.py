"""bf16 where the FLOPs are: the fused LM head + cross-entropy runs its matmuls in the training's mixed-precision
dtype although Accelerate's autocast only wraps `model.forward`, accumulates the loss in fp32, and stays close to
the Hugging Face loss; the same for validation."""

from __future__ import annotations

import pytest
import torch
from accelerate import Accelerator
from torch.utils._python_dispatch import TorchDispatchMode

from codeparrot.repository.model import load_pretrained_model
from codeparrot.training.loss import FusedHead, forward_loss, fused_head_weight
from codeparrot.training.validation import evaluate

from .in_process import reset_accelerate

pytestmark = pytest.mark.usefixtures("one_torch_thread")


class MatmulDtypes(TorchDispatchMode):
    """Records the dtype of every matrix product whose output has `width` columns (the [rows, V] logits)."""

    def __init__(self, width: int):
        super().__init__()
        self.width, self.dtypes = width, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func.overloadpacket in (torch.ops.aten.mm, torch.ops.aten.addmm, torch.ops.aten.bmm) and \
                out.shape[-1] == self.width:
            self.dtypes.append(out.dtype)
        return out


@pytest.fixture
def accelerator_of(fresh_accelerate_state):
    def make(mixed_precision):
        reset_accelerate()  # a second Accelerator in one test: its own mixed precision, not the first one's
        return Accelerator(cpu=True, mixed_precision=mixed_precision)

    return make


def prepared(tiny_models, accelerator):
    model = load_pretrained_model(str(tiny_models["random"]), revision=None)
    model.loss_type = "ForCausalLM"
    return accelerator.prepare(model)


def batch_for(model, rows=4, length=48):
    vocab = model.config.vocab_size
    return torch.randint(0, vocab, (rows, length), generator=torch.Generator().manual_seed(3))


def test_fused_head_runs_in_bf16_under_a_bf16_accelerator_and_matches_hugging_face(tiny_models, accelerator_of):
    accelerator = accelerator_of("bf16")
    model = prepared(tiny_models, accelerator)
    head = fused_head_weight(accelerator, model)
    assert isinstance(head, FusedHead) and head.compute_dtype == torch.bfloat16
    vocab, batch = model.config.vocab_size, batch_for(model)
    with MatmulDtypes(vocab) as seen:
        loss = forward_loss(model, head, batch)
        loss.backward()
    assert seen.dtypes and set(seen.dtypes) == {torch.bfloat16}  # logits (and the head's gradient) in bf16
    assert loss.dtype == torch.float32  # the loss is accumulated in fp32
    assert all(p.grad is not None and p.grad.dtype == torch.float32 and torch.isfinite(p.grad).all()
               for p in model.parameters())
    with torch.no_grad():
        hf_bf16 = model(input_ids=batch, labels=batch, use_cache=False).loss  # HF's loss under the same autocast
        plain = load_pretrained_model(str(tiny_models["random"]), revision=None)  # same weights, no accelerator
        plain.loss_type = "ForCausalLM"
        hf_fp32 = plain(input_ids=batch, labels=batch, use_cache=False).loss
    assert loss.item() == pytest.approx(hf_bf16.item(), rel=1e-2)
    assert loss.item() == pytest.approx(hf_fp32.item(), rel=2e-2)

    # Without mixed precision the head stays in fp32 and matches Hugging Face to fp32 accuracy.
    fp32 = accelerator_of("no")
    model32 = prepared(tiny_models, fp32)
    head32 = fused_head_weight(fp32, model32)
    with MatmulDtypes(vocab) as seen32:
        loss32 = forward_loss(model32, head32, batch)
    assert set(seen32.dtypes) == {torch.float32}
    torch.testing.assert_close(loss32, model32(input_ids=batch, labels=batch, use_cache=False).loss)


def test_validation_head_runs_in_bf16_and_matches_the_hugging_face_loss(tiny_models, accelerator_of):
    accelerator = accelerator_of("bf16")
    model = prepared(tiny_models, accelerator)
    head = fused_head_weight(accelerator, model)
    batches = [batch_for(model, rows=2, length=40) for _ in range(3)]
    with MatmulDtypes(model.config.vocab_size) as seen:
        fused = evaluate(model, batches, accelerator, head_weight=head)
    assert seen.dtypes and set(seen.dtypes) == {torch.bfloat16}
    reference = evaluate(model, batches, accelerator)  # the model's own head and F.cross_entropy, same autocast
    assert fused.tokens == reference.tokens == 3 * 2 * 39
    assert fused.loss == pytest.approx(reference.loss, rel=1e-2)

"""The micro-step (training/micro_step.py): `cuda_graphs: true` refused with one line wherever a graph cannot run,
the in-place gradient zeroing a graph needs trains exactly what freeing the gradients trains, and, on a GPU, the
graph's replays train what eager micro-steps train, dropout included, and resume exactly."""

from __future__ import annotations

import json
import pathlib
import shutil
from types import SimpleNamespace

import pytest
import torch
from accelerate.utils import DistributedType, TorchDynamoPlugin
from transformers import GPT2Config, GPT2LMHeadModel

from codeparrot.errors import CodeParrotError
from codeparrot.training import micro_step
from codeparrot.training.causal_attention import CAUSAL_SDPA, register_causal_attention
from codeparrot.training.config import TrainConfig
from codeparrot.training.loss import FinalNormOutput, FusedHead
from codeparrot.training.micro_step import MicroStep, graph_refusal, resolve_cuda_graphs

from ..host_reads import HostReads
from .in_process import train_here

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _accelerator(device="cuda", processes=1, distributed=DistributedType.NO, precision="bf16", dynamo=None):
    """What `graph_refusal` reads of an Accelerator, for a device this machine may not have."""
    return SimpleNamespace(device=torch.device(device), num_processes=processes, distributed_type=distributed,
                           mixed_precision=precision, state=SimpleNamespace(dynamo_plugin=dynamo))


@pytest.mark.parametrize(("cfg", "accelerator", "reason"), [
    ({}, _accelerator("cpu"), "need a CUDA device (this run is on cpu)"),
    ({}, _accelerator(processes=2, distributed=DistributedType.MULTI_GPU), "one process only (2 here)"),
    ({}, _accelerator(distributed=DistributedType.FSDP), "do not run under FSDP"),
    ({"fused_loss": False}, _accelerator(), "need the fused loss"),
    ({"gradient_checkpointing": True}, _accelerator(), "do not run with gradient_checkpointing"),
    ({}, _accelerator(precision="fp16"), "do not run under fp16"),
    ({"attn_implementation": "sdpa"}, _accelerator(), "need attn_implementation: causal_sdpa (with sdpa"),
    ({}, _accelerator(dynamo=TorchDynamoPlugin(backend="inductor", mode="reduce-overhead")),
     "whole-model compilation in mode 'reduce-overhead'"),
], ids=["cpu", "two-processes", "fsdp", "hf-loss", "checkpointing", "fp16", "hf-sdpa", "reduce-overhead"])
def test_cuda_graphs_are_refused_in_one_line_where_they_cannot_run(cfg, accelerator, reason):
    cfg = TrainConfig(cuda_graphs=True, **cfg)
    assert reason in graph_refusal(cfg, accelerator)
    with pytest.raises(CodeParrotError, match="^cuda_graphs: true: .*; set --cuda_graphs false$") as err:
        resolve_cuda_graphs(cfg, accelerator)
    assert "\n" not in str(err.value)
    for off in (None, False):  # the default and an explicit false: eager, whatever the run
        assert resolve_cuda_graphs(TrainConfig(cuda_graphs=off), accelerator) is False


def test_a_single_bf16_or_fp32_cuda_process_may_use_them():
    for precision, dynamo in (("bf16", None), ("no", TorchDynamoPlugin(backend="inductor")),
                              ("bf16", TorchDynamoPlugin(backend="no", mode="reduce-overhead"))):
        accelerator = _accelerator(precision=precision, dynamo=dynamo)
        assert graph_refusal(TrainConfig(cuda_graphs=True), accelerator) is None
        assert resolve_cuda_graphs(TrainConfig(cuda_graphs=True), accelerator) is True


def _tiny_gpt2(seed: int = 0) -> GPT2LMHeadModel:
    """2 blocks, 32 wide, no dropout, the training attention (causal_sdpa)."""
    register_causal_attention()
    torch.manual_seed(seed)
    config = GPT2Config(n_layer=2, n_embd=32, n_head=2, n_positions=32, vocab_size=128, resid_pdrop=0.0,
                        embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
    model = GPT2LMHeadModel(config)
    model.set_attn_implementation(CAUSAL_SDPA)
    return model


def test_zeroing_gradients_in_place_trains_what_freeing_them_trains():
    """What a graph needs of the loop (gradients zeroed in place, the captured backward adding into them, so the
    first micro-step computes 0 + g) trains bit for bit what the eager loop (gradients freed) trains: three AdamW
    steps of two micro-steps each, the fused loss."""
    from accelerate import Accelerator

    batches = torch.randint(0, 128, (6, 4, 24), generator=torch.Generator().manual_seed(3))  # 6 × [B, T]
    assert MicroStep(None, None, None, graphs=True).keeps_gradients  # what the loop asks before zeroing
    results = []
    for in_place in (False, True):
        model = _tiny_gpt2()
        accelerator = Accelerator(cpu=True, gradient_accumulation_steps=2)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
        run = MicroStep(accelerator, model, FusedHead(model.get_output_embeddings().weight,
                                                      final_norm=FinalNormOutput(model)))
        losses = []
        for step in range(3):
            for micro in range(2):
                losses.append(run(batches[2 * step + micro]))
            optimizer.step()
            optimizer.zero_grad(set_to_none=not in_place)
        assert all((p.grad is not None) is in_place for p in model.parameters())
        results.append((torch.stack(losses), {n: p.detach().clone() for n, p in model.named_parameters()}))
    (eager_losses, eager_weights), (kept_losses, kept_weights) = results
    assert torch.equal(eager_losses, kept_losses)
    assert list(eager_weights) == list(kept_weights)
    for name, value in eager_weights.items():
        assert torch.equal(value, kept_weights[name]), name
    assert not torch.equal(eager_weights["transformer.h.0.attn.c_attn.weight"],
                           _tiny_gpt2().transformer.h[0].attn.c_attn.weight)  # it trained


def test_the_training_micro_step_reads_nothing_on_the_host(tmp_path):
    """The model as `load_model` loads it for training: forward, fused loss and backward of a micro-batch whose
    rows start and end with the pad id (EOS in CodeParrot's tokenizers) read no value on the host, so nothing
    stalls the GPU's queue and the micro-step can be captured. transformers' padding check would, on every forward
    (`pad_token_id in input_ids[:, [-1, 0]]`; repository/model.py turns it off)."""
    from accelerate import Accelerator

    from codeparrot.training.model_io import load_model

    _tiny_gpt2().save_pretrained(tmp_path)
    model = load_model(TrainConfig(), tmp_path)
    assert model.config.pad_token_id is None or model.config.pad_token_id == 0
    model.config.pad_token_id = 0
    batch = torch.randint(1, 128, (2, 16), generator=torch.Generator().manual_seed(0))
    batch[:, 0] = batch[:, -1] = 0
    run = MicroStep(Accelerator(cpu=True), model, FusedHead(model.get_output_embeddings().weight, torch.bfloat16,
                                                            final_norm=FinalNormOutput(model)))
    with HostReads() as reads:
        run(batch)
    assert reads.count == 0
    stock = _tiny_gpt2()  # transformers' check left in place: the read this test exists for
    stock.config.pad_token_id = 0
    with HostReads() as reads:
        stock(input_ids=batch, use_cache=False)
    assert reads.count >= 1


def test_a_failed_capture_is_one_line_and_leaves_no_graph(monkeypatch):
    """What a capture raises (a CUDA error from a capture-unsafe call) ends the run with one line naming the
    switch, not a CUDA traceback; the stream and graph calls are stood in for, since this machine has no GPU."""
    import contextlib

    class Stream:
        def wait_stream(self, other):
            pass

    def refused(*args, **kwargs):
        raise RuntimeError("CUDA error: operation not permitted when stream is capturing\nCUDA kernel errors ...")

    for name, value in {"Stream": Stream, "current_stream": Stream, "CUDAGraph": object, "graph": refused,
                        "stream": lambda s: contextlib.nullcontext(), "synchronize": lambda: None,
                        "empty_cache": lambda: None}.items():
        monkeypatch.setattr(torch.cuda, name, value)
    model = _tiny_gpt2()
    run = MicroStep(SimpleNamespace(backward=lambda loss: loss.backward()), model,
                    FusedHead(model.get_output_embeddings().weight, final_norm=FinalNormOutput(model)), graphs=True,
                    warmup_micro_steps=1)
    batch = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(0))
    run(batch)  # the warm-up micro-step: eager
    assert all(p.grad is not None for p in model.parameters())
    with pytest.raises(CodeParrotError) as err:
        run(batch)
    assert str(err.value) == ("cuda_graphs: capturing the micro-step failed (CUDA error: operation not permitted "
                              "when stream is capturing); train with --cuda_graphs false")
    assert run.graph is None


    # An operation failing inside the capture: leaving the graph's block ends the capture, which raises again.
    # The line leads with the first error, the one that says what went wrong.
    class Capture:
        def __init__(self, *args, **kwargs):
            pass

        def __enter__(self):
            return self

        def __exit__(self, kind, value, tb):
            if value is not None:
                raise RuntimeError("CUDA error: operation failed due to a previous error during capture")

    def capture_unsafe(*args, **kwargs):
        raise RuntimeError("CUDA error: operation not permitted when stream is capturing")

    monkeypatch.setattr(torch.cuda, "graph", Capture)
    monkeypatch.setattr(micro_step, "forward_loss", capture_unsafe)
    with pytest.raises(CodeParrotError) as err:
        run(batch)
    assert str(err.value) == ("cuda_graphs: capturing the micro-step failed (CUDA error: operation not permitted "
                              "when stream is capturing; then: CUDA error: operation failed due to a previous error "
                              "during capture); train with --cuda_graphs false")
    assert run.graph is None


# ------------------------------------------------------------------------------------------- on a GPU
@pytest.fixture(scope="module")
def dropout_toy(tmp_path_factory, stdlib_texts):
    """`build_toy_run(root, stdlib_texts[:80], vocab_size=512, n_layer=4, dropouts 0.1)`, the model saved as a plain
    folder (`--revision null`, as gpu_check's CLI runs) instead of committed to a git repository: nothing says
    the GPU image has git."""
    from codeparrot.config import from_dict
    from codeparrot.repository.model import ModelConfig, build_model, save_model_folder, to_gpt2_config
    from codeparrot.tokenizer import train_tokenizer
    from codeparrot.tools.toy_run import ToyRun, write_shards

    root, texts = tmp_path_factory.mktemp("graphs"), stdlib_texts[:80]
    tokenizer = train_tokenizer(texts, vocab_size=512, show_progress=False)
    preset = from_dict(ModelConfig, {"n_layer": 4, "n_embd": 64, "n_head": 4, "n_positions": 128,
                                     "resid_pdrop": 0.1, "embd_pdrop": 0.1, "attn_pdrop": 0.1})
    save_model_folder(build_model(to_gpt2_config(preset, tokenizer), seed=0), root / "model", tokenizer)
    return ToyRun(root, root / "model", root / "model", write_shards(texts[8:], root / "data" / "train"),
                  write_shards(texts[:8], root / "data" / "valid"), len(tokenizer))


def _train_losses(toy, name: str, graphs: bool, steps: int = 8, resume: str | None = None, **extra) -> list[float]:
    cfg = toy.config(max_steps=steps, run_name=name, output_dir=str(toy.root / "runs" / name), cuda_graphs=graphs,
                     mixed_precision="bf16", revision=None, **{
                         "batch.micro_batch_size": 4, "batch.gradient_accumulation_steps": 2, "logging.log_steps": 1,
                         "checkpoint.save_steps": 4, "checkpoint.push": False, **extra})
    train_here(cfg, resume=resume)
    lines = (toy.root / "runs" / name / "metrics.jsonl").read_text().splitlines()
    return [entry["loss"] for entry in map(json.loads, lines) if "loss" in entry]


@pytest.mark.gpu
def test_graph_replays_train_what_eager_micro_steps_train(dropout_toy):
    """Dropout 0.1, compiled blocks, bf16, accumulation 2: 3 eager warm-up micro-steps, then replays. The same
    kernels draw the same random numbers from the same generator offsets, so the losses agree with eager ones."""
    eager = _train_losses(dropout_toy, "eager", graphs=False)
    graphed = _train_losses(dropout_toy, "graphed", graphs=True)
    assert len(graphed) == len(eager) == 8
    torch.testing.assert_close(torch.tensor(graphed), torch.tensor(eager), rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
def test_a_graphed_run_resumes_exactly(dropout_toy):
    """A fresh run folder holding only the step-4 checkpoint of a graphed run resumes (warm-up and capture again):
    steps 5-8 have the uninterrupted graphed run's losses (the same random numbers: the graph's generator offsets
    are restored like eager ones)."""
    whole = _train_losses(dropout_toy, "whole", graphs=True)
    checkpoint = pathlib.Path("checkpoints", "step-4")
    shutil.copytree(dropout_toy.root / "runs" / "whole" / checkpoint, dropout_toy.root / "runs" / "cut" / checkpoint)
    resumed = _train_losses(dropout_toy, "cut", graphs=True, resume="auto")
    # up to the order of atomic float additions (index_add_ in the fused loss, attention's backward)
    torch.testing.assert_close(torch.tensor(resumed), torch.tensor(whole[-4:]), rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
def test_a_batch_of_another_shape_after_the_capture_is_refused():
    from accelerate import Accelerator

    model = _tiny_gpt2().cuda()
    head = FusedHead(model.get_output_embeddings().weight, final_norm=FinalNormOutput(model))
    run = MicroStep(Accelerator(), model, head, graphs=True, warmup_micro_steps=1)
    batch = torch.randint(0, 128, (4, 24), device="cuda")
    for _ in range(3):  # warm-up, capture + replay, replay
        run(batch)
        model.zero_grad(set_to_none=False)
    with pytest.raises(CodeParrotError, match=r"shape \(2, 24\) after the graph was captured for \(4, 24\)"):
        run(batch[:2])

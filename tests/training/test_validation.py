"""The evaluation pass on one process (multi-process evaluation is in test_distributed.py and test_train.py): the
plain token mean over the whole split, one shape for every forward, and no value read on the host until the end."""

from __future__ import annotations

import json
import re
import sys
from types import SimpleNamespace

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

from codeparrot.training.loss import IGNORE_INDEX
from codeparrot.training.validation import evaluate, pad_rows

from ..host_reads import HostReads

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_one_process_evaluates_the_split_reading_the_host_only_for_the_totals():
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=2, n_positions=32, vocab_size=128,
                                       bos_token_id=0, eos_token_id=0))
    split = list(torch.randint(0, 128, (7, 24), generator=torch.Generator().manual_seed(1)).split(3))  # 3, 3, 1
    shapes = []
    hook = model.register_forward_pre_hook(lambda module, args, kwargs: shapes.append(
        tuple(kwargs["input_ids"].shape)), with_kwargs=True)
    with HostReads() as reads:
        result = evaluate(model, split, SimpleNamespace(device=torch.device("cpu"), num_processes=1))
    hook.remove()
    assert model.training  # evaluation put it back in training mode
    everything = torch.cat(split)
    with torch.no_grad():
        model.eval()  # no dropout, as in evaluation
        expected = model(input_ids=everything, labels=everything, use_cache=False).loss
    assert (result.sequences, result.tokens, result.batches, result.seq_length) == (7, 7 * 23, 3, 24)
    assert result.loss == pytest.approx(expected.item(), rel=1e-5)
    assert shapes == [(3, 24)] * 3  # the last batch padded to the others' shape
    assert reads.count == 3  # the totals at the end (loss, tokens, sequences: one .tolist()); none per batch


def test_an_evaluation_asked_to_stop_stops_before_its_next_batch():
    """`should_stop` (the app's losses plot, whose client cancelled or left) is asked before every batch: the
    evaluation stops there with a one-line error instead of forwarding the rest of the split for nobody, and the
    model is back in training mode."""
    from codeparrot.training.validation import EvaluationStopped

    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, n_positions=8, vocab_size=32))
    forwards = []
    model.register_forward_pre_hook(lambda module, args: forwards.append(1))
    split = [torch.zeros((2, 8), dtype=torch.long)] * 10
    with pytest.raises(EvaluationStopped, match="^the evaluation was stopped after 2 of its batches"):
        evaluate(model, split, SimpleNamespace(device=torch.device("cpu"), num_processes=1),
                 should_stop=lambda: len(forwards) >= 2)
    assert len(forwards) == 2 and model.training
    result = evaluate(model, split, SimpleNamespace(device=torch.device("cpu"), num_processes=1),
                      should_stop=lambda: False)
    assert result.batches == 10 and len(forwards) == 12


def test_padding_rows_are_masked_tokens():
    ids = torch.tensor([[5, 6, 7]])
    padded, labels = pad_rows(ids, 3)
    assert padded.tolist() == [[5, 6, 7], [0, 0, 0], [0, 0, 0]]
    assert labels.tolist() == [[5, 6, 7], [IGNORE_INDEX] * 3, [IGNORE_INDEX] * 3]


def test_a_dataset_without_one_complete_sequence_is_refused_before_the_model_loads(tiny_models, tmp_path,
                                                                                    monkeypatch,
                                                                                    fresh_accelerate_state):
    """It used to print `validation loss nan`, exit 0 and write NaN (not JSON) into the result; then to fail only
    after loading the model and evaluating."""
    from codeparrot.errors import CodeParrotError
    from codeparrot.training import validation

    def load(*args, **kwargs):
        raise AssertionError("the weights were loaded before the data was checked")

    monkeypatch.setattr(validation, "load_pretrained_model", load)
    data = tmp_path / "short.jsonl"
    data.write_text('{"content": "x = 1"}\n')
    with pytest.raises(CodeParrotError, match=r"^--dataset .*short.jsonl holds \d tokens, not one sequence of 32 "
                                              r"tokens \(--seq-length\): its validation loss would be NaN; give at "
                                              r"least 32 tokens of validation data, a shorter --seq-length"):
        validation.validation_loss(str(tiny_models["random"]), str(data), seq_length=32)


def test_a_validation_split_without_one_sequence_is_refused_before_training(tiny_models, tmp_path):
    """Training used to log `val_loss NaN` at every evaluation. Text data is dealt by file to the readers
    (processes × DataLoader workers), each of which drops its own short tail: two files of 17-31 tokens make one
    sequence of 32 for one reader and none for two. Pretokenized data is refused when it holds fewer tokens than
    one sequence (it deals whole sequences)."""
    from codeparrot.errors import CodeParrotError
    from codeparrot.tokenizer import load_tokenizer
    from codeparrot.training.config import DataConfig, TrainConfig
    from codeparrot.training.datasets.pretokenize import pretokenize
    from codeparrot.training.run_data import build_datasets

    tokenizer = load_tokenizer(str(tiny_models["random"]))
    text = "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n"
    assert 16 <= len(tokenizer(text)["input_ids"]) < 31  # + EOS: 17-31 tokens per file
    two = tmp_path / "two.jsonl"
    two.write_text(f"{json.dumps({'content': text})}\n" * 2)
    short = tmp_path / "short.jsonl"
    short.write_text('{"content": "x = 1"}\n')

    def datasets(valid, rank=0, world=1, workers=0):
        cfg = TrainConfig(model="m", data=DataConfig(train=str(two), valid=str(valid), seq_length=32,
                                                     num_workers=workers))
        return build_datasets(cfg, tokenizer, rank, world)

    with pytest.raises(CodeParrotError, match=r"^data.valid .*short.jsonl holds \d tokens, not one sequence of 32 "
                                              r"tokens \(data.seq_length\): its validation loss would be NaN"):
        datasets(short)
    assert len(list(datasets(two)[1])) == 1  # one reader: one sequence, evaluated
    refused = (r"^data.valid .*two.jsonl holds \d+ tokens, dealt by file to 2 readers \(processes × dataloader "
               r"workers\) .* at most \d+ tokens each: not one sequence of 32 tokens \(data.seq_length\) for any of "
               r"them")
    with pytest.raises(CodeParrotError, match=refused):
        datasets(two, rank=1, world=2)
    with pytest.raises(CodeParrotError, match=refused):
        datasets(two, workers=2)
    pretokenize(str(short), tokenizer, tmp_path / "tokens", progress=False)
    with pytest.raises(CodeParrotError, match=r"tokens holds \d tokens, fewer than one sequence of 32"):
        datasets(tmp_path / "tokens")


def test_bad_output_and_sequence_length_are_refused_before_the_evaluation(tmp_path, monkeypatch):
    """An --output folder used to fail (IsADirectoryError traceback) only once the whole split was evaluated, and
    --seq-length 0 silently meant the model's context."""
    from codeparrot.errors import CodeParrotError
    from codeparrot.training import validation
    from codeparrot.training.config import ValidationLossConfig

    def evaluation(*args, **kwargs):
        raise AssertionError("evaluated")

    monkeypatch.setattr(validation, "Accelerator", evaluation)
    with pytest.raises(CodeParrotError, match=r"--output .* is a folder; give the JSON file to write"):
        validation.run_validation_loss(ValidationLossConfig(model="m", dataset="d", output=str(tmp_path)))
    with pytest.raises(CodeParrotError, match="seq length must be > 0 .*got 0"):
        validation.validation_loss("m", "d", seq_length=0)


def test_the_cli_evaluation_reports_progress_and_training_evaluation_none(monkeypatch, capsys):
    """scripts/validation_loss.py and `checkpoints.py plot --dataset` used to evaluate for minutes in silence. Their
    progress (`on_step`, counted from the batches' shapes: no host read per batch) is a tqdm bar on a terminal and
    plain lines in a log file (no carriage returns); training's periodic evaluation, which has its own bar and
    log lines, passes none and prints nothing, even on a terminal."""
    from codeparrot.training import validation
    from codeparrot.training.config import TrainConfig
    from codeparrot.training.run_data import run_eval

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, n_positions=32, vocab_size=128))
    split = list(torch.randint(0, 128, (7, 24), generator=torch.Generator().manual_seed(1)).split(3))  # 3, 3, 1
    cpu = SimpleNamespace(device=torch.device("cpu"), num_processes=1)
    bar = validation.EvalProgress("validation", total=3, terminal=True)
    with HostReads() as reads:
        evaluate(model, split, cpu, on_step=bar)
    bar.close()
    assert reads.count == 3  # the totals at the end, as without progress: none per batch
    err = capsys.readouterr().err
    assert "validation: 100%" in err and "3/3" in err and "batch/s" in err and "tok/s" in err

    monkeypatch.setattr(validation, "PROGRESS_EVERY_S", 0.0)  # a line at every batch
    lines = validation.EvalProgress("validation", total=3, terminal=False)
    evaluate(model, split, cpu, on_step=lines)
    lines.close()
    err = capsys.readouterr().err
    assert "\r" not in err
    tokens = [r"69", r"138", r"161"]  # 3, 3 and 1 sequences of 23 predicted tokens
    pattern = r"validation: {}{}/3 batches, {} tokens in \d+ s \([\d.]+ batches/s, [\d,]+ tokens/s\)"
    for n, (line, count) in enumerate(zip(err.splitlines(), tokens), start=1):
        assert re.fullmatch(pattern.format("", n, count), line), line
    assert re.fullmatch(pattern.format("done, ", 3, "161").replace("/3", ""), err.splitlines()[-1])
    stopped = validation.EvalProgress("validation", total=3, terminal=False)
    stopped(23)
    stopped.close(finished=False)  # a pass stopped or failed: its error says so, no "done" line
    assert "done" not in capsys.readouterr().err

    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)  # where a bar would show
    cfg = TrainConfig(model="m")
    cfg.eval.micro_batch_size, cfg.data.seq_length = 3, 24
    run_eval(cfg, model, None, [row for batch in split for row in batch], cpu, torch.device("cpu"))
    assert capsys.readouterr() == ("", "")


def test_the_progress_total_is_the_main_process_eval_steps(tiny_models, tmp_path):
    """A pretokenized split's eval steps are known without reading it: the main process's (rank 0's) batches,
    each DataLoader worker batching its own share, capped by --max-eval-steps; text data: only the cap."""
    from codeparrot.tokenizer import load_tokenizer
    from codeparrot.training.datasets.pretokenize import pretokenize
    from codeparrot.training.datasets.pretokenized import PretokenizedDataset
    from codeparrot.training.validation import eval_steps_total

    tokenizer = load_tokenizer(str(tiny_models["random"]))
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"content": f"def f{i}(x):\n    return x + {i}\n" * 3}) + "\n"
                            for i in range(40)))
    pretokenize(str(data), tokenizer, tmp_path / "tokens", progress=False)
    for world, workers, batch in ((1, 0, 4), (2, 2, 3), (3, 2, 5)):
        ds = PretokenizedDataset(tmp_path / "tokens", 8, shuffle=False, world_size=world)
        readers = world * max(workers, 1)
        steps = sum(-(-len(ds.order(0, reader, readers)) // batch) for reader in range(max(workers, 1)))
        assert ds.n_sequences > 20 and eval_steps_total(ds, batch, workers, -1) == steps
        assert eval_steps_total(ds, batch, workers, 2) == 2
    assert eval_steps_total([], 4, 0, -1) is None and eval_steps_total([], 4, 0, 7) == 7


def test_validation_loss_cli_prints_progress_lines_unless_no_progress(tiny_models, tmp_path, load_script, capsys,
                                                                        fresh_accelerate_state):
    """In a log file (the demo's validation stage), scripts/validation_loss.py ends its evaluation with a line of
    batches and tokens/s before the result; --no-progress leaves it out."""
    from codeparrot.tokenizer import load_tokenizer
    from codeparrot.training.datasets.pretokenize import pretokenize

    from .in_process import reset_accelerate

    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"content": f"def f{i}(x):\n    return x * {i}\n" * 4}) + "\n"
                            for i in range(10)))
    pretokenize(str(data), load_tokenizer(str(tiny_models["random"])), tmp_path / "tokens", progress=False)
    script = load_script("validation_loss")
    argv = ["--model", str(tiny_models["random"]), "--dataset", str(tmp_path / "tokens"), "--seq-length", "16",
            "--batch-size", "4", "--max-eval-steps", "2"]
    assert script.main(argv) == 0
    reset_accelerate()
    err = capsys.readouterr().err
    assert re.search(r"^validation: done, 2 batches, 120 tokens in \d+ s \(.* tokens/s\)$", err, re.M), err
    assert script.main([*argv, "--no-progress"]) == 0
    assert "validation:" not in capsys.readouterr().err

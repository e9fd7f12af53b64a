"""Fixtures of the HumanEval tests: the 164 problems, a tiny GPT-2 model folder, and scripts/human_eval.py's
flags as the config its parser builds."""

from __future__ import annotations

import argparse

import pytest

from codeparrot.config_flags import config_from_args, config_parser
from codeparrot.humaneval.config import HumanEvalConfig
from codeparrot.humaneval.problems import load_problems


@pytest.fixture(scope="module")
def problems():
    return load_problems()


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory, stdlib_texts):
    """A 2-layer GPT-2 with a 1k byte-level BPE trained here on stdlib code, saved as a plain model folder."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    from codeparrot.tokenizer import train_tokenizer

    folder = tmp_path_factory.mktemp("tiny-model")
    tokenizer = train_tokenizer(stdlib_texts[:120], vocab_size=1000, show_progress=False)
    torch.manual_seed(0)
    config = GPT2Config(n_layer=2, n_embd=64, n_head=2, n_positions=1024, vocab_size=len(tokenizer),
                        bos_token_id=tokenizer.eos_token_id, eos_token_id=tokenizer.eos_token_id)
    GPT2LMHeadModel(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def _config(**flags) -> HumanEvalConfig:
    """A `HumanEvalConfig` from the values of scripts/human_eval.py's flags (the others at their defaults), as
    its parser would build it."""
    defaults = vars(config_parser(HumanEvalConfig).parse_args(["--output", "unused", "--canonical"]))
    return config_from_args(HumanEvalConfig, argparse.Namespace(**{**defaults, "canonical": False, **flags}))


def _score_options(tmp_path, completions, **changes) -> HumanEvalConfig:
    options = dict(problems=None, num_tasks=10, timeout=3.0, memory_mb=1024, completions=str(completions),
                   canonical=False, model=None, revision=None, output=str(tmp_path / "r.json"), k=[1],
                   allow_code_execution=True, num_workers=1, execute_duplicates=False, no_progress=True,
                   allow_missing_tasks=False, samples_file=None)
    return _config(**{**options, **changes})


def _load(tiny_model):
    from codeparrot.repository.model import load_model_and_tokenizer

    return load_model_and_tokenizer(str(tiny_model), device="cpu")

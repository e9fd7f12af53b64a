"""Batched generation with a tiny model: left padding changes nothing, prompts are tokenized as in training,
the checkpoint's generation config is ignored, prompts too long and bad temperatures are refused."""

from __future__ import annotations

import pytest

from codeparrot.errors import CodeParrotError

from .conftest import _load


def test_left_padded_batch_matches_unpadded_generation(tiny_model, problems):
    """Reference check: greedy completions of a prompt are the same alone and left-padded in a batch."""
    from codeparrot.humaneval.generation import SamplingConfig, generate_batch, prompt_ids

    model, tokenizer = _load(tiny_model)
    cfg = SamplingConfig(max_new_tokens=12)
    short, long = prompt_ids(tokenizer, [problems[2], problems[0]], strip=True)
    assert len(long) > len(short) + 20
    alone = generate_batch(model, tokenizer, [short], 0.0, cfg, seed=0)
    batched = generate_batch(model, tokenizer, [long, short, long], 0.0, cfg, seed=0)
    assert batched[1] == alone[0]
    assert batched[0] == batched[2]


def test_prompts_are_tokenized_as_plain_text_like_training(tiny_model, problems):
    """A special-token string in a prompt stays text (as training tokenized documents); the real HumanEval prompts
    contain none, so their ids are exactly those of the tokenizer's default call."""
    from codeparrot.fim.encoding import plain_text_encoder
    from codeparrot.humaneval.generation import prompt_ids

    _, tokenizer = _load(tiny_model)
    for strip in (True, False):
        texts = [p["prompt"].strip() if strip else p["prompt"] for p in problems]
        default = tokenizer(texts, add_special_tokens=False)["input_ids"]
        assert prompt_ids(tokenizer, problems, strip) == [[tokenizer.eos_token_id] + ids for ids in default]
    tricky = {"task_id": "t", "prompt": 'def f():\n    """Returns "<|endoftext|>"."""\n'}
    [ids] = prompt_ids(tokenizer, [tricky], strip=True)
    assert ids == [tokenizer.eos_token_id] + plain_text_encoder(tokenizer).batch([tricky["prompt"].strip()])[0]
    assert ids.count(tokenizer.eos_token_id) == 1  # only the leading one


def test_the_checkpoints_generation_config_does_not_change_the_protocol(tiny_model, problems):
    """A checkpoint's generation_config.json (here a repetition penalty and no_repeat_ngram_size, as some Hub models
    ship) must not leak into greedy or nucleus sampling: `generate` fills every setting not passed from it, so
    before, both gave other completions than the protocol's, silently. The model's own config is left as it was."""
    from codeparrot.humaneval.generation import SamplingConfig, generate_batch, prompt_ids

    model, tokenizer = _load(tiny_model)
    cfg = SamplingConfig(max_new_tokens=16)
    ids = prompt_ids(tokenizer, problems[:2], strip=True)
    protocol = [generate_batch(model, tokenizer, ids, t, cfg, seed=3) for t in (0.0, 0.8)]
    model.generation_config.repetition_penalty = 3.0
    model.generation_config.no_repeat_ngram_size = 2
    assert [generate_batch(model, tokenizer, ids, t, cfg, seed=3) for t in (0.0, 0.8)] == protocol
    assert model.generation_config.repetition_penalty == 3.0


def test_prompts_too_long_for_the_context_are_refused_before_generating(tiny_model, problems, tmp_path):
    from codeparrot.humaneval.generation import SamplingConfig, generate_samples

    model, tokenizer = _load(tiny_model)
    with pytest.raises(CodeParrotError, match=r"prompts plus --max-new-tokens 1000 exceed the model's context of 1024"):
        generate_samples(model, tokenizer, problems[:3], SamplingConfig(max_new_tokens=1000), tmp_path / "p", set())
    assert not (tmp_path / "p").exists()


@pytest.mark.parametrize("temperature", [float("nan"), float("inf"), -0.1])
def test_a_temperature_that_is_not_a_finite_non_negative_number_is_refused(temperature):
    from codeparrot.humaneval.config import SamplingConfig

    with pytest.raises(CodeParrotError, match="--temperature needs finite values >= 0"):
        SamplingConfig(temperatures=[0.2, temperature]).validate()

"""Stop strings: truncation of the completion only, per-sequence stopping in a real `generate` loop."""

from __future__ import annotations

import pytest
import torch

from codeparrot.humaneval.stopping import STOP_STRINGS, StopStringsCriteria, finished_completion, truncate_completion


@pytest.fixture(scope="module")
def tokenizer(stdlib_texts):
    from codeparrot.tokenizer import train_tokenizer

    return train_tokenizer(stdlib_texts[:120], vocab_size=1000, show_progress=False)


@pytest.fixture(scope="module")
def model(tokenizer):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(n_layer=1, n_embd=32, n_head=2, n_positions=256, vocab_size=len(tokenizer),
                        bos_token_id=tokenizer.eos_token_id, eos_token_id=tokenizer.eos_token_id)
    return GPT2LMHeadModel(config).eval()


def test_truncation_cases():
    body = "    return sorted(xs)\n"
    assert truncate_completion(body) == body  # no stop string: kept whole
    assert truncate_completion("\ndef helper():\n    pass") == ""  # stop string at the very start
    assert truncate_completion(body + "\nprint(f(1))\n\ndef g():\n    pass\n") == body  # the first of two wins
    assert truncate_completion(body + "\n\nif __name__ == '__main__':\n    g()\ndef h(): pass") == body + "\n"
    indented = "    if x:\n        return 1\n    # done\n"  # not at column 0: not a stop
    assert truncate_completion(indented) == indented
    assert truncate_completion(body + "\n#") == body  # a stop string ending the text counts
    assert truncate_completion("x\n@decorator\ndef f(): pass", stop_strings=("\ndef",)) == "x\n@decorator"
    assert set(STOP_STRINGS) == {"\nclass", "\ndef", "\n#", "\n@", "\nprint", "\nif"}


def test_finished_completion_decodes_and_names_the_reason(tokenizer):
    eos = tokenizer.eos_token_id
    ids = tokenizer("    return 1\ndef g():", add_special_tokens=False)["input_ids"]
    assert finished_completion(tokenizer, ids + [eos, eos]) == ("    return 1", "stop")
    body = tokenizer("    return 1\n", add_special_tokens=False)["input_ids"]
    assert finished_completion(tokenizer, body + [eos] + ids) == ("    return 1\n", "eos")
    assert finished_completion(tokenizer, body) == ("    return 1\n", "length")


def _ids(tokenizer, text):
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def test_stop_string_split_across_tokens_is_seen_at_the_token_that_completes_it(tokenizer):
    pieces = [_ids(tokenizer, "x = 1"), [tokenizer.convert_tokens_to_ids("Ċ")],  # "\n" alone
              [tokenizer.convert_tokens_to_ids("d")], [tokenizer.convert_tokens_to_ids("e")],
              [tokenizer.convert_tokens_to_ids("f")], _ids(tokenizer, " g():")]
    generated = [t for piece in pieces for t in piece]
    prompt = _ids(tokenizer, "def f():\n    pass\ndef g():\n")  # stop strings in the prompt must not count
    criteria = StopStringsCriteria(tokenizer, len(prompt))
    done_after = None
    for step in range(1, len(generated) + 1):
        row = torch.tensor([prompt + generated[:step]])
        if criteria(row, None)[0] and done_after is None:
            done_after = step
    assert done_after == len(pieces[0]) + 4  # the "f" completing "\ndef", not before
    assert tokenizer.decode(generated[:done_after]).endswith("\ndef")


def test_criteria_matches_brute_force_per_row_with_left_padding(tokenizer, stdlib_texts):
    """Three rows of different prompt lengths, left padded; each row's finish step equals the first prefix
    whose full decode contains a stop string (or EOS)."""
    eos = tokenizer.eos_token_id
    snippets = [stdlib_texts[3][:400], stdlib_texts[7][200:500], "    return [x for x in xs if x]\n" * 6]
    prompts = [_ids(tokenizer, "def f(xs):\n"), _ids(tokenizer, "import os\n\ndef g():\n    \"\"\"Doc.\"\"\"\n"), []]
    gens = [_ids(tokenizer, s) for s in snippets]
    gens[2] = gens[2][:5] + [eos] + gens[2][5:]
    width = max(len(p) for p in prompts) + 1
    length = min(len(g) for g in gens)

    def brute(ids):
        for step in range(1, len(ids) + 1):
            text = tokenizer.decode(ids[:step])
            if ids[step - 1] == eos or truncate_completion(text) != text:
                return step
        return None

    criteria = StopStringsCriteria(tokenizer, width)
    rows = [[eos] * (width - len(p)) + p for p in prompts]
    for step in range(1, length + 1):
        batch = torch.tensor([r + g[:step] for r, g in zip(rows, gens)])
        criteria(batch, None)
    assert criteria.finished_at == [brute(g[:length]) for g in gens]
    assert criteria.finished_at[2] == 6
    assert all(f is not None for f in criteria.finished_at[:2]), criteria.finished_at  # real stops, not vacuous


class Scripted:
    """A logits processor forcing row i to emit scripts[i][step] (then EOS): a model with known output."""

    def __init__(self, scripts, eos, prompt_len):
        self.scripts, self.eos, self.prompt_len = scripts, eos, prompt_len

    def __call__(self, input_ids, scores):
        step = input_ids.shape[1] - self.prompt_len
        forced = torch.full_like(scores, float("-inf"))
        for row, script in enumerate(self.scripts):
            forced[row, script[step] if step < len(script) else self.eos] = 0.0
        return forced


def _generate(model, tokenizer, scripts, max_new_tokens):
    from transformers import LogitsProcessorList, StoppingCriteriaList

    eos = tokenizer.eos_token_id
    prompt = torch.tensor([[eos] + _ids(tokenizer, "def f(x):")] * len(scripts))
    criteria = StopStringsCriteria(tokenizer, prompt.shape[1])
    out = model.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False,
                         max_new_tokens=max_new_tokens, pad_token_id=eos, eos_token_id=eos,
                         logits_processor=LogitsProcessorList([Scripted(scripts, eos, prompt.shape[1])]),
                         stopping_criteria=StoppingCriteriaList([criteria]))
    return out[:, prompt.shape[1]:].tolist(), criteria


def test_generate_stops_each_sequence_on_its_own(model, tokenizer):
    eos = tokenizer.eos_token_id
    stops = _ids(tokenizer, "\n    return x\n") + [tokenizer.convert_tokens_to_ids(t) for t in ("Ċ", "d", "e", "f")]
    early_eos = _ids(tokenizer, "\n    pass") + [eos]
    endless = _ids(tokenizer, "\n    y = x + 1" * 10)
    rows, criteria = _generate(model, tokenizer, [stops, early_eos, endless], max_new_tokens=20)
    assert all(len(r) == 20 for r in rows)  # one row never stops: the batch runs to max_new_tokens
    texts = [finished_completion(tokenizer, r) for r in rows]
    assert texts[0] == ("\n    return x\n", "stop")
    assert texts[1] == ("\n    pass", "eos")
    assert texts[2][1] == "length"
    assert criteria.finished_at[:2] == [len(stops), len(early_eos)] and criteria.finished_at[2] is None
    assert rows[0][len(stops):] == [eos] * (20 - len(stops))  # a finished row stays finished (padded)


def test_generate_ends_when_every_sequence_has_stopped(model, tokenizer):
    eos = tokenizer.eos_token_id
    a = _ids(tokenizer, "\n    return 1\nprint(f(1))")
    b = _ids(tokenizer, "\n    return 2") + [eos]
    rows, criteria = _generate(model, tokenizer, [a, b], max_new_tokens=64)
    longest = max(criteria.finished_at)
    assert len(rows[0]) == longest < 64  # stopped as soon as the last row finished
    assert [finished_completion(tokenizer, r)[0] for r in rows] == ["\n    return 1", "\n    return 2"]


def test_a_special_token_inside_a_completion_stays_in_it_and_hides_no_stop_string(tokenizer):
    """A FIM sentinel the model emits in a left-to-right completion was skipped when decoding: the code around it was
    glued together and scored as a program the model never wrote, and "\\n<fim_pad>def" even counted as the stop
    string "\\ndef". Its text stays now (the program fails as the model's output would); only EOS ends a completion,
    and when infilling the sentinels end a middle as before."""
    from codeparrot.fim import FIM_TOKENS, fim_token_ids

    eos, fim = tokenizer.eos_token_id, fim_token_ids(tokenizer)
    body = _ids(tokenizer, "    return 1") + [fim.prefix] + _ids(tokenizer, "\n    return 2\n")
    assert finished_completion(tokenizer, body + [eos, eos]) == ("    return 1<fim_prefix>\n    return 2\n", "eos")
    across = _ids(tokenizer, "x = 1\n") + [fim.pad] + _ids(tokenizer, "def g():")
    criteria = StopStringsCriteria(tokenizer, 0)
    for step in range(1, len(across) + 1):
        assert not criteria(torch.tensor([across[:step]]))[0], tokenizer.decode(across[:step])
    assert finished_completion(tokenizer, across) == ("x = 1\n<fim_pad>def g():", "length")
    assert finished_completion(tokenizer, body, FIM_TOKENS, stop_ids=fim.all()) == ("    return 1", "sentinel")

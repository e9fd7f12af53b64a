"""The batching engine without HTTP: token-for-token equal to `generate`, independent of its batch-mates, stopping
per sequence, cancelling, bounded, and surviving a failing forward pass."""

from __future__ import annotations

import threading

import pytest
import torch

from codeparrot.inference.completion import build_prompt_ids, generate_completions
from codeparrot.repository.model import load_model_and_tokenizer
from codeparrot.serving.engine import Engine
from codeparrot.serving.errors import ApiError
from codeparrot.serving.sampling import SamplingParams

pytestmark = pytest.mark.usefixtures("one_torch_thread")

PROMPTS = ["def add(a, b):", "import os\nclass Foo:", "x = [", "def sub(a, b):\n    return", "for i in range(3):\n"]


@pytest.fixture(scope="module")
def random_model(tiny_models):
    return load_model_and_tokenizer(str(tiny_models["random"]), device="cpu")


@pytest.fixture
def engine_for():
    """`engine_for(model, tokenizer, **kw) -> started Engine`; closed after the test."""
    engines = []

    def make(model, tokenizer, **kw):
        # Ending at EOS only, as generate does (the server also ends at the FIM sentinels, ids 1-4: a random model
        # sampling from 800 tokens draws them now and then).
        engine = Engine(model, tokenizer, **kw)
        engine.start()
        engines.append(engine)
        return engine

    yield make
    for engine in engines:
        engine.close()


def run(engine, tokenizer, requests, stagger: threading.Event | None = None):
    """Submit (prompt, params) pairs at once and wait for every result (a JobResult, or the ApiError)."""
    results, done = [None] * len(requests), [threading.Event() for _ in requests]
    for i, (prompt, params) in enumerate(requests):
        def listener(event, i=i):
            if event[0] in ("done", "error"):
                results[i] = event[1]
                done[i].set()
        engine.submit(build_prompt_ids(tokenizer, prompt, strip=False), params, listener)
    for event in done:
        assert event.wait(60), "a request never finished"
    return results


def generate_ids(model, tokenizer, prompt: str, new_tokens: int) -> list[int]:
    """The ids `generate` produces for `prompt`, called as scripts/generate.py calls it (greedy)."""
    ids = torch.tensor([build_prompt_ids(tokenizer, prompt, strip=False)])
    with torch.inference_mode():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens, do_sample=False,
                             eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.eos_token_id)
    new = out[0, ids.shape[1]:].tolist()
    return new[:new.index(tokenizer.eos_token_id) + 1] if tokenizer.eos_token_id in new else new


@pytest.mark.parametrize("which", ["memorized", "random"])
def test_greedy_tokens_equal_generate_token_by_token_in_a_shared_batch(which, memorized, random_model, engine_for):
    model, tokenizer = memorized if which == "memorized" else random_model
    engine = engine_for(model, tokenizer, max_batch_size=8)
    # Different lengths: the memorized prompt ends at EOS early, the random ones run to the limit.
    results = run(engine, tokenizer, [(p, SamplingParams(max_new_tokens=12 + 5 * i)) for i, p in enumerate(PROMPTS)])
    for i, (prompt, result) in enumerate(zip(PROMPTS, results)):
        expected = generate_ids(model, tokenizer, prompt, 12 + 5 * i)
        assert [t.id for t in result.sequences[0].tokens] == expected, prompt
    assert engine.counts["largest_batch"] > 1  # they did share forward passes


@pytest.mark.parametrize("group_prefill", [False, True], ids=["prefill-alone", "prefill-together"])
def test_a_sequence_does_not_depend_on_its_batch_mates(group_prefill, random_model, engine_for):
    """The same request alone, and among others that join later (staggered by their queue position and prefill)
    and leave earlier: the same tokens, greedy and seeded sampling alike; whether the prompts that arrive together
    are prefilled alone (the CPU's way) or together, left-padded (a GPU's)."""
    model, tokenizer = random_model
    engine = engine_for(model, tokenizer, max_batch_size=3)  # 3 rows: the others queue, then join mid-way
    engine.group_prefill = group_prefill
    for params in (SamplingParams(max_new_tokens=30), SamplingParams(max_new_tokens=30, temperature=0.9, seed=3)):
        alone = run(engine, tokenizer, [("def f(x):", params)])[0]
        others = [(p, SamplingParams(max_new_tokens=4 + 3 * i, temperature=0.7, seed=i, n=1 + i % 2))
                  for i, p in enumerate(PROMPTS)]
        crowded = run(engine, tokenizer, others[:2] + [("def f(x):", params)] + others[2:])[2]
        assert [t.id for t in crowded.sequences[0].tokens] == [t.id for t in alone.sequences[0].tokens]
        assert crowded.seed == alone.seed
    assert engine.counts["largest_batch"] == 3


@pytest.mark.parametrize("n", [1, 3])
def test_seeded_sampling_equals_generate_py(n, memorized, random_model, engine_for):
    """What scripts/generate.py samples for a seed (num_return_sequences = n) is what the engine samples."""
    model, tokenizer = random_model
    engine = engine_for(model, tokenizer, max_batch_size=8)
    params = SamplingParams(max_new_tokens=20, n=n, temperature=0.8, top_p=0.95, seed=7)
    [result] = run(engine, tokenizer, [("def f(x):", params)])
    expected = generate_completions(model, tokenizer, "def f(x):", max_new_tokens=20, temperature=0.8, top_p=0.95,
                                    num_return_sequences=n, seed=7, stop=False, strip_prompt=False)
    assert [s.text for s in result.sequences] == [c.text for c in expected]


def test_stop_strings_end_each_sequence_on_its_own(memorized, engine_for, memorized_code):
    model, tokenizer = memorized
    engine = engine_for(model, tokenizer)
    stop = SamplingParams(max_new_tokens=40, stop=("\ndef",))
    length = SamplingParams(max_new_tokens=3)
    by_stop, by_length, by_eos = run(engine, tokenizer, [("def add(a, b):", stop), ("def add(a, b):", length),
                                                         ("def add(a, b):", SamplingParams(max_new_tokens=40))])
    body = memorized_code[len("def add(a, b):"):]
    seq = by_stop.sequences[0]
    assert seq.finish_reason == "stop_sequence" and seq.text[:seq.stop[0]] == body[:body.index("\ndef")]
    assert by_length.sequences[0].finish_reason == "length" and len(by_length.sequences[0].tokens) == 3
    assert by_eos.sequences[0].finish_reason == "eos_token" and by_eos.sequences[0].text == body
    assert by_eos.sequences[0].tokens[-1].special and by_eos.sequences[0].tokens[-1].text == ""


def test_cancelled_request_leaves_the_batch_and_others_go_on(random_model, engine_for):
    model, tokenizer = random_model
    engine = engine_for(model, tokenizer)
    started, events = threading.Event(), []

    def listener(event):
        events.append(event[0])
        started.set()

    job = engine.submit(build_prompt_ids(tokenizer, "x ="), SamplingParams(max_new_tokens=60, stream=True), listener)
    assert started.wait(30)
    engine.cancel(job)
    [other] = run(engine, tokenizer, [("y =", SamplingParams(max_new_tokens=5))])
    assert len(other.sequences[0].tokens) == 5
    assert events[-1] == "error" and engine.counts["cancelled"] == 1
    assert len(events) < 61  # it did not run to the end
    assert engine.stats()["requests"] == 0


def test_bounds_are_answered_at_submit(random_model):
    model, tokenizer = random_model
    engine = Engine(model, tokenizer, max_batch_size=2, max_requests=2)  # not started: submitted jobs just wait
    ids = build_prompt_ids(tokenizer, "x")
    for _ in range(2):
        engine.submit(ids, SamplingParams(max_new_tokens=4), lambda event: None)
    with pytest.raises(ApiError, match="overloaded") as err:
        engine.submit(ids, SamplingParams(max_new_tokens=4), lambda event: None)
    assert err.value.kind == "overloaded"
    with pytest.raises(ApiError, match="context of 64 tokens"):
        engine.submit(ids, SamplingParams(max_new_tokens=64), lambda event: None)
    with pytest.raises(ApiError, match="at most 2"):
        engine.submit(ids, SamplingParams(max_new_tokens=4, n=3, temperature=1.0), lambda event: None)
    engine.close()


def test_a_request_cancelled_while_it_waits_gives_its_place_back_at_once(random_model, engine_for, monkeypatch):
    """Editors drop a request at each keystroke. One dropped while it waited behind a request waiting for rows kept
    counting against --max-concurrent-requests until that one started: live clients were answered 429."""
    model, tokenizer = random_model
    engine = engine_for(model, tokenizer, max_batch_size=1, max_requests=3)
    gate, real_step = threading.Event(), engine.batch.step
    monkeypatch.setattr(engine.batch, "step", lambda tokens: gate.wait(30) and real_step(tokens))
    ids, params, events = build_prompt_ids(tokenizer, "x ="), SamplingParams(max_new_tokens=3), []
    try:
        engine.submit(ids, params, lambda event: None)  # takes the one row, held at its first step
        engine.submit(ids, params, lambda event: None)  # waits for that row
        gone = engine.submit(ids, params, events.append)  # waits behind it
        engine.cancel(gone)
        assert [event[0] for event in events] == ["error"] and engine.stats()["requests"] == 2
        engine.submit(ids, params, lambda event: None)  # its place is free: not "overloaded"
    finally:
        gate.set()
    assert engine.counts["cancelled"] == 1


def test_a_failing_forward_fails_its_requests_not_the_engine(random_model, engine_for, monkeypatch):
    model, tokenizer = random_model
    engine = engine_for(model, tokenizer)
    real_step = engine.batch.step
    calls = []

    def broken_once(tokens):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("out of memory (simulated)\nsecond line")
        return real_step(tokens)

    monkeypatch.setattr(engine.batch, "step", broken_once)
    failed = run(engine, tokenizer, [("x =", SamplingParams(max_new_tokens=10))])[0]
    assert isinstance(failed, ApiError) and failed.kind == "generation"
    assert str(failed) == "generation failed: RuntimeError: out of memory (simulated)"
    [ok] = run(engine, tokenizer, [("x =", SamplingParams(max_new_tokens=10))])
    assert len(ok.sequences[0].tokens) == 10 and engine.failure is None


def test_a_temperature_too_small_for_float32_is_greedy_not_the_engine_s_end(random_model, engine_for):
    """logits ÷ 1e-40 overflow float32: sampling from them raised inside the engine's loop, which ended every request
    in flight and left the server answering 503. Such a temperature asks for the argmax, and gets it."""
    model, tokenizer = random_model
    engine = engine_for(model, tokenizer)
    tiny, greedy, sampled = run(engine, tokenizer, [
        ("x =", SamplingParams(max_new_tokens=8, temperature=1e-40, seed=1)),
        ("x =", SamplingParams(max_new_tokens=8)),
        ("y =", SamplingParams(max_new_tokens=8, temperature=1.0, n=2, seed=3))])
    assert [t.id for t in tiny.sequences[0].tokens] == [t.id for t in greedy.sequences[0].tokens]
    assert tiny.seed is None  # reported as the greedy request it is
    assert all(len(seq.tokens) == 8 for seq in sampled.sequences) and engine.failure is None


def test_a_request_whose_tokens_cannot_be_chosen_fails_alone(random_model, engine_for, monkeypatch):
    """An error while choosing one request's next token (NaN logits, say) fails that request, at the first token or
    later; its batch-mates and the next requests are served, and nothing waits forever."""
    from codeparrot.serving import sampling

    model, tokenizer = random_model
    engine = engine_for(model, tokenizer)
    real_choose = sampling.TokenChooser.choose

    def choose(self, logits, rows):
        if self.seed == 666 and (self.n == 2 or len(logits) and getattr(self, "calls", 0) >= 3):
            raise RuntimeError("probability tensor contains either `inf`, `nan` or element < 0")
        self.calls = getattr(self, "calls", 0) + 1
        return real_choose(self, logits, rows)

    monkeypatch.setattr(sampling.TokenChooser, "choose", choose)
    first, later, mate = run(engine, tokenizer, [
        ("x =", SamplingParams(max_new_tokens=8, temperature=1.0, n=2, seed=666)),  # fails at its first token
        ("x =", SamplingParams(max_new_tokens=8, temperature=1.0, seed=666)),  # fails at its fourth
        ("y =", SamplingParams(max_new_tokens=8, temperature=1.0, seed=5))])
    for failed in (first, later):
        assert isinstance(failed, ApiError) and str(failed).startswith("generation failed: RuntimeError: probability")
    assert len(mate.sequences[0].tokens) == 8
    [ok] = run(engine, tokenizer, [("z =", SamplingParams(max_new_tokens=4))])
    assert len(ok.sequences[0].tokens) == 4 and engine.failure is None and engine.stats()["requests"] == 0


def test_a_failure_shrinking_the_batch_fails_its_requests_not_the_engine(random_model, engine_for, monkeypatch):
    model, tokenizer = random_model
    engine = engine_for(model, tokenizer)
    real_keep = engine.batch.keep

    def keep(rows):
        if len(rows) == 1:  # the first sequence to finish: the cache is copied without it
            raise RuntimeError("CUDA out of memory (simulated)")
        return real_keep(rows)

    monkeypatch.setattr(engine.batch, "keep", keep)
    short, long = run(engine, tokenizer, [("x =", SamplingParams(max_new_tokens=2)),
                                         ("y =", SamplingParams(max_new_tokens=9))])
    assert len(short.sequences[0].tokens) == 2  # finished before the failure
    assert isinstance(long, ApiError) and "out of memory (simulated)" in str(long)
    monkeypatch.setattr(engine.batch, "keep", real_keep)
    [ok] = run(engine, tokenizer, [("z =", SamplingParams(max_new_tokens=4))])
    assert len(ok.sequences[0].tokens) == 4 and engine.failure is None


def test_any_end_token_ends_a_sequence_without_text(memorized):
    """The server ends sequences at the FIM sentinels too (`end_token_ids`): a sentinel is never part of a text."""
    model, tokenizer = memorized
    first = generate_ids(model, tokenizer, "def add(a, b):", 1)[0]
    engine = Engine(model, tokenizer, end_token_ids=(tokenizer.eos_token_id, first))
    engine.start()
    try:
        [result] = run(engine, tokenizer, [("def add(a, b):", SamplingParams(max_new_tokens=10))])
    finally:
        engine.close()
    seq = result.sequences[0]
    assert (seq.finish_reason, seq.text, [t.id for t in seq.tokens]) == ("eos_token", "", [first])


def test_prompt_logprobs_of_n_sequences_come_from_one_row(random_model, engine_for):
    """`echo` with `logprobs` (TGI's decoder_input_details) asks for the prompt's log-probabilities. The prefill
    made every position's logits for all n copies of the prompt, where one row gives them: a 1,000-token prompt,
    n=16 and a 50k vocabulary made 3 GB of logits. The output layer now never makes more than one row's."""
    model, tokenizer = random_model
    engine = engine_for(model, tokenizer, max_batch_size=8)
    prompt = "def f(x):\n    return [x for x in range(10)]\n"
    made = []
    hook = model.get_output_embeddings().register_forward_hook(lambda module, args, out: made.append(out.numel()))
    try:
        one, four = run(engine, tokenizer, [(prompt, SamplingParams(max_new_tokens=2, prompt_logprobs=True)),
                                            (prompt, SamplingParams(max_new_tokens=2, n=4, temperature=1.0, seed=1,
                                                                    prompt_logprobs=True))])
    finally:
        hook.remove()
    ids = one.prompt_ids
    assert len(ids) > 5 and max(made) <= len(ids) * model.config.vocab_size  # one row (a step has at most 5 rows)
    with torch.inference_mode():
        logp = torch.log_softmax(model(torch.tensor([ids])).logits[0, :-1].float(), dim=-1)
    expected = logp.gather(1, torch.tensor(ids[1:])[:, None])[:, 0]
    assert one.prompt_logprobs[0] is None and four.prompt_logprobs == one.prompt_logprobs
    torch.testing.assert_close(torch.tensor(one.prompt_logprobs[1:]), expected)
    assert len(four.sequences) == 4 and all(len(seq.tokens) == 2 for seq in four.sequences)

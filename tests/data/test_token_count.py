"""The characters-per-token filter's fast token counts: exactly the tokenizer's own counts (so the filter's
decisions do not change), on real code, on every ASCII character in context, and for tokenizers the shortcut
does not fit."""

from __future__ import annotations

import pickle
import random
from pathlib import Path

import pytest

from codeparrot.data.filters import FilterConfig, TextFilter
from codeparrot.data.token_count import TokenCounter, WordCountTokenizer


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory, code_tokenizer) -> Path:
    path = tmp_path_factory.mktemp("code-tokenizer")
    code_tokenizer.save_pretrained(path)
    return path


def _code(stdlib_texts: list[str], n: int) -> list[str]:
    """`n` real files not in the tokenizer's training set, cut to their first ~6,000 characters (fast)."""
    return [t[:6000] for t in stdlib_texts[50:50 + n]]


def _reference(tokenizer_dir: Path, texts: list[str]) -> list[int]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    return [len(tok(t, add_special_tokens=False)["input_ids"]) for t in texts]


def _edge_cases(seed: int = 0) -> list[str]:
    """Every ASCII character between letters, digits, spaces, newlines and quotes (contractions, whitespace
    runs before a word, trailing whitespace), plus random strings over a whitespace-heavy alphabet."""
    texts = []
    for code in range(128):
        c = chr(code)
        texts += [f"a{c}b", f"  {c}  x", f"x{c}{c} 's 'll 'S", f"1{c}2\n\n{c}\t ", f"{c}", f"\n  {c}def f():{c}\r\n"]
    rng = random.Random(seed)
    alphabet = [" "] * 12 + ["\n"] * 4 + ["\t", "\r", "\x0b", "\x0c", "\x1c", "\x1f", "'", "'", "s", "t", "ll", "_",
                                         "=", "(", ")", "0", "7", "a", "Z", "def", "#", "\\", '"', ".", "\x00", "\x7f"]
    texts += ["".join(rng.choice(alphabet) for _ in range(rng.randrange(1, 200))) for _ in range(400)]
    # Non-ASCII: letters, marks, numbers, spaces and symbols of other scripts next to ASCII ones.
    other = ["é", "ß", "φ", "变", "量", "\u0301", "٣", "Ⅻ", "²", "\xa0", "\u3000", "\u2028", "\x85", "€", "😀", "🐍",
             "\U00010437", "'", " ", "\n", "x", "7", "_", "(", "ü"]
    texts += ["".join(rng.choice(other) for _ in range(rng.randrange(1, 120))) for _ in range(300)]
    return texts


def test_counts_equal_the_tokenizers_own_on_code_and_every_ascii_character(tokenizer_dir, stdlib_texts):
    counter = TokenCounter(str(tokenizer_dir)).load()
    assert isinstance(counter._words, WordCountTokenizer)  # the trained code tokenizer takes the shortcut
    texts = [*_code(stdlib_texts, 80), *_edge_cases(), "", "x = '<|endoftext|>'\n<|endoftext|>", "é = 'ü'\n"]
    assert counter._words.count(texts[-2]) is None  # an added token's content: the full encoder counts it
    assert counter(texts) == _reference(tokenizer_dir, texts) == counter.encode_counts(texts)
    assert pickle.loads(pickle.dumps(counter))(texts[:5]) == counter(texts[:5])  # picklable for the workers


def test_filter_decisions_are_the_same_with_the_fast_and_the_full_counts(tokenizer_dir, stdlib_texts):
    # A threshold near the corpus median so that many files are decided by the count.
    counter = TokenCounter(str(tokenizer_dir)).load()
    texts = _code(stdlib_texts, 120)
    ratios = sorted(len(t) / n for t, n in zip(texts, counter.encode_counts(texts)) if n)
    config = FilterConfig(min_chars_per_token=ratios[len(ratios) // 2])
    fast = TextFilter(config, seed=0, count_tokens=counter).reasons(texts)
    full = TextFilter(config, seed=0, count_tokens=counter.encode_counts).reasons(texts)
    assert fast == full and fast.count("chars_per_token") >= 10


def test_other_tokenizer_shapes_fall_back_to_the_full_encoder(tmp_path, stdlib_texts):
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.Lowercase()  # a normalizer changes the text before pre-tokenization
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    tok.train_from_iterator(stdlib_texts[:10], trainers.BpeTrainer(vocab_size=400, show_progress=False,
                                                                   initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    PreTrainedTokenizerFast(tokenizer_object=tok).save_pretrained(tmp_path / "tok")
    counter = TokenCounter(str(tmp_path / "tok")).load()
    assert counter._words is None
    texts = stdlib_texts[10:30]
    assert counter(texts) == _reference(tmp_path / "tok", texts)

"""Exact dedup: the whitespace-free hash matches CodeParrot's definition exactly, and DigestSet is a set."""

from __future__ import annotations

import random
import sys

import numpy as np

from codeparrot.data.exact_dedup import ASCII_WHITESPACE, DigestSet, content_digest, strip_whitespace


def test_strip_whitespace_equals_join_split_on_real_files(stdlib_texts):
    for text in stdlib_texts:
        assert strip_whitespace(text) == "".join(text.split()).encode()


def test_strip_whitespace_knows_every_whitespace_character_python_splits_on():
    every_space = "".join(chr(c) for c in range(sys.maxunicode + 1) if chr(c).isspace())
    assert set(ASCII_WHITESPACE.decode()) == {c for c in every_space if c.isascii()}
    tricky = f"x{every_space}y\u00e9 z\x1cw\u3000v\u00a0u"  # all of them, plus non-ASCII text around
    assert strip_whitespace(tricky) == "".join(tricky.split()).encode() == "xyézwvu".encode()
    assert strip_whitespace("caf\u00e9 =\t1") == "café=1".encode()  # non-ASCII but no Unicode space: fast path


def test_digest_ignores_whitespace_only():
    original = "def add(a, b):\n    return a + b\n"
    variants = [
        "def add(a, b):\r\n    return a + b\r\n",  # CRLF
        "def add(a, b):\n\treturn a + b\n",  # tab indentation
        "def add(a,b):\n    return a+b   \n\n\n",  # spacing and trailing blank lines
        "def\u00a0add(a, b):\n\u3000return a + b",  # NBSP and ideographic space (str.split whitespace)
    ]
    assert {content_digest(v) for v in variants} == {content_digest(original)}
    assert content_digest("def add(a, b):\n    return a - b\n") != content_digest(original)
    assert content_digest("x = 'a b'") == content_digest("x = 'ab'")  # the definition is blind inside strings too


def test_digest_set_matches_a_python_set_across_batches_and_merges():
    rng = random.Random(0)
    reference: set[int] = set()
    digests = DigestSet()
    for _ in range(300):
        batch = [rng.randrange(5000) * 0x9E3779B97F4A7C15 % 2**64 for _ in range(rng.randrange(0, 60))]
        got = digests.add_batch(np.array(batch, dtype=np.uint64))
        expected = []
        for d in batch:
            expected.append(d not in reference)
            reference.add(d)
        assert got.tolist() == expected
    assert len(digests) == len(reference)
    assert digests.nbytes == 8 * len(reference)
    assert all(d in digests for d in list(reference)[:100])
    absent = [d for d in range(200) if d not in reference]
    assert absent and not any(d in digests for d in absent)
    assert len(digests._runs) <= 2 * np.log2(len(reference)) + 2  # logarithmically many runs


def test_first_occurrence_in_input_order_wins_within_a_batch():
    digests = DigestSet()
    assert digests.add_batch([7, 3, 7, 3, 9]).tolist() == [True, True, False, False, True]
    assert digests.add_batch([9, 1, 1]).tolist() == [False, True, False]
    assert digests.add_batch([]).tolist() == []

"""Fixtures shared by the training-dataset tests: the code tokenizer and held-out code they stream."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def tokenizer(code_tokenizer):
    return code_tokenizer


@pytest.fixture(scope="module")
def texts(held_out_code):
    return held_out_code

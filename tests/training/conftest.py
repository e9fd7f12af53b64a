"""Fixtures of the training tests."""

from __future__ import annotations

import pytest

from .in_process import reset_accelerate


@pytest.fixture
def fresh_accelerate_state():
    """Accelerate's process-wide state reset after the test (it builds Accelerators in this process)."""
    yield
    reset_accelerate()

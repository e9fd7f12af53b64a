"""Shared by the sandbox tests: start a Sandbox, or skip with the kernel's reason when it cannot start."""

from __future__ import annotations

import pytest

from codeparrot.errors import CodeParrotError
from codeparrot.sandbox import Sandbox, SandboxConfig


@pytest.fixture(scope="module")
def start_box():
    """A function (config, workers=1) -> started Sandbox; every box it made is closed after the module."""
    boxes = []

    def start(config: SandboxConfig, workers: int = 1) -> Sandbox:
        box = Sandbox(config, num_workers=workers)
        boxes.append(box)
        try:
            box.start()
        except CodeParrotError as err:
            pytest.skip(str(err))
        return box

    yield start
    for box in boxes:
        box.close()


@pytest.fixture(scope="session")
def default_box():
    """The default sandbox (every layer, the guard on) with 2 workers and a 3 s timeout, shared by the tests
    that need nothing else (`run(..., timeout=...)` for a shorter one); skipped where it cannot start."""
    box = Sandbox(SandboxConfig(timeout=3.0), num_workers=2)
    try:
        box.start()
    except CodeParrotError as err:
        box.close()
        pytest.skip(str(err))
    yield box
    box.close()

"""Fixtures of the data tests: one loopback-only local Ray for the whole session (only started by tests that
ask for it; skipped with the reason when Ray is not installed)."""

from __future__ import annotations

import os

import pytest

from codeparrot.data.ray_cluster import LOCAL_RAY_ENV, start_local_ray
from codeparrot.data.ray_pass1 import FAULT_MARKER_ENV


@pytest.fixture(scope="session")
def ray_session(tmp_path_factory):
    """The engine's own loopback-only local Ray with 2 CPUs (`start_local_ray`); `preprocess(engine="ray")`
    uses it instead of starting its own. Yields the folder whose marker file arms the engine's fault injection
    (see `FAULT_MARKER_ENV`)."""
    os.environ.update(LOCAL_RAY_ENV)
    ray = pytest.importorskip("ray", reason="ray is not installed: pip install 'codeparrot[distributed]'")
    if ray.is_initialized():
        ray.shutdown()
    start_local_ray(2)
    os.environ.pop(FAULT_MARKER_ENV, None)
    try:
        yield tmp_path_factory.mktemp("ray-faults")
    finally:
        ray.shutdown()

"""The local Ray cluster the Ray tests share (one per module: starting one takes seconds)."""

import os

import pytest


@pytest.fixture(scope="module")
def cluster():
    """A fresh local 2-CPU cluster: never someone's RAY_ADDRESS; no auth token written to ~/.ray."""
    pytest.importorskip("ray")
    from reasonrl.dist import start_ray, stop_ray

    saved = {key: os.environ.pop(key, None) for key in ("RAY_ADDRESS", "RAY_AUTH_MODE")}
    os.environ["RAY_AUTH_MODE"] = "disabled"
    start_ray(None, num_cpus=2, num_gpus=0, object_store_memory=128 << 20)
    yield
    stop_ray()
    for key, value in saved.items():
        os.environ.pop(key, None)
        if value is not None:
            os.environ[key] = value

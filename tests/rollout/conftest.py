"""Fixtures shared by the engine tests."""

import pytest

from reasonrl.models.load import load_model, load_tokenizer
from reasonrl.models.tiny import build_tiny_random


@pytest.fixture(scope="module")
def tiny_vllm(tmp_path_factory):
    """tiny-random with 32-wide attention heads (vLLM's CPU attention has no 16-wide kernel)."""
    directory = tmp_path_factory.mktemp("tiny-head32")
    build_tiny_random(directory, head_dim=32)
    return load_model(str(directory)), load_tokenizer(str(directory))

"""Fixtures shared by the engine tests."""

import pytest

from reasonrl.models.load import load_model, load_tokenizer, vision_processor
from reasonrl.models.tiny import build_tiny_random, build_tiny_random_vlm


@pytest.fixture(scope="module")
def tiny_vllm(tmp_path_factory):
    """tiny-random with 32-wide attention heads (vLLM's CPU attention has no 16-wide kernel)."""
    directory = tmp_path_factory.mktemp("tiny-head32")
    build_tiny_random(directory, head_dim=32)
    return load_model(str(directory)), load_tokenizer(str(directory))


@pytest.fixture(scope="module")
def tiny_vlm_vllm(tmp_path_factory):
    """tiny-random-vlm with 32-wide attention heads, and its processor."""
    directory = tmp_path_factory.mktemp("tiny-vlm-head32")
    build_tiny_random_vlm(directory, head_dim=32)
    return load_model(str(directory)), load_tokenizer(str(directory)), vision_processor(str(directory))

"""The main job on the real embedded model (slow: minutes; `make test-slow`)."""

import json

import pytest

from reasonrl.config import load_config
from reasonrl.models.load import load_model, load_tokenizer
from reasonrl.training.loop import fit

pytestmark = pytest.mark.slow


def test_builtin_model_loads_offline_and_chats():
    tokenizer = load_tokenizer("smollm2-135m")
    model = load_model("smollm2-135m")
    assert model.config.vocab_size == 49152 and tokenizer.eos_token == "<|im_end|>"
    assert tokenizer.pad_token_id == tokenizer.eos_token_id  # why masks are always explicit


def test_two_dapo_steps_on_the_embedded_model(tmp_path):
    cfg = load_config("dapo", ["train.rollout_steps=2", "data.eval_prompts=20"])
    summary = fit(cfg, tmp_path, preset="dapo", show_progress=False)
    assert summary["peak_rss_gb"] < 6.0
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [0, 1, 2]
    assert all(len(r) > 10 for r in records[1:])

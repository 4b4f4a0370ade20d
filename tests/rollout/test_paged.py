"""rollout.engine=paged (transformers' continuous batching, a paged KV cache) beyond the engine contract of
test_engines.py: filtered sampling's log-probs, runs that generate with it (GRPO agreeing with the trainer as
closely as the hf engine does, T-PPO's windows, PAG's conversations), and its refusals."""

import dataclasses

import pytest
import torch

from reasonrl.batch import ImagePrompt
from reasonrl.config import load_config
from reasonrl.models.load import ModelError, load_model, load_tokenizer
from reasonrl.rollout import SamplingParams, build_engine
from reasonrl.rollout.paged import cache_settings
from reasonrl.rollout.sampling import sampling_logprobs
from reasonrl.training.loop import fit
from reasonrl.training.record.metrics import read_metrics
from tests.helpers import DigitFraction
from tests.rollout.test_engines import PROMPTS, paged_available
from tests.train.test_loop import tiny_config
from tests.train.test_multiturn import PAG_TINY
from tests.train.test_tppo import tppo_config

needs_paged = pytest.mark.skipif(not paged_available(), reason="this transformers lacks continuous batching log-probs")


@pytest.fixture(scope="module")
def tiny():
    return load_model("tiny-random"), load_tokenizer("tiny-random")


@needs_paged
def test_the_log_probs_of_filtered_sampling_are_the_filtered_distributions(tiny):
    model, tokenizer = tiny
    engine = build_engine("paged", model, tokenizer, dtype=torch.float32)
    params = SamplingParams(max_new_tokens=8, temperature=0.8, top_k=20, top_p=0.9, seed=1)
    for prompt, completion in zip(PROMPTS, engine.generate(PROMPTS, params), strict=True):
        with torch.no_grad():
            logits = model(torch.tensor([prompt + completion.token_ids])).logits[0]
        positions = logits[len(prompt) - 1 : len(prompt) - 1 + len(completion.token_ids)]  # [T, V]
        expected = sampling_logprobs(positions, 0.8, 20, 0.9).gather(1, torch.tensor(completion.token_ids)[:, None])
        torch.testing.assert_close(torch.tensor(completion.logprobs), expected[:, 0], atol=1e-4, rtol=0)


def generated_steps(run_dir):
    steps = [r for r in read_metrics(run_dir / "metrics.jsonl") if r["step"] > 0]
    assert steps and all(r["rollout/tokens_generated"] > 0 for r in steps)
    return steps


@needs_paged
def test_a_grpo_run_on_paged_agrees_with_the_trainer_as_closely_as_on_hf(tmp_path):
    gaps = {}
    for engine in ("hf", "paged"):
        cfg = tiny_config("train.rollout_steps=2", f"rollout.engine={engine}", "model.dtype=float32", "run.seed=1")
        fit(cfg, tmp_path / engine, verifier=DigitFraction(), show_progress=False)
        gaps[engine] = max(r["rollout/logprob_abs_diff"] for r in generated_steps(tmp_path / engine))
    assert gaps["paged"] <= gaps["hf"] + 1e-5 and gaps["paged"] < 1e-4, gaps  # fp32 engine and trainer


@needs_paged
def test_t_ppo_windows_and_pag_conversations_generate_on_paged(tmp_path):
    fit(tppo_config("rollout.engine=paged", "train.rollout_steps=3"), tmp_path / "t_ppo", verifier=DigitFraction())
    windows = generated_steps(tmp_path / "t_ppo")
    assert any(r["rollout/pool_fill"] > 0 for r in windows)
    pag = load_config("pag", [*PAG_TINY[:-2], "train.rollout_steps=2", "run.eval_every=100", "rollout.engine=paged"])
    fit(pag, tmp_path / "pag", verifier=DigitFraction(), show_progress=False)
    assert all(r["multiturn/turns_mean"] >= 1 for r in generated_steps(tmp_path / "pag"))


def test_a_transformers_without_continuous_batching_log_probs_is_refused_with_the_engines_that_work(tiny, monkeypatch):
    import transformers.generation.configuration_utils as configuration

    @dataclasses.dataclass
    class OlderContinuousBatchingConfig:  # before log-probs and seeds
        num_blocks: int | None = None

    monkeypatch.setattr(configuration, "ContinuousBatchingConfig", OlderContinuousBatchingConfig)
    with pytest.raises(ModelError, match=r"rollout.engine=paged needs transformers' continuous batching .* use "):
        build_engine("paged", *tiny)


@needs_paged
def test_a_prompt_with_images_is_refused(tiny):
    engine = build_engine("paged", *tiny, dtype=torch.float32)
    with pytest.raises(ValueError, match=r"rollout.engine=paged is text-only"):
        engine.generate([ImagePrompt([1, 2, 3], {"pixel_values": torch.zeros(1, 3, 4, 4)})], SamplingParams(4))


def test_the_page_size_goes_by_the_name_this_transformers_gives_it(tiny, monkeypatch):
    import transformers.generation.configuration_utils as configuration

    @dataclasses.dataclass
    class ContinuousBatchingConfig517:  # transformers 5.17 (the GPU machines'): block_size, not page_size
        block_size: int = 256
        num_blocks: int | None = None
        max_batch_tokens: int | None = None
        max_requests_per_batch: int | None = None
        return_logprobs: bool = False
        seed: int | None = None

    monkeypatch.setattr(configuration, "ContinuousBatchingConfig", ContinuousBatchingConfig517)
    engine = build_engine("paged", *tiny, dtype=torch.float32)
    settings = cache_settings([[1, 2, 3], [4] * 300], 100, engine.page_field, engine.max_batch_sequences)
    assert settings["block_size"] == 256 and "page_size" not in settings
    assert settings["num_blocks"] == 1 + 2 + 1  # 103 tokens in one page, 400 in two, one spare


@needs_paged
def test_partial_rollouts_in_the_producer_and_lora_generate_on_paged(tmp_path):
    partial = ("rollout.max_staleness=1", "rollout.partial_rollouts=true", "rollout.partial_window_tokens=4")
    cfg = tiny_config("train.rollout_steps=2", "rollout.engine=paged", *partial)
    fit(cfg, tmp_path / "partial", verifier=DigitFraction(), show_progress=False)
    assert all(r["rollout/reprefill_tokens"] > 0 for r in generated_steps(tmp_path / "partial"))  # windows continued
    lora = tiny_config("train.rollout_steps=2", "rollout.engine=paged", "model.lora_rank=4", "train.lr=1e-2")
    fit(lora, tmp_path / "lora", verifier=DigitFraction(), show_progress=False)
    assert all(r["rollout/logprob_abs_diff"] < 0.01 for r in generated_steps(tmp_path / "lora"))  # ~1e-3, as hf

"""RL on a vision-language policy (tiny-random-vlm) end to end: GRPO on a visual task, resume parity,
exported model and evaluation, the image placeholder never sampled, and what is not supported yet refused."""

import re

import pytest
import torch
from safetensors.torch import load_file

from reasonrl.config import ConfigError, load_config
from reasonrl.data.loaders import DataError, load_examples
from reasonrl.data.prompts import PromptEncoder
from reasonrl.jobs.evaluate import EvalSettings, run_eval
from reasonrl.jobs.offline_sample import OfflineSampleRun, run_sampling
from reasonrl.models.load import load_model, load_tokenizer, vision_processor
from reasonrl.rollout import SamplingParams, build_engine
from reasonrl.training.loop import fit
from reasonrl.training.record.metrics import read_metrics
from tests.train.test_loop import comparable

VLM_RUN = [
    "model.name_or_path=tiny-random-vlm",
    "data.dataset=visual_counting",
    "rollout.rollout_prompts=2",
    "rollout.samples_per_prompt=4",
    "rollout.max_response_tokens=8",
    "train.minibatch_sequences=4",
    "data.eval_prompts=4",
    "reward.workers=1",
    "train.lr=1e-3",
    "run.save_every=2",
]


def test_grpo_on_a_visual_task_resumes_exactly_and_exports_a_model_eval_reads(tmp_path):
    straight, split = tmp_path / "straight", tmp_path / "split"
    fit(load_config("grpo", [*VLM_RUN, "train.rollout_steps=4"]), straight, show_progress=False)
    fit(load_config("grpo", [*VLM_RUN, "train.rollout_steps=2"]), split, show_progress=False)
    fit(load_config("grpo", [*VLM_RUN, "train.rollout_steps=4"]), split, show_progress=False)
    a = load_file(straight / "checkpoints" / "step-000004" / "model.safetensors")
    b = load_file(split / "checkpoints" / "step-000004" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    records = read_metrics(straight / "metrics.jsonl")
    assert comparable(records) == comparable(read_metrics(split / "metrics.jsonl"))
    assert any("vision_model" in k for k in a)  # the vision encoder is trained with the language model
    assert all("reward/mean" in r for r in records if r["step"] > 0)
    assert (straight / "final" / "processor_config.json").exists()  # the export keeps the processor
    result = run_eval(EvalSettings(model=str(straight), dataset="visual_grounding", limit=2, max_new_tokens=4))
    assert result["problems"] == 2 and 0.0 <= result["greedy_pass@1"] <= 1.0


def test_pag_evaluation_and_the_data_commands_on_image_prompts(tmp_path):
    result = run_eval(EvalSettings(model="tiny-random-vlm", dataset="visual_counting", limit=2, max_new_tokens=4,
                                   protocol="pag"))  # fmt: skip
    assert 0.0 <= result["acc@final"] <= 1.0  # the revision turns keep the prompt's images
    with pytest.raises(DataError, match=r"has prompts with images .* write text prompts only"):
        run_sampling(OfflineSampleRun(model="tiny-random-vlm", dataset="visual_counting", out=str(tmp_path / "s")))


def test_the_image_placeholder_is_never_sampled_even_where_the_model_favours_it():
    model, tokenizer = load_model("tiny-random-vlm"), load_tokenizer("tiny-random-vlm")
    image_token = model.config.image_token_id
    with torch.no_grad():  # make the placeholder by far the likeliest next token everywhere
        model.get_output_embeddings().weight[image_token] *= 0
        model.get_output_embeddings().weight[image_token] += model.model.text_model.norm.weight * 50
    encoder = PromptEncoder(tokenizer, "answer_line", 4096, processor=vision_processor("tiny-random-vlm"))
    prompts = [encoder(e) for e in load_examples("visual_counting", "test")[:4]]
    completions = build_engine("hf", model, tokenizer).generate(prompts, SamplingParams(6, 1.0, seed=0))
    assert all(image_token not in c.token_ids for c in completions)
    assert all(torch.isfinite(torch.tensor(c.logprobs)).all() for c in completions)


@pytest.mark.parametrize(
    ("preset", "extra", "named"),
    [
        ("t_ppo", ["algo.window_tokens=4"], "algo.window_tokens (T-PPO)"),
        ("pag", [], "rollout.multiturn"),
        ("grpo", ["model.lora_rank=4"], "model.lora_rank"),
        ("vapo", ["critic.init=reward_model", "critic.path=runs/rm"], "critic.init=reward_model or prm (a text model)"),
    ],
)
def test_what_a_vlm_cannot_train_with_yet_is_refused_before_loading(tmp_path, preset, extra, named):
    cfg = load_config(preset, [*VLM_RUN, *extra, "train.rollout_steps=1"])
    with pytest.raises(ConfigError, match=f"vision-language model.*{re.escape(named)}"):
        fit(cfg, tmp_path, show_progress=False)


def test_a_value_based_preset_trains_a_vlm_critic(tmp_path):
    overrides = [*VLM_RUN, "train.rollout_steps=1", "algo.value_pretrain_steps=1", "train.minibatch_sequences=8"]
    fit(load_config("vapo", overrides), tmp_path, show_progress=False)
    (step,) = [r for r in read_metrics(tmp_path / "metrics.jsonl") if r["step"] == 1]
    assert step["critic/value_loss"] > 0 and 0 < step["critic/grad_norm"] < float("inf")

"""Offline training on tiny-random: the dataset file, DPO and DQO learning, resume parity, clear errors."""

import dataclasses
import json
import math

import pytest
import torch
from safetensors.torch import load_file

from reasonrl.config import ConfigError, load_config
from reasonrl.data.loaders import DataError
from reasonrl.data.offline_dataset import OfflineSample, preference_pairs, read_samples
from reasonrl.training.loop import fit
from reasonrl.training.record.metrics import read_metrics
from tests.train.test_loop import comparable, undocumented_metrics

UNIFORM = -math.log(259)  # the byte-level tiny-random vocabulary
GOOD, BAD = [100, 101, 102, 103, 2], [150, 151, 152, 2]  # 2 = <|im_end|>


def write_samples(path, prompts=6, per_prompt=4, process=False):
    """An offline dataset where half the responses of every prompt are GOOD (reward 1) and half BAD (0)."""
    with path.open("w") as handle:
        for p in range(prompts):
            for j in range(per_prompt):
                good = j % 2 == 0
                response = GOOD if good else BAD
                row = {
                    "id": f"p{p}/{j}",
                    "example_id": f"p{p}",
                    "prompt_token_ids": [1, 40 + p, 41 + p, 42],
                    "response_token_ids": response,
                    "behaviour_logprobs": [UNIFORM] * len(response),
                    "reward": 1.0 if good else 0.0,
                    "correct": good,
                }
                if process and good:
                    row["process_rewards"] = [[1, 0.1]]
                handle.write(json.dumps(row) + "\n")
    return path


OFFLINE = [
    "model.name_or_path=tiny-random",
    "data.eval_prompts=4",
    "rollout.max_response_tokens=8",
    "train.minibatch_sequences=8",
    "train.microbatch_tokens=512",
    "run.eval_every=100",
    "reward.workers=1",
]


def offline_config(preset, path, *overrides):
    return load_config(preset, [*OFFLINE, f"data.offline_path={path}", *overrides])


def sequence_logprob(model, prompt, response):
    ids = torch.tensor([prompt + response])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : -1].log_softmax(-1)
    return logits.gather(-1, torch.tensor(response)[:, None]).sum().item()


def final_margin(run_dir, reference_dir):
    """How much more the trained policy prefers GOOD over BAD than the initial one does."""
    from transformers import AutoModelForCausalLM

    trained = AutoModelForCausalLM.from_pretrained(run_dir / "final")
    initial = AutoModelForCausalLM.from_pretrained(reference_dir)
    prompt = [1, 40, 41, 42]

    def margin(model):
        return sequence_logprob(model, prompt, GOOD) - sequence_logprob(model, prompt, BAD)

    return margin(trained) - margin(initial)


def tiny_random_dir():
    from reasonrl.models.load import resolve_model

    return resolve_model("tiny-random")


def test_preference_pairs_take_each_response_once_and_skip_unanimous_prompts():
    def sample(prompt, j, correct):
        return OfflineSample(f"{prompt}/{j}", prompt, (1,), (5,), (-1.0,), float(correct), correct)

    samples = [sample("a", 0, False), sample("a", 1, True), sample("a", 2, False), sample("a", 3, True),
               sample("b", 0, True), sample("b", 1, True), sample("c", 0, False), sample("c", 1, True)]  # fmt: skip
    pairs = [(samples[chosen].id, samples[rejected].id) for chosen, rejected in preference_pairs(samples)]
    assert pairs == [("a/1", "a/0"), ("a/3", "a/2"), ("c/1", "c/0")]


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ({"id": "x"}, "missing example_id"),
        ({"behaviour_logprobs": [-1.0]}, "1 behaviour_logprobs for 5 response tokens"),
        ({"reward": float("nan")}, "finite numbers"),
        ({"behaviour_logprobs": [0.5, -1, -1, -1, -1]}, "positive"),
        ({"process_rewards": [[9, 1.0]]}, "outside the response"),
        ({"prompt_token_ids": []}, "empty prompt_token_ids"),
        ({"reward": 0.5}, "id 'p0/0' is already the id of line 1"),
    ],
)
def test_a_malformed_sample_is_named_with_its_line(tmp_path, row, message):
    path = write_samples(tmp_path / "samples.jsonl", prompts=1, per_prompt=2)
    good = json.loads(path.read_text().splitlines()[0])
    bad = {**good, **row}
    if row == {"reward": 0.5}:  # the same id as line 1
        bad["id"] = good["id"]
    if row == {"id": "x"}:
        del bad["example_id"]
    path.write_text(path.read_text() + json.dumps(bad) + "\n")
    with pytest.raises(DataError, match=f"samples.jsonl:3: .*{message}"):
        read_samples(path)


def test_offline_presets_need_a_dataset_and_dpo_an_even_batch(tmp_path):
    with pytest.raises(ConfigError, match=r"data\.offline_path=FILE"):
        load_config("dqo", ["data.offline_path=null"])
    with pytest.raises(ConfigError, match="must be even"):
        load_config("dpo", ["train.minibatch_sequences=7"])
    with pytest.raises(ConfigError, match=r"algo\.offline is none"):
        load_config("grpo", [f"data.offline_path={tmp_path}/x.jsonl"])


def test_a_file_from_another_tokenizer_is_refused_before_training(tmp_path):
    path = write_samples(tmp_path / "samples.jsonl")
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    rows[0]["response_token_ids"][0] = 40_000
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(DataError, match="outside the model's vocabulary"):
        fit(offline_config("dqo", path, "train.rollout_steps=1"), tmp_path / "run", show_progress=False)


def test_dpo_learns_to_prefer_the_correct_responses(tmp_path):
    path = write_samples(tmp_path / "samples.jsonl")
    cfg = offline_config("dpo", path, "train.rollout_steps=12", "train.lr=1e-3")
    summary = fit(cfg, tmp_path / "run", show_progress=False)
    records = [r for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if "reward/margin" in r]
    assert len(records) == 12 and summary["steps"] == 12
    assert records[0]["reward/margin"] == pytest.approx(0.0, abs=1e-3)  # step 1 trains at the reference (up to bf16)
    assert records[-1]["reward/margin"] > 1.0 and records[-1]["reward/pairwise_accuracy"] == 1.0
    assert records[-1]["loss/dpo"] < math.log(2) < records[0]["loss/dpo"] + 1e-4
    assert final_margin(tmp_path / "run", tiny_random_dir()) > 1.0
    assert (tmp_path / "run" / "reference_logprobs.pt").exists()
    assert not undocumented_metrics(tmp_path / "run" / "metrics.jsonl")


def test_dqo_raises_the_rewarded_responses_and_fits_its_value_model(tmp_path):
    path = write_samples(tmp_path / "samples.jsonl", process=True)
    cfg = offline_config("dqo", path, "train.rollout_steps=12", "train.lr=1e-3", "critic.lr=1e-2")
    fit(cfg, tmp_path / "run", show_progress=False)
    records = [r for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if "loss/dqo_q" in r]
    assert len(records) == 12
    assert records[-1]["critic/value_loss"] < records[0]["critic/value_loss"]
    assert all(0 < r["dqo/weight_mean"] <= 2.0 for r in records)
    assert final_margin(tmp_path / "run", tiny_random_dir()) > 0.5
    assert not undocumented_metrics(tmp_path / "run" / "metrics.jsonl")


def test_offline_resume_parity(tmp_path):
    path = write_samples(tmp_path / "samples.jsonl")
    settings = ("run.save_every=2", "train.lr=1e-3", "critic.lr=1e-2")
    straight, split = tmp_path / "straight", tmp_path / "split"
    fit(offline_config("dqo", path, "train.rollout_steps=4", *settings), straight, show_progress=False)
    fit(offline_config("dqo", path, "train.rollout_steps=2", *settings), split, show_progress=False)
    fit(offline_config("dqo", path, "train.rollout_steps=4", *settings), split, show_progress=False)
    a = load_file(straight / "checkpoints" / "step-000004" / "model.safetensors")
    b = load_file(split / "checkpoints" / "step-000004" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert comparable(read_metrics(straight / "metrics.jsonl")) == comparable(read_metrics(split / "metrics.jsonl"))


def test_a_changed_dataset_is_refused_on_resume(tmp_path):
    path = write_samples(tmp_path / "samples.jsonl")
    fit(offline_config("dqo", path, "train.rollout_steps=1", "run.save_every=1"), tmp_path / "run", show_progress=False)
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    rows[0]["response_token_ids"] = BAD  # the file was re-sampled into the same path
    rows[0]["behaviour_logprobs"] = [UNIFORM] * len(BAD)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(DataError, match="the offline dataset changed since this run began"):
        fit(offline_config("dqo", path, "train.rollout_steps=2"), tmp_path / "run", show_progress=False)


@pytest.mark.parametrize("preset", ["dpo", "dqo"])
def test_an_offline_step_does_not_depend_on_the_micro_batch_size(tmp_path, preset):
    """The same step with every row in one micro-batch and with a micro-batch per pair or row gives the same
    losses, metrics and gradient norms (global denominators; DPO's pairs stay whole).  Weights are not
    compared: Adam's first step divides each gradient by its own size, which magnifies rounding where a
    gradient is near 0."""
    from reasonrl.training.loop import REFERENCE_CACHE, train_step
    from reasonrl.training.offline_steps import compute_reference
    from reasonrl.training.setup import setup

    path = tmp_path / "samples.jsonl"
    rows = [json.loads(line) for line in write_samples(tmp_path / "base.jsonl").read_text().splitlines()]
    for i, row in enumerate(rows):  # prompts of different lengths
        row["prompt_token_ids"] = row["prompt_token_ids"] + [60 + k for k in range(i % 5)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    results = []
    for budget in (10_000, 12):
        cfg = offline_config(preset, path, "train.lr=1e-3", "critic.lr=1e-2", "model.dtype=float32")
        run = setup(cfg, tmp_path / f"run-{budget}")
        compute_reference(run, run.offline, tmp_path / f"{REFERENCE_CACHE}-{budget}")
        run.plan = dataclasses.replace(run.plan, microbatch_tokens=budget)
        metrics = train_step(run, 1)
        results.append(metrics)
        run.close()
    one, many = results
    assert "train/grad_norm" in one
    for key in one:
        if not key.startswith("perf/"):
            assert many[key] == pytest.approx(one[key], rel=1e-4, abs=1e-6), key

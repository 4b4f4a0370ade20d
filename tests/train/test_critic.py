"""The critic: where values are read, its update, value pretraining, and the PPO family in the loop."""

import dataclasses
import json

import pytest
import torch

from reasonrl.algo.advantage_estimators import gae
from reasonrl.algo.masked import masked_whiten
from reasonrl.algo.presets import AlgoSpec, get_preset
from reasonrl.config import load_config
from reasonrl.models.value import ValueModel, load_value_model, value_model_from_policy
from reasonrl.training.loop import fit, setup, value_pretrain_stage
from reasonrl.training.record.metrics import read_metrics
from reasonrl.training.update.advantage_stage import assign_advantages
from reasonrl.training.update.critic import CriticUpdater
from reasonrl.training.value_pretrain import pretrain_critic
from tests.helpers import DigitFraction
from tests.train.test_loop import TINY, undocumented_metrics
from tests.train.test_step import rollout_batch, updated_parameters


def critic_updater(model, lr=1e-3, microbatch_tokens=10_000, minibatch=8):
    return CriticUpdater(
        model,
        torch.optim.Adam(model.parameters(), lr=lr),
        value_clip=None,
        minibatch_sequences=minibatch,
        epochs=1,
        microbatch_tokens=microbatch_tokens,
        grad_clip=None,
        compute_dtype=torch.float32,
    )


def randomised_head(model: ValueModel, seed=0) -> ValueModel:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        model.head.weight.copy_(torch.randn(model.head.weight.shape, generator=g))
        model.head.bias.fill_(0.3)
    return model


def test_values_are_read_at_the_position_before_each_response_token_whatever_the_padding():
    model = randomised_head(value_model_from_policy("tiny-random"))
    batch = rollout_batch(3, rows=4)
    values = critic_updater(model).values(batch)  # [B, T], batched with left/right padding
    for row in range(len(batch)):
        prompt = batch.prompt_ids[row][batch.prompt_mask[row]]
        response = batch.response_ids[row][batch.response_mask[row]]
        ids = torch.cat([prompt, response])[None]
        with torch.no_grad():
            hidden = model.backbone(input_ids=ids).last_hidden_state[0]  # [P+T, d], no padding
        expected = model.head(hidden[len(prompt) - 1 : len(prompt) - 1 + len(response)]).squeeze(-1)
        torch.testing.assert_close(values[row, : len(response)], expected, atol=1e-5, rtol=1e-4)
        assert torch.all(values[row, len(response) :] == 0)


def with_targets(batch, gamma=1.0):
    batch.rewards = torch.arange(len(batch), dtype=torch.float32) % 2
    batch.values = torch.zeros(batch.response_mask.shape)
    spec = AlgoSpec(advantage_estimator="gae", lambda_critic=1.0, gamma=gamma)
    assign_advantages(batch, spec, 0.0)
    return batch


def test_critic_update_is_invariant_to_the_micro_batch_split():
    updated = []
    for budget in (10_000, 20):
        torch.manual_seed(0)
        model = randomised_head(value_model_from_policy("tiny-random"))
        metrics = critic_updater(model, microbatch_tokens=budget).update(with_targets(rollout_batch(4)), seed=0)
        updated.append((dict(model.named_parameters()), metrics))
    (whole, m_whole), (split, m_split) = updated
    for name in whole:
        torch.testing.assert_close(split[name], whole[name], atol=1e-6, rtol=1e-5, msg=name)
    assert m_split["critic/value_loss"] == pytest.approx(m_whole["critic/value_loss"], rel=1e-5)


class PromptDecidesReturn:
    """A collector stand-in: the last prompt token decides the reward (a learnable value)."""

    def collect(self, step, seed_step):
        batch = rollout_batch(seed_step % 10_000, rows=16)
        batch.prompt_ids[:8, -1], batch.prompt_ids[8:, -1] = 5, 7  # prompts are left-padded: -1 is real
        batch.rewards = (torch.arange(16) < 8).float()
        return batch, {"reward/mean": batch.rewards.mean().item()}


def test_explained_variance_rises_during_value_pretraining_on_a_learnable_value():
    torch.manual_seed(0)
    critic = critic_updater(value_model_from_policy("tiny-random"), lr=3e-3, minibatch=16)
    records = []
    steps = pretrain_critic(
        PromptDecidesReturn(),
        critic,
        steps=25,
        ev_target=None,
        gamma=1.0,
        seed=0,
        on_step=lambda step, m: records.append(m),
    )
    ev = [r["critic/explained_variance"] for r in records]
    assert steps == 25 and ev[0] == pytest.approx(0.0, abs=1e-6)  # zero head: V ≡ 0 explains nothing
    early, late = sum(ev[:5]) / 5, sum(ev[-5:]) / 5
    assert early < 0.2 and late > 0.45, ev  # measured: 0.13 -> 0.64
    # the early stop ends pretraining at the first step that reaches the target
    critic = critic_updater(value_model_from_policy("tiny-random"), lr=3e-3, minibatch=16)
    records.clear()
    steps = pretrain_critic(
        PromptDecidesReturn(),
        critic,
        steps=25,
        ev_target=0.5,
        gamma=1.0,
        seed=0,
        on_step=lambda s, m: records.append(m),
    )
    assert steps < 25 and records[-1]["critic/explained_variance"] >= 0.5
    assert all(r["critic/explained_variance"] < 0.5 for r in records[:-1])


def vapo_tiny(*overrides):
    return load_config("vapo", [*TINY, "algo.value_pretrain_steps=2", *overrides])


def test_value_pretraining_never_changes_the_actor_and_saves_the_critic(tmp_path):
    run = setup(vapo_tiny(), tmp_path, verifier=DigitFraction())
    try:
        actor = {n: p.detach().clone() for n, p in run.model.named_parameters()}
        critic = {n: p.detach().clone() for n, p in run.critic.model.named_parameters()}
        summary = value_pretrain_stage(run, show_progress=False)
        assert all(torch.equal(p, actor[n]) for n, p in run.model.named_parameters())
        assert any(not torch.equal(p, critic[n]) for n, p in run.critic.model.named_parameters())
    finally:
        run.close()
    assert summary["value_pretrain_steps"] == 2
    records = read_metrics(tmp_path / "value_pretrain.jsonl")
    assert [r["step"] for r in records] == [1, 2]
    assert all("critic/explained_variance" in r and "critic/value_loss" in r for r in records)
    # a fresh zero head starts at the first batch's mean return (the best constant), not at 0
    assert records[0]["critic/value_mean"] == pytest.approx(records[0]["critic/return_mean"], abs=1e-5)
    assert records[0]["critic/return_mean"] != 0
    assert (tmp_path / "value_pretrain.png").stat().st_size > 0
    saved = load_value_model(tmp_path / "critic_pretrained")
    for name, value in run.critic.model.state_dict().items():
        assert torch.equal(saved.state_dict()[name], value), name


def test_a_saved_critic_is_loaded_and_skips_pretraining(tmp_path):
    first = tmp_path / "first"
    fit(vapo_tiny("train.rollout_steps=1"), first, verifier=DigitFraction(), show_progress=False)
    saved = first / "checkpoints" / "step-000001" / "critic"
    cfg = vapo_tiny("train.rollout_steps=1", "critic.init=checkpoint", f"critic.path={saved}")
    run = setup(cfg, tmp_path / "second", verifier=DigitFraction())
    try:
        assert run.plan.value_pretrain_steps == 0
        expected = load_value_model(saved).state_dict()
        assert all(torch.equal(expected[n], v) for n, v in run.critic.model.state_dict().items())
    finally:
        run.close()
    with pytest.raises(Exception, match="not a saved value model"):
        load_value_model(first / "final")


def test_vapo_with_mu_zero_and_constant_lambda_is_clip_higher_token_mean_ppo():
    vapo = dataclasses.replace(get_preset("vapo"), nll_weight=0.0, lambda_policy_mode="fixed", lambda_policy=0.9)
    # advantages: plain GAE(λ = 0.9), whitened over the batch; critic targets: Monte-Carlo returns
    batch = rollout_batch(5)
    batch.rewards = torch.tensor([1.0, 0, 0, 1, 1, 0, 1, 0])
    batch.values = torch.where(batch.response_mask, 0.1 * torch.randn(batch.response_mask.shape), 0.0)
    assign_advantages(batch, vapo, 0.0)
    token_rewards = batch.token_rewards
    expected, _ = gae(token_rewards, batch.values, batch.response_mask, 1.0, 0.9)
    torch.testing.assert_close(batch.advantages, masked_whiten(expected, batch.response_mask))
    # the actor loss: the clip-higher (0.2 / 0.28) token-mean surrogate and nothing else
    plain = AlgoSpec(eps_low=0.2, eps_high=0.28, loss_agg="token-mean")
    ours, _, _ = updated_parameters(10_000, None, batch, lr=0.1, spec=vapo)
    reference, _, _ = updated_parameters(10_000, None, batch, lr=0.1, spec=plain)
    for name in ours:
        assert torch.equal(ours[name], reference[name]), name


def parameter_delta(batch, mu):
    from reasonrl.models.load import load_model

    before = dict(load_model("tiny-random").named_parameters())
    spec = AlgoSpec(eps_high=0.28, loss_agg="token-mean", nll_weight=mu)
    after, _, _ = updated_parameters(10_000, None, batch, lr=0.1, spec=spec)  # plain SGD: Δθ = −lr·∇L
    return torch.cat([(after[n] - before[n]).detach().flatten() for n in before])


def test_nll_scales_linearly_with_mu_and_ignores_incorrect_sequences_in_the_update():
    batch = rollout_batch(6)
    d0, d1, d2 = (parameter_delta(batch, mu) for mu in (0.0, 0.1, 0.2))
    assert (d1 - d0).abs().max() > 1e-6  # the term is there
    torch.testing.assert_close(d2 - d0, 2 * (d1 - d0), atol=2e-6, rtol=1e-3)
    batch.correct[:] = False  # no correct sequence: μ changes nothing
    torch.testing.assert_close(parameter_delta(batch, 0.5), parameter_delta(batch, 0.0), atol=0, rtol=0)


def test_vapo_reward_rises_on_tiny_random(tmp_path):
    # 12-token answers: the preset's (the paper's) alpha = 0.05 clamps lambda to 0 below 21 tokens, one-step TD
    # on a critic trained for seconds, which does not learn in 20 steps (docs/algorithms.md, "VAPO's alpha on
    # short answers"); this test checks that the VAPO pipeline learns, with alpha scaled to the answer length
    scaled_alpha = "algo.length_alpha=5"
    cfg = vapo_tiny("train.rollout_steps=20", "train.lr=3e-3", "run.eval_every=100", "run.save_every=100", scaled_alpha)
    fit(cfg, tmp_path, verifier=DigitFraction(), show_progress=False)
    records = read_metrics(tmp_path / "metrics.jsonl")
    rewards = [r["reward/mean"] for r in records if "reward/mean" in r]
    first, last = sum(rewards[:4]) / 4, sum(rewards[-4:]) / 4
    assert last > first + 0.3, (first, last)
    assert all("critic/explained_variance" in r for r in records[1:])
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["value_pretrain_steps"] == 2
    assert not undocumented_metrics(tmp_path / "metrics.jsonl", tmp_path / "value_pretrain.jsonl")


def test_resume_parity_with_a_critic(tmp_path):
    ppo = ["train.lr=1e-3", "run.save_every=2", "rollout.samples_per_prompt=1", "rollout.rollout_prompts=8"]

    def run(directory, steps):
        cfg = load_config("ppo", [*TINY, *ppo, f"train.rollout_steps={steps}"])
        fit(cfg, directory, verifier=DigitFraction(), show_progress=False)

    run(tmp_path / "straight", 4)
    run(tmp_path / "split", 2)
    run(tmp_path / "split", 4)
    a = load_value_model(tmp_path / "straight" / "checkpoints" / "step-000004" / "critic").state_dict()
    b = load_value_model(tmp_path / "split" / "checkpoints" / "step-000004" / "critic").state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    keep = ("critic/", "reward/", "loss/")
    metrics = [
        [{k: v for k, v in r.items() if k.startswith(keep)} for r in read_metrics(d / "metrics.jsonl")]
        for d in (tmp_path / "straight", tmp_path / "split")
    ]
    assert metrics[0] == metrics[1]


def test_packed_shared_and_padded_training_learn_the_same(tmp_path):
    """train.pack_sequences and train.share_prompts change what is computed, not what is learnt: a VAPO run (old
    log-probs, values, policy and critic updates) gives the same losses and weights packed with each group's prompt
    read once, packed with every row reading its own, and padded, to float rounding; sharing computes the fewest
    tokens. In float32: model.dtype=auto is bf16 on a CPU with native bf16, whose rounding differs between the
    layouts by more."""
    from safetensors.torch import load_file

    layouts = {
        "shared": ["train.pack_sequences=true", "train.share_prompts=true"],
        "rows": ["train.pack_sequences=true", "train.share_prompts=false"],
        "padded": ["train.pack_sequences=false"],
    }
    runs = {}
    for name, layout in layouts.items():
        cfg = vapo_tiny("train.rollout_steps=2", "run.eval_every=100", *layout, "model.dtype=float32")
        fit(cfg, tmp_path / name, verifier=DigitFraction(), show_progress=False)
        runs[name] = [r for r in read_metrics(tmp_path / name / "metrics.jsonl") if "loss/policy" in r]
    for shared_step, rows_step, padded_step in zip(runs["shared"], runs["rows"], runs["padded"], strict=True):
        for key in ("loss/policy", "critic/value_loss", "policy/entropy", "reward/mean", "critic/explained_variance"):
            assert shared_step[key] == pytest.approx(padded_step[key], rel=1e-4, abs=1e-5), key
            assert rows_step[key] == pytest.approx(padded_step[key], rel=1e-4, abs=1e-5), key
        assert rows_step["perf/pad_fraction"] < 0.05 and rows_step["perf/microbatches"] > 0
        tokens = [step["perf/forward_tokens"] for step in (shared_step, rows_step, padded_step)]
        assert tokens[0] < tokens[1] <= tokens[2]  # rows this short fill one lane each: as many as padded
    assert max(step["perf/pad_fraction"] for step in runs["padded"]) > 0  # the padded run computed padding
    weights = [load_file(tmp_path / name / "final" / "model.safetensors") for name in layouts]
    for other in weights[1:]:
        for name, value in weights[0].items():
            assert torch.allclose(value, other[name], atol=1e-5), name

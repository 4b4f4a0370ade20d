"""The policy update: micro-batch invariance end to end, and NaN losses that skip a step."""

import pytest
import torch

from reasonrl.algo.presets import AlgoSpec
from reasonrl.batch import PoolWindow, RolloutBatch
from reasonrl.models.load import load_model
from reasonrl.training.update.policy import TokenLogprobs
from reasonrl.training.update.step import PolicyUpdater, RolloutCorrection


def rollout_batch(seed=0, rows=8):
    g = torch.Generator().manual_seed(seed)
    prompt_lens = torch.randint(3, 8, (rows,), generator=g)
    response_lens = torch.randint(1, 10, (rows,), generator=g)
    P, T = int(prompt_lens.max()), int(response_lens.max())
    prompt_mask = torch.arange(P)[None] >= (P - prompt_lens)[:, None]
    response_mask = torch.arange(T)[None] < response_lens[:, None]
    return RolloutBatch(
        prompt_ids=torch.where(prompt_mask, torch.randint(3, 250, (rows, P), generator=g), 0),
        prompt_mask=prompt_mask,
        response_ids=torch.where(response_mask, torch.randint(3, 250, (rows, T), generator=g), 0),
        response_mask=response_mask,
        policy_loss_mask=response_mask.clone(),
        value_loss_mask=response_mask.clone(),
        rollout_logprobs=torch.zeros(rows, T),
        rewards=torch.zeros(rows),
        correct=torch.arange(rows) % 3 == 0,
        truncated=torch.zeros(rows, dtype=torch.bool),
        group_ids=torch.arange(rows) // 4,
        old_logprobs=torch.where(response_mask, -2.0 + 0.1 * torch.randn(rows, T, generator=g), 0.0),
        advantages=torch.where(response_mask, torch.randn(rows, 1, generator=g).expand(rows, T), 0.0),
    )


def updated_parameters(
    microbatch_tokens, agg, batch, lr=1.0, spec=None, device="cpu", policy_class=TokenLogprobs, correction=None
):
    torch.manual_seed(0)
    model = load_model("tiny-random", device=device)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
    spec = spec or AlgoSpec(loss_agg=agg, eps_high=0.28, nll_weight=0.1)
    updater = PolicyUpdater(
        policy_class(model, temperature=1.0, compute_dtype=torch.float32),
        optimizer,
        scheduler,
        spec,
        minibatch_sequences=len(batch),
        epochs=1,
        microbatch_tokens=microbatch_tokens,
        grad_clip=None,
        loss_agg_constant=16.0,
        correction=correction or RolloutCorrection(),
    )
    metrics = updater.update(batch, seed=0)
    return dict(model.named_parameters()), metrics, updater


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_update_is_invariant_to_the_micro_batch_split(agg):
    batch = rollout_batch()
    whole, metrics_whole, _ = updated_parameters(10_000, agg, batch)
    split, metrics_split, _ = updated_parameters(20, agg, batch)  # several micro-batches
    for name in whole:
        torch.testing.assert_close(split[name], whole[name], atol=1e-6, rtol=1e-5, msg=name)
    assert metrics_split["loss/total"] == pytest.approx(metrics_whole["loss/total"], rel=1e-5)


def test_a_nan_loss_skips_the_optimiser_step():
    batch = rollout_batch(1)
    batch.advantages[0, 0] = float("nan")  # a valid token: the loss becomes NaN
    before = {n: p.detach().clone() for n, p in load_model("tiny-random").named_parameters()}
    after, metrics, updater = updated_parameters(10_000, "token-mean", batch)
    assert updater.skipped_steps == 1 and metrics["train/skipped_steps"] == 1.0
    for name, value in before.items():
        assert torch.equal(after[name].detach(), value), name


def test_single_minibatch_update_can_take_old_logprobs_from_its_own_forward():
    # one mini-batch, one epoch: the update's forward runs at the old policy, so skipping the
    # separate old-log-prob pass (plan.separate_old_logprob_pass=False) changes nothing
    from reasonrl.training.update.policy import response_logprobs

    batch = rollout_batch(2)
    model = load_model("tiny-random")
    with torch.no_grad():
        old, _ = response_logprobs(model, batch.prompt_ids, batch.prompt_mask, batch.response_ids, batch.response_mask)
    batch.old_logprobs = old
    with_pass, _, _ = updated_parameters(10_000, "token-mean", batch, lr=0.1)
    batch.old_logprobs = None
    without_pass, _, _ = updated_parameters(10_000, "token-mean", batch, lr=0.1)
    for name in with_pass:
        torch.testing.assert_close(without_pass[name], with_pass[name], atol=1e-6, rtol=1e-5, msg=name)


class EveryTokenLogprobs(TokenLogprobs):
    """The policy forward without token filtering: the LM head on every response token."""

    def forward(self, batch, head_mask=None):
        return super().forward(batch)


def test_tppo_token_filtering_leaves_the_update_unchanged():
    # a T-PPO batch: each response's first tokens came from earlier windows and are out of the policy loss
    batch = rollout_batch(3)
    starts = torch.tensor([0, 2, 4, 1, 3, 0, 5, 2])
    stale = batch.response_mask & (torch.arange(batch.response_mask.shape[1])[None] < starts[:, None])
    batch.pool_window = PoolWindow(running=torch.zeros(len(batch), dtype=torch.bool), stale_mask=stale)
    batch.policy_loss_mask = batch.response_mask & ~stale
    spec = AlgoSpec(loss_agg="token-mean", eps_high=0.28, nll_weight=0.1, entropy_coef=0.01)
    filtered, metrics, _ = updated_parameters(40, "token-mean", batch, spec=spec)
    every, every_metrics, _ = updated_parameters(40, "token-mean", batch, spec=spec, policy_class=EveryTokenLogprobs)
    for name in every:
        torch.testing.assert_close(filtered[name], every[name], atol=1e-6, rtol=0, msg=name)
    for key in ("loss/total", "policy/entropy", "train/grad_norm"):
        assert metrics[key] == pytest.approx(every_metrics[key], rel=1e-5), key
    assert metrics["perf/lm_head_tokens_policy"] == batch.policy_loss_mask.sum() < batch.response_mask.sum()


@pytest.mark.parametrize("mode", ["decoupled", "tis", "mis"])
def test_a_correction_changes_nothing_on_policy_and_drops_what_its_cap_drops(mode):
    spec = AlgoSpec(loss_agg="token-mean", eps_high=0.28)  # the policy loss alone (the NLL term is not weighted)
    batch = rollout_batch()
    batch.rollout_logprobs = batch.old_logprobs.clone()  # the engine sampled with the proximal policy
    plain, _, _ = updated_parameters(10_000, "", batch, spec=spec)
    corrected, metrics, _ = updated_parameters(10_000, "", batch, spec=spec, correction=RolloutCorrection(mode))
    for name, weight in plain.items():
        torch.testing.assert_close(corrected[name], weight, rtol=0, atol=0)
    assert metrics["rollout/is_weight_mean"] == 1.0 and metrics["rollout/is_masked_fraction"] == 0.0
    # rows 0-3 sampled by a policy that gave their tokens e^-3 of the probability: w = e^3, above any cap
    stale = torch.arange(len(batch)) < 4
    batch.rollout_logprobs = torch.where(stale[:, None], batch.old_logprobs - 3.0, batch.old_logprobs)
    corrected, metrics, _ = updated_parameters(10_000, "", batch, spec=spec, correction=RolloutCorrection(mode))
    assert metrics["rollout/is_weight_max"] == pytest.approx(torch.e**3, rel=1e-4)
    if mode == "tis":  # kept, the weight capped at 2
        assert metrics["rollout/is_truncated_fraction"] > 0 and metrics["rollout/is_masked_fraction"] == 0
        return
    # dropped: the same update as those rows with no advantage (no loss), the batch's denominator kept
    silent = RolloutBatch(**{**batch.__dict__, "advantages": torch.where(stale[:, None], 0.0, batch.advantages)})
    expected, _, _ = updated_parameters(10_000, "", silent, spec=spec)
    assert metrics["rollout/is_masked_fraction"] > 0
    for name, weight in expected.items():
        torch.testing.assert_close(corrected[name], weight)

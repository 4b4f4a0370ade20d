"""GAE, decoupled GAE, EGAE and length-adaptive λ (DAPO eqs 2–3, VAPO eqs 3 and 5, VC-PPO, T-PPO eq 6, PAG)."""

import pytest
import torch

from reasonrl.algo.advantage_estimators import decoupled_gae, egae, gae, length_adaptive_lambda


def reference_gae(rewards, values, mask, gamma, lam, mode="skip", bootstrap=None):
    """The GAE recursion written out per sequence and per token, in plain Python."""
    batch, length = rewards.shape
    advantages = [[0.0] * length for _ in range(batch)]
    for b in range(batch):
        lam_b = float(lam[b]) if isinstance(lam, torch.Tensor) else lam
        valid = [t for t in range(length) if mask[b, t]]
        last = valid[-1] if valid else -1
        next_value = float(bootstrap[b]) if bootstrap is not None else 0.0
        running = 0.0
        for t in reversed(range(last + 1)):
            if not mask[b, t]:
                if mode == "reset":
                    next_value, running = 0.0, 0.0
                continue
            delta = float(rewards[b, t]) + gamma * next_value - float(values[b, t])
            running = delta + gamma * lam_b * running
            advantages[b][t] = running
            next_value = float(values[b, t])
    adv = torch.tensor(advantages)
    return adv, torch.where(mask.bool(), adv + values, torch.zeros(()))


def random_batch(seed, batch=6, length=9, holes=True):
    g = torch.Generator().manual_seed(seed)
    rewards = torch.randn(batch, length, generator=g)
    values = torch.randn(batch, length, generator=g)
    lengths = torch.randint(0, length + 1, (batch,), generator=g)
    mask = torch.arange(length)[None, :] < lengths[:, None]
    if holes:  # interior gaps (multi-turn template tokens), kept away from the ends
        mask &= torch.rand(batch, length, generator=g) > 0.25
    return rewards, values, mask


# --- hand-computed cases -------------------------------------------------------------------------


def test_gae_hand_computed_three_tokens():
    # r = [0, 0, 1], V = [0.5, 0.6, 0.7], γ = 1, λ = 0.5
    # δ2 = 1 + 0 − 0.7 = 0.3;  A2 = 0.3
    # δ1 = 0 + 0.7 − 0.6 = 0.1; A1 = 0.1 + 0.5·0.3 = 0.25
    # δ0 = 0 + 0.6 − 0.5 = 0.1; A0 = 0.1 + 0.5·0.25 = 0.225;  G = A + V = [0.725, 0.85, 1.0]
    rewards = torch.tensor([[0.0, 0.0, 1.0]])
    values = torch.tensor([[0.5, 0.6, 0.7]])
    adv, ret = gae(rewards, values, torch.ones(1, 3), 1.0, 0.5)
    torch.testing.assert_close(adv, torch.tensor([[0.225, 0.25, 0.3]]))
    torch.testing.assert_close(ret, torch.tensor([[0.725, 0.85, 1.0]]))


def test_gae_discount_hand_computed():
    # r = [1, 2], V = [0, 0], γ = 0.5, λ = 1: A1 = 2, A0 = 1 + 0.5·2 = 2
    adv, ret = gae(torch.tensor([[1.0, 2.0]]), torch.zeros(1, 2), torch.ones(1, 2), 0.5, 1.0)
    torch.testing.assert_close(adv, torch.tensor([[2.0, 2.0]]))
    torch.testing.assert_close(ret, adv)


def test_skip_and_reset_modes_hand_computed():
    # mask [1, 0, 1] (a template token in the middle), r = [0, 5, 1] (5 is masked: ignored),
    # V = [0.5, 9, 0.7], γ = λ = 1.
    # skip:  A2 = 1 − 0.7 = 0.3; the gap carries V = 0.7 and A = 0.3; δ0 = 0.7 − 0.5 = 0.2; A0 = 0.5 = R − V0
    # reset: A2 = 0.3; the gap resets; δ0 = 0 + 0 − 0.5 = −0.5; A0 = −0.5 (turn 1 is its own episode)
    rewards = torch.tensor([[0.0, 5.0, 1.0]])
    values = torch.tensor([[0.5, 9.0, 0.7]])
    mask = torch.tensor([[1, 0, 1]])
    skip, _ = gae(rewards, values, mask, 1.0, 1.0, mask_mode="skip")
    reset, _ = gae(rewards, values, mask, 1.0, 1.0, mask_mode="reset")
    torch.testing.assert_close(skip, torch.tensor([[0.5, 0.0, 0.3]]))
    torch.testing.assert_close(reset, torch.tensor([[-0.5, 0.0, 0.3]]))


def test_egae_hand_computed_truncated_row():
    # running sequence of length 3 (pad after), r = 0, V = [0.2, 0.4, 0.6], γ = 1, λ = 0.5,
    # bootstrap V(s_3) := V(s_2) = 0.6:
    # δ2 = 0 + 0.6 − 0.6 = 0 -> A2 = 0;  δ1 = 0.6 − 0.4 = 0.2 -> A1 = 0.2;  δ0 = 0.2 -> A0 = 0.2 + 0.5·0.2 = 0.3
    values = torch.tensor([[0.2, 0.4, 0.6, 0.0]])
    mask = torch.tensor([[1, 1, 1, 0]])
    adv, ret = egae(torch.zeros(1, 4), values, mask, torch.tensor([True]), 1.0, 0.5)
    torch.testing.assert_close(adv, torch.tensor([[0.3, 0.2, 0.0, 0.0]]))
    torch.testing.assert_close(ret, torch.tensor([[0.5, 0.6, 0.6, 0.0]]))


# --- properties of GAE ------------------------------------------------------------------------------


def test_lambda_one_terminal_reward_gives_reward_minus_value():
    # §1.12 #1: λ = γ = 1, terminal R: A_t = R − V(s_t), G_t = R at every valid token
    values = torch.tensor([[0.3, -0.2, 0.9, 0.0], [0.1, 0.4, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
    rewards = torch.tensor([[0.0, 0.0, 2.0, 0.0], [0.0, -1.0, 0.0, 0.0]])
    adv, ret = gae(rewards, values, mask, 1.0, 1.0)
    expected_return = torch.tensor([[2.0, 2.0, 2.0, 0.0], [-1.0, -1.0, 0.0, 0.0]])
    torch.testing.assert_close(ret, expected_return)
    torch.testing.assert_close(adv, torch.where(mask.bool(), expected_return - values, torch.zeros(())))


def test_lambda_zero_gives_td_error():
    # §1.12 #2
    rewards, values, _ = random_batch(1, holes=False)
    mask = torch.ones_like(rewards, dtype=torch.bool)
    adv, _ = gae(rewards, values, mask, 0.9, 0.0)
    next_values = torch.cat([values[:, 1:], torch.zeros(values.shape[0], 1)], dim=1)
    torch.testing.assert_close(adv, rewards + 0.9 * next_values - values)


def test_zero_values_terminal_reward_decays_geometrically():
    # §1.12 #3: V ≡ 0, terminal R, λ < 1 -> A_t = λ^(T−1−t)·R
    length, reward, lam = 7, 2.0, 0.8
    rewards = torch.zeros(1, length)
    rewards[0, -1] = reward
    adv, _ = gae(rewards, torch.zeros(1, length), torch.ones(1, length), 1.0, lam)
    expected = torch.tensor([[lam ** (length - 1 - t) * reward for t in range(length)]])
    torch.testing.assert_close(adv, expected)


def test_vc_ppo_reward_decay_on_actor_side_only():
    # VC-PPO (f): λ_actor = 0.95, V ≡ 0, terminal R: A at t = T−101 is 0.95^100·R ≈ 0.0059·R; critic target = R
    length, reward = 150, 1.0
    rewards = torch.zeros(1, length)
    rewards[0, -1] = reward
    policy_adv, critic_ret = decoupled_gae(rewards, torch.zeros(1, length), torch.ones(1, length), 1.0, 0.95, 1.0)
    assert policy_adv[0, length - 101].item() == pytest.approx(0.95**100 * reward)
    assert 0.0058 < policy_adv[0, length - 101].item() < 0.0060
    torch.testing.assert_close(critic_ret, torch.full((1, length), reward))


def test_decoupled_critic_targets_do_not_depend_on_lambda_policy():
    # §1.12 #4 and VAPO (f)
    rewards, values, mask = random_batch(2)
    _, ret_a = decoupled_gae(rewards, values, mask, 1.0, 0.3, 1.0)
    adv_b, ret_b = decoupled_gae(rewards, values, mask, 1.0, 0.99, 1.0)
    adv_a, _ = decoupled_gae(rewards, values, mask, 1.0, 0.3, 1.0)
    torch.testing.assert_close(ret_a, ret_b)
    assert not torch.allclose(adv_a, adv_b)


def test_critic_targets_equal_terminal_reward_whatever_the_values():
    # VAPO (f): terminal-only reward -> every critic target equals R
    g = torch.Generator().manual_seed(3)
    values = torch.randn(4, 6, generator=g)
    mask = torch.tensor([[1] * 6, [1] * 4 + [0] * 2, [1] * 1 + [0] * 5, [1] * 5 + [0]])
    final = torch.tensor([1.0, -1.0, 0.0, 1.0])
    last = mask.sum(1) - 1
    rewards = torch.zeros(4, 6)
    rewards[torch.arange(4), last] = final
    _, ret = decoupled_gae(rewards, values, mask, 1.0, 0.7, 1.0)
    torch.testing.assert_close(ret, torch.where(mask.bool(), final[:, None].expand(4, 6), torch.zeros(())))


@pytest.mark.parametrize("mode", ["skip", "reset"])
@pytest.mark.parametrize("seed", range(5))
def test_vectorised_gae_matches_python_reference(mode, seed):
    rewards, values, mask = random_batch(seed)
    lam = torch.rand(rewards.shape[0], generator=torch.Generator().manual_seed(seed + 100))
    adv, ret = gae(rewards, values, mask, 0.97, lam, mask_mode=mode)
    ref_adv, ref_ret = reference_gae(rewards, values, mask, 0.97, lam, mode)
    torch.testing.assert_close(adv, ref_adv)
    torch.testing.assert_close(ret, ref_ret)


def test_per_sequence_lambda_equals_separate_calls():
    rewards, values, mask = random_batch(7, holes=False)
    lam = torch.linspace(0.1, 0.9, rewards.shape[0])
    adv, _ = gae(rewards, values, mask, 1.0, lam)
    for b in range(rewards.shape[0]):
        single, _ = gae(rewards[b : b + 1], values[b : b + 1], mask[b : b + 1], 1.0, float(lam[b]))
        torch.testing.assert_close(adv[b : b + 1], single)


def test_masked_positions_never_change_gae():
    rewards, values, mask = random_batch(4)
    poisoned_r = torch.where(mask, rewards, torch.full_like(rewards, float("nan")))
    poisoned_v = torch.where(mask, values, torch.full_like(values, 1e9))
    for mode in ("skip", "reset"):
        adv, ret = gae(rewards, values, mask, 1.0, 0.9, mask_mode=mode)
        adv_p, ret_p = gae(poisoned_r, poisoned_v, mask, 1.0, 0.9, mask_mode=mode)
        torch.testing.assert_close(adv, adv_p)
        torch.testing.assert_close(ret, ret_p)


def test_reset_mode_makes_turns_independent():
    # PAG (f): changing the reward of turn 3 leaves the advantages of turns 1–2 unchanged.
    # Turns: tokens 0-2 | template 3 | 4-5 | template 6 | 7-9
    mask = torch.tensor([[1, 1, 1, 0, 1, 1, 0, 1, 1, 1]])
    values = torch.linspace(0.1, 1.0, 10)[None]
    rewards = torch.zeros(1, 10)
    rewards[0, 2], rewards[0, 5], rewards[0, 9] = 1.0, 0.0, 1.0
    changed = rewards.clone()
    changed[0, 9] = -3.0
    adv, _ = gae(rewards, values, mask, 1.0, 1.0, mask_mode="reset")
    adv_changed, _ = gae(changed, values, mask, 1.0, 1.0, mask_mode="reset")
    torch.testing.assert_close(adv[0, :6], adv_changed[0, :6])
    assert not torch.allclose(adv[0, 7:], adv_changed[0, 7:])
    skip, _ = gae(rewards, values, mask, 1.0, 1.0, mask_mode="skip")
    skip_changed, _ = gae(changed, values, mask, 1.0, 1.0, mask_mode="skip")
    assert not torch.allclose(skip[0, :6], skip_changed[0, :6])  # skip mode lets credit flow back


# --- EGAE (T-PPO) ----------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["skip", "reset"])
def test_egae_equals_gae_bit_for_bit_on_complete_rows(mode):
    rewards, values, mask = random_batch(11)
    lam = torch.rand(rewards.shape[0], generator=torch.Generator().manual_seed(5))
    truncated = torch.tensor([True, False, True, False, False, True])
    adv, ret = egae(rewards, values, mask, truncated, 1.0, lam, mask_mode=mode)
    gae_adv, gae_ret = gae(rewards, values, mask, 1.0, lam, mask_mode=mode)
    complete = ~truncated
    assert torch.equal(adv[complete], gae_adv[complete])
    assert torch.equal(ret[complete], gae_ret[complete])


def test_egae_matches_reference_with_bootstrap():
    rewards, values, mask = random_batch(12, holes=False)
    truncated = torch.ones(rewards.shape[0], dtype=torch.bool)
    adv, _ = egae(rewards, values, mask, truncated, 0.9, 0.8)
    lengths = mask.sum(1)
    bootstrap = torch.where(lengths > 0, values[torch.arange(len(lengths)), (lengths - 1).clamp(min=0)], 0.0)
    ref_adv, _ = reference_gae(rewards, values, mask, 0.9, 0.8, bootstrap=bootstrap)
    torch.testing.assert_close(adv, ref_adv)


def test_egae_last_token_of_running_sequence_has_zero_advantage():
    # T-PPO (f): γ = 1, zero intermediate rewards -> A_{l−1} = 0 for a truncated sequence
    g = torch.Generator().manual_seed(9)
    values = torch.randn(3, 8, generator=g)
    lengths = torch.tensor([8, 5, 2])
    mask = torch.arange(8)[None, :] < lengths[:, None]
    adv, _ = egae(torch.zeros(3, 8), values, mask, torch.ones(3, dtype=torch.bool), 1.0, 0.95)
    assert torch.equal(adv[torch.arange(3), lengths - 1], torch.zeros(3))


# --- length-adaptive λ (VAPO eq 5) --------------------------------------------------------------


def test_length_adaptive_lambda_paper_values():
    lam = length_adaptive_lambda(torch.tensor([100, 1000, 20, 16384]), 0.05)
    torch.testing.assert_close(lam, torch.tensor([0.8, 0.98, 0.0, 1 - 1 / (0.05 * 16384)]))


def test_length_adaptive_lambda_horizon_and_clamp():
    # §1.12 #5: 1/(1−λ) = α·l for l > 1/α; clamped to [0, max] for l ≤ 1/α
    lengths = torch.tensor([21, 50, 333, 4000])
    lam = length_adaptive_lambda(lengths, 0.05)
    torch.testing.assert_close(1.0 / (1.0 - lam), 0.05 * lengths.double())
    short = length_adaptive_lambda(torch.tensor([0, 1, 10, 20]), 0.05)
    assert torch.equal(short, torch.zeros(4))
    assert length_adaptive_lambda(torch.tensor([10**9]), 0.05).item() == pytest.approx(0.9999)

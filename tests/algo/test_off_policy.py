"""Off-policy corrections w = π_prox / π_behav: decoupled PPO (AReaL), TIS and MIS (verl), per token and sequence."""

import math

import pytest
import torch

from reasonrl.algo.off_policy import (
    CORRECTION_LEVELS,
    CORRECTION_MODES,
    behaviour_log_ratio,
    correction_stats,
    importance_weights,
)
from reasonrl.algo.policy_loss import ppo_clip

NAN = float("nan")
THRESHOLD = 4.0  # MIS keeps 1/4 ≤ r ≤ 4
MASK = torch.tensor([[True, True, True], [True, True, False]])
# ratios π_prox / π_behav: row 0 [2, 3, 1] (product 6), row 1 [8, 0.2, masked NaN] (product 1.6)
PROXIMAL = torch.tensor([[0.4, 0.3, 0.7], [0.8, 0.1, NAN]], dtype=torch.float64).log()
BEHAVIOUR = torch.tensor([[0.2, 0.1, 0.7], [0.1, 0.5, NAN]], dtype=torch.float64).log()


def weights_of(mode, level, threshold=THRESHOLD):
    return importance_weights(behaviour_log_ratio(PROXIMAL, BEHAVIOUR, MASK), MASK, mode, level, threshold)


@pytest.mark.parametrize(
    ("mode", "level", "expected_weights", "expected_keep"),
    [
        # none: weight 1 on the mask
        ("none", "token", [[1, 1, 1], [1, 1, 0]], [[1, 1, 1], [1, 1, 0]]),
        ("none", "sequence", [[1, 1, 1], [1, 1, 0]], [[1, 1, 1], [1, 1, 0]]),
        # decoupled: w = r, dropped where r > 4 (the 8)
        ("decoupled", "token", [[2, 3, 1], [0, 0.2, 0]], [[1, 1, 1], [0, 1, 0]]),
        # tis token: min(r, 4): 8 -> 4
        ("tis", "token", [[2, 3, 1], [4, 0.2, 0]], [[1, 1, 1], [1, 1, 0]]),
        # tis sequence: row 0 min(2·3·1 = 6, 4) = 4; row 1 min(8·0.2 = 1.6, 4) = 1.6 on its two mask tokens
        ("tis", "sequence", [[4, 4, 4], [1.6, 1.6, 0]], [[1, 1, 1], [1, 1, 0]]),
        # mis token: 8 > 4 and 0.2 < 1/4 are dropped, row 0 all inside [1/4, 4]
        ("mis", "token", [[1, 1, 1], [0, 0, 0]], [[1, 1, 1], [0, 0, 0]]),
        # mis sequence: row 0's 6 > 4 drops the whole row; row 1's 1.6 keeps it whole
        ("mis", "sequence", [[0, 0, 0], [1, 1, 0]], [[0, 0, 0], [1, 1, 0]]),
    ],
)
def test_each_mode_and_level_hand_computed(mode, level, expected_weights, expected_keep):
    weights, keep = weights_of(mode, level)
    assert torch.equal(keep, torch.tensor(expected_keep, dtype=torch.bool))
    torch.testing.assert_close(weights, torch.tensor(expected_weights, dtype=weights.dtype))
    assert torch.isfinite(weights).all() and not keep[1, 2]  # the NaN position: weight 0, not kept


def test_the_log_ratio_is_zero_at_masked_positions_and_clamped():
    log_ratio = behaviour_log_ratio(PROXIMAL, BEHAVIOUR, MASK)
    torch.testing.assert_close(log_ratio, torch.tensor([[2, 3, 1], [8, 0.2, 1]]).log())  # ln 1 = 0 at the NaN
    far = behaviour_log_ratio(torch.tensor([[0.0, -100.0]]), torch.tensor([[-100.0, 0.0]]), torch.ones(1, 2))
    assert far.tolist() == [[20.0, -20.0]]  # ±LOG_RATIO_LIMIT


@pytest.mark.parametrize(
    ("mode", "level"),
    [(m, lv) for m in CORRECTION_MODES for lv in CORRECTION_LEVELS if (m, lv) != ("decoupled", "sequence")],
)
def test_on_policy_tokens_are_left_unchanged(mode, level):
    # synchronous run, engine and trainer agree: r = 1 everywhere, so no mode reweights or drops anything
    logprobs = torch.tensor([[-0.7, -2.3, -0.1], [-1.2, -3.0, NAN]])
    weights, keep = importance_weights(behaviour_log_ratio(logprobs, logprobs, MASK), MASK, mode, level, 1.5)
    assert torch.equal(keep, MASK)
    assert torch.equal(weights, MASK.to(weights.dtype))


def test_stats_hand_computed():
    log_ratio = behaviour_log_ratio(PROXIMAL, BEHAVIOUR, MASK)
    # ρ over the mask [2, 3, 1, 8, 0.2]: mean 14.2 / 5 = 2.84, max 8;
    # k3 = mean(ρ − 1 − ln ρ) = (14.2 − 5 − ln(2·3·1·8·0.2 = 9.6)) / 5 = (9.2 − 2.2617631) / 5 = 1.3876474
    tis = correction_stats(log_ratio, *weights_of("tis", "token"), MASK)
    assert tis == pytest.approx(
        {
            "rollout/is_weight_mean": 2.84,
            "rollout/is_weight_max": 8.0,
            "rollout/is_truncated_fraction": 0.2,  # the 8, lowered to 4
            "rollout/is_masked_fraction": 0.0,
            "rollout/trainer_kl": (9.2 - math.log(9.6)) / 5,
        }
    )
    assert all(type(value) is float for value in tis.values())
    mis = correction_stats(log_ratio, *weights_of("mis", "token"), MASK)
    assert mis["rollout/is_masked_fraction"] == pytest.approx(0.4)  # the 8 and the 0.2 of 5 tokens
    assert mis["rollout/is_truncated_fraction"] == 0.0  # weight 1 is no reweighting, not a truncation
    decoupled = correction_stats(log_ratio, *weights_of("decoupled", "token"), MASK)
    assert decoupled["rollout/is_masked_fraction"] == pytest.approx(0.2)
    assert decoupled["rollout/is_truncated_fraction"] == 0.0


def test_stats_of_an_empty_mask():
    nothing = torch.zeros(1, 2, dtype=torch.bool)
    log_ratio = torch.tensor([[NAN, 3.0]])
    assert correction_stats(log_ratio, *importance_weights(log_ratio, nothing, "tis", "token", 2.0), nothing) == {
        "rollout/is_weight_mean": 1.0,
        "rollout/is_weight_max": 1.0,
        "rollout/is_truncated_fraction": 0.0,
        "rollout/is_masked_fraction": 0.0,
        "rollout/trainer_kl": 0.0,
    }


@pytest.mark.parametrize(
    ("mode", "level", "threshold", "message"),
    [
        ("decoupled", "sequence", 2.0, "algo.rollout_correction_level='token'"),
        ("tis", "token", 1.0, "algo.rollout_correction_threshold must be > 1, got 1.0"),
        ("mis", "sequence", 0.5, "algo.rollout_correction_threshold must be > 1, got 0.5"),
        ("is", "token", 2.0, "algo.rollout_correction must be one of ('none', 'decoupled', 'tis', 'mis'), got 'is'"),
        ("tis", "row", 2.0, "algo.rollout_correction_level must be one of ('token', 'sequence'), got 'row'"),
    ],
)
def test_settings_the_corrections_do_not_define_are_refused(mode, level, threshold, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        importance_weights(torch.zeros(1, 2), torch.ones(1, 2), mode, level, threshold)


def test_dropped_tokens_get_no_gradient_and_weights_are_data():
    # first mini-batch: π_θ = π_prox, so the PPO ratio is 1 and d loss_t / d logπ_θ = −A_t · w_t
    logprobs = PROXIMAL.clone().requires_grad_(True)
    advantages = torch.tensor([[1.0, -2.0, 0.5], [3.0, 1.0, NAN]])
    # the weights are computed from the grad-carrying log-probs; they must still act as constants
    weights, keep = importance_weights(behaviour_log_ratio(logprobs, BEHAVIOUR, MASK), MASK, "decoupled", "token", 4.0)
    assert not weights.requires_grad
    loss, _ = ppo_clip(logprobs, logprobs.detach(), advantages, MASK, 0.2, 0.28)
    (loss * weights).sum().backward()
    # decoupled weights [[2, 3, 1], [0 (8 dropped), 0.2, 0]]: −A·w = [[−2, 6, −0.5], [0, −0.2, 0]]
    torch.testing.assert_close(logprobs.grad, torch.tensor([[-2.0, 6.0, -0.5], [0.0, -0.2, 0.0]]))
    assert (logprobs.grad[~keep] == 0).all()

"""Overlong penalty, reward placement, potential shaping (DAPO eq 13; Ng et al. 1999) and PAG rewards (PAG eq 1)."""

import pytest
import torch

from reasonrl.algo.masked import role_whiten
from reasonrl.algo.pag import VERDICT_CORRECT, VERDICT_UNPARSED, VERDICT_WRONG, pag_attempt_rewards, pag_verify_rewards
from reasonrl.algo.shaping import (
    overlong_penalty,
    paper_line_rewards,
    place_rewards,
    potential_shaping,
    terminal_token_rewards,
)


def test_overlong_penalty_paper_values():
    # DAPO (f): L_max = 20480, L_cache = 4096: 16384 -> 0, 18432 -> −0.5, 20480 -> −1, 10000 -> 0
    pen = overlong_penalty(torch.tensor([16384, 18432, 20480, 10000, 30000]), 20480, 4096)
    torch.testing.assert_close(pen, torch.tensor([0.0, -0.5, -1.0, 0.0, -1.0]))
    half = overlong_penalty(torch.tensor([18432]), 20480, 4096, factor=0.5)
    assert half.item() == pytest.approx(-0.25)


def test_terminal_rewards_sit_on_the_last_valid_token():
    out = terminal_token_rewards(torch.tensor([1.0, -1.0, 3.0]), torch.tensor([[1, 1, 1], [1, 0, 0], [0, 0, 0]]))
    torch.testing.assert_close(out, torch.tensor([[0.0, 0.0, 1.0], [-1.0, 0.0, 0.0], [0.0, 0.0, 0.0]]))


def test_place_rewards_scatters_and_drops_invalid_items():
    out = place_rewards(torch.tensor([[1.0, 2.0, 7.0]]), torch.tensor([[1, 3, 0]]), torch.tensor([[1, 1, 0]]), 5)
    torch.testing.assert_close(out, torch.tensor([[0.0, 1.0, 0.0, 2.0, 0.0]]))


def test_potential_shaping_telescopes():
    # telescoping: Σ dense rewards = c·(Φ_final − Φ_0) for any number of lines
    g = torch.Generator().manual_seed(0)
    for lines in (1, 3, 17):
        potentials = torch.rand(4, lines, generator=g)
        initial = torch.rand(4, generator=g)
        shaped = potential_shaping(potentials, torch.ones(4, lines), initial, 0.5)
        torch.testing.assert_close(shaped.sum(1), 0.5 * (potentials[:, -1] - initial))


def test_potential_shaping_hand_computed_with_skipped_line():
    # Φ0 = 0.2; lines Φ = [0.5, (comment) 0.9, 0.4], c = 2: r = [2·0.3, 0, 2·(0.4 − 0.5)] = [0.6, 0, −0.2]
    shaped = potential_shaping(torch.tensor([[0.5, 0.9, 0.4]]), torch.tensor([[1, 0, 1]]), torch.tensor([0.2]), 2.0)
    torch.testing.assert_close(shaped, torch.tensor([[0.6, 0.0, -0.2]]))


def test_paper_line_rewards_switch_lambda_with_the_outcome_skip_comments_and_normalise_length():
    scores = torch.tensor([[0.8, 0.4, 0.6], [0.8, 0.4, 0.6]])
    mask = torch.tensor([[1, 0, 1], [1, 0, 1]])  # the middle line is a comment
    shaped = paper_line_rewards(scores, mask, torch.tensor([False, True]))
    torch.testing.assert_close(shaped[0], torch.tensor([0.25 * 0.8 / 2, 0.0, 0.25 * 0.6 / 2]))  # fails: lambda 0.25
    torch.testing.assert_close(shaped[1], torch.tensor([0.025 * 0.8 / 2, 0.0, 0.025 * 0.6 / 2]))  # passes: 0.025
    # the same lines repeated: the total stays, it does not double
    doubled = paper_line_rewards(scores.repeat(1, 2), mask.repeat(1, 2), torch.tensor([False, True]))
    torch.testing.assert_close(doubled.sum(1), shaped.sum(1))
    # a response with only comment lines gets nothing
    assert paper_line_rewards(scores[:1], torch.zeros(1, 3), torch.tensor([False])).abs().sum() == 0


def test_pag_bonus_table():
    # PAG (f): α = 1: wrong->correct 2, correct->wrong −1, correct->correct 1, wrong->wrong 0; first attempt = acc
    acc = torch.tensor([[0, 1], [1, 0], [1, 1], [0, 0]])
    rewards = pag_attempt_rewards(acc, torch.ones(4, 2))
    torch.testing.assert_close(rewards, torch.tensor([[0.0, 2.0], [1.0, -1.0], [1.0, 1.0], [0.0, 0.0]]))
    torch.testing.assert_close(pag_attempt_rewards(acc, torch.ones(4, 2), alpha=5.0)[0], torch.tensor([0.0, 6.0]))
    masked = pag_attempt_rewards(acc, torch.tensor([[1, 0]] * 4))
    assert torch.equal(masked[:, 1], torch.zeros(4))


def test_pag_verify_rewards():
    verdicts = torch.tensor(
        [[VERDICT_CORRECT], [VERDICT_CORRECT], [VERDICT_WRONG], [VERDICT_WRONG], [VERDICT_UNPARSED]]
    )
    truth = torch.tensor([[1], [0], [0], [1], [1]])
    rewards = pag_verify_rewards(verdicts, truth, torch.ones(5, 1))
    torch.testing.assert_close(rewards, torch.tensor([[1.0], [0.0], [1.0], [0.0], [0.0]]))


def test_role_whiten_normalises_each_role_separately():
    # PAG (f): policy-role and verifier-role advantages each end with mean 0 and std 1
    g = torch.Generator().manual_seed(0)
    adv = torch.randn(4, 12, generator=g) * 3 + 1
    roles = torch.zeros(4, 12, dtype=torch.long)
    roles[:, 6:] = 1
    adv[:, 6:] = adv[:, 6:] * 10 - 4
    mask = torch.rand(4, 12, generator=g) > 0.2
    out = role_whiten(adv, roles, mask)
    for role in (0, 1):
        sel = mask & (roles == role)
        assert out[sel].mean().item() == pytest.approx(0.0, abs=1e-9)
        assert out[sel].std().item() == pytest.approx(1.0, rel=1e-6)
    assert torch.all(out[~mask] == 0)

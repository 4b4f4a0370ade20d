"""Loss aggregation modes and their micro-batch invariance (docs/algorithms.md, Conventions 5)."""

import pytest
import torch

from reasonrl.algo.aggregate import AGGREGATION_MODES, aggregate, count_for_aggregation
from reasonrl.algo.policy_loss import ppo_clip


def weights(mode, mask, **kwargs):
    """d aggregate / d per_token_loss: the weight each token carries."""
    loss = torch.zeros(mask.shape, requires_grad=True)
    aggregate(loss, mask, mode, **kwargs).backward()
    return loss.grad


def test_hand_computed_values():
    # L = [[1, 2, 3], [4, 0, 0]], m = [[1, 1, 1], [1, 0, 0]]
    loss = torch.tensor([[1.0, 2.0, 3.0], [4.0, 9.0, 9.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    assert aggregate(loss, mask, "token-mean").item() == pytest.approx(10 / 4)  # (1+2+3+4)/4
    assert aggregate(loss, mask, "seq-mean-token-mean").item() == pytest.approx((2 + 4) / 2)  # means 2 and 4
    assert aggregate(loss, mask, "seq-mean-token-sum").item() == pytest.approx((6 + 4) / 2)
    assert aggregate(loss, mask, "seq-mean-token-sum-norm", constant=5.0).item() == pytest.approx((6 + 4) / 2 / 5)
    # C defaults to the padded length T = 3
    assert aggregate(loss, mask, "seq-mean-token-sum-norm").item() == pytest.approx((6 + 4) / 2 / 3)


def test_token_mean_weights_every_token_equally():
    # §1.12 #7: every valid token weighs 1/N whatever its sequence length
    mask = torch.zeros(3, 50, dtype=torch.bool)
    mask[0, :3], mask[1, :50], mask[2, :11] = True, True, True
    w = weights("token-mean", mask)
    assert torch.allclose(w[mask], torch.full((64,), 1 / 64))
    assert torch.all(w[~mask] == 0)


def test_token_mean_duplicated_sequence_counts_twice():
    # §1.12 #7: duplicating a sequence doubles its contribution; all tokens still weigh the same
    g = torch.Generator().manual_seed(0)
    loss = torch.rand(3, 6, generator=g)
    mask = torch.tensor([[1] * 6, [1] * 2 + [0] * 4, [1] * 4 + [0] * 2])
    doubled = torch.cat([loss, loss[1:2]])
    doubled_mask = torch.cat([mask, mask[1:2]])
    n, n2 = mask.sum().item(), doubled_mask.sum().item()
    total = aggregate(loss, mask, "token-mean") * n
    assert (aggregate(doubled, doubled_mask, "token-mean") * n2).item() == pytest.approx(
        total.item() + loss[1, :2].sum().item()
    )
    w = weights("token-mean", doubled_mask)
    assert torch.allclose(w[doubled_mask.bool()], torch.full((n2,), 1 / n2))


def test_seq_mean_token_mean_gives_each_sequence_equal_weight():
    # §1.12 #8: a 10-token and a 1000-token sequence carry equal total weight
    mask = torch.zeros(2, 1000, dtype=torch.bool)
    mask[0, :10], mask[1, :] = True, True
    w = weights("seq-mean-token-mean", mask)
    assert w[0].sum().item() == pytest.approx(0.5)
    assert w[1].sum().item() == pytest.approx(0.5)


def test_fully_masked_sequences_do_not_count_and_empty_batches_give_zero():
    loss = torch.tensor([[2.0, 2.0], [7.0, 7.0]])
    mask = torch.tensor([[1, 1], [0, 0]])
    for mode in ("seq-mean-token-mean", "seq-mean-token-sum"):
        single = aggregate(loss[:1], mask[:1], mode)
        assert aggregate(loss, mask, mode).item() == pytest.approx(single.item())
    for mode in AGGREGATION_MODES:
        assert aggregate(loss, torch.zeros(2, 2), mode).item() == 0.0


def test_unknown_mode_is_an_error_naming_the_choices():
    with pytest.raises(ValueError, match="token-mean"):
        aggregate(torch.ones(1, 1), torch.ones(1, 1), "token-sum")


@pytest.mark.parametrize("mode", AGGREGATION_MODES)
@pytest.mark.parametrize("splits", [2, 3, 6])
def test_micro_batch_invariance_of_loss_and_gradient(mode, splits):
    # §1.12 #9: k micro-batches with global denominators == one pass (to 1e-6)
    g = torch.Generator().manual_seed(splits)
    batch, length = 12, 7
    logprobs = -torch.rand(batch, length, generator=g)
    old = logprobs + 0.1 * torch.randn(batch, length, generator=g)
    adv = torch.randn(batch, length, generator=g)
    lengths = torch.randint(0, length + 1, (batch,), generator=g)
    mask = torch.arange(length)[None, :] < lengths[:, None]
    tokens, seqs = count_for_aggregation(mask)

    def loss_of(rows, lp):
        per_token, _ = ppo_clip(lp[rows], old[rows], adv[rows], mask[rows], 0.2, 0.28)
        return aggregate(per_token, mask[rows], mode, global_tokens=tokens, global_seqs=seqs, constant=float(length))

    whole = logprobs.clone().requires_grad_(True)
    full_loss = loss_of(slice(None), whole)
    full_loss.backward()
    parts = logprobs.clone().requires_grad_(True)
    total = torch.zeros(())
    for rows in torch.arange(batch).chunk(splits):
        micro = loss_of(rows, parts)
        micro.backward()
        total = total + micro.detach()
    torch.testing.assert_close(total, full_loss.detach(), atol=1e-6, rtol=0)
    torch.testing.assert_close(parts.grad, whole.grad, atol=1e-6, rtol=0)

"""RolloutBatch helpers: selection, trimming, concatenation, micro-batching, and the feature records with them."""

import random

import pytest
import torch

from reasonrl.batch import PoolWindow, RolloutBatch


def make(prompt_lens, response_lens):
    B, P, T = len(prompt_lens), max(prompt_lens), max(response_lens)
    prompt_mask = torch.tensor([[i >= P - p for i in range(P)] for p in prompt_lens])
    response_mask = torch.tensor([[i < t for i in range(T)] for t in response_lens])
    return RolloutBatch(
        prompt_ids=torch.where(prompt_mask, 5, 0),
        prompt_mask=prompt_mask,
        response_ids=torch.where(response_mask, 7, 0),
        response_mask=response_mask,
        policy_loss_mask=response_mask.clone(),
        value_loss_mask=response_mask.clone(),
        rollout_logprobs=torch.zeros(B, T),
        rewards=torch.arange(B, dtype=torch.float32),
        correct=torch.zeros(B, dtype=torch.bool),
        truncated=torch.zeros(B, dtype=torch.bool),
        group_ids=torch.arange(B),
    )


def test_select_trims_padding_columns():
    batch = make([2, 6, 3], [4, 1, 9])
    part = batch.select([0, 2])
    assert part.prompt_ids.shape == (2, 3) and part.response_ids.shape == (2, 9)
    assert part.rewards.tolist() == [0.0, 2.0]
    assert part.prompt_mask.sum().item() == 5 and part.response_mask.sum().item() == 13


def test_padded_micro_batches_cover_every_row_once_within_budget():
    batch = make([3, 5, 2, 8, 4, 6, 1, 7], [10, 2, 7, 1, 9, 3, 12, 5])
    groups = batch.micro_batch_rows(token_budget=40, packed=False)
    assert sorted(r for g in groups for r in g) == list(range(8))
    for rows in groups:
        part = batch.select(rows)
        width = part.prompt_ids.shape[1] + part.response_ids.shape[1]
        assert len(rows) == 1 or len(rows) * width <= 40


def test_packed_micro_batches_hold_real_tokens_up_to_the_budget_in_the_fewest_balanced_bins():
    prompts, responses = [3, 5, 2, 8, 4, 6, 1, 7], [10, 2, 7, 1, 9, 3, 12, 5]  # 13+7+9+9+13+9+13+12 = 85 tokens
    batch = make(prompts, responses)
    assert batch.read_lengths() == [13, 7, 9, 9, 13, 9, 13, 12]
    groups = batch.micro_batch_rows(token_budget=30)
    assert sorted(r for g in groups for r in g) == list(range(8))
    loads = sorted(sum(batch.read_lengths()[r] for r in g) for g in groups)
    assert loads == [20, 21, 22, 22]  # no bin over 30 and none far lighter: balanced
    assert len(batch.micro_batch_rows(token_budget=30, packed=False)) == 5  # padded: 5 micro-batches
    assert batch.micro_batch_rows(token_budget=12) == [[0], [1], [2], [3], [4], [5], [6], [7]]  # over: alone
    batch.response_mask[0, 3:6] = False  # injected tokens in the middle of a conversation are still read
    assert batch.read_lengths()[0] == 13


def test_no_packed_micro_batch_computes_more_than_the_budget_in_lanes_or_in_one_sequence():
    """Lanes (sdpa, eager) are as wide as a micro-batch's longest row: a bin of real tokens within the budget can
    compute more than it in lanes (here rows of 12 beside one of 20: 4 lanes of 20 = 80 tokens for 56 read), so
    lanes cut it further; one sequence (flash-attn, varlen) computes only the read tokens and keeps the
    bins of real tokens."""
    batch = make([1, 1, 1, 1], [19, 11, 11, 11])  # read tokens 20, 12, 12, 12: 56
    assert batch.micro_batch_rows(token_budget=56, lanes=False) == [[0, 1, 2, 3]]
    assert batch.select([0, 1, 2, 3]).forward_tokens(lanes=True) == 4 * 20  # no two rows share a 20-token lane
    assert batch.select([0, 1, 2, 3]).forward_tokens(lanes=False) == 56
    groups = batch.micro_batch_rows(token_budget=56, lanes=True)
    assert sorted(r for g in groups for r in g) == [0, 1, 2, 3]
    assert all(batch.select(g).forward_tokens(lanes=True) <= 56 for g in groups) and len(groups) == 2
    lengths = [max(1, round(random.Random(s).lognormvariate(3.0, 1.0))) for s in range(200)]
    long_tailed = make([1] * 200, [min(n, 255) for n in lengths])
    for budget in (256, 512, 1024):
        for rows in long_tailed.micro_batch_rows(token_budget=budget):
            assert long_tailed.select(rows).forward_tokens() <= budget


def test_concat_repads_left_and_right():
    a, b = make([2], [3]), make([4], [1])
    both = RolloutBatch.concat([a, b])
    assert both.prompt_mask.tolist() == [[False, False, True, True], [True, True, True, True]]
    assert both.response_mask.tolist() == [[True, True, True], [True, False, False]]


def test_feature_records_follow_the_rows_through_select_and_concat():
    batch = make([2, 3, 1], [4, 1, 2])
    stale = torch.tensor([[True, True, False, False], [False] * 4, [True, False, False, False]])
    batch.pool_window = PoolWindow(running=torch.tensor([True, False, True]), stale_mask=stale)
    part = batch.select([2, 1])  # responses of 2 and 1 tokens: two columns kept
    assert part.pool_window.running.tolist() == [True, False]
    assert part.pool_window.stale_mask.tolist() == [[True, False], [False, False]]
    both = RolloutBatch.concat([part, batch.select([0])])
    assert both.pool_window.running.tolist() == [True, False, True]
    stale_rows = [[True, False, False, False], [False] * 4, [True, True, False, False]]  # re-padded on the right
    assert both.pool_window.stale_mask.tolist() == stale_rows
    with pytest.raises(ValueError, match="with and without a PoolWindow"):
        RolloutBatch.concat([part, make([1], [1])])

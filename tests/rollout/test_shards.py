"""Splitting a batch among engines: contiguous shares, never cutting a group, as even as groups allow."""

import pytest

from reasonrl.rollout.shards import group_boundaries, split_at_group_boundaries


def batch(*sizes: int) -> list[list[int]]:
    """A batch of groups: group g is ``sizes[g]`` copies of the prompt [1, g]."""
    return [[1, g] for g, size in enumerate(sizes) for _ in range(size)]


def spans(shares: list[range]) -> list[tuple[int, int]]:
    return [(share.start, share.stop) for share in shares]


def test_group_boundaries_are_where_the_prompt_changes():
    assert group_boundaries(batch(2, 3, 1)) == [0, 2, 5, 6]
    assert group_boundaries([]) == [0]
    # the same prompt again after another one starts a new group
    assert group_boundaries([[5], [5], [6], [5]]) == [0, 2, 3, 4]


def test_equal_groups_split_evenly():
    assert spans(split_at_group_boundaries(batch(2, 2, 2, 2), 2)) == [(0, 4), (4, 8)]
    assert spans(split_at_group_boundaries(batch(2, 2, 2, 2), 4)) == [(0, 2), (2, 4), (4, 6), (6, 8)]


def test_uneven_counts_cut_at_the_boundary_nearest_an_even_share():
    # 4 groups of 2 in 3 parts: cuts near 8/3 and 16/3, i.e. after groups 1 and 3
    assert spans(split_at_group_boundaries(batch(2, 2, 2, 2), 3)) == [(0, 2), (2, 6), (6, 8)]
    # a big first group: the rest shares the other part
    assert spans(split_at_group_boundaries(batch(5, 1, 1, 1), 2)) == [(0, 5), (5, 8)]
    # a group bigger than an even share never leaves a part empty while groups remain
    assert spans(split_at_group_boundaries(batch(10, 1, 1, 1), 3)) == [(0, 10), (10, 11), (11, 13)]


def test_a_single_group_goes_whole_to_the_first_part():
    assert spans(split_at_group_boundaries(batch(4), 1)) == [(0, 4)]
    assert spans(split_at_group_boundaries(batch(4), 3)) == [(0, 4), (4, 4), (4, 4)]


def test_more_parts_than_groups_gives_one_group_each_then_empty_parts():
    assert spans(split_at_group_boundaries(batch(3, 1), 4)) == [(0, 3), (3, 4), (4, 4), (4, 4)]
    assert spans(split_at_group_boundaries([], 2)) == [(0, 0), (0, 0)]


@pytest.mark.parametrize("parts", [1, 2, 3, 5, 8])
def test_shares_cover_the_batch_in_order_and_keep_groups_whole(parts):
    prompts = batch(3, 1, 4, 1, 5, 9, 2, 6)
    shares = split_at_group_boundaries(prompts, parts)
    assert len(shares) == parts
    assert [i for share in shares for i in share] == list(range(len(prompts)))
    cuts = {share.start for share in shares} | {len(prompts)}
    assert cuts <= set(group_boundaries(prompts))


def test_zero_parts_is_refused():
    with pytest.raises(ValueError, match="cannot split a batch into 0 parts"):
        split_at_group_boundaries(batch(2), 0)

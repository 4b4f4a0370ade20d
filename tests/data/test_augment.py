"""COCA's augmentations on a small conversation: what is masked, deleted and reordered, and that the
turn the scored reply answers keeps its place."""

import random

import pytest

from reasonrl.data.augment import DELETED, MASK, applicable, delete_turns, mask_terms, reorder_turns, two_views

HISTORY = [
    {"role": "user", "content": "one two three four"},
    {"role": "assistant", "content": "five six"},
    {"role": "user", "content": "seven eight nine ten"},
    {"role": "assistant", "content": "eleven twelve"},
    {"role": "user", "content": "thirteen fourteen"},
    {"role": "assistant", "content": "fifteen"},
    {"role": "user", "content": "what now?"},
]


def test_masking_hides_half_of_each_turns_words_and_merges_runs():
    masked = mask_terms(HISTORY, 0.5, random.Random(0))
    for before, after in zip(HISTORY, masked, strict=True):
        words = before["content"].split()
        kept = [w for w in after["content"].split() if w != MASK]
        assert len(kept) == len(words) - round(0.5 * len(words)) and set(kept) <= set(words)
        assert f"{MASK} {MASK}" not in after["content"] and after["role"] == before["role"]
    assert HISTORY[0]["content"] == "one two three four"  # the input is left alone


def test_deletion_blanks_half_of_the_turns_and_keeps_the_roles():
    deleted = delete_turns(HISTORY, 0.5, random.Random(1))
    assert sum(m["content"] == DELETED for m in deleted) == 4  # round(3.5)
    assert [m["role"] for m in deleted] == [m["role"] for m in HISTORY]


def test_reordering_swaps_two_exchanges_and_keeps_the_last_question_last():
    for seed in range(10):
        reordered = reorder_turns(HISTORY, random.Random(seed))
        assert reordered != HISTORY and reordered[-1] == HISTORY[-1]
        pairs = {(reordered[i]["content"], reordered[i + 1]["content"]) for i in range(0, 6, 2)}
        assert pairs == {(HISTORY[i]["content"], HISTORY[i + 1]["content"]) for i in range(0, 6, 2)}
    assert reorder_turns(HISTORY[-3:], random.Random(0)) is None  # one movable exchange


def test_the_settings_know_every_augmentation():
    from reasonrl.config import ConfigError
    from reasonrl.jobs.contrastive_pretrain import AUGMENTATIONS, ContrastivePretrainRun

    ContrastivePretrainRun(augmentations=",".join(AUGMENTATIONS)).check()
    with pytest.raises(ConfigError, match="--augmentations must name some of mask, delete, reorder"):
        ContrastivePretrainRun(augmentations="mask,shuffle").check()
    with pytest.raises(ConfigError, match="reorder needs another one beside it"):
        ContrastivePretrainRun(augmentations="reorder").check()


def test_two_views_use_two_different_augmentations_where_they_apply():
    single = [{"role": "user", "content": "a lone question with words"}]
    assert applicable(single, ["mask", "delete", "reorder"]) == ["mask", "delete"]
    first, second = two_views(single, ["mask", "delete", "reorder"], random.Random(0))
    assert {first[0]["content"] == DELETED, second[0]["content"] == DELETED} == {True, False}
    first, second = two_views(HISTORY, ["reorder"], random.Random(0))  # one strategy: both views use it
    assert first[-1] == second[-1] == HISTORY[-1]

"""T-PPO's rollout pool: windows, successive batching, the global cap, and its saved state."""

import random

import pytest

from reasonrl.data.examples import Example
from reasonrl.rollout.engine_protocol import SamplingParams
from reasonrl.rollout.fake import FakeEngine
from reasonrl.rollout.tppo_pool import (
    PartialRollouts,
    PoolSequence,
    RolloutPool,
    idle_slot_steps,
    slot_utilisation,
)

STOP = 0
PARAMS = SamplingParams(max_new_tokens=999, temperature=1.0, seed=1)


def random_lengths(prompt: list[int], rng: random.Random) -> list[int]:
    """Between 1 and 12 tokens, then a stop token: a response spans one to several windows."""
    return [7] * rng.randint(1, 12) + [STOP]


def finite_prompts(count: int, group_size: int):
    """A prompt source that runs dry after ``count`` prompts."""
    served = []

    def new_group(index: int) -> list[PoolSequence]:
        if len(served) == count:
            return []
        served.append(index)
        example = Example(f"q{index}", "question", "1")
        return [PoolSequence(example, [100 + index], index) for _ in range(group_size)]

    return new_group, served


def test_the_pool_stays_full_while_prompts_remain_then_drains():
    pool = RolloutPool(slots=6, window_tokens=4, max_response_tokens=10)
    engine = FakeEngine(random_lengths, stop_token_ids=[STOP])
    new_group, served = finite_prompts(count=12, group_size=4)
    sizes, exhausted_at = [], None
    for step in range(40):
        pool.refill(new_group)
        if not pool.active:
            break
        sizes.append(len(pool.active))
        if len(served) == 12 and not pool.waiting and exhausted_at is None:
            exhausted_at = len(sizes)
        pool.advance(engine, SamplingParams(999, 1.0, seed=step))
    assert exhausted_at is not None
    assert all(size == 6 for size in sizes[: exhausted_at - 1]), sizes  # full while prompts remain
    assert sizes[-1] < 6 and not pool.active  # then it drains to empty


def test_a_group_larger_than_the_free_slots_waits_for_the_next_free_ones():
    pool = RolloutPool(slots=6, window_tokens=4, max_response_tokens=10)
    new_group, _ = finite_prompts(count=5, group_size=4)
    pool.refill(new_group)
    assert [s.group for s in pool.active] == [0, 0, 0, 0, 1, 1]
    assert [s.group for s in pool.waiting] == [1, 1]
    assert pool.groups_admitted == 2


def test_each_window_adds_at_most_window_tokens_and_respects_the_cap():
    pool = RolloutPool(slots=3, window_tokens=4, max_response_tokens=10)  # 10 = 4 + 4 + 2
    engine = FakeEngine(lambda prompt, rng: [7] * 50, stop_token_ids=[STOP])  # never stops
    new_group, _ = finite_prompts(count=1, group_size=3)
    pool.refill(new_group)
    lengths = []
    while pool.active:
        window = pool.advance(engine, PARAMS)
        lengths.append([len(s.token_ids) for s in window.sequences])
        assert all(n <= 4 for n in window.new_tokens)
    assert lengths == [[4] * 3, [8] * 3, [10] * 3]
    assert all(s.finish_reason == "length" and s.windows == 3 for s in window.sequences)


def test_a_stop_token_finishes_a_sequence_and_each_token_keeps_its_logprob():
    calls = []

    def respond(prompt, rng):
        calls.append(list(prompt))
        return [5, 6, 7, 8] if len(calls) == 1 else [9, STOP]

    engine = FakeEngine(respond, stop_token_ids=[STOP], logprob=-0.5)
    pool = RolloutPool(slots=1, window_tokens=4, max_response_tokens=20)
    new_group, _ = finite_prompts(count=1, group_size=1)
    pool.refill(new_group)
    window = pool.advance(engine, PARAMS)
    first = window.sequences[0]
    assert first.running and first.token_ids == [5, 6, 7, 8] and first.window_start == 0
    assert window.reprefill_tokens == 0  # a new sequence: its prompt is read once
    window = pool.advance(engine, PARAMS)
    second = window.sequences[0]
    assert calls[1] == [100, 5, 6, 7, 8]  # continuation = prompt + partial response
    assert window.reprefill_tokens == 5  # ... read again: 1 prompt token + 4 response tokens
    assert second.finish_reason == "stop" and second.token_ids == [5, 6, 7, 8, 9, STOP]
    assert second.window_start == 4 and second.logprobs == [-0.5] * 6
    assert not pool.active


def test_saved_state_restores_every_in_flight_sequence_exactly():
    pool = RolloutPool(slots=6, window_tokens=4, max_response_tokens=10)
    engine = FakeEngine(random_lengths, stop_token_ids=[STOP], logprob=-0.123456789)
    new_group, _ = finite_prompts(count=10, group_size=4)
    pool.refill(new_group)
    pool.advance(engine, PARAMS)
    state = pool.state_dict()
    assert pool.active, "the test needs sequences still running"
    restored = RolloutPool(slots=6, window_tokens=4, max_response_tokens=10)
    restored.load_state_dict(state)
    assert restored.active == pool.active and restored.waiting == pool.waiting
    assert restored.state_dict() == state


def test_slot_utilisation_of_a_call():
    assert slot_utilisation([4, 4, 4]) == (1.0, 0.0)
    utilisation, underfull = slot_utilisation([1, 2, 4])
    assert utilisation == pytest.approx(7 / 12) and underfull == pytest.approx(0.75)
    assert idle_slot_steps([4, 4, 4]) == 0 and idle_slot_steps([1, 2, 4]) == 12 - 7 and idle_slot_steps([]) == 0


def test_partial_rollouts_continue_under_new_weights_and_tag_each_token_with_its_version():
    # the engine emits 10 + the version of its weights; responses: prompt 0 stops after 6 tokens, prompt 1
    # never stops (cap 10); windows of 4; versions 3, 4, 5 arrive before windows 1, 2, 3
    published = iter([3, 4, 5])
    engine = FakeEngine(lambda prompt, rng: [], stop_token_ids=[STOP])
    engine.respond = lambda prompt, rng: (
        [10 + version] * (6 - (len(prompt) - 1)) + [STOP] if prompt[0] == 100 else [10 + version] * 50
    )
    calls = []
    generate = engine.generate
    engine.generate = lambda prompts, params: calls.append(params) or generate(prompts, params)
    version = None

    def newest_version():
        nonlocal version
        version = next(published)
        engine.load_weights({})
        return version

    partial = PartialRollouts(engine, window_tokens=4, newest_version=newest_version)
    first, second = partial.generate([[100], [200]], SamplingParams(10, 1.0, seed=9, first_index=5))
    assert first.token_ids == [13] * 4 + [14, 14, STOP] and first.finish_reason == "stop"
    assert first.policy_versions == [3] * 4 + [4] * 3
    assert second.token_ids == [13] * 4 + [14] * 4 + [15] * 2 and second.finish_reason == "length"
    assert second.policy_versions == [3] * 4 + [4] * 4 + [5] * 2
    # every prompt samples from its own stream in each window; the first window with the call's seed
    assert [c.request_indices for c in calls] == [(5, 6), (5, 6), (6,)]
    assert calls[0].seed == 9 and len({c.seed for c in calls}) == 3
    assert partial.reprefill_tokens == (1 + 4) * 2 + (1 + 8)  # prompts and partial responses read again

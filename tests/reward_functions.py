"""Reward functions in TRL's and verl's shapes, for tests (scoring workers import them by module path)."""

import time


def digit_share(prompts, completions, **kwargs):
    """TRL shape: the fraction of digits in each completion."""
    return [sum(ch.isdigit() for ch in c) / max(1, len(c)) for c in completions]


def only_source_a(prompts, completions, data_source, **kwargs):
    """TRL shape: 1.0 for data source 'a'; None (does not apply) elsewhere."""
    return [1.0 if source == "a" else None for source in data_source]


def check_arguments(prompts, completions, ground_truth, data_source, extra_info, ability, **kwargs):
    """TRL shape: 1.0 when called as TRL calls a conversational row's function; raises what differs otherwise."""
    assert len(prompts) == len(completions) == len(ground_truth) == 1, (prompts, completions)
    assert prompts[0][-1] == {"role": "user", "content": "What is 3 + 4?"}, prompts
    assert completions[0] == [{"role": "assistant", "content": "It is 7"}], completions
    assert (ground_truth, data_source, extra_info, ability) == (["7"], ["src"], [{"index": 3}], ["math"]), kwargs
    assert "prompt" not in kwargs and "question" not in kwargs, kwargs
    return [1.0]


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    """verl shape: a dict with the score and the verdict."""
    right = solution_str.strip().endswith(str(ground_truth))
    bonus = 0.5 if (extra_info or {}).get("bonus") else 0.0
    return {"score": float(right) + bonus, "acc": right, "source_seen": data_source}


def raises_on_boom(prompts, completions, **kwargs):
    if any("boom" in c for c in completions):
        raise ValueError("cannot score a boom")
    return [1.0] * len(completions)


def hangs_on_hang(prompts, completions, **kwargs):
    if any("hang" in c for c in completions):
        time.sleep(3600)
    return [1.0] * len(completions)


def returns_a_float(prompts, completions, **kwargs):
    return 1.0


def fails_on_odd_length(prompts, completions, **kwargs):
    """TRL shape: 0.5 for a completion of even length; for an odd one a value that is no reward (its sample fails)."""
    return [0.5 if len(c) % 2 == 0 else "odd length" for c in completions]


def has_digit(prompts, completions, **kwargs):
    """TRL shape: 1.0 when a completion contains a digit, else 0.0 (binary: groups can be all-equal)."""
    return [float(any(ch.isdigit() for ch in c)) for c in completions]


def always_raises(prompts, completions, **kwargs):
    raise ValueError("this reward function cannot score anything")


def overflows_on_huge(prompts, completions, **kwargs):
    """TRL shape: a finite Python float float32 cannot hold (1e39) for a completion saying "huge", else 1e10."""
    return [1e39 if "huge" in c else 1e10 for c in completions]


def batch_rank(prompts, completions, completion_ids, trainer_state, **kwargs):
    """TRL shape, normalised over its batch: each completion's rank by token count, over the batch's size - 1;
    raises unless called as TRL calls it (the whole batch, its token ids, the trainer state)."""
    assert len(completions) == len(completion_ids) == 3, (completions, completion_ids)
    assert (trainer_state.global_step, trainer_state.max_steps) == (3, 10), trainer_state
    order = sorted(range(len(completion_ids)), key=lambda i: len(completion_ids[i]))
    return [order.index(i) / (len(order) - 1) for i in range(len(order))]

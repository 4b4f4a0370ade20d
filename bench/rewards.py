"""Reward functions for benchmarks that time random-weight models, which never solve a task: a reward that varies
with the response, so that every step has a learning signal and takes its update (a batch whose every advantage is
zero takes none)."""


def response_length(prompts, completions, **kwargs):
    """TRL shape: each completion's length in characters / 1000 (long-tailed answers: never one value for a group)."""
    return [len(c if isinstance(c, str) else c[-1]["content"]) / 1000 for c in completions]

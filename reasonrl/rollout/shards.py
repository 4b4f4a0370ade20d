"""Splitting one generation call over several engines (data-parallel ranks, rollout workers)."""

from __future__ import annotations

import itertools
from collections.abc import Sequence


def split_at_group_boundaries(prompts: Sequence[Sequence[int]], parts: int) -> list[range]:
    """``parts`` contiguous ranges covering ``prompts``, never splitting a run of identical consecutive
    prompts (the G copies of a GRPO group), with sizes as even as whole runs allow; trailing ranges
    may be empty when there are fewer runs than parts."""
    starts = [i for i in range(len(prompts)) if i == 0 or list(prompts[i]) != list(prompts[i - 1])]
    bounds = [0]
    for part in range(1, parts):
        target = round(len(prompts) * part / parts)
        candidates = [s for s in starts if s >= bounds[-1]] + [len(prompts)]
        bounds.append(min(candidates, key=lambda s: (abs(s - target), s)))
    bounds.append(len(prompts))
    return [range(a, b) for a, b in itertools.pairwise(bounds)]

"""Splitting one generation batch among several engines without cutting a GRPO group.

A batch holds each prompt's G copies next to each other (one group).  Data-parallel generation
gives each engine a contiguous share; with ``SamplingParams.first_index`` set to the share's
offset, the union of the shares is what one engine generating the whole batch would sample.
Keeping a group on one engine keeps its G copies together for whatever follows on that engine.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence


def group_boundaries(prompts: Sequence[Sequence[int]]) -> list[int]:
    """Indices where a run of identical consecutive prompts starts, then ``len(prompts)``.

    ``[a, a, b, b, c]`` gives ``[0, 2, 4, 5]``; an empty batch gives ``[0]``.
    """
    starts = [i for i in range(len(prompts)) if i == 0 or list(prompts[i]) != list(prompts[i - 1])]
    return [*starts, len(prompts)]


def split_at_group_boundaries(prompts: Sequence[Sequence[int]], parts: int) -> list[range]:
    """``parts`` contiguous ranges covering ``prompts``, cut only between groups, as even in size as that allows.

    Each cut is the group boundary nearest to its even share (``k * len(prompts) / parts``), kept
    after the previous cut and leaving one group for each later part, so no part is empty while
    there are at least as many groups as parts.  With fewer groups than parts, each group gets its
    own part and the last parts are empty.
    """
    if parts < 1:
        raise ValueError(f"cannot split a batch into {parts} parts; give at least 1")
    bounds = group_boundaries(prompts)
    groups = len(bounds) - 1
    if groups <= parts:
        cuts = bounds + [len(prompts)] * (parts - groups)
        return [range(cuts[k], cuts[k + 1]) for k in range(parts)]
    cuts = [0]
    index = 0  # position in bounds of the last cut
    for k in range(1, parts):
        target = k * len(prompts) / parts
        low, high = index + 1, groups - (parts - k)  # leave a group for each later part
        at = min(max(bisect_left(bounds, target, low, high + 1), low), high)
        if at > low and target - bounds[at - 1] <= bounds[at] - target:
            at -= 1  # the boundary just before the target is nearer (ties: the earlier one)
        index = at
        cuts.append(bounds[at])
    cuts.append(len(prompts))
    return [range(cuts[k], cuts[k + 1]) for k in range(parts)]

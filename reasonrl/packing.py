"""How a batch's rows become micro-batches and lanes: balanced bins under a token budget, the rows that share a
prompt, and first-fit lanes (docs/packing.md).  Pure functions of lengths (and prompt tokens), used by
``RolloutBatch.micro_batch_rows`` and by the packed forward (``models.forward``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from torch import Tensor


def balanced_bins(
    lengths: Sequence[int], budget: int, cost: Callable[[list[int]], int] | None = None
) -> list[list[int]]:
    """Indices of ``lengths`` in the fewest bins of ``cost`` at most ``budget`` that greedy balancing finds:
    k = ⌈Σ lengths / budget⌉ bins, each item (longest first) into the lightest bin, one more bin until
    every bin fits, at least as many more as the bins' costs need together (an item over the budget alone in its
    own).  ``cost`` of a bin's indices: by default the sum of their lengths; a caller's may be more (lanes' padding)
    or less (a prompt its items share, counted once).  Bins sorted, in order of their first item."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    oversized = [[i] for i in order if lengths[i] > budget]
    fitting = [i for i in order if lengths[i] <= budget]
    cost = cost or (lambda items: sum(lengths[i] for i in items))
    count, bins = -(-sum(lengths[i] for i in fitting) // budget), []  # ⌈Σ / budget⌉
    while fitting:
        bins = [[] for _ in range(count)]
        loads = [0] * count
        for i in fitting:
            lightest = min(range(count), key=loads.__getitem__)
            bins[lightest].append(i)
            loads[lightest] += lengths[i]
        costs = [cost(b) for b in bins if b]
        if max(costs) <= budget:
            break
        count = max(count + 1, -(-sum(costs) // budget))
    return sorted((sorted(g) for g in oversized + [b for b in bins if b]), key=lambda g: g[0])


def prompt_segments(prompt_ids: Tensor, prompt_mask: Tensor) -> list[list[int]]:
    """Rows whose prompts are the same tokens (``prompt_ids`` [B, P] left-padded, ``prompt_mask`` [B, P]), in
    order of each prompt's first row, each group's rows in order."""
    segments: dict[tuple[int, ...], list[int]] = {}
    for row, (ids, mask) in enumerate(zip(prompt_ids.tolist(), prompt_mask.bool().tolist(), strict=True)):
        segments.setdefault(tuple(i for i, m in zip(ids, mask, strict=True) if m), []).append(row)
    return list(segments.values())


def lane_tokens(lengths: Sequence[int]) -> int:
    """Tokens lanes as wide as the longest of ``lengths`` hold when those sequences are packed into them
    (``pack_lanes``): lanes × the longest, padding included."""
    lanes, _ = pack_lanes(list(lengths), max(lengths))
    return (max(lanes) + 1) * max(lengths)


def pack_lanes(lengths: list[int], capacity: int) -> tuple[list[int], list[int]]:
    """Each row's lane and offset when rows of ``lengths`` tokens are packed into lanes of ``capacity``
    tokens: longest first, each into the first lane it fits (first-fit decreasing)."""
    lane, offset, filled = [0] * len(lengths), [0] * len(lengths), []
    for row in sorted(range(len(lengths)), key=lambda r: -lengths[r]):
        first = next((i for i, used in enumerate(filled) if used + lengths[row] <= capacity), len(filled))
        if first == len(filled):
            filled.append(0)
        lane[row], offset[row] = first, filled[first]
        filled[first] += lengths[row]
    return lane, offset

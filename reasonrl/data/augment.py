"""COCA's three augmentations of a behaviour sequence, transposed to a conversation's history.

COCA (arXiv 2108.10510, §3.3) varies a search session three ways: term masking, query/document
deletion and behaviour reordering; each of the two views of a session uses one strategy, a different
one for each view.  Here the sequence is the conversation before the reply a reward model scores:
``mask_terms`` replaces a share of each turn's words with a mask (runs of masks merged),
``delete_turns`` replaces a share of the turns with a deletion marker, ``reorder_turns`` swaps two
user/assistant exchanges.  The reply itself is never changed.  The rates are COCA's (0.5 each).
"""

from __future__ import annotations

import random
from collections.abc import Sequence

Messages = list[dict[str, str]]
MASK, DELETED = "[masked]", "[deleted]"


def mask_terms(history: Messages, rate: float, rng: random.Random) -> Messages:
    """Each turn with round(rate × its words) of its words replaced by ``MASK``; adjacent masks merge into one."""
    out = []
    for message in history:
        words = message["content"].split()
        hidden = set(rng.sample(range(len(words)), round(rate * len(words))))
        kept: list[str] = []
        for i, word in enumerate(words):
            if i not in hidden:
                kept.append(word)
            elif not kept or kept[-1] != MASK:
                kept.append(MASK)
        out.append({**message, "content": " ".join(kept)})
    return out


def delete_turns(history: Messages, rate: float, rng: random.Random) -> Messages:
    """round(rate × the turns) turns (at least one) with their content replaced by ``DELETED``; roles stay."""
    count = max(1, round(rate * len(history))) if history else 0
    gone = set(rng.sample(range(len(history)), count))
    return [{**m, "content": DELETED} if i in gone else dict(m) for i, m in enumerate(history)]


def exchanges(history: Messages) -> list[tuple[int, int]]:
    """(start, stop) of each user turn with the assistant turn that answers it (system turns stay put)."""
    spans, i = [], 0
    while i < len(history):
        if history[i]["role"] == "user":
            stop = i + 2 if i + 1 < len(history) and history[i + 1]["role"] == "assistant" else i + 1
            spans.append((i, stop))
            i = stop
        else:
            i += 1
    return spans


def movable_exchanges(history: Messages) -> list[tuple[int, int]]:
    """The exchanges reordering may move: all but the one of the last user turn (the scored reply answers it)."""
    last_user = max((i for i, m in enumerate(history) if m["role"] == "user"), default=-1)
    return [span for span in exchanges(history) if span[0] != last_user]


def reorder_turns(history: Messages, rng: random.Random) -> Messages | None:
    """Two exchanges of ``history`` swapped (None when fewer than two can move)."""
    spans = movable_exchanges(history)
    if len(spans) < 2:
        return None
    a, b = sorted(rng.sample(range(len(spans)), 2))
    (a0, a1), (b0, b1) = spans[a], spans[b]
    return [*history[:a0], *history[b0:b1], *history[a1:b0], *history[a0:a1], *history[b1:]]


def applicable(history: Messages, enabled: Sequence[str]) -> list[str]:
    """The enabled augmentations that change ``history`` (reordering needs two movable exchanges)."""
    return [name for name in enabled if name != "reorder" or len(movable_exchanges(history)) >= 2]


def augment(history: Messages, name: str, rng: random.Random, mask_rate: float, delete_rate: float) -> Messages:
    """``history`` under one augmentation."""
    if name == "mask":
        return mask_terms(history, mask_rate, rng)
    if name == "delete":
        return delete_turns(history, delete_rate, rng)
    reordered = reorder_turns(history, rng)
    return reordered if reordered is not None else [dict(m) for m in history]


def two_views(
    history: Messages, enabled: Sequence[str], rng: random.Random, mask_rate: float = 0.5, delete_rate: float = 0.5
) -> tuple[Messages, Messages]:
    """Two augmented views of one history, by two different augmentations where two apply (COCA §3.3)."""
    names = applicable(history, enabled)
    if not names:
        raise ValueError(f"no augmentation of {list(enabled)} applies")
    first = rng.choice(names)
    second = rng.choice([n for n in names if n != first] or names)
    return augment(history, first, rng, mask_rate, delete_rate), augment(history, second, rng, mask_rate, delete_rate)

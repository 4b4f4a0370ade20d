"""T-PPO's rollout pool: truncated rollouts with successive batching (arXiv 2506.15050; docs/algorithms.md, T-PPO).

The pool holds a fixed number of generation slots.  Each training step advances every sequence in
it by at most ``window_tokens`` tokens.  A sequence that emits a stop token or reaches the global
cap ``max_response_tokens`` is finished and leaves; its slot is refilled with a new prompt, so the
generation batch stays full while prompts remain.  An unfinished sequence keeps its prefix and
continues at the next step under the updated policy.  Continuation is a prefill of prompt + partial
response, which every engine supports.  Each token's behaviour log-prob is stored when the token is
generated, because a sequence that spans several windows was sampled by several policy versions.

Asynchronous RL's partial rollouts reuse the pool within one generation call (``generate_in_windows``):
a slot per prompt, advanced window by window, the newest published weights loaded between windows.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from reasonrl.data.examples import Example
from reasonrl.rollout.engine_protocol import Completion, EngineWrapper, FinishReason, RolloutEngine, SamplingParams


@dataclass
class PoolSequence:
    """One response in the pool: its prompt, the tokens generated so far and their behaviour log-probs."""

    example: Example | None
    """The dataset row (None for a partial rollout's sequence: its call's caller keeps the rows)."""

    prompt_ids: list[int]
    group: int
    """Index of the prompt among all prompts the pool admitted (the G samples of a prompt share it; a
    partial rollout's sequence: the index of its prompt in its generation call)."""

    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    """Log-prob of each generated token under the policy that sampled it, recorded at generation time."""

    versions: list[int] = field(default_factory=list)
    """The policy version that sampled each generated token."""

    window_start: int = 0
    """Index of the first token generated in the latest window; earlier tokens came from older policies."""

    windows: int = 0
    """How many windows the sequence has been advanced."""

    finish_reason: FinishReason | None = None
    """stop (a stop token) or length (the global cap); None while the sequence is still running."""

    @property
    def running(self) -> bool:
        return self.finish_reason is None

    def to_state(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @staticmethod
    def from_state(state: dict[str, Any]) -> PoolSequence:
        example = None if state["example"] is None else Example(**state["example"])
        unknown = [-1] * len(state["token_ids"])  # a checkpoint from before versions were kept
        return PoolSequence(**{"versions": unknown, **state, "example": example})


@dataclass
class Window:
    """What one step of the pool generated."""

    sequences: list[PoolSequence]
    """Every sequence advanced in this window, in slot order; the finished ones have left the pool."""

    new_tokens: list[int]
    """Tokens each of those sequences gained in this window."""

    reprefill_tokens: int = 0
    """Tokens the engine read again to continue sequences started in earlier windows: their prompt and
    partial response (no KV cache is kept between windows)."""


NewGroup = Callable[[int], list[PoolSequence]]
"""Given the new prompt's group index, returns its G fresh sequences, or [] when no prompt remains."""


class RolloutPool:
    """A fixed number of slots, advanced one window per step and refilled as sequences finish."""

    def __init__(self, slots: int, window_tokens: int, max_response_tokens: int) -> None:
        if not 1 <= window_tokens <= max_response_tokens:
            raise ValueError(f"window_tokens={window_tokens} must be in [1, max_response_tokens={max_response_tokens}]")
        self.slots, self.window_tokens, self.max_response_tokens = slots, window_tokens, max_response_tokens
        self.active: list[PoolSequence] = []
        self.waiting: list[PoolSequence] = []
        """Samples of an admitted prompt that found no free slot yet; they take the next free ones."""

        self.groups_admitted = 0

    def refill(self, new_group: NewGroup) -> int:
        """Fill the free slots, first from ``waiting``, then with new prompts; returns how many were added."""
        added = 0
        while len(self.active) < self.slots:
            if not self.waiting:
                self.waiting = new_group(self.groups_admitted)
                if not self.waiting:
                    break  # no prompt remains
                self.groups_admitted += 1
            self.active.append(self.waiting.pop(0))
            added += 1
        return added

    def advance(self, engine: RolloutEngine, params: SamplingParams, version: int = 0) -> Window:
        """Advance every active sequence by at most one window; finished sequences leave the pool.

        One engine call serves all slots: each sequence's prompt is its prompt + response so far.
        A sequence is never taken past the global cap: new tokens beyond it are dropped.  The new
        tokens are tagged with ``version``, the policy version of ``engine``'s weights.
        """
        advanced = self.active
        budgets = [min(self.window_tokens, self.max_response_tokens - len(s.token_ids)) for s in advanced]
        request = dataclasses.replace(params, max_new_tokens=max(budgets, default=1))
        reprefill = sum(len(s.prompt_ids) + len(s.token_ids) for s in advanced if s.windows)
        completions = engine.generate([s.prompt_ids + s.token_ids for s in advanced], request)
        gained = []
        for sequence, completion, budget in zip(advanced, completions, budgets, strict=True):
            kept = completion.token_ids[:budget]
            sequence.window_start = len(sequence.token_ids)
            sequence.token_ids += kept
            sequence.logprobs += completion.logprobs[:budget]
            sequence.versions += [version] * len(kept)
            sequence.windows += 1
            gained.append(len(kept))
            if kept and kept[-1] in engine.stop_token_ids and completion.finish_reason == "stop":
                sequence.finish_reason = "stop"
            elif len(sequence.token_ids) >= self.max_response_tokens or not kept:
                sequence.finish_reason = "length"  # the cap, or an engine that could generate nothing more
        self.active = [s for s in advanced if s.running]
        return Window(advanced, gained, reprefill)

    def state_dict(self) -> dict[str, Any]:
        """Every in-flight sequence with its tokens and log-probs (for checkpoints)."""
        return {
            "active": [s.to_state() for s in self.active],
            "waiting": [s.to_state() for s in self.waiting],
            "groups_admitted": self.groups_admitted,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue with exactly the saved in-flight sequences."""
        self.active = [PoolSequence.from_state(s) for s in state["active"]]
        self.waiting = [PoolSequence.from_state(s) for s in state["waiting"]]
        self.groups_admitted = int(state["groups_admitted"])


class PartialRollouts(EngineWrapper):
    """Partial rollouts (asynchronous RL, rollout.partial_rollouts): an engine whose every call generates
    its responses window by window through a ``RolloutPool`` with a slot per prompt.  Before each window
    ``newest_version`` loads the newest published weights into ``engine`` (when there are newer ones) and
    returns their version, so a response still generating when new weights arrive continues under them
    rather than being finished by the old policy or thrown away.  Each token keeps the version that
    sampled it (``Completion.policy_versions``) and its behaviour log-prob; continuing a response is a
    prefill of its prompt and partial response (``reprefill_tokens`` counts those, to be read and reset
    by the caller)."""

    def __init__(self, engine: RolloutEngine, window_tokens: int, newest_version: Callable[[], int]) -> None:
        super().__init__(engine)
        self.window_tokens, self.newest_version = window_tokens, newest_version
        self.reprefill_tokens = 0

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[Completion]:
        if not prompts:
            return []
        # 1. a slot per prompt; each keeps its sampling stream (its index in the call) in every window
        indices = params.request_indices or tuple(range(params.first_index, params.first_index + len(prompts)))
        sequences = [PoolSequence(None, list(prompt), i) for i, prompt in enumerate(prompts)]
        pool = RolloutPool(len(prompts), min(self.window_tokens, params.max_new_tokens), params.max_new_tokens)
        pool.refill(lambda group: list(sequences) if group == 0 else [])
        window = 0
        while pool.active:
            # 2. the newest weights between windows, then one window for every running response
            version = self.newest_version()
            request = dataclasses.replace(
                params,
                seed=window_seed(params.seed, window),
                request_indices=tuple(indices[s.group] for s in pool.active),
                fire=params.fire if window == 0 else None,  # FIRE's positions open the response
            )
            self.reprefill_tokens += pool.advance(self.engine, request, version).reprefill_tokens
            window += 1
        return [Completion(s.token_ids, s.logprobs, s.finish_reason or "length", s.versions) for s in sequences]


def window_seed(seed: int | None, window: int) -> int | None:
    """The sampling seed of a partial rollout's ``window``-th window: the call's own for the first."""
    if seed is None or window == 0:
        return seed
    return (seed * 1_000_003 + window) % (2**31 - 1)


def slot_utilisation(new_tokens: list[int]) -> tuple[float, float]:
    """(share of slot-steps that produced a token, share of decode steps with at least one idle slot)
    for one generation call in which every sequence starts together and generates ``new_tokens[i]``
    tokens: the call lasts max(new_tokens) decode steps, and a slot idles once its sequence is done.
    A proxy for the time a synchronous batch spends waiting on its longest response."""
    if not new_tokens or max(new_tokens) == 0:
        return 1.0, 0.0
    longest = max(new_tokens)
    return sum(new_tokens) / (len(new_tokens) * longest), 1.0 - min(new_tokens) / longest


def idle_slot_steps(new_tokens: list[int]) -> int:
    """Slot-steps in which a sequence of the call was already done while the call went on, for one
    generation call as ``slot_utilisation`` models it: len(new_tokens) · max(new_tokens) − Σ new_tokens."""
    return len(new_tokens) * max(new_tokens, default=0) - sum(new_tokens)

"""Multi-turn episodes: the ``Environment`` protocol, and the record the driver keeps of each episode.

An environment is one object for all the episodes of a run; what one episode needs to remember lives in
that episode (``Conversation.state``, which ``reset`` returns).  The driver (``rollout/multiturn/conversations.py``,
``run_conversations``) asks it three things:

- ``reset(row)`` once per episode, before the first turn: the first ``Observation`` (the chat the episode
  starts from, the episode's state).  ``row`` is the dataset row, an ``Example`` whose ``messages`` are the
  chat that asks its question as the run's data settings render it (system prompt, prompt template).
- ``step(episode)`` after every policy turn (``episode.turns()[-1]``): a ``Step``, the message to append and
  the role of the next turn (None ends the episode), and this turn's reward.
- ``finish(episode)`` once when the episode has ended, however it ended (the environment's own end, a turn or
  token limit): the reward of its end, or None for "the row's verifier scores the final turn".

``tools`` (a class attribute) are the function schemas its episodes may call; where the chat template has a
tool-call format they are rendered into the prompt (``apply_chat_template(tools=...)``).

The driver runs one turn's ``step`` calls of every episode concurrently, one thread each, under one time
budget: ``step`` and ``finish`` may be called from several threads at once, each for its own episode.  A
``reset``, ``step`` or ``finish`` that raises or does not return within the budget ends its episode with a
logged error (``Conversation.error``) and zero reward; the run goes on.

A TRL ``environment_factory`` class fits this protocol through an adapter (``rollout/multiturn/trl_environments.py``; no
change to it): ``reset`` makes an instance for the episode (its state) and appends what the instance's
``reset`` returns to the chat, ``tools`` are its public methods' schemas, ``step`` calls the method a tool call
names, ``finish`` returns its ``get_reward()``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol, TypeVar

from reasonrl.data.examples import Example
from reasonrl.rollout.engine_protocol import extended

log = logging.getLogger(__name__)

ROLE_INJECTED = -1
ROLE_POLICY = 0  # an attempt at the answer
ROLE_VERIFIER = 1  # the policy judging its previous attempt
MAX_ENVIRONMENT_THREADS = 64  # episodes whose step runs at once, at most


@dataclass
class Segment:
    """A run of tokens of one conversation: a generated turn, or injected text."""

    token_ids: list[int]
    logprobs: list[float]  # the engine's, per token; 0 for injected tokens
    role: int  # ROLE_POLICY / ROLE_VERIFIER for a generated turn, ROLE_INJECTED otherwise
    text: str  # the generated turn decoded (special tokens skipped), or the injected user message
    finish_reason: str | None = None  # a generated turn's: "stop" or "length"

    @property
    def generated(self) -> bool:
        return self.role != ROLE_INJECTED


@dataclass
class Conversation:
    """One episode: its chat so far, the segments after the prompt, and what comes next."""

    prompt_ids: list[int]  # chat-formatted, ending with the assistant header
    messages: list[dict[str, str]]  # the chat the prompt rendered (system and user messages)
    stream: int = 0  # sampling stream index: the same conversation samples the same turns in any batch
    next_role: int = ROLE_POLICY
    segments: list[Segment] = field(default_factory=list)
    tools: list[dict] | None = None  # the tool schemas the prompt rendered (a template's tool-call format)
    done: bool = False
    end: str = ""  # why it ended: "rule" (the environment), "turn_limit", "token_limit" or "error"
    tool_errors: int = 0  # its tool calls that failed (unparseable, crashed, timed out...), each told to the model
    tool_calls: int = 0  # its tool calls answered in the conversation
    state: Any = None  # what the environment keeps for this episode (``Observation.state``)
    rewards: list[float] = field(default_factory=list)  # per generated turn: the environment's reward (0: none)
    final_reward: float | None = None  # the environment's reward of the end (``finish``); None: the verifier's
    error: str = ""  # why the environment failed this episode (it then ends with zero reward)

    @property
    def response_length(self) -> int:
        """Tokens after the prompt, generated and injected."""
        return sum(len(s.token_ids) for s in self.segments)

    def turns(self, role: int | None = None) -> list[Segment]:
        """The generated turns, in order (only those of ``role`` when given)."""
        return [s for s in self.segments if s.generated and (role is None or s.role == role)]

    def token_ids(self) -> list[int]:
        """The prompt and every segment: what the model reads to generate the next turn."""
        return extended(self.prompt_ids, [t for s in self.segments for t in s.token_ids])  # a prompt keeps its images

    def fail(self, error: str) -> None:
        """End the episode for an environment failure: logged, and rewarded 0."""
        self.done, self.end, self.error = True, "error", error
        log.warning("an environment failed an episode (stream %d), which ends with reward 0: %s", self.stream, error)


@dataclass(frozen=True)
class Observation:
    """The start of an episode: the chat before its first turn, and what the environment keeps for it."""

    messages: Sequence[dict[str, str]]
    state: Any = None


@dataclass(frozen=True)
class Injection:
    """A message to append (a user message, or a tool's output), and the role of the turn generated after it."""

    text: str
    next_role: int
    message_role: str = "user"  # the chat role it is rendered as: "user", or "tool" for a native tool call
    tool_error: bool = False  # the message reports a tool call that failed
    tool_call: bool = False  # the message answers a tool call (its output, or why it failed)


@dataclass(frozen=True)
class Step:
    """An environment's answer to a policy turn: the message to append (None ends the episode), and the
    turn's reward (None: none), which sits on the turn's last token."""

    injection: Injection | None = None
    reward: float | None = None


class Environment(Protocol):
    """A kind of multi-turn episode (the module docstring says how the driver uses it).  Subclasses inherit
    the defaults: no tools, the row's chat as the first observation, no reward of its own at the end."""

    tools: ClassVar[Sequence[dict]] = ()

    def reset(self, row: Example) -> Observation:
        """The first observation of an episode on ``row``."""
        return Observation(row.messages)

    def step(self, episode: Conversation) -> Step:
        """What follows the episode's last generated turn."""
        ...

    def finish(self, episode: Conversation) -> float | None:
        """The reward of the episode's end, added on its last turn; None: the row's verifier scores that turn."""
        return None


T = TypeVar("T")
PENDING = object()  # the result of a contained call that has not returned
_BATCH = threading.local()  # per thread: when the contained batch it works for began


def batch_started() -> float | None:
    """When the ``contained`` batch whose call this thread runs began (``time.monotonic()``), None outside one:
    the tool calls of one turn's steps share one time budget from then, however many wait for a thread."""
    return getattr(_BATCH, "started", None)


class OutOfTime(TimeoutError):
    """A call that ran out of the environment's time (``rollout.environment_timeout_seconds``), which ends its
    episode: a tool's function that raises it is no tool error told to the model (``tool_calls.call_tool``)."""


@dataclass(frozen=True)
class Failure:
    """A contained call that raised or ran out of time: why."""

    error: str


def contained(calls: Sequence[Callable[[], T]], timeout_s: float) -> list[T | Failure]:
    """Run ``calls`` concurrently (at most MAX_ENVIRONMENT_THREADS at once, in daemon threads) within
    ``timeout_s`` seconds in all: each one's result, or a ``Failure`` for one that raised or had not returned
    when the time was up (a call that never returns is left behind in its thread; it holds nothing of the run).
    Limit: a call into C code that holds the GIL stops every thread, this one's clock too, until it returns."""
    results: list[Any] = [PENDING] * len(calls)
    pending = iter(range(len(calls)))
    lock, stopped, started = threading.Lock(), threading.Event(), time.monotonic()

    def work() -> None:
        _BATCH.started = started
        while not stopped.is_set():
            with lock:
                index = next(pending, None)
            if index is None:
                return
            try:
                results[index] = calls[index]()
            except Exception as exc:  # an environment's failure ends its own episode only
                results[index] = Failure(f"{type(exc).__name__}: {exc}"[:500])

    threads = [threading.Thread(target=work, daemon=True) for _ in range(min(len(calls), MAX_ENVIRONMENT_THREADS))]
    deadline = started + timeout_s
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    stopped.set()
    late = Failure(f"no answer within the environment's {timeout_s:g} s")
    return [late if result is PENDING else result for result in list(results)]
